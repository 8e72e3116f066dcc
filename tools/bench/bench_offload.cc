// zrt-bench offload: how much of the CPU optimizer the offload pipeline hides, on a GPT of a few
// tens of millions of parameters, bf16, at ZeRO stages 2 and 3 with optimizer offload (pinned
// host memory), at the world size mpirun gives.
//
// Per configuration, medians over rounds (each round measures every figure once, so load from
// other processes hits them alike), each the slowest rank's:
//   step     one training step as zrt-train runs it (forward+backward, step(), the compute
//            stream drained for the loss; the CPU optimizer runs on into the next forward): the
//            start-to-start time of steps 2 and 3 of three run back to back;
//   fwd+bwd  the same forward+backward alone: every stream drained before it, timed until its
//            gradients are on the host;
//   update   the optimizer alone: step() issued with every stream drained, timed until every
//            stream is drained again (host gradient norm, CPU Adam, copies up, all-gathers);
//   adam     the CPU Adam's own share of it: the sum of its "adam unit U" events in a timeline
//            trace of that step().
// hidden = (fwd+bwd + update - step) / min(fwd+bwd, update): 100% means the step cost no more
// than the longer of the two, 0% that they ran one after the other. hidden_adam is the same
// with adam for update: what it would be if the rest of the update (norm, copies) were free.
// adam||compute: in a timeline trace of three pipelined steps, the share of the CPU Adam's time
// (steps 1-2) during which the compute stream was busy too: the overlap itself, which load from
// other processes cannot fake (it can only slow both sides).
//
// Copies: host<->device GB/s of Device::copy_to_device / copy_to_host between a device buffer
// and a pinned host buffer (on the CPU backend both are host memory: a memcpy on the copy
// stream), next to a plain memcpy of the same size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <mpi.h>

#include "kernels/kernel_context.h"
#include "models/model_registry.h"
#include "offload/cpu_optimizer_offload.h"
#include "optimizers/device_adam.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/log.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_recorder.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct OffloadFigures {
  std::int64_t params = 0;
  int units = 0;
  double step = 0.0;
  double forward_backward = 0.0;
  double adam = 0.0;
  double update = 0.0;
  double adam_overlapped = 0.0;  // share of the CPU Adam's time with the compute stream busy
};

