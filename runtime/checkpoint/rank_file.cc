#include "runtime/checkpoint/rank_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "runtime/checkpoint/tensor_writer.h"
#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"

namespace zrt::checkpoint {

void write_rank_file(const std::string& path, const RankState& snapshot, int world,
                     std::uint64_t seed, std::int64_t save_id, bool kill_midway,
                     RankFileTimings* timings, bool direct_io) {
  RankFileTimings t;
  using Clock = std::chrono::steady_clock;
  auto lap = [at = Clock::now()]() mutable {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - at).count();
    at = now;
    return s;
  };
  H5File file = H5File::create(path);
  // The data and a generous bound on HDF5's metadata (attributes, the checksum arrays, object
  // headers), allocated before anything is written: a full disk is reported here.
  const std::int64_t blocks = (snapshot.elements * 4 + kTensorBlockBytes - 1) / kTensorBlockBytes;
  file.reserve(snapshot.bytes() + (64 << 10) +
               static_cast<std::int64_t>(snapshot.datasets.size()) * (4 * blocks + (4 << 10)));
  write_attr(file.id(), "format", std::string(kRankFormat));
  write_attr(file.id(), "format_version", kFormatVersion);
  write_attr(file.id(), "rank", std::int64_t{snapshot.rank});
  write_attr(file.id(), "world", std::int64_t{world});
  // Training draws no random numbers after initialisation (no dropout; the data order is a pure
  // function of the global sample index and data.seed): the seed is the whole RNG state.
  write_attr(file.id(), "rng_seed", static_cast<std::int64_t>(seed));
  if (save_id != 0) write_attr(file.id(), "save_id", save_id);
  ZRT_CHECK(snapshot.arrays.size() == snapshot.datasets.size() && !snapshot.arrays.empty(),
            "{}: {} state arrays for {} datasets", path, snapshot.arrays.size(),
            snapshot.datasets.size());
  // Opened after HDF5 created the file; closed before HDF5 closes it (its last metadata).
  TensorWriter tensor_writer(path, direct_io);
  t.create_s = lap();
  for (std::size_t i = 0; i < snapshot.arrays.size(); ++i) {
    write_dataset(file, snapshot.datasets[i], H5Elem::kFloat32, {snapshot.elements},
                  snapshot.arrays[i], kTensorBlockBytes, 0, &tensor_writer, &t.crc_s);
    if (kill_midway && i == 0) {
      H5Fflush(file.id(), H5F_SCOPE_GLOBAL);
      std::raise(SIGKILL);
    }
  }
  t.data_s = lap();
  file.close();
  t.close_s = lap();
  fsync_path(path);
  t.fsync_s = lap();
  if (timings != nullptr) *timings = t;
}

// ---- reading ----------------------------------------------------------------------------------

struct ShardedReader::OpenFile {
  H5File file;
  std::vector<std::unique_ptr<H5Dataset>> data;  // index.state_datasets() order
};

void check_rank_file(const H5File& file, const CheckpointIndex& index, int rank) {
  const hid_t root = file.id();
  if (!has_attr(root, "format", file.path()) ||
      read_attr_string(root, "format", file.path()) != kRankFormat) {
    ZRT_THROW(InvalidArgument,
              "{}: not a zrt checkpoint rank file (attribute 'format' is not '{}')", file.path(),
              kRankFormat);
  }
  const std::int64_t r = read_attr_int(root, "rank", file.path());
  const std::int64_t w = read_attr_int(root, "world", file.path());
  if (r != rank || w != index.world) {
    ZRT_THROW(InvalidArgument,
              "{}: holds rank {} of {}, the index expects rank {} of {} (files mixed up?)",
              file.path(), r, w, rank, index.world);
  }
  if (index.save_id != 0) {
    const std::int64_t id =
        has_attr(root, "save_id", file.path()) ? read_attr_int(root, "save_id", file.path()) : 0;
    if (id != index.save_id) {
      ZRT_THROW(InvalidArgument,
                "{}: written by another save than the index next to it (save id {}, the index's "
                "{}): a rank file copied in from another checkpoint, or a run sharing the "
                "directory; restore the checkpoint's own files, or resume from another tag",
                file.path(), id, index.save_id);
    }
  }
}

ShardedReader::ShardedReader(std::string dir, const CheckpointIndex& index, ParamSources sources)
    : dir_(std::move(dir)), index_(index), sources_(std::move(sources)) {}
ShardedReader::~ShardedReader() = default;

ShardedReader::OpenFile& ShardedReader::file(int old_rank) {
  auto it = files_.find(old_rank);
  if (it != files_.end()) return *it->second;
  auto f = std::make_unique<OpenFile>();
  f->file = H5File::open_read((std::filesystem::path(dir_) / rank_file_name(old_rank)).string());
  check_rank_file(f->file, index_, old_rank);
  const std::int64_t n = index_.rank_elements[static_cast<std::size_t>(old_rank)];
  for (const std::string& name : index_.state_datasets()) {
    f->data.push_back(
        std::make_unique<H5Dataset>(f->file, name, H5Elem::kFloat32, std::vector<std::int64_t>{n}));
  }
  return *files_.emplace(old_rank, std::move(f)).first->second;
}

