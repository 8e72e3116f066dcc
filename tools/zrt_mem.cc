// zrt-mem: how much memory a run needs per rank and per node, for every ZeRO stage, before
// running it; and the first setting that fits the device. See docs/choosing-a-stage.md.
//
//   zrt-mem (--model gpt2-xl | --params 7.5e9 | --config run.json) --world 8 [--nodes 2]
//           [--stage 3] [--offload-optimizer cpu] [--offload-param cpu] [--micro-batch 4]
//           [--seq 1024] [--sp 4] [--ep 4] [--dtype bf16] [--grad-accum-dtype fp32] [--device-gb
//           80] ...
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "config/config.h"
#include "config/json_reader.h"
#include "optimizers/optimizer.h"
#include "optimizers/optimizer_config.h"
#include "runtime/common/error.h"
#include "runtime/common/log.h"
#include "tools/mem/longest_sequence.h"
#include "tools/mem/mem_report.h"
#include "tools/mem/memory_estimate.h"

using namespace zrt;

namespace {

const char* kUsage = R"(usage: zrt-mem (--model SPEC | --params N | --config FILE) [options]

What one rank holds on its device and one node in host memory, by category, for the chosen
ZeRO setting; a table of stages 0-3 with and without offload; and the first setting that fits
the device (order: stage 0, 1, 2, 2 + optimizer offload, 3, 3 + optimizer offload, 3 +
optimizer and parameter offload).

model (one of):
  --model SPEC              a built-in model: a preset (listed at the end) or a spec, e.g.
                            "gpt2:n_layer=24", "n_layer=4,n_head=4,n_embd=128,vocab_size=256,
                            seq_len=128", "llama-3.1-8b:seq_len=4096",
                            "llama:hidden_size=512,...", "qwen3-30b-a3b:num_hidden_layers=8"
                            (exact: the engine's partition, padding and schedule)
  --params N                a parameter count, e.g. 7.5e9 (the ZeRO paper's formulas)
  --config FILE             a zrt-train config: model, batch, dtypes, zero_optimization,
                            activation checkpointing and device.memory_limit_gb from it;
                            the options below override it
options:
  --world N                 ranks (default: from the config's batch numbers, else 1)
  --nodes N                 nodes the ranks are spread over (default: world / the config's
                            comm.ranks_per_node, else 1; host figures per node)
  --stage S                 the setting printed in detail (default: the config's stage and
                            offload, else the verdict's)
  --offload-optimizer cpu|none, --offload-param cpu|none
  --offload-ratio R         offload_optimizer.ratio: the share of the optimizer state offloaded
                            at stage 3 (default 1; the rest stays on the device)
  --micro-batch B           sequences per micro-batch (default 1)
  --gas G                   gradient_accumulation_steps (default: the config's, else 1); with
                            optimizer offload at stages 2-3, 1 sends the reduced gradient
                            slices to host memory as they are (no device gradient slice)
  --seq T                   tokens per sequence (default: the model's seq_len; zrt-train trains
                            at the model's seq_len, so this also sets it)
  --sp N                    sequence_parallel_size (default: the config's, else 1): each rank
                            holds T/N tokens of every sequence (its activations), attention's
                            N-th of the heads over the whole sequence, the all-to-alls' buffers
  --ep N                    expert_parallel.autoep_size (default: the config's, else 1), for a
                            mixture of experts at stages 0-3: each rank holds E/N of every MoE
                            layer's experts as units of their own, sliced over world/N ranks
                            (the dense units over the world); the rows its experts receive
                            counted at --expert-rows-reserve, the worst case beside them
  --expert-rows-reserve F   with --ep: the rows a rank's experts' buffers hold, over the balanced
                            share tokens x k (model.expert_rows_reserve, default 1.25; a run's
                            metrics.jsonl prints the load its routing reached, expert_rows_load)
  --optimizer adam|adamw|lion  the optimizer (default: the config's, else AdamW): its fp32
                            state is 12 bytes per parameter for Adam, 8 for Lion
  --dtype fp32|bf16|fp16    compute dtype (default bf16)
  --grad-accum-dtype D      gradient accumulation dtype (default fp32, as zrt-train)
  --comm-dtype D            communication_data_type (default: the compute dtype)
  --activation-checkpointing   count the checkpointed activations in the total
  --cpu-checkpointing       with --activation-checkpointing: the kept block inputs in pinned
                            host memory (activation_checkpointing.cpu_checkpointing)
  --head-tile-rows N, --mlp-tile-rows N
                            rows per tile of the head and of the MLP (the Llama's, a mixture
                            of experts' MoE layers and dense MLPs; model.tiling: 0 automatic,
                            the default; -1 never tiled)
  --reduce-bucket-size N, --prefetch-bucket-size N, --max-live-parameters N,
  --max-reuse-distance N, --persistence-threshold N
                            zero_optimization knobs (elements; DeepSpeed's defaults, but
                            --max-reuse-distance 0 as zrt-train's)
  --hpz S                   ZeRO++ hpZ (zero_hpz_partition_size) at stage 3: secondary shards of
                            1/S of each gathered unit, S dividing the ranks per node
  --mics S                  MiCS (zero_optimization.mics_shard_size) at stages 1-3: the state
                            sliced over groups of S consecutive ranks, replicated across them
                            (with --ep the experts' over their ranks in each group)
  --device-gb G             device memory per rank in GiB, as device.memory_limit_gb (default 80)
  --device cuda|cpu         the backend (default cuda; a config's device.type): the CPU backend's
                            MPI collectives add scratch to the comm category, NCCL's is untracked
  --max-seq-len             instead of the report: for every setting, the longest sequence (a
                            multiple of --seq-multiple tokens) whose exact estimate fits
                            --device-gb per rank (and --host-gb per node), and what stops the next
  --seq-multiple M          the lengths --max-seq-len tries are multiples of M (default 64)
  --host-gb G               host memory per node in GiB for --max-seq-len (default: no limit)
  -h, --help
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "zrt-mem: %s\n(zrt-mem --help for usage)\n", message.c_str());
  std::exit(2);
}

double parse_number(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs a number, not '" + value + "'");
}

int parse_int(const std::string& flag, const std::string& value) {
  const double v = parse_number(flag, value);
  if (v != static_cast<double>(static_cast<int>(v))) {
    usage_error(flag + " needs an integer, not '" + value + "'");
  }
  return static_cast<int>(v);
}

bool parse_offload(const std::string& flag, const std::string& value) {
  if (value == "cpu") return true;
  if (value == "none") return false;
  if (value == "nvme") usage_error(flag + " nvme: NVMe offload is not implemented");
  usage_error(flag + " must be cpu or none, not '" + value + "'");
}

// zrt-mem --max-seq-len: a line per setting of the verdict order.
std::string longest_sequences_report(const ModelDef& model, const mem::Inputs& in, int multiple,
                                     double device_gib, double host_gib) {
  constexpr double kGiB = 1073741824.0;
  std::string out = fmt::format(
      "longest sequence per setting: {} on {} rank(s) over {} node(s){}{}, micro-batch {}, {}, "
      "{:.1f} GiB device per rank{}; lengths in multiples of {}\n",
      model.name(), in.world, in.nodes,
      in.engine.sequence_parallel_size > 1
          ? fmt::format(", sequence_parallel_size {}", in.engine.sequence_parallel_size)
          : "",
      in.engine.expert_parallel_size > 1
          ? fmt::format(", expert_parallel.autoep_size {}", in.engine.expert_parallel_size)
          : "",
      in.micro_batch,
      in.activation_checkpointing
          ? (in.cpu_checkpointing ? "activation checkpointing in host memory"
                                  : "activation checkpointing")
          : "no activation checkpointing",
      device_gib, host_gib > 0 ? fmt::format(", {:.1f} GiB host per node", host_gib) : "",
      multiple);
  for (const mem::Setting& s : mem::verdict_order()) {
    const mem::SequenceFit fit = mem::longest_sequence(
        model, in, s, static_cast<std::int64_t>(std::llround(device_gib * kGiB)),
        static_cast<std::int64_t>(std::llround(host_gib * kGiB)), multiple);
    if (fit.seq_len == 0) {
      out += fmt::format("  {:<44} none fits ({})\n", in.name(s), fit.limit);
      continue;
    }
    out +=
        fmt::format("  {:<44} {:>9} tokens  device {:6.1f} GiB  host/node {:7.1f} GiB  next: {}\n",
                    in.name(s), fit.seq_len, fit.estimate.device_total() / kGiB,
                    fit.estimate.host_node_total() / kGiB, fit.limit);
  }
  return out;
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args;
  bool checkpointing_flag = false;
  bool max_seq_len_flag = false;
  bool cpu_checkpointing_flag = false;
  const std::map<std::string, bool> known = {{"--model", true},
                                             {"--params", true},
                                             {"--config", true},
                                             {"--world", true},
                                             {"--nodes", true},
                                             {"--stage", true},
                                             {"--offload-optimizer", true},
                                             {"--offload-param", true},
                                             {"--offload-ratio", true},
                                             {"--micro-batch", true},
                                             {"--gas", true},
                                             {"--seq", true},
                                             {"--sp", true},
                                             {"--ep", true},
                                             {"--dtype", true},
                                             {"--grad-accum-dtype", true},
                                             {"--comm-dtype", true},
                                             {"--reduce-bucket-size", true},
                                             {"--prefetch-bucket-size", true},
                                             {"--max-live-parameters", true},
                                             {"--max-reuse-distance", true},
                                             {"--persistence-threshold", true},
                                             {"--device-gb", true},
                                             {"--device", true},
                                             {"--optimizer", true},
                                             {"--hpz", true},
                                             {"--mics", true},
                                             {"--seq-multiple", true},
                                             {"--host-gb", true},
                                             {"--head-tile-rows", true},
                                             {"--mlp-tile-rows", true},
                                             {"--expert-rows-reserve", true}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      // The presets from the registry, so a model added there is listed without editing this.
      std::fputs("\npresets (--model):\n", stdout);
      for (const std::string& type : builtin_models().types()) {
        const ModelEntry& entry = builtin_models().entry(type);
        if (entry.presets.empty()) continue;
        std::string line = "  " + type + ":";
        std::string text;
        for (const std::string& preset : entry.presets) {
          if (line.size() + 1 + preset.size() > 98) {
            text += line + "\n";
            line = "   ";
          }
          line += " " + preset;
        }
        std::fputs((text + line + "\n").c_str(), stdout);
      }
      return 0;
    }
    if (a == "--activation-checkpointing") {
      checkpointing_flag = true;
      continue;
    }
    if (a == "--cpu-checkpointing") {
      cpu_checkpointing_flag = true;
      continue;
    }
    if (a == "--max-seq-len") {
      max_seq_len_flag = true;
      continue;
    }
    if (known.count(a) == 0) usage_error("unknown option '" + a + "'");
    if (i + 1 >= argc) usage_error(a + " needs a value");
    args[a] = argv[++i];
  }
  const int sources =
      static_cast<int>(args.count("--model") + args.count("--params") + args.count("--config"));
  if (sources != 1) usage_error("give exactly one of --model, --params, --config");

  mem::Inputs in;
  in.engine.compute_dtype = DType::kBFloat16;
  std::optional<int> chosen_stage;
  // The model: the config's model block, or --model in the default model.type's spec syntax.
  std::shared_ptr<const ModelDef> model;
  if (args.count("--config")) {
    // Planning for another world size than the file's batch numbers imply: keep the
    // micro-batch (what sets activation memory) and let the batch rule solve the global batch.
    const int world = args.count("--world") ? parse_int("--world", args["--world"]) : 0;
    nlohmann::json document = config::read_json_file(args["--config"]);
    // The flags that enter the batch rule (sp divides the world into data-parallel ranks) go
    // into the document before it is read, so trying --sp 1, 2, 4 against one file works.
    if (document.is_object()) {
      if (args.count("--sp")) {
        document["sequence_parallel_size"] = parse_int("--sp", args["--sp"]);
      }
      if (args.count("--micro-batch")) {
        document["train_micro_batch_size_per_gpu"] =
            parse_int("--micro-batch", args["--micro-batch"]);
      }
      if (args.count("--gas")) {
        document["gradient_accumulation_steps"] = parse_int("--gas", args["--gas"]);
      }
      if (world > 0 && document.contains("train_micro_batch_size_per_gpu") &&
          document["train_micro_batch_size_per_gpu"].is_number()) {
        document.erase("train_batch_size");
      }
    }
    const Config config = parse_config(document, world, args["--config"]);
    in = mem::inputs_from_config(config);
    model = in.model->def;
    chosen_stage = config.engine.stage;
  }

  if (args.count("--world")) in.world = parse_int("--world", args["--world"]);
  if (args.count("--nodes")) in.nodes = parse_int("--nodes", args["--nodes"]);
  if (args.count("--stage")) chosen_stage = parse_int("--stage", args["--stage"]);
  if (args.count("--optimizer")) {
    const std::string& name = args["--optimizer"];
    if (!unsupported_optimizer_type(name).empty()) {
      usage_error("--optimizer must be adam, adamw or lion, not '" + name + "'");
    }
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    in.optimizer = optimizer_spec(lower == "lion" ? OptimizerKind::kLion : OptimizerKind::kAdam);
  }
  if (args.count("--offload-optimizer"))
    in.engine.offload_optimizer.enabled =
        parse_offload("--offload-optimizer", args["--offload-optimizer"]);
  if (args.count("--offload-ratio"))
    in.engine.offload_optimizer.ratio = parse_number("--offload-ratio", args["--offload-ratio"]);
  if (args.count("--offload-param"))
    in.engine.offload_param.enabled = parse_offload("--offload-param", args["--offload-param"]);
  if (args.count("--micro-batch"))
    in.micro_batch = parse_int("--micro-batch", args["--micro-batch"]);
  if (args.count("--gas"))
    in.engine.gradient_accumulation_steps = parse_int("--gas", args["--gas"]);
  if (args.count("--sp")) {
    in.engine.sequence_parallel_size = parse_int("--sp", args["--sp"]);
    if (in.engine.sequence_parallel_size < 1) usage_error("--sp must be >= 1");
  }
  if (args.count("--ep")) {
    in.engine.expert_parallel_size = parse_int("--ep", args["--ep"]);
    if (in.engine.expert_parallel_size < 1)
      usage_error("--ep must be >= 1 (1: every expert local)");
  }
  if (args.count("--dtype")) in.engine.compute_dtype = parse_dtype(args["--dtype"]);
  if (args.count("--grad-accum-dtype"))
    in.engine.grad_accum_dtype = parse_dtype(args["--grad-accum-dtype"]);
  if (args.count("--comm-dtype")) in.engine.communication_dtype = parse_dtype(args["--comm-dtype"]);
  if (args.count("--reduce-bucket-size"))
    in.engine.reduce_bucket_size = static_cast<std::int64_t>(
        parse_number("--reduce-bucket-size", args["--reduce-bucket-size"]));
  if (args.count("--prefetch-bucket-size"))
    in.engine.stage3_prefetch_bucket_size = static_cast<std::int64_t>(
        parse_number("--prefetch-bucket-size", args["--prefetch-bucket-size"]));
  if (args.count("--max-live-parameters"))
    in.engine.stage3_max_live_parameters = static_cast<std::int64_t>(
        parse_number("--max-live-parameters", args["--max-live-parameters"]));
  if (args.count("--max-reuse-distance"))
    in.engine.stage3_max_reuse_distance = static_cast<std::int64_t>(
        parse_number("--max-reuse-distance", args["--max-reuse-distance"]));
  if (args.count("--persistence-threshold"))
    in.engine.stage3_param_persistence_threshold = static_cast<std::int64_t>(
        parse_number("--persistence-threshold", args["--persistence-threshold"]));
  if (args.count("--hpz")) {
    in.engine.hpz_partition_size = parse_int("--hpz", args["--hpz"]);
    if (in.engine.hpz_partition_size < 1) usage_error("--hpz must be >= 1 (1: off)");
  }
  if (args.count("--mics")) {
    in.engine.mics_shard_size = parse_int("--mics", args["--mics"]);
    if (in.engine.mics_shard_size < 1) usage_error("--mics must be >= 1 (ranks per shard group)");
  }
  if (args.count("--device")) {
    const std::string d = args["--device"];
    if (d != "cuda" && d != "cpu") usage_error("--device must be cuda or cpu, not '" + d + "'");
    in.device_type = d == "cpu" ? DeviceType::kCpu : DeviceType::kCuda;
  }
  if (args.count("--device-gb")) in.device_gib = parse_number("--device-gb", args["--device-gb"]);
  if (checkpointing_flag) in.activation_checkpointing = true;
  if (cpu_checkpointing_flag) in.cpu_checkpointing = true;
  if (args.count("--head-tile-rows"))
    in.head_tile_rows = parse_int("--head-tile-rows", args["--head-tile-rows"]);
  if (args.count("--mlp-tile-rows"))
    in.mlp_tile_rows = parse_int("--mlp-tile-rows", args["--mlp-tile-rows"]);
  if (args.count("--expert-rows-reserve")) {
    in.expert_rows_reserve = parse_number("--expert-rows-reserve", args["--expert-rows-reserve"]);
    if (!(in.expert_rows_reserve >= 1.0)) {
      usage_error("--expert-rows-reserve must be >= 1 (the balanced share of the rows)");
    }
  }
  if (in.head_tile_rows < -1 || in.mlp_tile_rows < -1) {
    usage_error(
        "--head-tile-rows and --mlp-tile-rows take a row count, 0 (automatic) or -1 (never)");
  }
  for (const auto& [flag, field] :
       {std::pair{"--world", in.world}, {"--nodes", in.nodes}, {"--micro-batch", in.micro_batch}}) {
    if (field < 1) usage_error(std::string(flag) + " must be >= 1");
  }
  if (args.count("--params")) {
    in.params = parse_number("--params", args["--params"]);
    if (!(in.params >= 1.0)) usage_error("--params must be >= 1");
  } else {
    if (args.count("--model")) model = builtin_models().parse_spec(args["--model"]);
    if (args.count("--seq")) {
      // zrt-train trains at the model's seq_len (a GPT's wpe has seq_len rows), so --seq sets it.
      model = model->with_seq_len(parse_int("--seq", args["--seq"]));
    }
    in.seq_len = model->seq_len();
    // The config's model.frozen / model.trainable stay (the model itself may have changed: --seq).
    const std::optional<mem::ModelSpec> from_config = in.model;
    in.model = mem::model_spec(model);
    if (from_config) {
      in.model->frozen = from_config->frozen;
      in.model->trainable = from_config->trainable;
    }
  }
  if (args.count("--seq") && args.count("--params")) {
    usage_error("--seq needs a model (--model or --config): activations need its dimensions");
  }
  // Without a stage the verdict picks one; the inputs are checked at the first the engine runs.
  in.engine.stage = chosen_stage.value_or(0);

  if (max_seq_len_flag) {
    if (!model) usage_error("--max-seq-len needs a model (--model or --config)");
    const int multiple =
        args.count("--seq-multiple") ? parse_int("--seq-multiple", args["--seq-multiple"]) : 64;
    if (multiple < 1) usage_error("--seq-multiple must be >= 1");
    if (multiple % in.engine.sequence_parallel_size != 0) {
      usage_error(
          fmt::format("--seq-multiple {} must be a multiple of --sp {} (each rank holds "
                      "an equal chunk of every sequence)",
                      multiple, in.engine.sequence_parallel_size));
    }
    // The search sets the length: the inputs are checked at its first candidate, not at the
    // model's own seq_len, which --sp need not divide.
    mem::Inputs first = in;
    first.model = mem::model_spec(model->with_seq_len(multiple));
    first.model->frozen = in.model->frozen;
    first.model->trainable = in.model->trainable;
    first.seq_len = multiple;
    first.validate();
    const double host_gib =
        args.count("--host-gb") ? parse_number("--host-gb", args["--host-gb"]) : 0;
    if (host_gib < 0) usage_error("--host-gb must be >= 0");
    std::fputs(longest_sequences_report(*model, in, multiple, in.device_gib, host_gib).c_str(),
               stdout);
    return 0;
  }
  in.validate();
  std::vector<mem::Estimate> estimates;
  for (const mem::Setting& s : mem::table_order()) {
    estimates.push_back(mem::estimate(in, s));
  }
  mem::Setting chosen = in.setting();
  if (!chosen_stage) {
    // No stage given: detail the verdict's choice (the most sharded setting if nothing fits).
    const auto fit = mem::first_fit(
        estimates, static_cast<std::int64_t>(std::llround(in.device_gib * 1073741824.0)));
    chosen = fit.value_or(mem::verdict_order().back());
  }
  const mem::Estimate detail = mem::estimate(in, chosen);
  std::fputs(mem::format_report(in, detail, estimates).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zrt::init_tool_logging("zrt-mem");  // a config's warnings on stderr, not in the table
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-mem: %s\n", zrt::error_text(e).c_str());
    return 1;
  }
}
