// TrainingRun's construction: build() and its parts, in the order they run.
#include "train/training_run.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "kernels/ops.h"
#include "models/model_registry.h"
#include "offload/cpu_optimizer_offload.h"
#include "optimizers/optimizer.h"
#include "runtime/common/cpu_affinity.h"
#include "runtime/common/error.h"
#include "runtime/common/fault.h"
#include "runtime/data/open_dataset.h"
#include "runtime/engine/engine_parallel_dims.h"
#include "train/frozen_parameters.h"

namespace zrt::train {

namespace {

EngineOptions engine_options(const Config& config) {
  EngineOptions o = config.engine;
  o.offload_optimizer.enabled = config.offload_optimizer.enabled();
  o.offload_optimizer.pin_memory = config.offload_optimizer.pin_memory;
  o.offload_optimizer.ratio = config.offload_optimizer.ratio;
  o.offload_param.enabled = config.offload_param.enabled();
  o.offload_param.pin_memory = config.offload_param.pin_memory;
  return o;
}

// Called where the loop builds the model; throws InvalidArgument naming what is missing.
void check_factory(const ModelFactory& factory) {
  if (!factory.build) ZRT_THROW(InvalidArgument, "ModelFactory: build is not set");
  if (factory.seq_len <= 0 || factory.vocab_size <= 0) {
    ZRT_THROW(InvalidArgument, "ModelFactory for {}: seq_len {} and vocab_size {} must be positive",
              factory.description, factory.seq_len, factory.vocab_size);
  }
}

}  // namespace

TrainingRun::TrainingRun(const Config& config, const RankInfo& ranks,
                         std::function<ModelFactory()> make_factory, const TrainHooks& hooks)
    : config_(config),
      ranks_(ranks),
      rank_(ranks.rank),
      world_(ranks.world),
      make_factory_(std::move(make_factory)),
      hooks_(hooks) {}

TrainingRun::~TrainingRun() = default;

TrainingRun::DrainStreams::~DrainStreams() {
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

void TrainingRun::build() {
  // What checkpoint.load means here: decided before anything is built, so a run that would
  // overwrite another run's checkpoints stops at once (on every rank: same files).
  load_plan_ = CheckpointPolicy::plan(config_, rank_, &save_dir_lock_);
  // ZRT_CPU_ISA is read here, before any work: a bad value ends the run on every rank at once.
  cpu_isa_ = active_cpu_isa();
  timed("device", [&] { build_device(); });
  timed("groups", [&] { build_groups(); });
  timed("model", [&] { build_model(); });
  build_engine();  // times its state's allocation and initialisation itself
  timed("data", [&] { build_data(); });
  timed("checkpoints", [&] { build_checkpoints(); });
  timed("buffers", [&] { build_step_buffers(); });
  build_trace();
  // Destroyed first: if anything below throws, the streams finish (or fail) what they were
  // given before the buffers above are released under them.
  drain_.emplace(*engine_, *device_);
  log_setup();
  open_logs();
}

template <typename Part>
void TrainingRun::timed(const char* name, Part&& part) {
  const Clock::time_point start = Clock::now();
  part();
  startup_seconds_.emplace_back(name, std::chrono::duration<double>(Clock::now() - start).count());
}

void TrainingRun::build_device() {
  gpu_count_ = cuda_device_count();
  const DeviceOptions device_options =
      config_.device.options(gpu_count_, ranks_.local_rank, config_.seed);
  device_ = make_device(device_options);
}

// The streams and every process group of the run: the engine's, the control group, and the
// subgroups the engine's options ask for.
void TrainingRun::build_groups() {
  compute_ = device_->create_stream("compute");
  comm_ = device_->create_stream("comm");
  control_stream_ = device_->create_stream("control");
  // Every collective reports a timeout to the watchdog, which knows the step and ends the run.
  comm_options_ = config_.comm;
  // NCCL refuses two ranks of a communicator on one GPU: ranks that share one talk over MPI
  // through pinned host memory (staged_process_group.h).
  const bool sharing_gpu = device_->type() == DeviceType::kCuda && ranks_.local_size > gpu_count_;
  if (sharing_gpu) comm_options_.host_staged = true;
  if (comm_options_.host_staged && device_->type() == DeviceType::kCuda && rank_ == 0) {
    spdlog::info("collectives over MPI through pinned host memory, not NCCL ({})",
                 sharing_gpu ? fmt::format("{} ranks share {} GPU(s) on a node", ranks_.local_size,
                                           gpu_count_)
                             : std::string("comm.host_staged_collectives"));
  }
  comm_options_.watchdog = std::make_shared<Watchdog>(config_.comm.timeout_s, hooks_.on_hang);
  watchdog_ = comm_options_.watchdog.get();
  fault_point("train.start");  // test hook: a rank lost before the groups exist
  engine_options_ = engine_options(config_);
  // Every process group of the run, built once: the world ("zero") and control groups, the
  // node topology (comm.ranks_per_node simulates nodes), MiCS, ZeRO++ and hpZ groups.
  // Sequence parallelism's all-to-alls get a stream of their own: on the engine's they would
  // queue behind its gathers and reductions.
  if (engine_options_.sequence_parallel_size > 1) {
    sequence_stream_ = device_->create_stream("sequence-parallel");
  }
  layout_.emplace(*device_, MPI_COMM_WORLD, *comm_, *control_stream_,
                  parallel_dims(engine_options_, world_, config_.comm.ranks_per_node),
                  comm_options_, sequence_stream_.get());
  control_.emplace(*device_, layout_->control_group());
  share_ = DataShare::of(layout_->dims(), rank_);
}

CommCounts TrainingRun::engine_comm() const {
  return layout_->engine_traffic();
}

void TrainingRun::build_model() {
  ctx_.emplace(*device_, *compute_);
  // The registry's architecture (model.type picks it, it resolves the model block) or the
  // caller's model.
  model_source_ = make_factory_();
  check_factory(model_source_);
  if (config_.train.sample_tokens > 0 && model_source_.vocab_size != 256 && rank_ == 0) {
    // The sample is a byte-level demo (its prompt and output are bytes): say so now rather
    // than end the run without the sample that was asked for.
    spdlog::warn(
        "train.sample_tokens {}: the sample is byte-level text and needs a vocabulary of 256 "
        "(this model's is {}); no sample will be generated",
        config_.train.sample_tokens, model_source_.vocab_size);
  }
  ModelOptions model_options;
  model_options.activation_checkpointing = config_.model.activation_checkpointing;
  model_options.sequence_group = layout_->sequence_group();
  model_options.expert_group = layout_->expert_parallel_group();
  model_options.cpu_checkpointing = config_.model.cpu_checkpointing;
  model_options.head_tile_rows = config_.model.head_tile_rows;
  model_options.mlp_tile_rows = config_.model.mlp_tile_rows;
  model_options.expert_rows_reserve = config_.model.expert_rows_reserve;
  model_owner_ = model_source_.build(*ctx_, model_options);
  if (!model_owner_) {
    ZRT_THROW(InvalidArgument, "ModelFactory for {} built no model", model_source_.description);
  }
  model_ = model_owner_.get();
}

void TrainingRun::build_engine() {
  Model& model = *model_;
  std::vector<ParamSpec> params = model.parameters();
  for (ParamSpec& p : params) p.no_weight_decay = !config_.optimizer.applies_weight_decay(p.name);
  if (!config_.model.frozen.empty() || !config_.model.trainable.empty()) {
    // Every rank marks its own parameters (an expert-parallel rank holds some experts only);
    // the patterns are judged over all of them, so every rank throws or none does.
    const FrozenMarks marks = mark_frozen_parameters(config_.model, params);
    check_frozen_patterns(config_.model, control_->sum(marks.matches),
                          control_->sum(marks.total_params - marks.frozen_params), params,
                          model_source_.description);
    const std::string frozen = describe_frozen(config_.model, marks);
    if (rank_ == 0 && !frozen.empty()) spdlog::info("{}", frozen);
  }
  // Expert parallelism splits experts: a model must declare its expert parameters (group 1, the
  // expert-data-parallel group) for it to mean anything.
  const int ep = engine_options_.expert_parallel_size;
  if (ep > 1 &&
      std::none_of(params.begin(), params.end(), [](const ParamSpec& p) { return p.group == 1; })) {
    ZRT_THROW(InvalidArgument,
              "expert_parallel.autoep_size {}: {} has no experts (no mixture-of-experts layer "
              "declares expert parameters); remove the expert_parallel block or set autoep_size 1",
              ep, model_source_.description);
  }
  // The engine asks the optimizer for its state tensors (optimizers/optimizer.h).
  optimizer_ = make_device_optimizer(*device_, config_.optimizer);
  // A model that can end its backward at the lowest module with a trained parameter does, when
  // the modules below are frozen (model_interface.h): the engine's schedule ends there too.
  take_model_capabilities(engine_options_, model);
  timed("engine state", [&] {
    engine_.emplace(*device_, *compute_, layout_->engine_groups(), params, model.num_modules(),
                    engine_options_, *optimizer_, make_cpu_optimizer_offload);
  });
  const int first_backward = engine_->first_backward_module();
  // Every rank must end its backward at the same module, or their collectives would not pair
  // (an expert-parallel rank marks only its own experts: they are frozen by their fused name,
  // alike everywhere, so this holds unless a model declares its modules differently per rank).
  const std::vector<std::int64_t> highest = control_->max({first_backward, -first_backward});
  if (highest[0] != -highest[1]) {
    ZRT_THROW(InvalidArgument,
              "model.frozen / model.trainable: the backward would end at module {} on some ranks "
              "and {} on others (the lowest module with a trained parameter differs between "
              "ranks); train the same modules on every rank",
              -highest[1], highest[0]);
  }
  if (rank_ == 0 && first_backward > 0) {
    spdlog::info("{}", describe_backward_stop(params, first_backward, model.num_modules()));
  }
  // Hugging Face weights (model.init_from: every rank reads the file and keeps only its
  // slices) or the model's own random initialisation.
  if (model_source_.initializer) {
    timed("initialisation", [&] {
      engine_->initialize(model_source_.initializer(model, config_.seed, config_.model.init_from));
    });
  } else if (!config_.model.init_from.empty()) {
    ZRT_THROW(InvalidArgument,
              "model.init_from '{}': {} has no initializer that reads weights (ModelFactory)",
              config_.model.init_from, model_source_.description);
  } else {
    timed("initialisation", [&] {
      engine_->initialize([&model, seed = config_.seed](int index, std::int64_t first,
                                                        std::int64_t count, float* out) {
        model.init_parameter(index, seed, first, count, out);
      });
    });
  }
  if (!config_.model.init_from.empty() && rank_ == 0) {
    spdlog::info("initialised from {}", config_.model.init_from);
  }
  schedule_.emplace(config_.scheduler, config_.optimizer.lr());
}

void TrainingRun::build_data() {
  B_ = static_cast<int>(config_.batch.micro_batch_size);
  T_ = model_source_.seq_len;
  G_ = config_.engine.gradient_accumulation_steps;
  DatasetOptions data_options;
  data_options.vocab_size = model_source_.vocab_size;
  data_options.document_mask = config_.data.document_mask;
  data_options.document_separator = config_.data.document_separator;
  // A data error names the config key it came from (data.train or data.val: both may be globs,
  // and "no file matches" alone does not say which).
  auto open_named = [&](const char* key, const std::string& path) {
    try {
      return open_dataset(path, T_, data_options);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{} (from {})", e.what(), key));
    }
  };
  train_data_ = open_named("data.train", config_.data.train);
  const std::int64_t per_step = config_.batch.train_batch_size;
  if (train_data_->num_samples() < per_step && rank_ == 0) {
    // Legal (the stream wraps into the next epoch within a step), but rarely what was meant: a
    // small fine-tuning set trains on the same sequences several times in every step.
    spdlog::warn(
        "data.train {}: {} sequence(s), fewer than one step's global batch of {} "
        "(train_batch_size): every step repeats them, about {:.1f} times each",
        config_.data.train, train_data_->num_samples(), per_step,
        static_cast<double>(per_step) / static_cast<double>(train_data_->num_samples()));
  }
  DataStreamOptions stream_options;
  stream_options.shuffle = config_.data.shuffle;
  stream_options.seed = config_.data.seed;
  train_stream_.emplace(*train_data_, stream_options);
  if (!config_.data.val.empty()) {
    val_data_ = open_named("data.val", config_.data.val);
  }
  check_same_data_everywhere("data.train", *train_data_);
  if (val_data_) check_same_data_everywhere("data.val", *val_data_);
  // Masked or packed data: the loss is weighted by the global batch's loss tokens
  // (loss_divisor), and the model must honour the masks and the document boundaries.
  masked_ = train_data_->documents() || (val_data_ && val_data_->documents());
  if (masked_ && !model_->supports_packed_documents()) {
    ZRT_THROW(InvalidArgument,
              "data.train {}: packed documents or loss masks, which model {} does not support "
              "(it would attend across documents and train on every token)",
              config_.data.train, model_source_.description);
  }
  if (share_.chunked() && T_ % share_.sp_size != 0) {
    ZRT_THROW(InvalidArgument,
              "sequence_parallel_size {} does not divide the sequence length {}: each rank of a "
              "group trains on an equal chunk of every sequence; give a divisor of it",
              share_.sp_size, T_);
  }
  feeder_.emplace(*device_, *compute_, B_, T_, masked_, share_);
}

// Every rank opens the data itself: ranks that see other files (a path relative to another
// working directory, a node-local copy that differs) would read other streams silently, or
// take other loss paths and hang in a collective. Their data's kind and sample count must
// agree (collective over the control group).
void TrainingRun::check_same_data_everywhere(const char* key, const SampleSource& data) {
  const std::vector<std::int64_t> mine = {data.documents() ? 1 : 0, data.num_samples(),
                                          data.group()};
  // Maxima of the values and of their negations in one all-reduce: max and -min.
  std::vector<std::int64_t> both = mine;
  for (std::int64_t v : mine) both.push_back(-v);
  both = control_->max(both);
  const std::vector<std::int64_t> high(both.begin(), both.begin() + 3);
  const std::vector<std::int64_t> low(both.begin() + 3, both.end());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (high[i] == -low[i]) continue;
    ZRT_THROW(InvalidArgument,
              "{} {}: the ranks read different data: rank {} sees {} sample(s) of {}, the ranks "
              "between {} and {}{}; every rank must see the same files (a file system all ranks "
              "share; a relative path counts from each rank's working directory)",
              key, data.pattern(), rank_, data.num_samples(),
              data.documents() ? "packed SFT shards" : "token shards", -low[1], high[1],
              high[0] != -low[0] ? " (some of them another kind of shard)" : "");
  }
}

// Resume (at any world size or stage), then save as configured.
void TrainingRun::build_checkpoints() {
  checkpoints_.emplace(config_, rank_, *device_, *engine_, *train_stream_);
  start_step_ = checkpoints_->resume(load_plan_);
  summary_.resumed_from = start_step_;
}

// The evaluation's and the steps' loss accumulators.
void TrainingRun::build_step_buffers() {
  evaluator_.emplace(config_, ranks_, *device_, *compute_, *control_, *feeder_, *model_, *engine_,
                     val_data_.get());
  step_losses_ =
      device_->allocate(4 * kMaxUnreadLosses, MemCategory::kWorkspace, "step loss accumulators");
  if (model_->aux_loss()) {
    aux_loss_sum_ = device_->allocate(4, MemCategory::kWorkspace, "auxiliary loss accumulator");
    device_->fill_zero(aux_loss_sum_.device<std::byte>(), 4, *compute_);
  }
}

// The timeline trace (trace.path, trace.steps).
void TrainingRun::build_trace() {
  if (config_.trace.enabled()) {
    // One time origin for every rank (the largest clock reading): steady_clock is one clock per
    // node, so the ranks of a node line up when their files are viewed together.
    const auto now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch());
    const std::int64_t origin_ns = control_->max({now.count()})[0];
    trace_ = std::make_unique<TraceRecorder>(
        rank_, Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                   std::chrono::nanoseconds(origin_ns))));
  }
  last_traced_ = std::min(config_.trace.last_step, config_.train.steps);
}