void ShardedReader::fill(const PartitionPlan& plan, int rank, int u,
                         const std::vector<float*>& out) {
  const std::size_t arrays = index_.optimizer_states.size() + 1;
  ZRT_CHECK(out.size() == arrays,
            "{}: {} destination arrays for the checkpoint's {} datasets (master + {} state)", dir_,
            out.size(), arrays, index_.optimizer);
  // Pieces of the new slice and where they are in the old rank files.
  struct Piece {
    int old_rank;
    std::int64_t file_pos;  // element in the old rank's datasets
    std::int64_t count;
    std::int64_t dest;  // element in the new slice
  };
  std::vector<Piece> pieces;
  for (int p : plan.unit(u).params) {
    const auto range = plan.owned_range(p, rank);
    if (range.count == 0) continue;
    const std::vector<ParamSource> whole{
        ParamSource{0, index_.params[static_cast<std::size_t>(p)].numel, p, 0}};
    const std::vector<ParamSource>& sources =
        sources_.empty() ? whole : sources_[static_cast<std::size_t>(p)];
    for (const ParamSource& source : sources) {
      // The part of the owned range this source holds.
      const std::int64_t lo = std::max(range.first, source.first);
      const std::int64_t hi = std::min(range.first + range.count, source.first + source.count);
      if (lo >= hi) continue;
      const ParamEntry& e = index_.params[static_cast<std::size_t>(source.row)];
      const UnitEntry& old = index_.units[static_cast<std::size_t>(e.unit)];
      std::int64_t done = 0;
      while (done < hi - lo) {
        // Element of the old unit.
        const std::int64_t idx = e.offset + source.at + (lo - source.first) + done;
        const SliceEntry& slice = old.slices[static_cast<std::size_t>(idx / old.shard)];
        const std::int64_t within = idx % old.shard;
        const std::int64_t n = std::min(hi - lo - done, old.shard - within);
        pieces.push_back(Piece{static_cast<int>(slice.rank), slice.offset + within, n,
                               range.slice_offset + (lo - range.first) + done});
        done += n;
      }
    }
  }
  // The pieces by destination, for the check below (their destinations never overlap).
  std::vector<Piece> by_dest = pieces;
  std::sort(by_dest.begin(), by_dest.end(),
            [](const Piece& a, const Piece& b) { return a.dest < b.dest; });
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.old_rank != b.old_rank ? a.old_rank < b.old_rank : a.file_pos < b.file_pos;
  });
  // Neighbouring pieces of one file (padding between parameters) are read as one span.
  constexpr std::int64_t kGap = kTensorBlockBytes / 4;
  for (std::size_t i = 0; i < pieces.size();) {
    std::size_t j = i + 1;
    std::int64_t end = pieces[i].file_pos + pieces[i].count;
    while (j < pieces.size() && pieces[j].old_rank == pieces[i].old_rank &&
           pieces[j].file_pos <= end + kGap) {
      end = std::max(end, pieces[j].file_pos + pieces[j].count);
      ++j;
    }
    const std::int64_t first = pieces[i].file_pos;
    OpenFile& f = file(pieces[i].old_rank);
    // Same layout in the old and the new slice (the usual case: same world size, or a unit
    // whose old slice maps onto the new one in one piece): read straight into the destination
    // (the padding read between pieces is zeroed below). Not when what the span would write
    // between its pieces is another piece's destination (pieces of other files, or of other
    // units of this one, when a new unit gathers several old ones).
    bool direct = true;
    for (std::size_t k = i + 1; k < j; ++k) {
      direct = direct && pieces[k].dest - pieces[k].file_pos == pieces[i].dest - first;
    }
    if (direct) {
      const std::int64_t to = pieces[i].dest + (end - first);
      auto k =
          std::lower_bound(by_dest.begin(), by_dest.end(), pieces[i].dest,
                           [](const Piece& p, std::int64_t at) { return p.dest + p.count <= at; });
      for (; direct && k != by_dest.end() && k->dest < to; ++k) {
        direct = k->old_rank == pieces[i].old_rank && k->file_pos >= first &&
                 k->file_pos + k->count <= end && k->dest - k->file_pos == pieces[i].dest - first;
      }
    }
    if (direct) {
      for (std::size_t d = 0; d < arrays; ++d) {
        if (out[d] == nullptr) continue;  // not held (a frozen unit's optimizer state)
        float* to = out[d] + pieces[i].dest;
        bytes_read_ += f.data[d]->read(first, end - first, to, true, scratch_);
      }
      i = j;
      continue;
    }
    span_.resize(static_cast<std::size_t>(end - first));
    for (std::size_t d = 0; d < arrays; ++d) {
      if (out[d] == nullptr) continue;
      bytes_read_ += f.data[d]->read(first, end - first, span_.data(), true, scratch_);
      for (std::size_t k = i; k < j; ++k) {
        std::memcpy(out[d] + pieces[k].dest, span_.data() + (pieces[k].file_pos - first),
                    static_cast<std::size_t>(pieces[k].count) * 4);
      }
    }
    i = j;
  }
  // Padding (what no piece covers) is zero.
  std::int64_t covered = 0;
  auto zero = [&](std::int64_t from, std::int64_t to) {
    if (to <= from) return;
    for (float* o : out) {
      if (o != nullptr) std::memset(o + from, 0, static_cast<std::size_t>(to - from) * 4);
    }
  };
  for (const Piece& p : by_dest) {
    zero(covered, p.dest);
    covered = std::max(covered, p.dest + p.count);
  }
  zero(covered, plan.unit(u).shard);
}

std::int64_t verify_rank_file(const std::string& path, const CheckpointIndex& index, int rank) {
  H5File file = H5File::open_read(path);
  check_rank_file(file, index, rank);
  std::int64_t bytes = 0;
  for (const std::string& name : index.state_datasets()) {
    bytes += H5Dataset(file, name, H5Elem::kFloat32,
                       {index.rank_elements[static_cast<std::size_t>(rank)]})
                 .verify_all();
  }
  return bytes;
}

}  // namespace zrt::checkpoint
