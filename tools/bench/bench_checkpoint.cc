// zrt-bench checkpoint: per-rank save and load bandwidth of a sharded checkpoint (the whole
// commit protocol, fsync included) next to a plain sequential write (and read) of the same
// bytes with fsync, measured in the same run; and the training stall of an async save as the
// training loop experiences it: the save call plus what the next training step takes beyond a
// step without a save (the step waits for a state copy still in flight, and shares the cores
// with the copy and the writer). The state is a real ZeroEngine's on the CPU backend (fp32
// master + two Adam moments, 12 bytes x params / N per rank, GPT-2-like tensors in 12 modules);
// its "training step" is the engine's own work with no model compute (the micro-batch's
// acquire/release, gradient reduce-scatter, norm, AdamW, parameter all-gather), which is the
// shortest window a copy can hide in: a model's forward/backward only lengthens it. Two async
// forms side by side: the copy issued on the engine's stream (ZeroEngine::copy_state_out_async,
// what zrt-train does) and the copy made on the training thread (the snapshot filler). The first
// async save also allocates the snapshot buffer: its own row. Reads drop the page cache of the
// files first (posix_fadvise DONTNEED on clean pages), so loads are measured from the device.
// Median over repeats; the slowest rank.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include <mpi.h>

#include "offload/cpu_optimizer_offload.h"
#include "optimizers/device_adam.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/error.h"
#include "runtime/engine/zero_engine.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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
  Args args(
      argc, argv,
      {"params", "dir", "repeats", "stage", "dcp", "python", "direct-io", "in-place", "help"});
  MpiRuntime mpi(&argc, &argv);
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench checkpoint [--params 124M] [--dir /tmp/zrt_bench_ckpt] [--repeats 3] "
          "[--stage 2] [--direct-io 1] [--in-place 1] [--dcp 1 [--python PATH]]\nrun under mpirun "
          "(tools/zrt-run "
          "-n 2 "
          "build/bin/zrt-bench checkpoint)\n--dcp 1: also torch.distributed.checkpoint's save "
          "and `dd conv=fsync` of the same bytes per rank, at the same world size, each right "
          "after one of zrt's sync saves, paired (tools/bench/torch_dcp_checkpoint_bench.py; needs "
          "python with torch)\n"
          "--direct-io 0: zrt's tensor data through the page cache (checkpoint.direct_io false)\n"
          "--in-place 0: the sync save copies the engine's state into a snapshot buffer first (as "
          "for a GPU's state) instead of writing it where it lives\n");
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
  // The engine whose state is saved (CPU backend).
  auto device = make_device(DeviceOptions{});
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *comm, "bench-checkpoint");
  auto adam = make_device_adam(*device, AdamOptions{});
  EngineOptions eo;
  eo.stage = stage;
  eo.reduce_bucket_size = 25000000;
  eo.alignment = 64;
  ZeroEngine engine(*device, *compute, *group, params, 12, eo, *adam, make_cpu_optimizer_offload);
  engine.initialize([](int p, std::int64_t first, std::int64_t count, float* out) {
    for (std::int64_t i = 0; i < count; ++i)
      out[i] = 0.01f * static_cast<float>((p + first + i) % 97);
  });
  // One training step of the engine with no model compute (zero gradients): what a step costs
  // besides the model, and where the optimizer waits for a pending state copy.
  Clock::time_point step_called;  // when the last train_step()'s gradients were reduced
  auto train_step = [&] {
    for (int m = 0; m < 12; ++m) {
      engine.acquire(m, Phase::kForward);
      engine.release(m, Phase::kForward);
    }
    for (int m = 11; m >= 0; --m) {
      engine.acquire(m, Phase::kBackward);
      engine.release(m, Phase::kBackward);
    }
    // step() starts by waiting for the gradient reductions; waiting here first costs nothing
    // and timestamps the point after which its update can be issued.
    comm->synchronize();
    compute->synchronize();
    step_called = Clock::now();
    engine.step(1e-4);
    compute->synchronize();  // the trainer reads the loss here
  };
  train_step();  // first-use allocations
  const PartitionPlan& plan = engine.plan();
  checkpoint::CheckpointIndex index;
  index.config_json = "{}";
  checkpoint::describe_engine(engine, index);
  const bool writes = rank < plan.world();
  checkpoint::RankSnapshot state;  // the engine's state, copied once for the sync saves
  state.rank = rank;
  state.datasets = index.state_datasets();
  if (writes) {
    state.assign(plan.total_shard());
    checkpoint::snapshot_engine(engine, state.pointers());
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
  sync_config.direct_io = args.get("direct-io", "1") != "0";
  CheckpointConfig async_config = sync_config;
  async_config.async = true;
  checkpoint::Checkpointer sync_saver(sync_config, 600.0);
  checkpoint::Checkpointer async_saver(async_config, 600.0);

  std::vector<double> t_plain_w, t_save, t_plain_r, t_load, t_step, t_async_total, t_first_stall;
  // The sync save by phase (SaveTimings), each the slowest rank's.
  // --in-place 1 (zrt-train's way on the CPU backend and with offload): the sync save writes the
  // engine's memory itself; 0: it is first copied into the snapshot buffer (a GPU's way).
  const bool in_place = args.get("in-place", "1") != "0";
  const char* phase_names[] = {in_place ? "  engine state located (written in place)"
                                        : "  engine state -> snapshot buffer (copy)",
                               "  directory + shared-fs probe",
                               "  rank file: create + reserve blocks",
                               "  rank file: data written (CRC-32C included)",
                               "    of which CRC-32C (overlaps the writes)",
                               "  rank file: HDF5 metadata + close",
                               "  rank file: fsync",
                               "  index (rank 0)",
                               "  agreement: every rank's files",
                               "  rename + latest (rank 0)",
                               "  previous keep_last pruning (rank 0)"};
  std::vector<double> t_phase[std::size(phase_names)];
  std::int64_t step = 0;
  // An async save, then the next training step. The stall the training loop sees is the save
  // call plus the step's wait for the state copy. That wait is a stream wait inside step(),
  // before the update; it is at most how long the copy was still running once the step's
  // gradients were reduced (the update cannot start earlier), which is what is measured. The step's
  // excess over a step without a save (`baseline`) is reported apart: there the copy and the writer
  // thread share the cores with the step.
  struct AsyncFigures {
    std::vector<double> call, wait, stall, slowdown;
  };
  AsyncFigures on_stream_figures, on_thread_figures;
  auto async_save_and_step = [&](bool on_stream, double baseline, AsyncFigures* figures) {
    checkpoint::SaveRequest request;
    request.tag = checkpoint::Checkpointer::tag_for_step(++step);
    request.index = index;
    checkpoint::describe_engine(engine, request.index);
    Clock::time_point copy_done{};  // written by the writer thread, read after wait()
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = Clock::now();
    auto fill = [&](const std::vector<float*>& arrays) {
      checkpoint::snapshot_engine(engine, arrays);
    };
    if (on_stream) {
      async_saver.save(std::move(request), fill, [&](const std::vector<float*>& arrays) {
        std::function<void()> copied = checkpoint::snapshot_engine_async(engine, arrays);
        return [copied, &copy_done] {
          copied();
          copy_done = Clock::now();
        };
      });
    } else {
      async_saver.save(std::move(request), fill);
    }
    const double call = since(start);
    const auto step_start = Clock::now();
    train_step();
    const double stepped = since(step_start);
    const auto wait_start = Clock::now();
    async_saver.wait();
    const double total = call + stepped + since(wait_start);
    double wait = 0.0;  // the copy on the training thread is done when save() returns
    if (on_stream && writes) {
      wait = std::max(0.0, std::chrono::duration<double>(copy_done - step_called).count());
    }
    const double stall = slowest_rank(call + wait);
    if (figures == nullptr) {
      t_first_stall.push_back(stall);
      return;
    }
    figures->call.push_back(slowest_rank(call));
    figures->wait.push_back(slowest_rank(wait));
    figures->stall.push_back(stall);
    figures->slowdown.push_back(slowest_rank(stepped - baseline));
    if (on_stream) t_async_total.push_back(slowest_rank(total));
  };
  // DCP and dd beside zrt's figures, one save of each right after each of zrt's sync saves (this
  // VM's disk drifts by 2x within a minute, so only neighbours compare): rank 0 runs the script
  // (its own processes, the same world size and bytes per rank; its first save is a warm-up)
  // while the other ranks wait without spinning.
  const bool with_dcp = args.get("dcp", "0") != "0";
  std::vector<double> t_dcp, t_dd, dcp_over_save;
  std::string dcp_note;
  const std::string python = with_dcp && rank == 0 ? find_python(args.get("python", "")) : "";
  auto measure_dcp = [&]() {
    if (rank == 0 && dcp_note.rfind("DCP failed", 0) != 0) {
      const std::string script = find_script("torch_dcp_checkpoint_bench.py", ZRT_TORCH_DCP_SCRIPT);
      if (python.empty()) {
        dcp_note = "no python with torch: DCP not measured";
      } else {
        const std::string out = run_capture(
            fmt::format("'{}' '{}' --world {} --elements {} --repeats 1 --dir '{}/dcp' 2>&1",
                        python, script, world, bytes / 12, dir));
        const auto value = [&](const std::string& line_key) {
          const auto at = out.find(line_key + " median_s=");
          return at == std::string::npos ? 0.0 : std::stod(out.substr(at + line_key.size() + 10));
        };
        const double dcp = value("dcp_save");
        if (dcp > 0) {
          t_dcp.push_back(dcp);
          t_dd.push_back(value("dd_fsync"));
          const auto v = out.find("torch=");
          dcp_note = "torch " + out.substr(v + 6, out.find('\n', v) - v - 6);
        } else {
          dcp_note = "DCP failed: " + out;
        }
      }
    }
    MPI_Request done;
    MPI_Ibarrier(MPI_COMM_WORLD, &done);
    for (int finished = 0; !finished;) {
      MPI_Test(&done, &finished, MPI_STATUS_IGNORE);
      if (!finished) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  for (int r = 0; r < repeats; ++r) {
    // Plain write + fsync of the same bytes.
    MPI_Barrier(MPI_COMM_WORLD);
    t_plain_w.push_back(slowest_rank(writes ? plain_write(plain_path, plain) : 0.0));
    if (writes)
      t_plain_r.push_back(slowest_rank(plain_read(plain_path, plain)));
    else
      t_plain_r.push_back(slowest_rank(0.0));

    // Synchronous save: the whole protocol (probe, files, fsyncs, agreement, rename, latest).
    checkpoint::SaveRequest request;
    request.tag = checkpoint::Checkpointer::tag_for_step(++step);
    request.index = index;
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = Clock::now();
    // As zrt-train saves synchronously: the engine's state written where it lives (in place),
    // or copied into the checkpointer's snapshot buffer (reused from save to save) first.
    sync_saver.save(
        std::move(request),
        [&](const std::vector<float*>& arrays) { checkpoint::snapshot_engine(engine, arrays); }, {},
        [&] {
          return in_place ? checkpoint::engine_state_view(engine)
                          : std::vector<std::vector<checkpoint::HostBytes>>{};
        });
    const double save_s = since(start);
    t_save.push_back(slowest_rank(save_s));
    const checkpoint::SaveTimings& st = sync_saver.last_timings();
    const double phases[] = {
        save_s - st.commit_s,
        st.prepare_s,
        st.file.create_s,
        st.file.data_s,
        st.file.crc_s,
        st.file.close_s,
        st.file.fsync_s,
        st.write_s - (st.file.create_s + st.file.data_s + st.file.close_s + st.file.fsync_s),
        st.agree_s,
        st.rename_s,
        st.prune_s};
    static_assert(std::size(phases) == std::size(phase_names), "a name for every phase");
    for (std::size_t i = 0; i < std::size(phases); ++i)
      t_phase[i].push_back(slowest_rank(phases[i]));
    if (with_dcp) {
      const std::size_t before = t_dcp.size();
      measure_dcp();
      if (t_dcp.size() > before) dcp_over_save.push_back(t_dcp.back() / t_save.back());
    }

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
        checkpoint::RankSnapshot unit_state;
        unit_state.datasets = loaded.state_datasets();
        for (std::size_t u = 0; u < plan.units().size(); ++u) {
          unit_state.assign(plan.unit(static_cast<int>(u)).shard);
          reader.fill(plan, rank, static_cast<int>(u), unit_state.pointers());
        }
      }
    }
    t_load.push_back(slowest_rank(since(start)));

    // A training step with no save in flight: the baseline of this repeat.
    MPI_Barrier(MPI_COMM_WORLD);
    start = Clock::now();
    train_step();
    const double baseline = since(start);
    t_step.push_back(slowest_rank(baseline));

    // Async saves measured the same way: the copy on the engine's stream (zrt-train's way; the
    // first one allocates the snapshot buffer, its own row) and on the training thread.
    async_save_and_step(true, baseline, r == 0 ? nullptr : &on_stream_figures);
    async_save_and_step(false, baseline, &on_thread_figures);
  }
  if (writes) fs::remove(plain_path);
  const double dcp_s = t_dcp.empty() ? 0.0 : median(t_dcp);
  const double dd_s = t_dd.empty() ? 0.0 : median(t_dd);
  if (rank == 0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    const double pw = median(t_plain_w), sv = median(t_save), pr = median(t_plain_r),
                 ld = median(t_load), at = median(t_async_total), ts = median(t_step),
                 st0 = t_first_stall.front();
    std::printf("checkpoint: %d rank(s), stage %d, %s params, %s per rank, %d repeats, dir %s\n",
                world, stage, human_bytes(total).c_str(), human_bytes(bytes).c_str(), repeats,
                dir.c_str());
    Table t({"operation", "seconds", "GB/s per rank", "vs plain"});
    t.add(
        {"plain write + fsync", fmt::format("{:.3f}", pw), fmt::format("{:.2f}", gb / pw), "1.00"});
    t.add({"save (sync, whole protocol)", fmt::format("{:.3f}", sv), fmt::format("{:.2f}", gb / sv),
           fmt::format("{:.2f}", pw / sv)});
    for (std::size_t i = 0; i < std::size(phase_names); ++i) {
      const double v = median(t_phase[i]);
      t.add({phase_names[i], fmt::format("{:.3f}", v), "",
             fmt::format("{:.0f}% of save", 100.0 * v / sv)});
    }
    if (dcp_s > 0.0) {
      t.add({"dd conv=fsync, every rank at once", fmt::format("{:.3f}", dd_s),
             fmt::format("{:.2f}", gb / dd_s),
             fmt::format("{:.2f} (zrt save: {:.2f})", pw / dd_s, dd_s / sv)});
      t.add({"DCP save (" + dcp_note + ")", fmt::format("{:.3f}", dcp_s),
             fmt::format("{:.2f}", gb / dcp_s),
             fmt::format("{:.2f} (zrt save: {:.2f}x DCP)", pw / dcp_s, dcp_s / sv)});
      // The ratio of each DCP save to zrt's save just before it, then the median: robust to
      // the disk's drift across the run.
      t.add(
          {"  zrt save speed / DCP's, paired per repeat", "", "",
           fmt::format("{:.2f}x DCP (median of {})", median(dcp_over_save), dcp_over_save.size())});
    } else if (!dcp_note.empty()) {
      t.add({"DCP: " + dcp_note.substr(0, 120), "", "", ""});
    }
    t.add({"plain read (cold)", fmt::format("{:.3f}", pr), fmt::format("{:.2f}", gb / pr), "1.00"});
    t.add({"load (verified, cold)", fmt::format("{:.3f}", ld), fmt::format("{:.2f}", gb / ld),
           fmt::format("{:.2f}", pr / ld)});
    t.add({"async save: call to commit (during a step)", fmt::format("{:.3f}", at), "", ""});
    t.add({"training step, no save (engine only)", fmt::format("{:.3f}", ts), "", ""});
    const auto pct = [&](double v) { return fmt::format("{:.1f}% of save", 100.0 * v / sv); };
    const auto rows = [&](const char* how, const AsyncFigures& f) {
      const double st = median(f.stall), sc = median(f.call), sw = median(f.wait),
                   sd = median(f.slowdown);
      t.add({fmt::format("async stall, copy {}", how), fmt::format("{:.3f}", st), "", pct(st)});
      t.add({"  save call", fmt::format("{:.3f}", sc), "", pct(sc)});
      t.add({"  next step's wait for the copy (<=)", fmt::format("{:.3f}", sw), "", pct(sw)});
      t.add({"  next step slower (shared cores)", fmt::format("{:.3f}", sd), "",
             fmt::format("{:.1f}% of step", 100.0 * sd / ts)});
    };
    rows("on the engine's stream", on_stream_figures);
    rows("on the training thread", on_thread_figures);
    t.add({"async stall, first save (allocates)", fmt::format("{:.3f}", st0), "", pct(st0)});
    std::printf("%s", t.str().c_str());
    if (!t_dcp.empty()) {
      std::string pairs;
      for (std::size_t i = 0; i < t_dcp.size(); ++i) {
        pairs += fmt::format(" {:.3f}/{:.3f}", t_save[i], t_dcp[i]);
      }
      std::printf("per repeat, zrt save / DCP save (s):%s\n", pairs.c_str());
    }
  }
  return 0;
}

}  // namespace zrt::bench
