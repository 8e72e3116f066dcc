// zrt-bench checkpoint: per-rank save and load bandwidth of a sharded checkpoint (the whole
// commit protocol, fsync included) next to a plain sequential write (and read) of the same
// bytes with fsync, measured in the same run; and the training stall of an async save (the
// snapshot copied into the checkpointer's reused host buffer + hand-off to the writer thread)
// against the sync save time. The first async save also allocates that buffer (page faults):
// its stall is shown on its own row, the median is over the repeats after it. Each rank's state is
// 12 bytes x params / N (fp32 master + two Adam moments), laid out as GPT-2-like parameters.
// Reads drop the page cache of the files first (posix_fadvise DONTNEED on clean pages), so
// loads are measured from the device, not from memory. Median over repeats; the slowest rank.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include <mpi.h>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/error.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double slowest(double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The reference: write() the bytes sequentially in 8 MiB pieces, then fsync.
double plain_write(const std::string& path, const std::vector<char>& data) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZRT_CHECK(fd >= 0, "{}: {}", path, std::strerror(errno));
  const std::size_t piece = 8 << 20;
  for (std::size_t at = 0; at < data.size(); at += piece) {
    const std::size_t n = std::min(piece, data.size() - at);
    ZRT_CHECK(::write(fd, data.data() + at, n) == static_cast<ssize_t>(n), "{}: short write", path);
  }
  ::fsync(fd);
  ::close(fd);
  return since(start);
}

double plain_read(const std::string& path, std::vector<char>& data) {
  drop_cache(path);
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  ZRT_CHECK(fd >= 0, "{}: {}", path, std::strerror(errno));
  const std::size_t piece = 8 << 20;
  for (std::size_t at = 0; at < data.size(); at += piece) {
    const std::size_t n = std::min(piece, data.size() - at);
    ZRT_CHECK(::read(fd, data.data() + at, n) == static_cast<ssize_t>(n), "{}: short read", path);
  }
  ::close(fd);
  return since(start);
}

}  // namespace