OffloadFigures run_config(int stage, bool offload_params, double ratio,
                          const std::string& model_spec, int B, int repeats,
                          const std::string& trace_path) {
  auto device = make_device(DeviceOptions{});
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *comm, "bench-offload");
  kernels::KernelContext ctx(*device, *compute);
  const std::unique_ptr<ModelDef> model_def = builtin_models().parse_spec(model_spec);
  const std::unique_ptr<Model> model_owner = model_def->build(ctx, ModelOptions{});
  Model& model = *model_owner;
  AdamOptions adam_options;
  auto adam = make_device_adam(*device, adam_options);
  EngineOptions options;
  options.stage = stage;
  options.compute_dtype = DType::kBFloat16;
  options.gradient_clipping = 1.0;
  options.reduce_bucket_size = model_def->num_parameters() / 8;
  options.stage3_prefetch_bucket_size = model_def->num_parameters() / 4;
  options.stage3_param_persistence_threshold = 1000;
  options.offload_optimizer.enabled = true;
  options.offload_optimizer.ratio = ratio;
  options.offload_param.enabled = offload_params;
  take_model_capabilities(options, model);
  ZeroEngine engine(*device, *compute, *group, model.parameters(), model.num_modules(), options,
                    *adam, make_cpu_optimizer_offload);
  engine.initialize(model_def->initializer(model, 1, ""));
  const int T = model_def->seq_len();
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(2 * B * T));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] =
        static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(model_def->vocab_size()));
  Buffer batch = device->allocate(static_cast<std::int64_t>(tokens.size()) * 4,
                                  MemCategory::kActivations, "bench tokens");
  device->copy_to_device(batch.device<std::byte>(), tokens.data(), tokens.size() * 4, *compute);
  TokenBatch tb;
  tb.inputs = batch.device<std::int32_t>();
  tb.targets = batch.device<std::int32_t>() + B * T;
  tb.batch = B;
  tb.seq_len = T;
  auto forward_backward = [&] {
    model.forward_backward(engine, tb, static_cast<float>(engine.loss_scale()));
  };

  // Warm-up: allocations, scratch, first touch of the host state.
  for (int i = 0; i < 2; ++i) {
    forward_backward();
    engine.step(1e-4);
    compute->synchronize();
  }
  // Three pipelined steps with the timeline trace on (not timed): how much of the CPU Adam ran
  // while the compute stream was busy (steps 1-2: step 3's update has no next forward), a
  // structural view of the overlap that load from other processes does not blur.
  double adam_overlapped = 0.0;
  {
    engine.synchronize();
    TraceRecorder trace(group->rank());
    engine.set_trace(&trace);
    double last_start = 0.0;
    for (int i = 1; i <= 3; ++i) {
      const double start = trace.now_us();
      if (i == 3) last_start = start;
      forward_backward();
      engine.step(1e-4);
      compute->synchronize();
      if (i == 3) engine.synchronize();
      trace.add_step(i, start, trace.now_us());
    }
    engine.set_trace(nullptr);
    const std::vector<TraceEvent> events = trace.events();
    double adam = 0.0, overlapped = 0.0;
    for (const TraceEvent& a : events) {
      if (a.track != TraceTrack::kCpuOptimizer || a.start_us >= last_start) continue;
      adam += a.duration_us;
      for (const TraceEvent& c : events) {
        if (c.track != TraceTrack::kCompute) continue;
        const double from = std::max(a.start_us, c.start_us);
        const double to = std::min(a.start_us + a.duration_us, c.start_us + c.duration_us);
        if (to > from) overlapped += to - from;
      }
    }
    adam_overlapped = adam > 0.0 ? overlapped / adam : 0.0;
    if (!trace_path.empty()) {
      trace.write(trace_path_for_rank(trace_path, group->rank(), group->size()));
    }
  }
  // Rounds: each measures every figure once, so load from other processes hits them alike.
  std::vector<double> steps, fbs, adams, updates;
  for (int round = 0; round < repeats; ++round) {
    // Pipelined, as zrt-train (the host waits for the compute stream, the loss, every step):
    // three steps from a drained start; the step time is the start-to-start time of the last
    // two, when the previous step's CPU work overlaps the next step as it would in training.
    engine.synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    Clock::time_point starts[3];
    for (auto& start : starts) {
      start = Clock::now();
      forward_backward();
      engine.step(1e-4);
      compute->synchronize();
    }
    steps.push_back(
        slowest_rank(std::chrono::duration<double>(starts[2] - starts[0]).count() / 2.0));
    // Alone: every stream drained before each phase. Forward+backward until its gradients are
    // on the host; then the whole offloaded update (norm, CPU Adam, copies, all-gathers), with
    // the CPU Adam's own time read from a timeline trace.
    engine.synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = Clock::now();
    forward_backward();
    engine.synchronize();
    fbs.push_back(slowest_rank(seconds_since(start)));
    MPI_Barrier(MPI_COMM_WORLD);
    TraceRecorder trace(group->rank());
    engine.set_trace(&trace);
    start = Clock::now();
    engine.step(1e-4);
    engine.synchronize();
    updates.push_back(slowest_rank(seconds_since(start)));
    engine.set_trace(nullptr);
    double adam_us = 0.0;
    for (const TraceEvent& e : trace.events()) {
      if (e.track == TraceTrack::kCpuOptimizer) adam_us += e.duration_us;
    }
    adams.push_back(slowest_rank(adam_us * 1e-6));
  }
  OffloadFigures f;
  f.params = model_def->num_parameters();
  f.units = static_cast<int>(engine.plan().units().size());
  f.step = median(steps);
  f.forward_backward = median(fbs);
  f.adam = median(adams);
  f.update = median(updates);
  f.adam_overlapped = slowest_rank(-adam_overlapped) * -1.0;  // the least overlapped rank
  return f;
}

struct CopyFigures {
  double h2d = 0.0, d2h = 0.0, memcpy = 0.0;  // GB/s
};

CopyFigures run_copies(std::int64_t bytes, int repeats) {
  auto device = make_device(DeviceOptions{});
  auto copy = device->create_stream("copy");
  Buffer on_device = device->allocate(bytes, MemCategory::kWorkspace, "copy bench (device)");
  Buffer pinned = device->allocate(bytes, MemCategory::kWorkspace, "copy bench (pinned host)",
                                   MemorySpace::kPinnedHost);
  std::vector<std::byte> a(static_cast<std::size_t>(bytes), std::byte{1});
  std::vector<std::byte> b(static_cast<std::size_t>(bytes), std::byte{2});
  std::memset(pinned.host<void>(), 3, static_cast<std::size_t>(bytes));
  device->fill_zero(on_device.device<std::byte>(), static_cast<std::size_t>(bytes), *copy);
  copy->synchronize();
  std::vector<double> h2d, d2h, plain;
  const auto n = static_cast<std::size_t>(bytes);
  for (int i = 0; i < repeats + 1; ++i) {  // the first round is a warm-up
    auto start = Clock::now();
    device->copy_to_device(on_device.device<std::byte>(), pinned.host<void>(), n, *copy);
    copy->synchronize();
    const double up = seconds_since(start);
    start = Clock::now();
    device->copy_to_host(pinned.host<void>(), on_device.device<std::byte>(), n, *copy);
    copy->synchronize();
    const double down = seconds_since(start);
    start = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    const double reference = seconds_since(start);
    if (i == 0) continue;
    h2d.push_back(static_cast<double>(bytes) / up / 1e9);
    d2h.push_back(static_cast<double>(bytes) / down / 1e9);
    plain.push_back(static_cast<double>(bytes) / reference / 1e9);
  }
  if (b[0] != std::byte{1}) std::printf("# memcpy reference check failed\n");
  return CopyFigures{median(h2d), median(d2h), median(plain)};
}

}  // namespace

