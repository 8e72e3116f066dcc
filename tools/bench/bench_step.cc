// zrt-bench step: one training step of a small GPT at every ZeRO stage, at the world size
// mpirun gives (2 by default), with the simulated link at a few bandwidths: step time, bytes
// moved, peak model-state bytes, and the share of communication hidden behind compute.
//
// hidden = 1 - exposed / t_link, where exposed is what the link adds to a step: the median,
// over interleaved pairs of timed runs, of (step with the simulated link - step without it;
// the latter is compute + real MPI traffic, or with --link-only compute alone), and t_link the link
// time of the step's collectives as the model charges it (calls x latency + bus bytes / bandwidth).
// 100% means the link cost nothing; 0% that it added fully to the step. The two engines run side by
// side in one process and their runs alternate, so load on the machine shifts both alike.
//
// inter_MB: what a rank sends to ranks on other nodes per step (the node topology MPI gives, or
// --ranks-per-node to make one machine act as several nodes), as zrt-train's step line and
// metrics.jsonl count it (docs/multi-node.md tabulates the expected values).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpi.h>

#include "kernels/kernel_context.h"
#include "models/model_registry.h"
#include "offload/cpu_optimizer_offload.h"
#include "optimizers/device_adam.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/topology.h"
#include "runtime/common/log.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_recorder.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

struct StepFigures {
  double seconds = 0.0;  // median step time
  double exposed = 0.0;  // median over paired runs of (this step - the step without the link)
  CommCounts comm;       // one step
  std::int64_t model_state_peak = 0;
};

struct StepConfig {
  std::string model_spec;
  int batch = 4;
  int block = 3;
  int units = 4;              // reduce_bucket_size = parameters / units
  double prefetch = 0.25;     // stage3_prefetch_bucket_size = prefetch x parameters
  double reuse = 0.0;         // stage3_max_reuse_distance = reuse x parameters
  std::vector<int> node_map;  // the node of every rank
};

// One engine over its own device, streams and group (with or without the simulated link),
// ready to run steps: two of them (no link, a link) run side by side, their timed blocks
// interleaved, so that both see the same machine load.
class StepRig {
 public:
  StepRig(int stage, const StepConfig& config, const CommOptions& comm_options)
      : config_(config),
        device_(make_device(DeviceOptions{})),
        compute_(device_->create_stream("compute")),
        comm_(device_->create_stream("comm")),
        group_(make_process_group(*device_, MPI_COMM_WORLD, *comm_, "bench-step", comm_options)),
        ctx_(*device_, *compute_),
        model_def_(builtin_models().parse_spec(config.model_spec)),
        model_(model_def_->build(ctx_, ModelOptions{})),
        adam_(make_device_adam(*device_, AdamOptions{})) {
    EngineOptions options;
    options.stage = stage;
    options.compute_dtype = DType::kBFloat16;
    options.reduce_bucket_size = model_def_->num_parameters() / config.units;
    options.stage3_prefetch_bucket_size = static_cast<std::int64_t>(
        config.prefetch * static_cast<double>(model_def_->num_parameters()));
    options.stage3_max_reuse_distance =
        static_cast<std::int64_t>(config.reuse * static_cast<double>(model_def_->num_parameters()));
    options.stage3_param_persistence_threshold = 1000;
    take_model_capabilities(options, *model_);
    engine_ = std::make_unique<ZeroEngine>(*device_, *compute_, *group_, model_->parameters(),
                                           model_->num_modules(), options, *adam_,
                                           make_cpu_optimizer_offload);
    engine_->initialize(model_def_->initializer(*model_, 1, ""));
    const int T = model_def_->seq_len();
    const int B = config.batch;
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(2 * B * T));
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::int32_t>((i * 7919) % 256);
    batch_ = device_->allocate(static_cast<std::int64_t>(tokens.size()) * 4,
                               MemCategory::kActivations, "bench tokens");
    device_->copy_to_device(batch_.device<std::byte>(), tokens.data(), tokens.size() * 4,
                            *compute_);
    tokens_.inputs = batch_.device<std::int32_t>();
    tokens_.targets = batch_.device<std::int32_t>() + B * T;
    tokens_.batch = B;
    tokens_.seq_len = T;
    group_->set_node_map(config.node_map);
    run_steps(2);  // warm-up: allocations, scratch
    engine_->synchronize();
    before_ = group_->stats().snapshot();
  }

  // Steps run back to back, as in training: a step's trailing communication (the post-step
  // all-gather at stages 1-2) overlaps the next step's forward. So a block is timed in steady
  // state: one untimed step first, then `block` steps timed from the return of one step() to
  // the return of the last (step() returns once the step's gradient norm has reached the host,
  // the one synchronisation of a step), and the work still in flight is drained untimed.
  // Slowest rank, divided by `block`.
  double timed_block() {
    MPI_Barrier(MPI_COMM_WORLD);
    run_steps(1);
    const auto start = std::chrono::steady_clock::now();
    run_steps(config_.block);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    engine_->synchronize();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    steps_ += config_.block + 1;
    return s / config_.block;
  }

  // One more block (not timed) with the timeline trace on, written to `path` (one file per
  // rank): where a linked step's compute waits, which the medians cannot show.
  void trace_block(const std::string& path) {
    MPI_Barrier(MPI_COMM_WORLD);
    TraceRecorder trace(group_->rank());
    engine_->set_trace(&trace);
    for (int i = 0; i < config_.block; ++i) {
      const double start = trace.now_us();
      model_->forward_backward(*engine_, tokens_, static_cast<float>(engine_->loss_scale()));
      engine_->step(1e-4);
      trace.add_step(i, start, trace.now_us());
    }
    engine_->synchronize();
    engine_->set_trace(nullptr);
    trace.write(path);
  }

  StepFigures figures() const {
    StepFigures f;
    const CommCounts total = group_->stats().snapshot() - before_;
    for (std::size_t op = 0; op < kNumCollectiveOps; ++op) {
      f.comm.calls[op] = total.calls[op] / steps_;
      f.comm.bytes[op] = total.bytes[op] / steps_;
      f.comm.intra_bytes[op] = total.intra_bytes[op] / steps_;
      f.comm.inter_bytes[op] = total.inter_bytes[op] / steps_;
    }
    f.model_state_peak = device_->tracker().usage(MemorySpace::kDevice).model_state_peak;
    return f;
  }

 private:
  // n steps, not synchronised at the end.
  void run_steps(int n) {
    for (int i = 0; i < n; ++i) {
      model_->forward_backward(*engine_, tokens_, static_cast<float>(engine_->loss_scale()));
      engine_->step(1e-4);
    }
  }

  StepConfig config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
  std::unique_ptr<ProcessGroup> group_;
  kernels::KernelContext ctx_;
  std::unique_ptr<ModelDef> model_def_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<DeviceOptimizer> adam_;
  std::unique_ptr<ZeroEngine> engine_;
  Buffer batch_;
  TokenBatch tokens_;
  CommCounts before_;
  std::int64_t steps_ = 0;
};

