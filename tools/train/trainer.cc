#include "tools/train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel_context.h"
#include "models/model_registry.h"
#include "offload/cpu_optimizer_offload.h"
#include "optimizers/lr_schedule.h"
#include "optimizers/optimizer.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/load_plan.h"
#include "runtime/comm/parallel_layout.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/cpu_affinity.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/common/error.h"
#include "runtime/common/fault.h"
#include "runtime/common/watchdog.h"
#include "runtime/data/data_stream.h"
#include "runtime/data/open_dataset.h"
#include "runtime/data/sample_source.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/engine_parallel_dims.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_recorder.h"
#include "runtime/trace/trace_summary.h"
#include "tools/train/device_peaks.h"
#include "tools/train/metrics_log.h"
#include "tools/train/monitors/event_file_writer.h"
#include "tools/train/monitors/monitors.h"
#include "tools/train/run_clock.h"

namespace zrt::train {

namespace {

using Clock = std::chrono::steady_clock;

// Two host/device buffer pairs for a micro-batch's rows (inputs, targets, and with packed
// documents their positions and document starts), so the next micro-batch's tokens are prepared
// while the previous copy may still be in flight.
class BatchFeeder {
 public:
  BatchFeeder(Device& device, Stream& stream, int B, int T, bool documents)
      : device_(device), stream_(stream), arrays_(documents ? 4 : 2) {
    const std::int64_t bytes = std::int64_t{B} * T * 4 * arrays_;
    for (int i = 0; i < 2; ++i) {
      host_[i] = device.allocate(bytes, MemCategory::kWorkspace, "token staging",
                                 MemorySpace::kPinnedHost);
      device_buf_[i] = device.allocate(bytes, MemCategory::kActivations, "token batch");
      copied_[i] = device.create_event();
    }
    B_ = B;
    T_ = T;
  }
  // The stream may still read the buffers (an exception unwinding mid-step destroys the feeder
  // before the engine drains its streams): wait for it before they are freed.
  ~BatchFeeder() {
    try {
      stream_.synchronize();
    } catch (const std::exception&) {
      // A stream error was reported where it happened; the buffers are free to go now.
    }
  }
  BatchFeeder(const BatchFeeder&) = delete;
  BatchFeeder& operator=(const BatchFeeder&) = delete;

  // Copies `rows` into the next slot and returns the device batch, with `loss_divisor`
  // (TokenBatch: 0 for the mean over every token).
  TokenBatch next(const HostBatch& rows, float loss_divisor) {
    const std::int64_t n = std::int64_t{B_} * T_;
    ZRT_CHECK(rows.batch == B_ && rows.seq_len == T_, "a {}x{} batch for a {}x{} feeder",
              rows.batch, rows.seq_len, B_, T_);
    ZRT_CHECK(!rows.documents || arrays_ == 4, "a batch with documents for a feeder without");
    const int slot = slot_++ % 2;
    copied_[slot]->synchronize();  // the host buffer's previous copy is done
    std::int32_t* staged = host_[slot].host<std::int32_t>();
    std::copy(rows.inputs.begin(), rows.inputs.end(), staged);
    std::copy(rows.targets.begin(), rows.targets.end(), staged + n);
    if (rows.documents) {
      std::copy(rows.positions.begin(), rows.positions.end(), staged + 2 * n);
      std::copy(rows.doc_start.begin(), rows.doc_start.end(), staged + 3 * n);
    }
    const int arrays = rows.documents ? 4 : 2;
    device_.copy_to_device(device_buf_[slot].device<std::byte>(), staged,
                           static_cast<std::size_t>(n * 4 * arrays), stream_);
    copied_[slot]->record(stream_);
    const DevicePtr<std::int32_t> base = device_buf_[slot].device<std::int32_t>();
    TokenBatch batch;
    batch.inputs = base;
    batch.targets = base + n;
    if (rows.documents) {
      batch.positions = base + 2 * n;
      batch.doc_start = base + 3 * n;
    }
    batch.batch = B_;
    batch.seq_len = T_;
    batch.loss_divisor = loss_divisor;
    return batch;
  }

 private:
  Device& device_;
  Stream& stream_;
  int arrays_ = 2;  // int32 arrays of B*T per slot
  Buffer host_[2];
  Buffer device_buf_[2];
  std::unique_ptr<Event> copied_[2];
  int slot_ = 0;
  int B_ = 0;
  int T_ = 0;
};

// Small collective helpers over the control group (its own communicator and stream).
class Control {
 public:
  Control(Device& device, ProcessGroup& group) : device_(device), group_(group) {
    scratch_ = device.allocate(64 * 8, MemCategory::kWorkspace, "control scratch");
  }
  double mean(double value) { return mean(std::vector<float>{static_cast<float>(value)})[0]; }
  // Element-wise float32 averages of `values` over the ranks, in one all-reduce.
  std::vector<float> mean(std::vector<float> values) {
    ZRT_CHECK(values.size() <= 64, "too many values");
    const std::size_t bytes = values.size() * 4;
    device_.copy_to_device(scratch_.device<std::byte>(), values.data(), bytes, group_.stream());
    group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(),
                      static_cast<std::int64_t>(values.size()), DType::kFloat32, ReduceOp::kAvg);
    device_.copy_to_host(values.data(), scratch_.device<std::byte>(), bytes, group_.stream());
    group_.stream().synchronize();
    return values;
  }
  std::vector<std::int64_t> max(std::vector<std::int64_t> values) {
    ZRT_CHECK(values.size() <= 64, "too many values");
    const std::size_t bytes = values.size() * 8;
    device_.copy_to_device(scratch_.device<std::byte>(), values.data(), bytes, group_.stream());
    group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(),
                      static_cast<std::int64_t>(values.size()), DType::kInt64, ReduceOp::kMax);
    device_.copy_to_host(values.data(), scratch_.device<std::byte>(), bytes, group_.stream());
    group_.stream().synchronize();
    return values;
  }
  std::int64_t sum(std::int64_t value) {
    device_.copy_to_device(scratch_.device<std::byte>(), &value, 8, group_.stream());
    group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(), 1, DType::kInt64,
                      ReduceOp::kSum);
    device_.copy_to_host(&value, scratch_.device<std::byte>(), 8, group_.stream());
    group_.stream().synchronize();
    return value;
  }

 private:
  Device& device_;
  ProcessGroup& group_;
  Buffer scratch_;
};