int offload(int argc, char** argv) {
  Args args(argc, argv, {"model", "batch", "repeats", "configs", "copy-bytes", "trace", "help"});
  MpiRuntime mpi(&argc, &argv);
  init_logging(mpi.rank(), "warn");
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench offload [--model n_layer=8,n_head=8,n_embd=512,vocab_size=256,seq_len=32]\n"
          "                  [--batch 1] [--repeats 7] [--configs 2,3,3p] [--copy-bytes 64M]\n"
          "                  [--trace DIR/trace.json]\n"
          "configs: ZeRO stage with optimizer offload; 3p adds parameter offload; 3rR is stage 3\n"
          "with partial offload, offload_optimizer.ratio R (e.g. 3r0.5).\n"
          "--trace: also write a timeline of three pipelined steps per config (the config's name\n"
          "before the extension, then the rank with several ranks).\n"
          "run under mpirun for several ranks: tools/zrt-run -n 2 build/bin/zrt-bench offload\n");
    }
    return 0;
  }
  const std::string model =
      args.get("model", "n_layer=8,n_head=8,n_embd=512,vocab_size=256,seq_len=32");
  const int B = static_cast<int>(args.get_double("batch", 1));
  const int repeats = static_cast<int>(args.get_double("repeats", 7));
  const std::vector<std::string> configs = split_list(args.get("configs", "2,3,3p"));
  const std::int64_t copy_bytes = args.get_bytes("copy-bytes", std::int64_t{64} << 20);
  const int world = mpi.size();
  if (mpi.rank() == 0) {
    std::printf(
        "# zrt-bench offload: %s, micro-batch %d, %d rank(s), bf16, optimizer offload to "
        "pinned host memory; median of %d\n",
        model.c_str(), B, world, repeats);
    std::printf(
        "# hidden = (fwd+bwd + update - step) / min(fwd+bwd, update), fwd+bwd and update measured "
        "alone;\n# hidden_adam: the same with the CPU Adam's time (from a trace) for update\n");
  }
  Table table({"config", "ranks", "params", "units", "step_ms", "fwd+bwd_ms", "adam_ms",
               "update_ms", "hidden", "hidden_adam", "adam||compute"});
  for (const std::string& c : configs) {
    const bool params = c == "3p";
    const bool partial = c.rfind("3r", 0) == 0;
    double ratio = 1.0;
    int stage = 0;
    try {
      ratio = partial ? std::stod(c.substr(2)) : 1.0;
      stage = params || partial ? 3 : std::stoi(c);
    } catch (const std::exception&) {
      stage = 0;
    }
    if (stage < 1 || stage > 3 || !(ratio >= 0.0 && ratio <= 1.0))
      ZRT_THROW(InvalidArgument, "--configs: '{}' is not 1, 2, 3, 3p or 3rR (R in [0, 1])", c);
    std::string trace_path = args.get("trace", "");
    if (!trace_path.empty()) {
      const std::filesystem::path p(trace_path);
      trace_path = ((p.parent_path() / p.stem()).string() + ".stage" + c) + p.extension().string();
    }
    const OffloadFigures f = run_config(stage, params, ratio, model, B, repeats, trace_path);
    auto hidden = [&](double other) {
      return (f.forward_backward + other - f.step) /
             std::max(std::min(f.forward_backward, other), 1e-12);
    };
    const std::string name = params    ? "stage 3 + params"
                             : partial ? fmt::format("stage 3, ratio {:g}", ratio)
                                       : "stage " + c;
    table.add({name, std::to_string(world), fmt::format("{:.1f}M", f.params / 1e6),
               std::to_string(f.units), fmt::format("{:.1f}", f.step * 1e3),
               fmt::format("{:.1f}", f.forward_backward * 1e3), fmt::format("{:.1f}", f.adam * 1e3),
               fmt::format("{:.1f}", f.update * 1e3),
               fmt::format("{:.0f}%", 100.0 * hidden(f.update)),
               // No CPU Adam at all (ratio 0): nothing to hide.
               f.adam > 0.0 ? fmt::format("{:.0f}%", 100.0 * hidden(f.adam)) : std::string("-"),
               fmt::format("{:.0f}%", 100.0 * f.adam_overlapped)});
  }
  if (mpi.rank() == 0) std::printf("%s", table.str().c_str());
  if (mpi.rank() == 0) {
    const CopyFigures c = run_copies(copy_bytes, repeats);
    Table copies({"copy", "bytes", "h2d_GB/s", "d2h_GB/s", "memcpy_GB/s"});
    copies.add({"pinned host <-> device", human_bytes(copy_bytes), fmt::format("{:.2f}", c.h2d),
                fmt::format("{:.2f}", c.d2h), fmt::format("{:.2f}", c.memcpy)});
    std::printf("%s", copies.str().c_str());
  }
  return 0;
}

}  // namespace zrt::bench