double link_seconds(const CommCounts& c, int world, double bandwidth, double latency) {
  double s = 0.0;
  for (std::size_t op = 0; op < kNumCollectiveOps; ++op) {
    const auto kind = static_cast<CollectiveOp>(op);
    s += c.calls[op] * latency + c.bytes[op] * bus_factor(kind, world) / bandwidth;
  }
  return s;
}

std::vector<double> parse_list(const std::string& text, const char* what) {
  std::vector<double> values;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    try {
      std::size_t used = 0;
      values.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format(
          "zrt-bench step: {} '{}' is not a comma-separated list of numbers", what, text));
    }
    pos = comma + 1;
  }
  return values;
}

}  // namespace

int step(int argc, char** argv) {
  Args args(argc, argv,
            {"model", "batch", "steps", "block", "stages", "links", "latency-us", "units",
             "prefetch", "reuse", "ranks-per-node", "trace", "link-only", "help"});
  MpiRuntime mpi(&argc, &argv);
  init_logging(mpi.rank(), "warn");
  if (args.has("help")) {
    if (mpi.rank() == 0) {
      std::printf(
          "zrt-bench step [--model n_layer=4,n_head=4,n_embd=128,vocab_size=256,seq_len=128]\n"
          "    [--batch 4] [--steps 5] [--block 3] [--stages 0123] [--links 1,0.1,0.025]\n"
          "    [--latency-us 20] [--units 4] [--prefetch 0.25] [--reuse 0] [--ranks-per-node N]\n"
          "    [--trace PREFIX] [--link-only]\n"
          "  a step is timed in steady state: after one untimed step, --block steps from one\n"
          "  step()'s return to the last's, divided by --block; for each link (GB/s) an engine\n"
          "  with that simulated link and one without run side by side, --steps timed blocks\n"
          "  each, interleaved; reduce_bucket_size = parameters / --units;\n"
          "  stage3_prefetch_bucket_size = --prefetch x parameters (below one unit's size nothing\n"
          "  is prefetched); stage3_max_reuse_distance = --reuse x parameters (2: every unit kept\n"
          "  from the forward into the backward); inter_MB = bytes a rank sends to other nodes\n"
          "  per step (--ranks-per-node N: one machine as nodes of N ranks); --trace PREFIX:\n"
          "  after the timed runs, one more block of each engine with the timeline trace on, to\n"
          "  PREFIX-stage{S}-{none|<GB/s>}.rank{R}.json (docs/trace.md); --link-only: no bytes\n"
          "  move between ranks, every rank computes as if the others held its data, and the\n"
          "  modelled link is the only communication cost (the schedule's overlap, without\n"
          "  shared-memory MPI competing with compute for the cores; not a real run's numerics)\n"
          "run under mpirun: tools/zrt-run -n 2 build/bin/zrt-bench step\n");
    }
    return 0;
  }
  StepConfig config;
  config.model_spec = args.get("model", "n_layer=4,n_head=4,n_embd=128,vocab_size=256,seq_len=128");
  config.batch = static_cast<int>(args.get_double("batch", 4));
  config.block = static_cast<int>(args.get_double("block", 3));
  config.units = static_cast<int>(args.get_double("units", 4));
  config.prefetch = args.get_double("prefetch", 0.25);
  config.reuse = args.get_double("reuse", 0.0);
  const int steps = static_cast<int>(args.get_double("steps", 5));
  const std::string stages = args.get("stages", "0123");
  if (steps < 1 || config.block < 1 || config.units < 1)
    throw InvalidArgument("zrt-bench step: --steps, --block and --units must be >= 1");
  const int world = mpi.size();
  const NodeTopology topology =
      NodeTopology::detect(MPI_COMM_WORLD, static_cast<int>(args.get_double("ranks-per-node", 0)));
  config.node_map = topology.node_map();
  const double latency = args.get_double("latency-us", 20) * 1e-6;
  const bool link_only = args.has("link-only");
  // Slow links make communication comparable to the model's compute.
  const std::vector<double> links_gbs = parse_list(args.get("links", "1,0.1,0.025"), "--links");
  if (mpi.rank() == 0) {
    std::printf(
        "# zrt-bench step: %s, micro-batch %d, %d ranks, bf16, reduce buckets of 1/%d of the "
        "parameters, prefetch %g of them, reuse distance %g of them; median of %d runs of %d "
        "steps\n",
        config.model_spec.c_str(), config.batch, world, config.units, config.prefetch, config.reuse,
        steps, config.block);
    std::printf(
        "# link: simulated (latency %.0f us + bus bytes / bandwidth); none = %s; nodes: %s\n",
        latency * 1e6,
        link_only ? "no link (--link-only: no bytes move between ranks)" : "real MPI only",
        topology.describe().c_str());
    std::printf(
        "# exposed = median over interleaved pairs of (step with the link - step without);\n"
        "# hidden = 1 - exposed / link_ms; link/none = link_ms / the step without the link\n");
  }
  Table table({"stage", "link", "step_ms", "comm_MB", "inter_MB", "link_ms", "link/none",
               "exposed_ms", "hidden", "model_state_MiB"});
  for (int stage = 0; stage <= 3; ++stage) {
    if (stages.find(static_cast<char>('0' + stage)) == std::string::npos) continue;
    CommOptions none_options;
    none_options.simulated_link_only = link_only;
    StepRig none(stage, config, none_options);
    std::vector<double> none_times;
    bool first_row = true;
    for (double gbs : links_gbs) {
      const double bw = gbs * 1e9;
      CommOptions options;
      options.simulated_bandwidth_bytes_per_s = bw;
      options.simulated_latency_s = latency;
      options.simulated_link_only = link_only;
      StepRig linked(stage, config, options);
      std::vector<double> link_times, differences;
      for (int i = 0; i < steps; ++i) {
        // Alternate which goes first, so that a trend in the load cancels out.
        double t_none = 0.0, t_link = 0.0;
        if (i % 2 == 0) {
          t_none = none.timed_block();
          t_link = linked.timed_block();
        } else {
          t_link = linked.timed_block();
          t_none = none.timed_block();
        }
        none_times.push_back(t_none);
        link_times.push_back(t_link);
        differences.push_back(t_link - t_none);
      }
      if (first_row) {
        const StepFigures f = none.figures();
        table.add({std::to_string(stage), "none", fmt::format("{:.1f}", median(none_times) * 1e3),
                   fmt::format("{:.2f}", f.comm.total_bytes() / 1e6),
                   fmt::format("{:.2f}", f.comm.total_inter_bytes() / 1e6), "0.0", "-", "-", "-",
                   fmt::format("{:.2f}", f.model_state_peak / 1048576.0)});
        first_row = false;
      }
      const StepFigures f = linked.figures();
      const double link = link_seconds(f.comm, world, bw, latency);
      const double exposed = median(differences);
      const double hidden = std::clamp(1.0 - exposed / link, 0.0, 1.0);
      table.add({std::to_string(stage), fmt::format("{:g} GB/s", gbs),
                 fmt::format("{:.1f}", median(link_times) * 1e3),
                 fmt::format("{:.2f}", f.comm.total_bytes() / 1e6),
                 fmt::format("{:.2f}", f.comm.total_inter_bytes() / 1e6),
                 fmt::format("{:.1f}", link * 1e3),
                 fmt::format("{:.2f}", link / median(none_times)),
                 fmt::format("{:.1f}", exposed * 1e3), fmt::format("{:.0f}%", 100.0 * hidden),
                 fmt::format("{:.2f}", f.model_state_peak / 1048576.0)});
      const std::string trace_prefix = args.get("trace", "");
      if (!trace_prefix.empty()) {
        const std::string rank = std::to_string(mpi.rank());
        if (gbs == links_gbs.front())
          none.trace_block(fmt::format("{}-stage{}-none.rank{}.json", trace_prefix, stage, rank));
        linked.trace_block(
            fmt::format("{}-stage{}-{:g}.rank{}.json", trace_prefix, stage, gbs, rank));
      }
    }
  }
  if (mpi.rank() == 0) std::printf("%s", table.str().c_str());
  return 0;
}

}  // namespace zrt::bench