void TrainingRun::log_setup() {
  tokens_per_step_ = std::int64_t{B_} * T_ * G_ * share_.dp_size;
  flops_per_token_ = model_source_.flops_per_token ? model_source_.flops_per_token(T_) : 0.0;
  peak_ = device_peak(*device_, config_.engine.compute_dtype, ranks_.local_size);
  if (rank_ == 0) {
    spdlog::info(
        "model {}; {} rank{}, ZeRO stage {}, {} x {} x {} sequences of {} tokens per step{}",
        model_source_.description, world_, world_ == 1 ? "" : "s", config_.engine.stage, B_, G_,
        share_.dp_size, T_,
        share_.chunked() ? fmt::format(", each in {} chunks of {} over a sequence-parallel "
                                       "group",
                                       share_.sp_size, share_.chunk_length(T_))
                         : std::string());
    spdlog::info("device {}; MFU peak: {}", device_->description(), peak_.source);
    // Where a large model's start-up goes (allocating and faulting in the state, drawing the
    // weights, reading a checkpoint): rank 0's parts, slowest ranks wait in the first step.
    double total = 0.0;
    std::string parts;
    for (const auto& [name, seconds] : startup_seconds_) {
      total += seconds;
      parts += fmt::format("{}{} {:.1f} s", parts.empty() ? "" : ", ", name, seconds);
    }
    spdlog::info("start-up {:.1f} s: {}", total, parts);
    spdlog::info("CPU kernels: {} (this CPU runs up to {}; ZRT_CPU_ISA chooses)",
                 cpu_isa_name(cpu_isa_), cpu_isa_name(hardware_cpu_isa()));
    if (device_->type() == DeviceType::kCuda) {
      spdlog::info("CUDA attention: {} (ZRT_CUDA_ATTENTION chooses)",
                   kernels::describe_cuda_attention(ctx_->options()));
    }
  }
  // Where the host's cores do the work (the CPU backend, a CPU optimizer), say how many this
  // rank has, and warn once per node when a launcher confined it (mpirun binds by default).
  const bool offload = config_.engine.offload_optimizer.enabled;
  if ((device_->type() == DeviceType::kCpu || offload) && ranks_.local_rank == 0) {
    const CpuAffinity affinity = cpu_affinity();
    const int threads = omp_get_max_threads();
    const char* for_what = device_->type() != DeviceType::kCpu ? "the CPU optimizer"
                           : offload ? "the CPU kernels and the CPU optimizer"
                                     : "the CPU kernels";
    spdlog::info(
        "CPU threads: {} OpenMP thread(s) per rank for {}; this rank may use {} of the "
        "node's {} cores ({})",
        threads, for_what, affinity.usable, affinity.online, affinity.list);
    if (const auto warning = cpu_binding_warning(affinity, ranks_.local_size, threads)) {
      spdlog::warn("{}", *warning);
    }
  }
  if (rank_ == 0) {
    spdlog::info("train data: {}{}", train_data_->describe(),
                 train_data_->documents() ? " (documents and loss masks: the loss is weighted by "
                                            "the global batch's loss tokens)"
                                          : "");
  }
}

