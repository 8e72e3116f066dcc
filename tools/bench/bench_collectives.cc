// zrt-bench collectives: our fp32 all-gather and reduce-scatter next to MPI_Allgather and
// MPI_Reduce_scatter_block, same sizes, same run, and our deterministic all-reduce (its busbw
// factor is 2(n-1)/n, as nccl-tests counts it). Sizes are the whole array (nccl-tests'
// "size"); algbw = size / time, busbw = algbw x (n-1)/n. Time is the slowest rank's, median
// over repeats.
//
// Our operations are stream-ordered: by default (--sync batch, nccl-tests' method) a timed run
// enqueues its `iters` operations back to back and synchronises once, as the engine issues its
// collectives and waits for them later; --sync op synchronises after every operation, which
// adds the hand-off to the communication stream's worker and back (two thread wake-ups) to
// each. MPI's blocking calls need neither.
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <mpi.h>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

// Runs fn `iters` times between barriers, then `finish` (may be empty) inside the timed
// region; returns seconds per call of the slowest rank, median over `repeats`.
double time_op(MPI_Comm comm, int iters, int repeats, const std::function<void()>& fn,
               const std::function<void()>& finish = {}) {
  fn();  // warm-up (also allocates scratch)
  if (finish) finish();
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(comm);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    if (finish) finish();
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
    samples.push_back(seconds);
  }
  return median(samples);
}

std::string fmt_us(double s) {
  return fmt::format("{:.1f}", s * 1e6);
}
std::string fmt_gbs(double bytes_per_s) {
  return fmt::format("{:.2f}", bytes_per_s / 1e9);
}

}  // namespace