int checkpoint(int argc, char** argv) {
  Args args(argc, argv, {"params", "dir", "repeats", "stage", "help"});
  MpiRuntime mpi(&argc, &argv);
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench checkpoint [--params 124M] [--dir /tmp/zrt_bench_ckpt] [--repeats 3] "
          "[--stage 2]\nrun under mpirun (tools/zrt-run -n 2 build/bin/zrt-bench checkpoint)\n");
    }
    return 0;
  }
  const std::int64_t total = args.get_bytes("params", 124000000);
  const int repeats = static_cast<int>(args.get_double("repeats", 3));
  ZRT_CHECK(repeats >= 2, "--repeats {}: at least 2 (the first async save allocates)", repeats);
  const int stage = static_cast<int>(args.get_double("stage", 2));
  const std::string dir = args.get("dir", "/tmp/zrt_bench_ckpt");
  const int rank = mpi.rank();
  const int world = mpi.size();

  // GPT-2-like tensors: 12 blocks of (4C^2 + 8C^2 + biases) around C = 768, scaled to `total`.
  std::vector<ParamSpec> params;
  const std::int64_t per = std::max<std::int64_t>(total / 48, 64);
  for (int b = 0; b < 12; ++b) {
    for (int t = 0; t < 4; ++t) {
      params.push_back(ParamSpec{fmt::format("h.{}.w{}", b, t), {per - 1 - t}, {b}, false});
    }
  }
  PartitionOptions po;
  po.stage = stage;
  po.world = stage == 0 ? 1 : world;
  po.bucket_elements = 25000000;
  po.alignment = 64;
  po.num_modules = 12;
  const PartitionPlan plan(params, po);
  checkpoint::CheckpointIndex index;
  index.stage = stage;
  index.config_json = "{}";
  checkpoint::fill_tables(index, params, plan);
  const bool writes = rank < plan.world();
  checkpoint::RankSnapshot state;  // stands for the engine's host-resident state
  state.rank = rank;
  if (writes) {
    const auto n = static_cast<std::size_t>(plan.total_shard());
    state.master.assign(n, 0.5f);
    state.exp_avg.assign(n, 0.25f);
    state.exp_avg_sq.assign(n, 0.125f);
    for (std::size_t i = 0; i < n; i += 97) state.master[i] = static_cast<float>(i);
  }
  const std::int64_t bytes = writes ? state.bytes() : 0;
  std::vector<char> plain(static_cast<std::size_t>(bytes), 1);
  const std::string plain_path = fmt::format("{}/plain_rank{}.bin", dir, rank);
  if (rank == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  CheckpointConfig sync_config;
  sync_config.save_dir = dir + "/ckpt";
  sync_config.save_interval = 1;
  sync_config.keep_last = 1;
  CheckpointConfig async_config = sync_config;
  async_config.async = true;
  checkpoint::Checkpointer sync_saver(sync_config, 600.0);
  checkpoint::Checkpointer async_saver(async_config, 600.0);

  std::vector<double> t_plain_w, t_save, t_plain_r, t_load, t_stall, t_first_stall, t_async_total;
  std::int64_t step = 0;
  for (int r = 0; r < repeats; ++r) {
    // Plain write + fsync of the same bytes.
    MPI_Barrier(MPI_COMM_WORLD);
    t_plain_w.push_back(slowest(writes ? plain_write(plain_path, plain) : 0.0));
    if (writes)
      t_plain_r.push_back(slowest(plain_read(plain_path, plain)));
    else
      t_plain_r.push_back(slowest(0.0));

    // Synchronous save: the whole protocol (probe, files, fsyncs, agreement, rename, latest).
    checkpoint::SaveRequest request;
    request.tag = checkpoint::Checkpointer::tag_for_step(++step);
    request.index = index;
    if (writes) request.snapshot = state;  // copied before timing
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = Clock::now();
    sync_saver.save(std::move(request));
    t_save.push_back(slowest(since(start)));

    // Load: every rank reads its slices back (verified), from the device.
    const std::string ckpt =
        sync_config.save_dir + "/" + checkpoint::Checkpointer::tag_for_step(step);
    if (writes) drop_cache(ckpt + "/" + checkpoint::rank_file_name(rank));
    MPI_Barrier(MPI_COMM_WORLD);
    start = Clock::now();
    {
      const auto loaded = checkpoint::read_index(ckpt + "/index.h5", &params);
      checkpoint::ShardedReader reader(ckpt, loaded);
      if (writes) {
        std::vector<float> a, b, c;
        for (std::size_t u = 0; u < plan.units().size(); ++u) {
          const auto n = static_cast<std::size_t>(plan.unit(static_cast<int>(u)).shard);
          a.assign(n, 0.f);
          b.assign(n, 0.f);
          c.assign(n, 0.f);
          reader.fill(plan, rank, static_cast<int>(u), a.data(), b.data(), c.data());
        }
      }
    }
    t_load.push_back(slowest(since(start)));

    // Async save: the training loop stalls for the snapshot copy (a memcpy per array into the
    // reused buffer, as the CPU backend's copy_state_out does) and the hand-off only.
    checkpoint::SaveRequest async_request;
    async_request.tag = checkpoint::Checkpointer::tag_for_step(++step);
    async_request.index = index;
    MPI_Barrier(MPI_COMM_WORLD);
    start = Clock::now();
    async_saver.save(std::move(async_request), [&](float* m, float* a, float* v) {
      const std::size_t n = state.master.size() * 4;
      std::memcpy(m, state.master.data(), n);
      std::memcpy(a, state.exp_avg.data(), n);
      std::memcpy(v, state.exp_avg_sq.data(), n);
    });
    (r == 0 ? t_first_stall : t_stall).push_back(slowest(since(start)));
    async_saver.wait();
    t_async_total.push_back(slowest(since(start)));
  }
  if (writes) fs::remove(plain_path);
  if (rank == 0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    const double pw = median(t_plain_w), sv = median(t_save), pr = median(t_plain_r),
                 ld = median(t_load), st = median(t_stall), at = median(t_async_total),
                 st0 = t_first_stall.front();
    std::printf("checkpoint: %d rank(s), stage %d, %s params, %s per rank, %d repeats, dir %s\n",
                world, stage, human_bytes(total).c_str(), human_bytes(bytes).c_str(), repeats,
                dir.c_str());
    Table t({"operation", "seconds", "GB/s per rank", "vs plain"});
    t.add(
        {"plain write + fsync", fmt::format("{:.3f}", pw), fmt::format("{:.2f}", gb / pw), "1.00"});
    t.add({"save (sync, whole protocol)", fmt::format("{:.3f}", sv), fmt::format("{:.2f}", gb / sv),
           fmt::format("{:.2f}", pw / sv)});
    t.add({"plain read (cold)", fmt::format("{:.3f}", pr), fmt::format("{:.2f}", gb / pr), "1.00"});
    t.add({"load (verified, cold)", fmt::format("{:.3f}", ld), fmt::format("{:.2f}", gb / ld),
           fmt::format("{:.2f}", pr / ld)});
    t.add({"async save: total", fmt::format("{:.3f}", at), fmt::format("{:.2f}", gb / at),
           fmt::format("{:.2f}", pw / at)});
    t.add({"async save: training stall", fmt::format("{:.3f}", st), "",
           fmt::format("{:.1f}% of save", 100.0 * st / sv)});
    t.add({"async stall, first save (allocates)", fmt::format("{:.3f}", st0), "",
           fmt::format("{:.1f}% of save", 100.0 * st0 / sv)});
    std::printf("%s", t.str().c_str());
  }
  return 0;
}

}  // namespace zrt::bench
