#include "tools/train_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "config/json_reader.h"
#include "models/model_registry.h"
#include "runtime/common/error.h"
#include "tools/mem/mem_report.h"
#include "tools/mem/memory_estimate.h"
#include "train/frozen_parameters.h"

namespace zrt::cli {

namespace {

// --check's default world size: the file's batch numbers when it gives all three, else 1.
int default_check_world(const nlohmann::json& document) {
  if (!document.is_object()) return 1;
  bool all_three = true;
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    const auto it = document.find(key);
    all_three = all_three && it != document.end() && it->is_number();
  }
  if (all_three) return 0;  // parse_config takes it from the three numbers
  // Sequence parallelism runs on at least one group of its size: the smallest world it fits.
  const auto sp = document.find("sequence_parallel_size");
  if (sp != document.end() && sp->is_number_integer() && sp->get<std::int64_t>() > 1 &&
      sp->get<std::int64_t>() <= 1 << 20) {
    return static_cast<int>(sp->get<std::int64_t>());
  }
  return 1;
}

void print_lines(std::FILE* out, const std::string& prefix, const std::string& text) {
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::fprintf(out, "%s%s\n", prefix.c_str(), text.substr(begin, end - begin).c_str());
    begin = end + 1;
  }
}

std::size_t count_lines(const std::string& text) {
  return 1 + static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

// "1.2 GB", or "3.4 MB" below a gigabyte (decimal units, as zrt-mem), so small models do not
// read "0.0".
std::string bytes_text(std::int64_t bytes) {
  if (bytes >= 1000000000) return mem::gb(bytes) + " GB";
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

// What the run checks when it builds the model (dimensions against the preset, what sequence
// and expert parallelism ask of its heads and experts, model.frozen / model.trainable against
// its names), on `config`: the problems' text, empty when there are none.
struct ModelCheck {
  mem::Inputs in;
  std::string frozen;             // describe_frozen's line, when parameters are marked
  std::vector<ParamSpec> marked;  // the parameters with model.frozen / model.trainable marked
  std::string problems;
};

// model.frozen / model.trainable against the model's names, as the run matches them (an
// expert's tensors by their fused names at any autoep_size, ParamSpec::pattern_name): marks
// `params` and returns describe_frozen's line; InvalidArgument for a pattern that matches
// nothing or leaves nothing to train.
std::string check_frozen(const ModelConfig& model, std::vector<ParamSpec>& params,
                         const std::string& description) {
  const train::FrozenMarks marks = train::mark_frozen_parameters(model, params);
  train::check_frozen_patterns(model, marks.matches, marks.total_params - marks.frozen_params,
                               params, description);
  return train::describe_frozen(model, marks);
}

ModelCheck check_model(const Config& config) {
  ModelCheck m;
  try {
    m.in = mem::inputs_from_config(config);
    m.in.validate();
    if (!config.model.frozen.empty() || !config.model.trainable.empty()) {
      m.marked = m.in.model->params;
      m.frozen = check_frozen(config.model, m.marked, m.in.model->description);
    }
  } catch (const InvalidArgument& e) {
    m.problems = e.message();
  }
  return m;
}

// The checks that read the model block alone: its dimensions resolved against the preset, and
// model.frozen / model.trainable against its names. They hold whatever the rest of the config
// says, so they run beside problems in the keys check_model also reads (the ZeRO block, the
// precision, the batch), where check_model cannot.
std::string model_block_problems(const ModelConfig& model) {
  try {
    const std::unique_ptr<ModelDef> def = builtin_models().resolve(model);
    if (!model.frozen.empty() || !model.trainable.empty()) {
      std::vector<ParamSpec> params = def->parameters();
      check_frozen(model, params, def->describe());
    }
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return {};
}

// Whether the model's checks can run on a config with problems: only when every problem is
// about a key they do not read (the optimizer, the schedule, checkpoints, monitors, the run's
// length and logging, the data: of data they read only document_mask, for the memory estimate,
// never for a problem), so a rejected value left at its default cannot make them report what
// is not there.
bool model_checks_apply(const ConfigDraft& draft) {
  static const char* const kIndependent[] = {"optimizer",
                                             "scheduler",
                                             "checkpoint",
                                             "train",
                                             "data",
                                             "tensorboard",
                                             "csv_monitor",
                                             "wandb",
                                             "comet",
                                             "comms_logger",
                                             "flops_profiler",
                                             "trace",
                                             "seed",
                                             "output_dir",
                                             "log_level",
                                             "steps_per_print",
                                             "wall_clock_breakdown",
                                             "memory_breakdown",
                                             "dump_state",
                                             "timers",
                                             "gradient_clipping"};
  for (const std::string& key : draft.problem_keys) {
    const std::string top = key.substr(0, key.find('.'));
    if (std::find(std::begin(kIndependent), std::end(kIndependent), top) ==
        std::end(kIndependent)) {
      return false;
    }
  }
  return true;
}

void print_model_problems(const std::string& config_path, const std::string& problems) {
  print_lines(stdout, fmt::format("  {}: model: ", config_path), problems);
}

}  // namespace

std::string model_problems_beside(const ConfigDocument& d, int world,
                                  const std::string& config_path) {
  if (!d.json.is_object()) return {};
  try {
    const ConfigDraft draft = draft_config(d.json, world, config_path, d.command_line_paths);
    if (draft.problems.empty()) return {};
    if (model_checks_apply(draft)) return check_model(draft.config).problems;
    // A problem in the model block itself (or in no single key) leaves its draft at defaults
    // that are not the user's model: nothing is checked then.
    for (const std::string& key : draft.problem_keys) {
      if (key.empty() || key.substr(0, key.find('.')) == "model") return {};
    }
    return model_block_problems(draft.config.model);
  } catch (const InvalidArgument&) {
    // The config's reading failed before a draft: its error is the one to report.
  }
  return {};
}

ConfigDocument read_config_document(const std::string& config_path,
                                    const ConfigOverrides& overrides) {
  ConfigDocument d;
  d.json = config::read_json_file(config_path);
  d.command_line_paths = apply_overrides(d.json, overrides);
  return d;
}

int check_training_config(const CheckArguments& args) {
  Config config;
  int assumed_world = 0;
  ConfigDocument d;
  int world = 0;
  try {
    d = read_config_document(args.config_path, args.overrides);
    assumed_world = default_check_world(d.json);
    world = args.world.value_or(assumed_world);
    config = parse_config(d.json, world, args.config_path, d.command_line_paths);
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    const std::string model_problems = model_problems_beside(d, world, args.config_path);
    const std::size_t n =
        count_lines(message) + (model_problems.empty() ? 0 : count_lines(model_problems));
    std::printf("config: INVALID: %zu problem%s (the most fundamental first)\n", n,
                n == 1 ? "" : "s");
    print_lines(stdout, "  ", message);
    if (!model_problems.empty()) print_model_problems(args.config_path, model_problems);
    if (!args.world && assumed_world > 0) {
      std::printf(
          "  (checked for %d rank%s, --check's assumption: give --world N, the rank "
          "count the run will have)\n",
          assumed_world, assumed_world == 1 ? "" : "s");
    }
    return 1;
  }

  // The model's own checks (dimensions against the preset, what sequence parallelism asks of
  // its heads) happen when it is built: do them here too, before the config is called valid,
  // so --check finds what the start of the run would.
  ModelCheck model = check_model(config);
  if (!model.problems.empty()) {
    const std::size_t n = count_lines(model.problems);
    std::printf("config: INVALID: %zu problem%s\n", n, n == 1 ? "" : "s");
    print_model_problems(args.config_path, model.problems);
    if (!config.warnings.empty()) {
      std::printf("warnings: %zu\n", config.warnings.size());
      for (const std::string& w : config.warnings) std::printf("  %s\n", w.c_str());
    }
    return 1;
  }
  const mem::Inputs& in = model.in;
  const std::string& frozen = model.frozen;
  const std::vector<ParamSpec>& marked = model.marked;

  const BatchConfig& b = config.batch;
  std::printf("config: %s is valid for %d rank%s%s\n", args.config_path.c_str(), b.world_size,
              b.world_size == 1 ? "" : "s",
              args.overrides.empty()
                  ? ""
                  : fmt::format(" (with {} command-line override{})", args.overrides.size(),
                                args.overrides.size() == 1 ? "" : "s")
                        .c_str());
  // The batch rule counts the data-parallel ranks: an sp group trains one sequence together.
  const int sp = config.engine.sequence_parallel_size;
  const int dp = b.world_size / sp;
  std::printf("batch: train_batch_size %lld = micro-batch %lld x accumulation %d x %s\n",
              static_cast<long long>(b.train_batch_size),
              static_cast<long long>(b.micro_batch_size), b.gradient_accumulation_steps,
              sp > 1 ? fmt::format("data-parallel degree {} (world {} / sequence_parallel_size {})",
                                   dp, b.world_size, sp)
                           .c_str()
                     : fmt::format("{} rank{}", dp, dp == 1 ? "" : "s").c_str());
  if (config.warnings.empty()) {
    std::printf("warnings: none\n");
  } else {
    std::printf("warnings: %zu\n", config.warnings.size());
    for (const std::string& w : config.warnings) std::printf("  %s\n", w.c_str());
  }
  std::printf("resolved config (defaults filled in):\n");
  print_lines(stdout, "  ", resolved_document(config).dump(2));

  std::vector<mem::Estimate> estimates;
  for (const mem::Setting& s : mem::table_order()) {
    estimates.push_back(mem::estimate(in, s));
  }
  const mem::Estimate mine = mem::estimate(in, in.setting());
  const auto capacity = static_cast<std::int64_t>(std::llround(in.device_gib * 1073741824.0));
  const bool fits = mine.device_total() <= capacity;
  // A CPU rank without device.memory_limit_gb has no cap to exceed: the estimate is advice.
  const bool capped = config.device.type != DeviceChoice::kCpu || config.device.memory_limit_gb > 0;
  std::printf("model: %s\n", in.model->description.c_str());
  if (!frozen.empty()) std::printf("  %s\n", frozen.c_str());
  // Where the backward ends, as the run's engine will end it (zrt-mem replays its schedule).
  const std::string stop =
      train::describe_backward_stop(marked, mine.first_backward_module, in.model->num_modules);
  if (!stop.empty()) std::printf("  %s\n", stop.c_str());
  std::printf(
      "memory (zrt-mem): %s needs %s per rank on the device (model state %s, activations %s, "
      "buffers %s); the device has %g GiB (%s%s): %s\n",
      in.name(mine.setting).c_str(), bytes_text(mine.device_total()).c_str(),
      bytes_text(mine.model_state()).c_str(), bytes_text(mine.activations()).c_str(),
      bytes_text(mine.buffers()).c_str(), in.device_gib, bytes_text(capacity).c_str(),
      config.device.memory_limit_gb > 0 ? ", device.memory_limit_gb" : ", zrt-mem's default",
      fits ? "fits" : (capped ? "DOES NOT FIT" : "over, but CPU ranks have no cap"));
  std::printf("  %s\n", mem::format_verdict(in, estimates).c_str());
  std::printf("  (the whole table: zrt-mem --config %s --world %d)\n", args.config_path.c_str(),
              b.world_size);
  if (!fits && capped) {
    std::printf("result: the config is valid but does not fit the device\n");
    return 1;
  }
  std::printf("result: OK\n");
  return 0;
}

}  // namespace zrt::cli
