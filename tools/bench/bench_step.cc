// zrt-bench step: one training step of a small GPT at every ZeRO stage, at the world size
// mpirun gives (2 by default), with the simulated link at a few bandwidths: step time, bytes
// moved, peak model-state bytes, and the share of communication hidden behind compute.
//
// hidden = (t_nolink + t_link - t_step) / t_link, where t_nolink is the step without the
// simulated link (compute + real MPI traffic), and t_link the link time of the step's
// collectives as the model charges it (calls x latency + bus bytes / bandwidth). 100% means the
// link cost nothing; 0% that it added fully to the step.
#include <algorithm>
#include <chrono>
#include <cstdio>
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
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

struct StepFigures {
  double seconds = 0.0;
  CommCounts comm;  // one step
  std::int64_t model_state_peak = 0;
};

StepFigures run_stage(int stage, const std::string& model_spec, int B, int steps, int block,
                      const CommOptions& comm_options) {
  auto device = make_device(DeviceOptions{});
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *comm, "bench-step", comm_options);
  kernels::KernelContext ctx(*device, *compute);
  const std::unique_ptr<ModelDef> model_def = builtin_models().parse_spec(model_spec);
  const std::unique_ptr<Model> model_owner = model_def->build(ctx, ModelOptions{});
  Model& model = *model_owner;
  AdamOptions adam_options;
  auto adam = make_device_adam(*device, adam_options);
  EngineOptions options;
  options.stage = stage;
  options.compute_dtype = DType::kBFloat16;
  options.reduce_bucket_size = model_def->num_parameters() / 4;
  options.stage3_prefetch_bucket_size = model_def->num_parameters() / 4;
  options.stage3_param_persistence_threshold = 1000;
  ZeroEngine engine(*device, *compute, *group, model.parameters(), model.num_modules(), options,
                    *adam, make_cpu_optimizer_offload);
  engine.initialize(model_def->initializer(model, 1, ""));
  const int T = model_def->seq_len();
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(2 * B * T));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7919) % 256);
  Buffer batch = device->allocate(static_cast<std::int64_t>(tokens.size()) * 4,
                                  MemCategory::kActivations, "bench tokens");
  device->copy_to_device(batch.device<std::byte>(), tokens.data(), tokens.size() * 4, *compute);
  TokenBatch tb;
  tb.inputs = batch.device<std::int32_t>();
  tb.targets = batch.device<std::int32_t>() + B * T;
  tb.batch = B;
  tb.seq_len = T;
  // Steps run back to back, as in training: a step's trailing communication (the post-step
  // all-gather at stages 1-2) may overlap the next step's forward, so a step is timed as a run
  // of `block` steps ended by a full synchronisation, divided by `block`.
  auto run_steps = [&](int n) {
    for (int i = 0; i < n; ++i) {
      model.forward_backward(engine, tb, static_cast<float>(engine.loss_scale()));
      engine.step(1e-4);
    }
    engine.synchronize();
  };
  run_steps(2);  // warm-up: allocations, scratch
  std::vector<double> times;
  const CommCounts before = group->stats().snapshot();
  for (int i = 0; i < steps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    run_steps(block);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(s / block);
  }
  StepFigures f;
  f.seconds = median(times);
  const CommCounts total = group->stats().snapshot() - before;
  for (std::size_t op = 0; op < kNumCollectiveOps; ++op) {
    f.comm.calls[op] = total.calls[op] / (steps * block);
    f.comm.bytes[op] = total.bytes[op] / (steps * block);
  }
  f.model_state_peak = device->tracker().usage(MemorySpace::kDevice).model_state_peak;
  return f;
}

double link_seconds(const CommCounts& c, int world, double bandwidth, double latency) {
  double s = 0.0;
  for (std::size_t op = 0; op < kNumCollectiveOps; ++op) {
    const auto kind = static_cast<CollectiveOp>(op);
    s += c.calls[op] * latency + c.bytes[op] * bus_factor(kind, world) / bandwidth;
  }
  return s;
}

}  // namespace

int step(int argc, char** argv) {
  Args args(argc, argv, {"model", "batch", "steps", "block", "stages", "help"});
  MpiRuntime mpi(&argc, &argv);
  init_logging(mpi.rank(), "warn");
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench step [--model n_layer=4,n_head=4,n_embd=128,vocab_size=256,"
          "seq_len=128] [--batch 4] [--steps 5] [--block 3] [--stages 0123]\n"
          "  a step is timed as --block steps back to back ended by a synchronisation, divided\n"
          "  by --block; the median over --steps such runs is printed\n"
          "run under mpirun: tools/zrt-run -n 2 build/bin/zrt-bench step\n");
    }
    return 0;
  }
  const std::string model =
      args.get("model", "n_layer=4,n_head=4,n_embd=128,vocab_size=256,seq_len=128");
  const int B = static_cast<int>(args.get_double("batch", 4));
  const int steps = static_cast<int>(args.get_double("steps", 5));
  const int block = static_cast<int>(args.get_double("block", 3));
  const std::string stages = args.get("stages", "0123");
  if (steps < 1 || block < 1)
    throw InvalidArgument("zrt-bench step: --steps and --block must be >= 1");
  const int world = mpi.size();
  const double latency = 20e-6;
  // 0: no simulated link. Slow links make communication comparable to this small model's compute.
  const std::vector<double> bandwidths = {0.0, 1e9, 100e6, 25e6};
  if (mpi.rank() == 0) {
    std::printf(
        "# zrt-bench step: %s, micro-batch %d, %d ranks, bf16; median of %d runs of %d steps\n",
        model.c_str(), B, world, steps, block);
    std::printf(
        "# link: simulated (latency %.0f us + bus bytes / bandwidth); none = real MPI only\n",
        latency * 1e6);
  }
  Table table({"stage", "link", "step_ms", "comm_MB", "link_ms", "hidden", "model_state_MiB"});
  for (int stage = 0; stage <= 3; ++stage) {
    if (stages.find(static_cast<char>('0' + stage)) == std::string::npos) continue;
    double baseline = 0.0;
    for (double bw : bandwidths) {
      CommOptions options;
      options.simulated_bandwidth_bytes_per_s = bw;
      options.simulated_latency_s = bw > 0.0 ? latency : 0.0;
      const StepFigures f = run_stage(stage, model, B, steps, block, options);
      if (bw == 0.0) baseline = f.seconds;
      const double link = bw > 0.0 ? link_seconds(f.comm, world, bw, latency) : 0.0;
      std::string hidden = "-";
      if (bw > 0.0 && link > 0.0) {
        const double h = std::clamp((baseline + link - f.seconds) / link, 0.0, 1.0);
        hidden = fmt::format("{:.0f}%", 100.0 * h);
      }
      table.add({std::to_string(stage), bw > 0.0 ? fmt::format("{:g} GB/s", bw / 1e9) : "none",
                 fmt::format("{:.1f}", f.seconds * 1e3),
                 fmt::format("{:.2f}", f.comm.total_bytes() / 1e6),
                 fmt::format("{:.1f}", link * 1e3), hidden,
                 fmt::format("{:.2f}", f.model_state_peak / 1048576.0)});
    }
  }
  if (mpi.rank() == 0) std::printf("%s", table.str().c_str());
  return 0;
}

}  // namespace zrt::bench