int collectives(int argc, char** argv) {
  Args args(argc, argv, {"min-bytes", "max-bytes", "repeats", "sync", "all-gather", "help"});
  MpiRuntime mpi(&argc, &argv);
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench collectives [--min-bytes 4K] [--max-bytes 256M] [--repeats 5]\n"
          "    [--sync batch|op] [--all-gather auto|mpi|p2p]\n"
          "  --sync batch: each timed run enqueues its operations and synchronises once\n"
          "  (nccl-tests); op: synchronise after every operation (adds the stream hand-off)\n"
          "  --all-gather: CommOptions::all_gather_algo (auto: point to point up to 8 MiB a rank)\n"
          "run under mpirun (tools/zrt-run -n 2 build/bin/zrt-bench collectives)\n");
    }
    return 0;
  }
  const std::int64_t min_bytes = args.get_bytes("min-bytes", 4 << 10);
  const std::int64_t max_bytes = args.get_bytes("max-bytes", 256 << 20);
  const int repeats = static_cast<int>(args.get_double("repeats", 5));
  const int world = mpi.size();
  const std::string sync = args.get("sync", "batch");
  const std::string ag_algo = args.get("all-gather", "auto");
  if (sync != "batch" && sync != "op")
    throw InvalidArgument(fmt::format("zrt-bench collectives: --sync {} (batch or op)", sync));
  CommOptions options;
  if (ag_algo == "mpi") {
    options.all_gather_algo = AllGatherAlgo::kMpi;
  } else if (ag_algo == "p2p") {
    options.all_gather_algo = AllGatherAlgo::kPointToPoint;
  } else if (ag_algo != "auto") {
    throw InvalidArgument(
        fmt::format("zrt-bench collectives: --all-gather {} (auto, mpi or p2p)", ag_algo));
  }

  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("comm");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *stream, "bench", options);
  // --sync op: every operation waits for itself; batch: the run waits once at its end.
  const bool sync_each = sync == "op";
  const auto each = [&] {
    if (sync_each) stream->synchronize();
  };
  const std::function<void()> at_end = [&] {
    if (!sync_each) stream->synchronize();
  };
  MPI_Comm ref_comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &ref_comm);

  if (mpi.rank() == 0) {
    std::printf(
        "# zrt-bench collectives: %d ranks, fp32, time = slowest rank, median of %d; "
        "--sync %s, --all-gather %s\n",
        world, repeats, sync.c_str(), ag_algo.c_str());
    std::printf("# size = whole array; busbw = algbw * (n-1)/n (nccl-tests)\n");
  }
  Table table({"size", "count", "ag_us", "ag_busbw", "mpi_ag_us", "mpi_ag_busbw", "ag/mpi", "rs_us",
               "rs_busbw", "mpi_rs_us", "mpi_rs_busbw", "rs_speedup", "ar_us", "ar_busbw"});
  const double factor = bus_factor(CollectiveOp::kAllGather, world);
  const double all_reduce_factor = bus_factor(CollectiveOp::kAllReduce, world);
  for (std::int64_t size = min_bytes; size <= max_bytes; size *= 4) {
    const std::int64_t count = size / 4 / world;  // elements per rank
    if (count == 0) continue;
    const std::int64_t whole = count * world * 4;
    Buffer in = device->allocate(count * world * 4, MemCategory::kComm, "bench input");
    Buffer out = device->allocate(count * world * 4, MemCategory::kComm, "bench output");
    std::vector<float> host_in(static_cast<std::size_t>(count * world), 1.0f);
    device->copy_to_device(in.device<std::byte>(), host_in.data(), host_in.size() * 4, *stream);
    stream->synchronize();
    std::vector<float> ref_in(static_cast<std::size_t>(count * world), 1.0f);
    std::vector<float> ref_out(static_cast<std::size_t>(count * world));
    const int iters = static_cast<int>(std::max<std::int64_t>(1, (64 << 20) / whole));

    const double ag = time_op(
        ref_comm, iters, repeats,
        [&] {
          group->all_gather(in.device<std::byte>(), out.device<std::byte>(), count,
                            DType::kFloat32);
          each();
        },
        at_end);
    const double mpi_ag = time_op(ref_comm, iters, repeats, [&] {
      MPI_Allgather(ref_in.data(), static_cast<int>(count), MPI_FLOAT, ref_out.data(),
                    static_cast<int>(count), MPI_FLOAT, ref_comm);
    });
    const double rs = time_op(
        ref_comm, iters, repeats,
        [&] {
          group->reduce_scatter(in.device<std::byte>(), out.device<std::byte>(), count,
                                DType::kFloat32, ReduceOp::kSum);
          each();
        },
        at_end);
    const double mpi_rs = time_op(ref_comm, iters, repeats, [&] {
      MPI_Reduce_scatter_block(ref_in.data(), ref_out.data(), static_cast<int>(count), MPI_FLOAT,
                               MPI_SUM, ref_comm);
    });
    const double ar = time_op(
        ref_comm, iters, repeats,
        [&] {
          group->all_reduce(in.device<std::byte>(), out.device<std::byte>(), count * world,
                            DType::kFloat32, ReduceOp::kSum);
          each();
        },
        at_end);
    const auto busbw = [&](double seconds) { return whole / seconds * factor; };
    table.add({human_bytes(whole), std::to_string(count * world), fmt_us(ag), fmt_gbs(busbw(ag)),
               fmt_us(mpi_ag), fmt_gbs(busbw(mpi_ag)), fmt::format("{:.2f}", mpi_ag / ag),
               fmt_us(rs), fmt_gbs(busbw(rs)), fmt_us(mpi_rs), fmt_gbs(busbw(mpi_rs)),
               fmt::format("{:.2f}", mpi_rs / rs), fmt_us(ar),
               fmt_gbs(whole / ar * all_reduce_factor)});
  }
  if (mpi.rank() == 0) {
    std::printf("%s", table.str().c_str());
    std::printf(
        "# busbw in GB/s (1e9); ag/mpi = MPI time / ours (>= 0.95 is the goal);\n"
        "# rs_speedup = MPI_Reduce_scatter_block time / ours (>= 2 is the goal)\n");
  }
  MPI_Comm_free(&ref_comm);
  return 0;
}

}  // namespace zrt::bench