// metrics.jsonl (rank 0), DeepSpeed's monitors, the progress line.
void TrainingRun::open_logs() {
  std::filesystem::create_directories(config_.output_dir);
  // The history of the whole training (metrics_log.h): rows after the resumed step go.
  if (rank_ == 0) {
    metrics_.emplace((std::filesystem::path(config_.output_dir) / "metrics.jsonl").string(),
                     start_step_);
    const HistoryTrim& trim = metrics_->trimmed();
    if (trim.dropped > 0 && start_step_ == 0) {
      spdlog::info(
          "{}: a fresh start begins a new history; the {} row(s) of an earlier run "
          "are dropped",
          metrics_->path(), trim.dropped);
    } else if (trim.dropped > 0) {
      // The resumed checkpoint is the newest when the rows came from a run that went on past
      // it unsaved; an older one was chosen, and the rows past it are another timeline's.
      spdlog::info("{}: kept {} row(s) up to step {}, dropped {} written after it ({})",
                   metrics_->path(), trim.kept, start_step_, trim.dropped,
                   checkpoints_->resumed_before_newest()
                       ? "the run resumed from an older checkpoint than the newest: those rows "
                         "are the later checkpoints' timeline"
                       : "by a run that did not reach a later checkpoint");
    }
  }
  // DeepSpeed's monitors; their x axis is samples trained.
  samples_per_step_ = config_.batch.train_batch_size;
  monitors_.emplace(config_, rank_, start_step_ * samples_per_step_);
  for (const std::string& where : monitors_->destinations()) spdlog::info("monitor {}", where);
  tty_ = rank_ == 0 && isatty(STDERR_FILENO);
}

}  // namespace zrt::train
