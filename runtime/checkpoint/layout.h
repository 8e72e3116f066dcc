// The on-disk layout of a zrt checkpoint and its index (docs/checkpoints.md):
//
//   <save_dir>/latest                 the tag of the newest complete checkpoint (one line)
//   <save_dir>/<tag>/index.h5         written by rank 0: run metadata and the tables below
//   <save_dir>/<tag>/rank_00000.h5    one per rank of the partition: that rank's slices
//
// A rank file holds float32 datasets of the rank's whole slice, every unit's slice one after the
// other (unit u at element unit_slice_offset[u]): /master (fp32 master weights), then one per
// state tensor of the optimizer, named as the optimizer names it (optimizers/optimizer.h; Adam:
// /exp_avg and /exp_avg_sq, Lion: /exp_avg); plus attributes format, rank, world, seed.
//
// The index holds attributes (format, format_version, step, world, stage, dtypes, the optimizer's
// state family and state names, optimizer and loss-scaler counters, the data stream's state, the
// config as JSON) and datasets: the parameter table (param_name, param_ndim, param_dims,
// param_numel, param_unit, param_offset) and the unit table (unit_numel, unit_shard,
// unit_slice_offset). Every dataset has CRC-32C block checksums (h5.h).
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
inline constexpr std::int64_t kFormatVersion = 1;
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
};

struct UnitEntry {
  std::int64_t numel = 0;         // padded, a multiple of world
  std::int64_t shard = 0;         // numel / world: each rank's slice
  std::int64_t slice_offset = 0;  // where the unit's slice starts in a rank's datasets
};

// Throws InvalidArgument unless every unit of `plan` is in one shard group: the index records
// one world for every unit (`what`: "save" or "load", for the message).
void refuse_several_groups(const PartitionPlan& plan, const char* what);

// Everything but the tensor data: what rank 0 writes to index.h5.
struct CheckpointIndex {
  std::int64_t step = 0;             // trainer steps done (skipped ones included)
  std::int64_t optimizer_steps = 0;  // applied steps: Adam's step count and the LR schedule's
  std::int64_t skipped_steps = 0;
  int world = 1;  // ranks the units were sliced over (1 at stage 0): rank files written
  int stage = 0;
  std::string compute_dtype = "float32";
  std::string master_dtype = "float32";
  // The optimizer state the rank files hold (OptimizerSpec::family and state_names). Indexes
  // written before the optimizer seam have neither attribute: they hold Adam's.
  std::string optimizer = "Adam";
  std::vector<std::string> optimizer_states = {"exp_avg", "exp_avg_sq"};
  std::uint64_t seed = 0;  // the run's seed (init and sampling RNGs are keyed on it)
  LossScaleState loss_scale;
  DataStreamState data;
  std::string scheduler;    // the schedule's type: its value is a pure function of the step
  std::string config_json;  // the run's config as written
  std::vector<ParamEntry> params;
  std::vector<UnitEntry> units;

  std::int64_t slice_elements() const;  // one rank's dataset length
  // The rank files' fp32 datasets in file order: "/master", then "/<state>" per state.
  std::vector<std::string> state_datasets() const;
};

// The tables of a partition plan, for the index.
void fill_tables(CheckpointIndex& index, const std::vector<ParamSpec>& params,
                 const PartitionPlan& plan);

std::string rank_file_name(int rank);  // "rank_00003.h5"

// Writes `index` to `path` (a new file).
void write_index(const std::string& path, const CheckpointIndex& index);

// Reads and validates an index. With `expect` (the running model's parameters) the table must
// match it name for name and shape for shape before any table is read into memory sized by the
// file; mismatches are InvalidArgument naming the file, the dataset and the parameter.
CheckpointIndex read_index(const std::string& path, const std::vector<ParamSpec>* expect = nullptr);

}  // namespace zrt::checkpoint