// n floats from the device, once the stream has reached the copy (a host wait).
std::vector<float> read_floats(Device& device, Stream& stream, DevicePtr<const float> p,
                               std::size_t n) {
  std::vector<float> v(n);
  device.copy_to_host(v.data(), p.as<const std::byte>(), 4 * n, stream);
  stream.synchronize();
  return v;
}

float read_float(Device& device, Stream& stream, DevicePtr<const float> p) {
  return read_floats(device, stream, p, 1)[0];
}

// Losses the host has not read yet: one float per step on the device (the step's micro-batch
// losses summed there), read in one copy when the loop needs them. The two slots past the
// losses carry the step boundary's votes on the same all-reduce (Control::mean takes 64).
constexpr int kMaxUnreadLosses = 62;

// What the loop knew of a step when it ended, for the monitors' rows once its loss is read.
struct UnreadStep {
  std::int64_t step = 0;
  double wall_time = 0.0;
  double lr = 0.0;
  StepResult result;  // undecided until the engine's settle_step() (ZeroEngine::enqueue_step)
  std::int64_t loss_tokens = 0;  // the global batch's
};

// The loss divisor of each micro-batch of a step or an evaluation (TokenBatch::loss_divisor):
// the global batch's loss tokens shared out over the micro-batches and ranks the engine averages
// over, so that the step's loss and gradient are the sum over every loss token divided by their
// count, however the global batch is split. 0 (the mean over every token, bit for bit as
// before) for data where every target counts.
float loss_divisor(bool masked, std::int64_t global_loss_tokens, int micro_batches, int world) {
  if (!masked) return 0.f;
  return static_cast<float>(static_cast<double>(global_loss_tokens) /
                            (static_cast<double>(micro_batches) * world));
}

EngineOptions engine_options(const Config& config) {
  EngineOptions o = config.engine;
  o.offload_optimizer.enabled = config.offload_optimizer.enabled();
  o.offload_optimizer.pin_memory = config.offload_optimizer.pin_memory;
  o.offload_optimizer.ratio = config.offload_optimizer.ratio;
  o.offload_param.enabled = config.offload_param.enabled();
  o.offload_param.pin_memory = config.offload_param.pin_memory;
  return o;
}

std::string progress_bar(std::int64_t done, std::int64_t total, int width = 30) {
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  return "[" + std::string(static_cast<std::size_t>(filled), '=') +
         std::string(static_cast<std::size_t>(width - filled), ' ') + "]";
}

// Called where the loop builds the model; throws InvalidArgument naming what is missing.
void check_factory(const ModelFactory& factory) {
  if (!factory.build) ZRT_THROW(InvalidArgument, "ModelFactory: build is not set");
  if (factory.seq_len <= 0 || factory.vocab_size <= 0) {
    ZRT_THROW(InvalidArgument, "ModelFactory for {}: seq_len {} and vocab_size {} must be positive",
              factory.description, factory.seq_len, factory.vocab_size);
  }
}

