// The on-disk layout of a zrt checkpoint and its index (docs/checkpoints.md):
//
//   <save_dir>/latest                 the tag of the newest complete checkpoint (one line)
//   <save_dir>/<tag>/index.h5         written by rank 0: run metadata and the tables below
//   <save_dir>/<tag>/rank_00000.h5    one per rank that writes slices: those slices
//
// A rank file holds float32 datasets of the slices the rank writes, one after the other:
// /master (fp32 master weights), then one per state tensor of the optimizer, named as the
// optimizer names it (optimizers/optimizer.h; Adam: /exp_avg and /exp_avg_sq, Lion: /exp_avg);
// plus attributes format, rank, world, seed. Every slice of every unit is written exactly once:
// by the ranks of the one shard group that holds it (the first of its replicas).
//
// The index holds attributes (format, format_version, step, world, stage, dtypes, the optimizer's
// state family and state names, optimizer and loss-scaler counters, the data stream's state, the
// config as JSON) and datasets: the parameter table (param_name, param_ndim, param_dims,
// param_numel, param_unit, param_offset), the unit table (unit_numel, unit_shard, unit_group,
// unit_slices), where each slice is (slice_rank, slice_offset: unit by unit, slice by slice) and
// each rank file's length (rank_elements). Every dataset has CRC-32C block checksums (h5.h).
// Format 1 (read, no longer written) had one world for every unit: slice r of unit u in rank
// file r at unit_slice_offset[u]; it reads as format 2 with those slices.
//
// Thread-safety: plain values; the functions do HDF5 I/O on the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/token_dataset.h"
#include "runtime/engine/loss_scaler.h"
#include "runtime/engine/optimizer_interface.h"
#include "runtime/engine/partition.h"
#include "runtime/model_interface.h"

namespace zrt::checkpoint {

inline constexpr const char* kIndexFormat = "zrt-checkpoint-index";
inline constexpr const char* kRankFormat = "zrt-checkpoint-rank";
inline constexpr std::int64_t kFormatVersion = 2;
// The first format, still read (see above).
inline constexpr std::int64_t kOneWorldFormatVersion = 1;
inline constexpr std::int64_t kNameBytes = 256;  // fixed-length parameter names
// The first fp32 array of every rank file; the optimizer's state datasets follow it.
inline constexpr const char* kMasterDataset = "/master";

// One parameter's row of the table.
struct ParamEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::int64_t unit = 0;
  std::int64_t offset = 0;  // element offset inside its unit
  // The optimizer steps it took (EngineCounters::parameter_steps: Adam's count for it; 0 when
  // it was frozen); -1: not recorded (an index written before `param_steps`), the run's count.
  std::int64_t steps = -1;
};

// Where one slice of a unit lives.
struct SliceEntry {
  std::int64_t rank = 0;    // the rank file
  std::int64_t offset = 0;  // its first element in that file's datasets
};

struct UnitEntry {
  std::int64_t numel = 0;  // padded: shard x its number of slices
  std::int64_t shard = 0;  // each slice's length
  std::int64_t group = 0;  // the shard group it was sliced over when saved (ParamSpec::group)
  std::vector<SliceEntry> slices;  // slice s: the rank of the shard group that owned it
};

// A range of a rank's whole state: every unit it holds, in plan order, as snapshot_engine
// copies it (plan().total_shard() floats per state array).
struct StateRange {
  std::int64_t first = 0;
  std::int64_t count = 0;
};

// One slice a rank writes, as a row of the tables (an engine over several groups: rank 0
// gathers every rank's rows at save time, rank_share.h).
struct WrittenSlice {
  std::string unit_key;         // the unit's first parameter's name: the same unit on every rank
  std::int64_t local_unit = 0;  // its index in the writer's plan (orders the merged tables)
  std::int64_t group = 0;
  std::int64_t numel = 0;
  std::int64_t shard = 0;
  std::int64_t slices = 0;         // the unit's group's world
  std::int64_t slice = 0;          // which of them
  std::int64_t offset = 0;         // where it starts in the writer's rank file
  std::vector<ParamEntry> params;  // slice 0's writer only: the unit's parameters (unit unused)
};

// This rank's part of a save (describe_engine); not stored as such.
struct RankShare {
  // Floats per state array of the rank's whole state (what a SnapshotFiller fills); 0: not
  // described (a one-group index from fill_tables: the whole of slice_elements()).
  std::int64_t held = 0;
  std::vector<StateRange> written;  // what the rank file holds, in file order; empty: no file
  // Several groups: the tables are assembled on rank 0 from every rank's `slices` (the
  // checkpointer gathers them); otherwise the index's tables are complete on every rank.
  bool gather = false;
  std::vector<WrittenSlice> slices;
  std::int64_t file_elements() const;
};

// Everything but the tensor data: what rank 0 writes to index.h5.
struct CheckpointIndex {
  std::int64_t step = 0;             // trainer steps done (skipped ones included)
  std::int64_t optimizer_steps = 0;  // applied steps: Adam's step count and the LR schedule's
  std::int64_t skipped_steps = 0;
  // Rank-file slots: rank_00000.h5 .. rank_<world-1>.h5, those with rank_elements > 0 written
  // (one group: the ranks the units were sliced over, 1 at stage 0; several groups: every rank)
  int world = 1;
  int stage = 0;
  std::string compute_dtype = "float32";
  std::string master_dtype = "float32";
  // The optimizer state the rank files hold (OptimizerSpec::family and state_names). Indexes
  // written before the optimizer seam have neither attribute: they hold Adam's.
  std::string optimizer = "Adam";
  std::vector<std::string> optimizer_states = {"exp_avg", "exp_avg_sq"};
  std::uint64_t seed = 0;  // the run's seed (init and sampling RNGs are keyed on it)
  // A number drawn for each save, written into the index and every rank file of it: a rank file
  // from another save (copied over, or a run sharing the directory) is refused on load. 0: an
  // index written before save ids (its rank files are not checked for one).
  std::int64_t save_id = 0;
  LossScaleState loss_scale;
  DataStreamState data;
  std::string scheduler;    // the schedule's type: its value is a pure function of the step
  std::string config_json;  // the run's config as written
  std::vector<ParamEntry> params;
  std::vector<UnitEntry> units;
  std::vector<std::int64_t> rank_elements;  // [world]: each rank file's dataset length (0: none)
  RankShare share;                          // this rank's save; not stored

  // Every rank file's dataset length where they are all alike (one group); throws otherwise.
  std::int64_t slice_elements() const;
  // The rank files' fp32 datasets in file order: "/master", then "/<state>" per state.
  std::vector<std::string> state_datasets() const;
};

// The tables of a one-group partition plan, for the index: slice r of every unit in rank file
// r, every rank file the plan's whole slice. A plan over several groups is InvalidArgument: its
// tables come from every rank (describe_engine, and the checkpointer's gather).
void fill_tables(CheckpointIndex& index, const std::vector<ParamSpec>& params,
                 const PartitionPlan& plan);

std::string rank_file_name(int rank);  // "rank_00003.h5"

// Writes `index` to `path` (a new file).
void write_index(const std::string& path, const CheckpointIndex& index);

// Reads and validates an index (format 2, or format 1 as its format-2 equivalent). With
// `expect` (the running model's parameters) the table must match it name for name and shape for
// shape before any table is read into memory sized by the file; mismatches are InvalidArgument
// naming the file, the dataset and the parameter.
CheckpointIndex read_index(const std::string& path, const std::vector<ParamSpec>* expect = nullptr);

}  // namespace zrt::checkpoint