// The loop of both run_training()s. `make_factory` is called where the model is built (after
// the device and the process groups), so a bad model block fails there as it always has.
RunSummary train(const Config& config, const RankInfo& mpi,
                 const std::function<ModelFactory()>& make_factory, const TrainHooks& hooks) {
  const int rank = mpi.rank;
  const int world = mpi.world;
  RunSummary summary;

  // ---- what checkpoint.load means here: decided before anything is built, so a run that
  // would overwrite another run's checkpoints stops at once (on every rank: same files) --------
  const checkpoint::LoadPlan load_plan = checkpoint::plan_load(config.checkpoint);
  if (rank == 0) {
    spdlog::info("{}", load_plan.note);
    if (load_plan.clear_save_dir) checkpoint::remove_checkpoints(config.checkpoint.save_dir);
  }

  // ZRT_CPU_ISA is read here, before any work: a bad value ends the run on every rank at once.
  const CpuIsa cpu_isa = active_cpu_isa();

  // ---- device, streams, groups ---------------------------------------------------------------
  const int gpu_count = cuda_device_count();
  const DeviceOptions device_options =
      config.device.options(gpu_count, mpi.local_rank, config.seed);
  auto device = make_device(device_options);
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto control_stream = device->create_stream("control");
  // Every collective reports a timeout to the watchdog, which knows the step and ends the run.
  CommOptions comm_options = config.comm;
  // NCCL refuses two ranks of a communicator on one GPU: ranks that share one talk over MPI
  // through pinned host memory (staged_process_group.h).
  const bool sharing_gpu = device->type() == DeviceType::kCuda && mpi.local_size > gpu_count;
  if (sharing_gpu) comm_options.host_staged = true;
  if (comm_options.host_staged && device->type() == DeviceType::kCuda && rank == 0) {
    spdlog::info("collectives over MPI through pinned host memory, not NCCL ({})",
                 sharing_gpu
                     ? fmt::format("{} ranks share {} GPU(s) on a node", mpi.local_size, gpu_count)
                     : std::string("comm.host_staged_collectives"));
  }
  comm_options.watchdog = std::make_shared<Watchdog>(config.comm.timeout_s, hooks.on_hang);
  Watchdog& watchdog = *comm_options.watchdog;
  fault_point("train.start");  // test hook: a rank lost before the groups exist
  // Every process group of the run, built once: the world ("zero") and control groups, the
  // node topology (comm.ranks_per_node simulates nodes), MiCS, ZeRO++ and hpZ groups.
  ParallelLayout layout(*device, MPI_COMM_WORLD, *comm, *control_stream,
                        parallel_dims(engine_options(config), world, config.comm.ranks_per_node),
                        comm_options);
  Control control(*device, layout.control_group());

  // ---- model and engine ----------------------------------------------------------------------
  kernels::KernelContext ctx(*device, *compute);
  // The registry's architecture (model.type picks it, it resolves the model block) or the
  // caller's model.
  const ModelFactory model_source = make_factory();
  check_factory(model_source);
  ModelOptions model_options;
  model_options.activation_checkpointing = config.model.activation_checkpointing;
  const std::unique_ptr<Model> model_owner = model_source.build(ctx, model_options);
  if (!model_owner) {
    ZRT_THROW(InvalidArgument, "ModelFactory for {} built no model", model_source.description);
  }
  Model& model = *model_owner;
  std::vector<ParamSpec> params = model.parameters();
  for (ParamSpec& p : params) p.no_weight_decay = !config.optimizer.applies_weight_decay(p.name);
  // The engine asks the optimizer for its state tensors (optimizers/optimizer.h).
  const std::unique_ptr<DeviceOptimizer> optimizer =
      make_device_optimizer(*device, config.optimizer);
  const EngineOptions options = engine_options(config);
  ZeroEngine engine(*device, *compute, layout.engine_groups(), params, model.num_modules(), options,
                    *optimizer, make_cpu_optimizer_offload);
  // The engine's traffic, over every group it uses.
  const auto engine_comm = [&layout] { return layout.engine_traffic(); };
  // Hugging Face weights (model.init_from: every rank reads the file and keeps only its
  // slices) or the model's own random initialisation.
  if (model_source.initializer) {
    engine.initialize(model_source.initializer(model, config.seed, config.model.init_from));
  } else if (!config.model.init_from.empty()) {
    ZRT_THROW(InvalidArgument,
              "model.init_from '{}': {} has no initializer that reads weights (ModelFactory)",
              config.model.init_from, model_source.description);
  } else {
    engine.initialize([&model, seed = config.seed](int index, std::int64_t first,
                                                   std::int64_t count, float* out) {
      model.init_parameter(index, seed, first, count, out);
    });
  }
  if (!config.model.init_from.empty() && rank == 0) {
    spdlog::info("initialised from {}", config.model.init_from);
  }
  const LrSchedule schedule(config.scheduler, config.optimizer.lr());

  // ---- data ----------------------------------------------------------------------------------
  const int B = static_cast<int>(config.batch.micro_batch_size);
  const int T = model_source.seq_len;
  const int G = config.engine.gradient_accumulation_steps;
  DatasetOptions data_options;
  data_options.vocab_size = model_source.vocab_size;
  data_options.document_mask = config.data.document_mask;
  data_options.document_separator = config.data.document_separator;
  const std::unique_ptr<SampleSource> train_data = open_dataset(config.data.train, T, data_options);
  DataStreamOptions stream_options;
  stream_options.shuffle = config.data.shuffle;
  stream_options.seed = config.data.seed;
  DataStream train_stream(*train_data, stream_options);
  std::unique_ptr<SampleSource> val_data;
  if (!config.data.val.empty()) {
    val_data = open_dataset(config.data.val, T, data_options);
  }
  // Masked or packed data: the loss is weighted by the global batch's loss tokens
  // (loss_divisor), and the model must honour the masks and the document boundaries.
  const bool masked = train_data->documents() || (val_data && val_data->documents());
  if (masked && !model.supports_packed_documents()) {
    ZRT_THROW(InvalidArgument,
              "data.train {}: packed documents or loss masks, which model {} does not support "
              "(it would attend across documents and train on every token)",
              config.data.train, model_source.description);
  }
  BatchFeeder feeder(*device, *compute, B, T, masked);

  // ---- checkpoints: resume (at any world size or stage), then save as configured -------------
  checkpoint::Checkpointer checkpointer(config.checkpoint, config.comm.timeout_s,
                                        checkpoint::TestHooks::from_env());
  checkpointer.set_host_allocator(checkpoint::snapshot_allocator(*device, engine));
  std::int64_t start_step = 0;
  if (const auto& dir = load_plan.dir) {
    const checkpoint::CheckpointIndex index = checkpoint::load_engine(*dir, engine);
    train_stream.restore(index.data);
    start_step = index.step;
    summary.resumed_from = index.step;
    if (index.scheduler != lr_schedule_name(config.scheduler.type)) {
      spdlog::warn("{}: saved with scheduler {}, resuming with {}", *dir, index.scheduler,
                   lr_schedule_name(config.scheduler.type));
    }
    if (rank == 0) {
      spdlog::info("resumed from {} at step {} (saved by {} rank(s) at ZeRO stage {})", *dir,
                   index.step, index.world, index.stage);
    }
  }
  auto last_save = Clock::now();  // checkpoint.save_interval_minutes counts from here
  auto save_checkpoint = [&](std::int64_t step, bool synchronous) {
    engine.settle_step();  // the counters it saves count the step's decision
    checkpoint::SaveRequest request;
    request.tag = checkpoint::Checkpointer::tag_for_step(step);
    request.synchronous = synchronous;
    request.index.step = step;
    request.index.seed = config.seed;
    request.index.data = train_stream.state();
    request.index.scheduler = lr_schedule_name(config.scheduler.type);
    request.index.config_json = config.document.dump();
    checkpoint::describe_engine(engine, request.index);
    // Every rank of the partition writes its slices (at stage 0 the one full copy, rank 0's).
    // A sync save writes them from where the engine keeps them when that is host memory, and
    // copies them here otherwise (a GPU); an async one only issues the copy (the engine's next
    // step waits for it on its stream) and the writer thread waits for it.
    checkpointer.save(
        std::move(request),
        [&](const std::vector<float*>& arrays) { checkpoint::snapshot_engine(engine, arrays); },
        [&](const std::vector<float*>& arrays) {
          return checkpoint::snapshot_engine_async(engine, arrays,
                                                   checkpointer.hooks().copy_delay_ms);
        },
        [&] { return checkpoint::engine_state_view(engine); });
  };
  // checkpoint.on_save_error: a failed save (the same error on every rank: the checkpointer's
  // agreements fail together) ends the run ("stop"), or is logged and training goes on
  // ("continue"); either way `latest` still names the previous checkpoint.
  auto tolerate_save_error = [&](const Error& e) {
    // A rank lost or hung (Timeout) is not a storage fault: the run cannot go on.
    if (config.checkpoint.stop_on_save_error || dynamic_cast<const Timeout*>(&e) != nullptr) {
      return false;
    }
    ++summary.saves_failed;
    if (rank == 0) {
      const auto latest = checkpoint::read_latest(config.checkpoint.save_dir);
      spdlog::error("{}; training goes on (checkpoint.on_save_error \"continue\"), latest is {}",
                    e.what(), latest ? *latest : std::string("(none)"));
    }
    return true;
  };
  auto guarded_wait = [&]() {
    try {
      checkpointer.wait();
      return true;
    } catch (const Error& e) {
      if (!tolerate_save_error(e)) throw;
      return false;
    }
  };
  // Saves step `step` (and with `wait`, waits for it); false if a save failed and was tolerated.
  // The wall-clock interval counts from here.
  auto guarded_save = [&](std::int64_t step, bool wait) {
    guarded_wait();  // an earlier async save's error is reported (or thrown) on its own
    bool ok = true;
    try {
      // A save waited for (a preemption's) is written synchronously: no snapshot copy first.
      save_checkpoint(step, /*synchronous=*/wait);
    } catch (const Error& e) {
      // save() first waits for the previous async save: its error may be the one caught here.
      if (!tolerate_save_error(e)) throw;
      ok = false;
    }
    last_save = Clock::now();
    if (wait) ok = guarded_wait() && ok;
    return ok;
  };
  Buffer loss_sum = device->allocate(4, MemCategory::kWorkspace, "eval loss accumulator");
  Buffer step_losses =
      device->allocate(4 * kMaxUnreadLosses, MemCategory::kWorkspace, "step loss accumulators");
  // ---- timeline trace (trace.path, trace.steps) -----------------------------------------------
  // Declared before `drain`, so it outlives the stream work that records into it.
  std::unique_ptr<TraceRecorder> trace;
  if (config.trace.enabled()) {
    // One time origin for every rank (the largest clock reading): steady_clock is one clock per
    // node, so the ranks of a node line up when their files are viewed together.
    const auto now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch());
    const std::int64_t origin_ns = control.max({now.count()})[0];
    trace = std::make_unique<TraceRecorder>(
        rank, Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                  std::chrono::nanoseconds(origin_ns))));
  }
  const std::int64_t last_traced = std::min(config.trace.last_step, config.train.steps);

  // Destroyed first: if anything below throws, the streams finish (or fail) what they were
  // given before the buffers above are released under them.
  struct DrainStreams {
    ZeroEngine& engine;  // its CPU-optimizer thread is not a device stream
    Device& device;
    ~DrainStreams() {
      try {
        engine.synchronize();
      } catch (const std::exception& e) {
        spdlog::debug("engine streams drained after an error: {}", e.what());
      }
      try {
        device.synchronize();
      } catch (const std::exception& e) {
        spdlog::debug("streams drained after an error: {}", e.what());
      }
    }
  } drain{engine, *device};

  const std::int64_t tokens_per_step = std::int64_t{B} * T * G * world;
  const double flops_per_token =
      model_source.flops_per_token ? model_source.flops_per_token(T) : 0.0;
  const DevicePeak peak = device_peak(*device, config.engine.compute_dtype, mpi.local_size);
  if (rank == 0) {
    spdlog::info("model {}; {} ranks, ZeRO stage {}, {} x {} x {} sequences of {} tokens per step",
                 model_source.description, world, config.engine.stage, B, G, world, T);
    spdlog::info("device {}; MFU peak: {}", device->description(), peak.source);
    spdlog::info("CPU kernels: {} (this CPU runs up to {}; ZRT_CPU_ISA chooses)",
                 cpu_isa_name(cpu_isa), cpu_isa_name(hardware_cpu_isa()));
  }
  // Where the host's cores do the work (the CPU backend, a CPU optimizer), say how many this
  // rank has, and warn once per node when a launcher confined it (mpirun binds by default).
  const bool offload = config.engine.offload_optimizer.enabled;
  if ((device->type() == DeviceType::kCpu || offload) && mpi.local_rank == 0) {
    const CpuAffinity affinity = cpu_affinity();
    const int threads = omp_get_max_threads();
    const char* for_what = device->type() != DeviceType::kCpu ? "the CPU optimizer"
                           : offload ? "the CPU kernels and the CPU optimizer"
                                     : "the CPU kernels";
    spdlog::info(
        "CPU threads: {} OpenMP thread(s) per rank for {}; this rank may use {} of the "
        "node's {} cores ({})",
        threads, for_what, affinity.usable, affinity.online, affinity.list);
    if (const auto warning = cpu_binding_warning(affinity, mpi.local_size, threads)) {
      spdlog::warn("{}", *warning);
    }
  }
  if (rank == 0) {
    spdlog::info("train data: {}{}", train_data->describe(),
                 train_data->documents() ? " (documents and loss masks: the loss is weighted by "
                                           "the global batch's loss tokens)"
                                         : "");
  }
  std::filesystem::create_directories(config.output_dir);
  // The history of the whole training (metrics_log.h): rows after the resumed step go.
  std::optional<MetricsLog> metrics;
  if (rank == 0) {
    metrics.emplace((std::filesystem::path(config.output_dir) / "metrics.jsonl").string(),
                    start_step);
    const HistoryTrim& trim = metrics->trimmed();
    if (trim.dropped > 0 && start_step == 0) {
      spdlog::info(
          "{}: a fresh start begins a new history; the {} row(s) of an earlier run "
          "are dropped",
          metrics->path(), trim.dropped);
    } else if (trim.dropped > 0) {
      spdlog::info(
          "{}: kept {} row(s) up to step {}, dropped {} written after it by a run that "
          "did not reach a later checkpoint",
          metrics->path(), trim.kept, start_step, trim.dropped);
    }
  }
  // DeepSpeed's monitors; their x axis is samples trained.
  const std::int64_t samples_per_step = config.batch.train_batch_size;
  Monitors monitors(config, rank, start_step * samples_per_step);
  for (const std::string& where : monitors.destinations()) spdlog::info("monitor {}", where);
  const bool tty = rank == 0 && isatty(STDERR_FILENO);

  auto evaluate = [&]() {
    // Every rank evaluates its share of the first eval_batches x world micro-batches.
    DataStream val_stream(*val_data);
    device->fill_zero(loss_sum.device<std::byte>(), 4, *compute);
    // The same rule as training: the sum over every evaluated loss token over their count.
    std::vector<HostBatch> rows(static_cast<std::size_t>(config.train.eval_batches));
    std::int64_t local_tokens = 0;
    for (HostBatch& r : rows) {
      val_stream.next_micro_batch(rank, world, B, r);
      local_tokens += r.loss_tokens;
    }
    const bool weighted = val_data->documents();
    const std::int64_t global_tokens = weighted ? control.sum(local_tokens) : 0;
    if (weighted && global_tokens == 0) {
      if (rank == 0)
        spdlog::warn("evaluation: no loss token in {} batch(es); skipped",
                     config.train.eval_batches);
      return std::numeric_limits<double>::quiet_NaN();
    }
    const float divisor = loss_divisor(weighted, global_tokens, config.train.eval_batches, world);
    for (const HostBatch& r : rows) {
      TokenBatch batch = feeder.next(r, divisor);
      model.forward(engine, batch);
      engine_kernels::accumulate(*device, *compute, model.loss().as<const std::byte>(),
                                 DType::kFloat32, loss_sum.device<std::byte>(), DType::kFloat32, 1);
    }
    const double local =
        read_float(*device, *compute, loss_sum.device<float>()) / config.train.eval_batches;
    return control.mean(local);
  };

  // ---- the loop ------------------------------------------------------------------------------
  std::vector<UnreadStep> unread;  // steps whose loss is still on the device, in order
  double last_loss = std::numeric_limits<double>::quiet_NaN();  // the latest step's read
  // This rank's losses of the unread steps (each the mean of its micro-batches), in one copy.
  auto local_unread_losses = [&]() {
    std::vector<float> local =
        read_floats(*device, *compute, step_losses.device<float>(), unread.size());
    for (float& v : local) v = v / G;
    return local;
  };
  // The unread steps' losses averaged over the ranks: the summary, the monitors' rows.
  auto deliver_losses = [&](const std::vector<float>& agreed) {
    ZRT_CHECK(agreed.size() == unread.size(), "{} losses read for {} unread steps", agreed.size(),
              unread.size());
    for (std::size_t i = 0; i < unread.size(); ++i) {
      const UnreadStep& u = unread[i];
      const double loss = agreed[i];
      summary.losses.push_back(loss);
      if (monitors.enabled()) {
        std::vector<ScalarEvent> events = {
            {"Train/Samples/train_loss", loss, u.step * samples_per_step},
            {"Train/Samples/lr", u.lr, u.step * samples_per_step},
            {"Train/Samples/grad_norm", u.result.grad_norm, u.step * samples_per_step}};
        if (config.fp16()) {
          events.push_back(
              {"Train/Samples/loss_scale", u.result.loss_scale, u.step * samples_per_step});
        }
        monitors.write(events, u.wall_time);
      }
      last_loss = loss;
    }
    unread.clear();
  };
  CommCounts comm_before = engine_comm();
  const auto run_start = Clock::now();  // elapsed_s and the ETA count from here
  auto interval_start = run_start;
  std::int64_t interval_steps = 0;
  summary.steps = start_step;
  if (rank == 0 && start_step >= config.train.steps) {
    spdlog::info("the checkpoint is at step {} and train.steps is {}: nothing left to train",
                 start_step, config.train.steps);
  }
  // The step line and the metrics row of a decided step whose loss has been delivered (the
  // latest read, last_loss). Collective (the peaks are the ranks' maximum): every rank calls it
  // for the same steps, since every input of that choice is rank-identical.
  auto log_step = [&](std::int64_t step, double lr, double wall_time, const StepResult& result,
                      std::int64_t loss_tokens) {
    const double loss = last_loss;
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - run_start).count();
    const double seconds = std::chrono::duration<double>(Clock::now() - interval_start).count();
    const double tokens_per_s = tokens_per_step * interval_steps / std::max(seconds, 1e-9);
    const double mfu =
        peak.flops_per_s > 0.0 ? tokens_per_s / world * flops_per_token / peak.flops_per_s : 0.0;
    const MemoryUsage usage = device->tracker().usage(MemorySpace::kDevice);
    std::vector<std::int64_t> peaks(usage.peak.begin(), usage.peak.end());
    peaks.push_back(usage.total_peak);
    peaks = control.max(peaks);
    const CommCounts comm_now = engine_comm();
    const std::int64_t comm_bytes = (comm_now - comm_before).total_bytes();
    const std::int64_t comm_inter_node_bytes = (comm_now - comm_before).total_inter_bytes();
    const std::int64_t comm_intra_node_bytes = (comm_now - comm_before).total_intra_bytes();
    comm_before = comm_now;
    if (rank == 0) {
      if (tty) std::fprintf(stderr, "\r%80s\r", "");
      spdlog::info(
          "step {:>6}/{} | loss {:.4f} | lr {:.3e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
          "mem {} | comm {}{} | elapsed {} | ETA {}{}",
          step, config.train.steps, loss, lr, result.grad_norm, tokens_per_s, 100.0 * mfu,
          format_bytes(peaks.back()), format_bytes(comm_bytes),
          // Several nodes: what this rank sent to the others (comm_inter_node_bytes).
          comm_inter_node_bytes > 0
              ? fmt::format(" ({} across nodes)", format_bytes(comm_inter_node_bytes))
              : std::string(),
          format_duration(elapsed_s),
          format_duration(eta_seconds(elapsed_s, step - start_step, config.train.steps - step)),
          result.skipped ? fmt::format(" | SKIPPED (loss scale {})", result.loss_scale) : "");
      nlohmann::json row;
      row["step"] = step;
      row["time"] = wall_time;
      row["elapsed_s"] = elapsed_s;
      row["loss"] = loss;
      row["loss_tokens"] = loss_tokens;  // the global batch's (every token without masks)
      row["lr"] = lr;
      row["grad_norm"] = result.grad_norm;
      row["tokens_per_s"] = tokens_per_s;
      row["mfu"] = mfu;
      nlohmann::json mem;
      for (std::size_t c = 0; c < kNumMemCategories; ++c) {
        mem[mem_category_name(static_cast<MemCategory>(c))] = peaks[c];
      }
      mem["total"] = peaks.back();
      row["mem_peak_bytes"] = mem;
      row["comm_bytes"] = comm_bytes;
      row["comm_intra_node_bytes"] = comm_intra_node_bytes;
      row["comm_inter_node_bytes"] = comm_inter_node_bytes;
      row["loss_scale"] = result.loss_scale;
      row["skipped"] = result.skipped;
      row["skipped_total"] = result.skipped_steps;
      metrics->append(row);
    }
    interval_start = Clock::now();
    interval_steps = 0;
  };
  // The engine takes a step's decision on the device where it can (ZeroEngine::enqueue_step),
  // and the loop reads it only when it needs it: on a step it logs or reads the losses of (it
  // waits for the stream then anyway), else at the next step, after that step's micro-batches
  // are enqueued, when on a GPU the decision is long done. A skipped step learnt of then gets
  // its row then, one step late (its loss read with it).
  bool previous_undecided = false;
  std::vector<HostBatch> step_rows(static_cast<std::size_t>(G));  // reused step after step
  for (std::int64_t step = start_step + 1; step <= config.train.steps; ++step) {
    const bool traced = trace && step >= config.trace.first_step && step <= last_traced;
    const double step_start_us = traced ? trace->now_us() : 0.0;
    const CommCounts comm_at_step_start = traced ? engine_comm() : CommCounts{};
    if (traced) engine.set_trace(trace.get());
    watchdog.set_step(step);
    // This step's loss slot: the micro-batch losses are summed into it on the compute stream.
    const std::size_t slot = unread.size();
    const DevicePtr<std::byte> loss_slot = step_losses.device<std::byte>() + 4 * slot;
    device->fill_zero(loss_slot, 4, *compute);
    // The step's micro-batches are read first: their loss tokens, summed over the ranks, weigh
    // every micro-batch's loss (loss_divisor).
    std::int64_t local_tokens = 0;
    for (HostBatch& r : step_rows) {
      train_stream.next_micro_batch(rank, world, B, r);
      local_tokens += r.loss_tokens;
    }
    const std::int64_t global_tokens =
        masked ? control.sum(local_tokens) : std::int64_t{G} * world * B * T;
    if (global_tokens == 0) {
      // Every rank sees the same count: the step is skipped on all of them alike, before any
      // collective of the engine, and the schedule does not advance.
      if (rank == 0) spdlog::warn("step {}: no loss token in the global batch; skipped", step);
      if (rank == 0 && metrics) {
        nlohmann::json row;
        row["step"] = step;
        row["time"] = unix_seconds();
        row["loss_tokens"] = 0;
        row["skipped"] = true;
        row["skipped_reason"] = "no loss token";
        metrics->append(row);
      }
      summary.steps = step;
      continue;
    }
    const float divisor = loss_divisor(masked, global_tokens, G, world);
    for (int g = 0; g < G; ++g) {
      TokenBatch batch = feeder.next(step_rows[static_cast<std::size_t>(g)], divisor);
      float scale = static_cast<float>(engine.loss_scale());
      // Test hook (runtime/common/fault.h): "nan" poisons this rank's gradients through the
      // loss gradient's scale; signals freeze or kill the rank here, mid-step.
      if (g == G - 1 && fault_point("train.step", step) == FaultAction::kNan) {
        scale = std::numeric_limits<float>::quiet_NaN();
      }
      model.forward_backward(engine, batch, scale);
      engine_kernels::accumulate(*device, *compute, model.loss().as<const std::byte>(),
                                 DType::kFloat32, loss_slot, DType::kFloat32, 1);
    }
    if (previous_undecided) {
      previous_undecided = false;
      const StepResult previous = engine.settle_step();
      // Still unread: a step whose losses were read was decided then.
      ZRT_CHECK(!unread.empty() && unread.back().step == step - 1,
                "step {}'s decision settled without its unread entry", step - 1);
      unread.back().result = previous;
      if (previous.skipped && config.train.log_interval > 0) {
        // A skipped step always gets its row: the losses so far are read now, and this step's
        // moves to the first slot, where the next read looks for it.
        const UnreadStep skipped = unread.back();
        deliver_losses(control.mean(local_unread_losses()));
        device->copy(step_losses.device<std::byte>(), loss_slot, 4, *compute);
        log_step(skipped.step, skipped.lr, skipped.wall_time, previous, skipped.loss_tokens);
      }
    }
    const double lr = schedule.lr_for_step(engine.counters().optimizer_steps + 1);
    StepResult result = engine.enqueue_step(lr);
    ++interval_steps;
    const double wall_time = unix_seconds();
    unread.push_back({step, wall_time, lr, result, global_tokens});
    const bool periodic =
        config.train.log_interval > 0 &&
        (step % config.train.log_interval == 0 || step == config.train.steps || step == 1);
    const bool buffer_full = unread.size() == static_cast<std::size_t>(kMaxUnreadLosses);
    auto settle = [&] {
      if (result.decided) return;
      result = engine.settle_step();
      unread.back().result = result;
    };
    if (periodic || step == config.train.steps || buffer_full) settle();
    if (hooks.after_step) hooks.after_step(step, engine, result);
    // A skipped step (the same decision on every rank) always gets its metrics row.
    const bool log_now = periodic || (config.train.log_interval > 0 && result.skipped);
    // The losses are read only when the loop needs them: a logged step, a full buffer, the last
    // step. A quiet step waits for the device nowhere: the step's decision stays on the device
    // (read at the next step) and the host goes on enqueueing the next step while the optimizer
    // runs. The read losses ride on the step boundary's all-reduce with its decisions (an
    // average of 0/1 votes is non-zero when any rank voted): stop (a preemption signal reached
    // some rank since the last boundary) and a wall-clock save (rank 0's clock alone votes, so
    // every rank agrees however their clocks drift). Every input of the read decision is
    // rank-identical.
    const bool read_losses = log_now || step == config.train.steps || buffer_full;
    const bool stop_vote = hooks.stop_requested && hooks.stop_requested();
    const bool time_vote = rank == 0 && config.checkpoint.save_interval_minutes > 0.0 &&
                           std::chrono::duration<double>(Clock::now() - last_save).count() >=
                               60.0 * config.checkpoint.save_interval_minutes;
    std::vector<float> votes = read_losses ? local_unread_losses() : std::vector<float>{};
    const std::size_t n_losses = votes.size();
    votes.push_back(stop_vote ? 1.f : 0.f);
    votes.push_back(time_vote ? 1.f : 0.f);
    const std::vector<float> agreed = control.mean(votes);
    const bool stop = agreed[n_losses] > 0.f;
    const bool timed_save = agreed[n_losses + 1] > 0.f;
    if (stop) settle();  // the summary's last rows
    if (read_losses) {
      deliver_losses({agreed.begin(), agreed.begin() + static_cast<std::ptrdiff_t>(n_losses)});
    } else if (stop) {
      deliver_losses(
          control.mean(local_unread_losses()));  // the last steps' losses, for the summary
    }
    if (stop) {
      if (hooks.on_stop) hooks.on_stop(step);
      if (rank == 0) {
        spdlog::warn(
            "step {}: stop requested (a preemption signal reached {} rank(s)); saving a "
            "checkpoint of step {} and stopping",
            step, static_cast<int>(std::lround(agreed[n_losses] * world)), step);
      }
    }
    previous_undecided = !result.decided;
    if (log_now) {
      log_step(step, lr, wall_time, result, global_tokens);
    } else if (tty) {
      // The loss shown is the latest read (a logged step's): reading it here would wait.
      const double elapsed_s = std::chrono::duration<double>(Clock::now() - run_start).count();
      const std::string shown =
          std::isnan(last_loss) ? std::string() : fmt::format(" loss {:.4f}", last_loss);
      std::fprintf(
          stderr, "\r%s step %lld/%lld%s ETA %s", progress_bar(step, config.train.steps).c_str(),
          static_cast<long long>(step), static_cast<long long>(config.train.steps), shown.c_str(),
          format_duration(eta_seconds(elapsed_s, step - start_step, config.train.steps - step))
              .c_str());
    }
    if (val_data && config.train.eval_interval > 0 && !stop &&
        (step % config.train.eval_interval == 0 || step == config.train.steps)) {
      const double val = evaluate();
      summary.eval_losses.push_back(val);
      if (rank == 0) {
        if (tty) std::fprintf(stderr, "\r%80s\r", "");
        spdlog::info("eval after step {}: val loss {:.4f}", step, val);
        const double eval_time = unix_seconds();
        nlohmann::json row;
        row["step"] = step;
        row["time"] = eval_time;
        row["elapsed_s"] = std::chrono::duration<double>(Clock::now() - run_start).count();
        row["val_loss"] = val;
        metrics->append(row);
        monitors.write({{"Eval/Samples/val_loss", val, step * samples_per_step}}, eval_time);
      }
    }
    summary.steps = step;
    summary.skipped = result.skipped_steps;  // the last step is decided (logged or stopped)
    if (traced) {
      if (step == last_traced) {
        // Everything the traced steps enqueued is done before the last marker ends.
        engine.synchronize();
        device->synchronize();
      }
      // The step's traffic, as the metrics count it (what this rank sent).
      const CommCounts sent = engine_comm() - comm_at_step_start;
      trace->add_step(step, step_start_us, trace->now_us(),
                      {{"comm_bytes", sent.total_bytes()},
                       {"comm_intra_node_bytes", sent.total_intra_bytes()},
                       {"comm_inter_node_bytes", sent.total_inter_bytes()}});
      if (step == last_traced) {
        engine.set_trace(nullptr);
        const std::string path = trace_path_for_rank(config.trace.path, rank, world);
        trace->write(path);
        if (rank == 0) {
          spdlog::info(
              "trace of steps {}-{} written to {}", config.trace.first_step, last_traced,
              world > 1 ? trace_path_for_rank(config.trace.path, 0, world) + " (one file per rank)"
                        : path);
          // What the device did per step (rank 0's streams); the last traced step also holds the
          // drain of everything it enqueued, so the earlier steps are the steady state.
          for (const TraceStepSummary& s : summarize_trace_steps(trace->events())) {
            spdlog::info("trace {}", format_trace_step(s));
          }
        }
        trace.reset();
      }
    }
    const bool interval_save =
        config.checkpoint.save_interval > 0 &&
        (step % config.checkpoint.save_interval == 0 || step == config.train.steps);
    const bool last_save_due = config.checkpoint.saves() && step == config.train.steps;
    if (stop) {
      // Synchronous: the previous save (an async one still writing) finishes first, then this
      // step's checkpoint is committed before the run returns.
      const auto t = Clock::now();
      const bool saved = guarded_save(step, /*wait=*/true);
      // A stop at the last step is a finished run (nothing to requeue).
      summary.status = !saved                       ? RunStatus::kPreemptedUnsaved
                       : step == config.train.steps ? RunStatus::kCompleted
                                                    : RunStatus::kPreempted;
      if (rank == 0 && saved) {
        spdlog::warn(
            "preempted at step {}: checkpoint {} saved in {:.2f} s; resume with "
            "checkpoint.load \"auto\"",
            step, checkpoint::Checkpointer::tag_for_step(step),
            std::chrono::duration<double>(Clock::now() - t).count());
      }
      break;
    }
    if (interval_save || last_save_due || timed_save) guarded_save(step, /*wait=*/false);
  }
  // An async save finishes (or reports its error) before the run ends.
  guarded_wait();

  // ---- a short byte-level sample -------------------------------------------------------------
  if (config.train.sample_tokens > 0 && model_source.vocab_size == 256 &&
      summary.status == RunStatus::kCompleted) {
    // Every rank runs the same forwards (stage 3 gathers are collective) with the same seed.
    std::string text = "And God said";
    std::mt19937_64 rng(config.seed);
    std::vector<std::byte> logits(static_cast<std::size_t>(model_source.vocab_size) *
                                  dtype_size(config.engine.compute_dtype));
    BatchFeeder one(*device, *compute, 1, T, /*documents=*/false);
    HostBatch prompt;
    prompt.batch = 1;
    prompt.seq_len = T;
    prompt.inputs.assign(static_cast<std::size_t>(T), 0);
    prompt.targets.assign(static_cast<std::size_t>(T), 0);
    for (int i = 0; i < config.train.sample_tokens; ++i) {
      const int length =
          static_cast<int>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(T)));
      const std::string context = text.substr(text.size() - static_cast<std::size_t>(length));
      for (int t = 0; t < T; ++t) {
        prompt.inputs[static_cast<std::size_t>(t)] =
            t < length ? static_cast<unsigned char>(context[static_cast<std::size_t>(t)]) : 0;
      }
      TokenBatch batch = one.next(prompt, 0.f);
      batch.targets = DevicePtr<const std::int32_t>();
      model.forward(engine, batch);
      const std::int64_t stride =
          model.logits_row_stride() > 0 ? model.logits_row_stride() : model_source.vocab_size;
      const std::int64_t row = std::int64_t{length - 1} * stride;
      device->copy_to_host(
          logits.data(),
          model.logits() + row * static_cast<std::int64_t>(dtype_size(config.engine.compute_dtype)),
          logits.size(), *compute);
      compute->synchronize();
      std::vector<double> probs(static_cast<std::size_t>(model_source.vocab_size));
      double max_logit = -1e30;
      for (int v = 0; v < model_source.vocab_size; ++v) {
        const std::byte* p = logits.data() + v * dtype_size(config.engine.compute_dtype);
        float value = 0.f;
        switch (config.engine.compute_dtype) {
          case DType::kFloat32:
            std::memcpy(&value, p, 4);
            break;
          case DType::kBFloat16: {
            bf16 h;
            std::memcpy(&h, p, 2);
            value = to_float(h);
            break;
          }
          default: {
            fp16 h;
            std::memcpy(&h, p, 2);
            value = to_float(h);
            break;
          }
        }
        probs[static_cast<std::size_t>(v)] = value;
        max_logit = std::max(max_logit, static_cast<double>(value));
      }
      for (double& p : probs) p = std::exp((p - max_logit) / 0.8);  // temperature 0.8
      std::discrete_distribution<int> pick(probs.begin(), probs.end());
      text.push_back(static_cast<char>(pick(rng)));
    }
    summary.sample = text;
    if (rank == 0) spdlog::info("sample: {}", text);
  }
  compute->synchronize();
  return summary;
}

}  // namespace

ModelFactory registry_model(const ModelConfig& model) {
  std::shared_ptr<const ModelDef> def = builtin_models().resolve(model);
  ModelFactory factory;
  factory.seq_len = def->seq_len();
  factory.vocab_size = def->vocab_size();
  factory.description = def->describe();
  factory.build = [def](kernels::KernelContext& ctx, const ModelOptions& options) {
    return def->build(ctx, options);
  };
  factory.flops_per_token = [def](int seq_len) { return def->flops_per_token(seq_len); };
  factory.initializer = [def](const Model& built, std::uint64_t seed,
                              const std::string& init_from) {
    return def->initializer(built, seed, init_from);
  };
  return factory;
}

RunSummary run_training(const Config& config, const RankInfo& ranks, const TrainHooks& hooks) {
  return train(
      config, ranks, [&config] { return registry_model(config.model); }, hooks);
}

RunSummary run_training(const Config& config, const RankInfo& ranks, const ModelFactory& model,
                        const TrainHooks& hooks) {
  return train(
      config, ranks, [&model] { return model; }, hooks);
}

}  // namespace zrt::train
