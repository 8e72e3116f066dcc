// zrt-ckpt: look into, check and convert zrt checkpoints (docs/checkpoints.md).
//   zrt-ckpt inspect DIR                      step, world, stage, dtypes, the parameter table
//   zrt-ckpt verify DIR                       every checksum of the index and the rank files
//   zrt-ckpt consolidate DIR --out model.h5   one fp32 dataset per parameter under /params
//   zrt-ckpt export DIR --safetensors F       Hugging Face safetensors + config.json (the saved
//                                             model.type's layout, through the model registry)
//   zrt-ckpt export DIR --hf OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]
//                                             a Hugging Face model directory (from_pretrained)
//   zrt-ckpt logits DIR --tokens 1,2,3        the model's fp32 logits for one sequence, as JSON
//                                             (CPU, fp32 weights: to compare with transformers)
// DIR is a checkpoint directory (<save_dir>/<tag>) or a save_dir holding a `latest` file. The
// output's folder is created when missing. Exit status: 0 done (and for --help), 1 an error
// (the message names the file and the system's reason), 2 bad arguments.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/hf/hf_weights.h"
#include "models/model_registry.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/param_match.h"
#include "runtime/common/error.h"
#include "runtime/common/log.h"
#include "runtime/device/device.h"

namespace {

namespace fs = std::filesystem;
using namespace zrt::checkpoint;

void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: zrt-ckpt COMMAND DIR [OPTIONS]\n"
      "commands:\n"
      "  inspect DIR                                 step, world, stage, dtypes, the "
      "parameter table\n"
      "  verify DIR                                  every checksum of the index and "
      "the rank files\n"
      "  consolidate DIR --out model.h5              one fp32 dataset per parameter\n"
      "  export DIR --safetensors model.safetensors  one fp32 file in Hugging Face's names "
      "+ config.json\n"
      "  export DIR --hf OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]\n"
      "                                              a Hugging Face model directory "
      "(config.json,\n"
      "                                              generation_config.json, weights, "
      "tokenizer files)\n"
      "  logits DIR --tokens 1,2,3                   fp32 logits of one sequence (JSON)\n"
      "DIR: a checkpoint (<save_dir>/<tag>), a save_dir with a 'latest' file or that file.\n"
      "The output's folder is created if needed. See docs/checkpoints.md.\n");
}

// The folder an output file goes into, created (with its parents) if missing.
void create_parent_folder(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    ZRT_THROW(zrt::Error, "cannot create the folder {} for {}: {}", parent.string(), file,
              ec.message());
  }
}

// A save_dir resolves to the checkpoint its `latest` names, and so does the `latest` file itself
// (DeepSpeed's save_dir has one too, and a path ending in it is the natural thing to type).
std::string resolve(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "index.h5")) {
    // A save's files are written under <tag>.tmp and renamed when every rank's are complete:
    // a .tmp directory is a save that never committed (a crash, a full disk, a lost rank).
    std::string name = fs::path(dir).lexically_normal().filename().string();
    if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      std::fprintf(stderr,
                   "zrt-ckpt: warning: %s is a save that never committed (a .tmp directory): "
                   "its files may be incomplete or from different steps\n",
                   dir.c_str());
    }
    return dir;
  }
  std::error_code ec;
  const fs::path path(dir);
  const bool latest_file = path.filename() == "latest" && fs::is_regular_file(path, ec);
  // A `latest` reached through a symbolic link names tags beside the file it links to.
  const fs::path target = latest_file && fs::is_symlink(path, ec) ? fs::canonical(path, ec) : path;
  const std::string save_dir = latest_file ? (ec ? path : target).parent_path().string() : dir;
  if (const auto tag = read_latest(save_dir.empty() ? "." : save_dir)) {
    return (fs::path(save_dir) / *tag).string();
  }
  ZRT_THROW(zrt::InvalidArgument,
            "{}: neither a checkpoint (no index.h5) nor a save_dir (no latest)", dir);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// The checkpoint's whole model, handed to the exporter of the architecture that saved it.
void export_safetensors(const std::string& dir, const std::string& out) {
  const CheckpointIndex index = open_index(dir);
  std::vector<std::vector<float>> values = read_full_params(dir, index);
  zrt::ExportInput input;
  input.checkpoint = dir;
  input.config_json = index.config_json;
  for (std::size_t p = 0; p < index.params.size(); ++p) {
    input.tensors.push_back({index.params[p].name, index.params[p].shape, std::move(values[p])});
  }
  zrt::builtin_models().export_safetensors(std::move(input), out);
}

zrt::ExportInput export_input(const std::string& dir, const CheckpointIndex& index) {
  std::vector<std::vector<float>> values = read_full_params(dir, index);
  zrt::ExportInput input;
  input.checkpoint = dir;
  input.config_json = index.config_json;
  for (std::size_t p = 0; p < index.params.size(); ++p) {
    input.tensors.push_back({index.params[p].name, index.params[p].shape, std::move(values[p])});
  }
  return input;
}

zrt::DType parse_dtype_name(const std::string& name, const std::string& what) {
  if (name == "fp32") return zrt::DType::kFloat32;
  if (name == "bf16") return zrt::DType::kBFloat16;
  if (name == "fp16") return zrt::DType::kFloat16;
  ZRT_THROW(zrt::InvalidArgument, "{} '{}': expected fp32, bf16 or fp16", what, name);
}

// A Hugging Face directory in the checkpoint's compute dtype, or `dtype` when given.
void export_hf(const std::string& dir, const std::string& out, const std::string& dtype,
               const std::string& max_shard_size) {
  const CheckpointIndex index = open_index(dir);
  zrt::HfExportOptions options;
  options.dtype = parse_dtype_name(dtype.empty() ? index.compute_dtype : dtype,
                                   dtype.empty() ? "the checkpoint's compute_dtype" : "--dtype");
  if (!max_shard_size.empty()) {
    options.max_shard_bytes = zrt::hf::parse_byte_size(max_shard_size, "--max-shard-size");
  }
  const std::vector<std::string> files =
      zrt::builtin_models().export_hf(export_input(dir, index), out, options);
  std::printf("wrote %s:", out.c_str());
  for (const std::string& f : files) std::printf(" %s", f.c_str());
  std::printf(" (%s)\n", zrt::dtype_name(options.dtype));
}

// The checkpoint's model (its saved model block, through the registry) with its fp32 master
// weights on the CPU backend, one forward pass of `tokens`: the logits, as JSON on stdout.
int logits(const std::string& dir, const std::string& token_text) {
  std::vector<std::int32_t> tokens;
  for (std::size_t pos = 0; pos < token_text.size();) {
    std::size_t end = token_text.find(',', pos);
    if (end == std::string::npos) end = token_text.size();
    const std::string item = token_text.substr(pos, end - pos);
    std::size_t used = 0;
    long value = -1;
    try {
      value = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || value < 0) {
      ZRT_THROW(zrt::InvalidArgument, "--tokens: '{}' is not a token id", item);
    }
    tokens.push_back(static_cast<std::int32_t>(value));
    pos = end + 1;
  }
  if (tokens.empty()) ZRT_THROW(zrt::InvalidArgument, "--tokens: no token ids");
  const CheckpointIndex index = open_index(dir);
  const auto def = zrt::builtin_models().resolve(zrt::saved_model_config(index.config_json, dir));
  const int T = static_cast<int>(tokens.size());
  if (T > def->seq_len()) {
    ZRT_THROW(zrt::InvalidArgument, "--tokens: {} tokens, the model's seq_len is {}", T,
              def->seq_len());
  }
  for (const std::int32_t t : tokens) {
    if (t >= def->vocab_size()) {
      ZRT_THROW(zrt::InvalidArgument, "--tokens: token {} >= vocab_size {}", t, def->vocab_size());
    }
  }
  std::vector<std::vector<float>> values = read_full_params(dir, index);
  auto device = zrt::make_device(zrt::DeviceOptions{});
  auto stream = device->create_stream("compute");
  zrt::kernels::KernelContext ctx(*device, *stream);
  auto model = def->build(ctx, zrt::ModelOptions{});
  const auto& params = model->parameters();
  zrt::FlatParamAccess access(*device, *stream, params, model->num_modules(), zrt::DType::kFloat32,
                              zrt::DType::kFloat32);
  // By name: a checkpoint of several shard groups lists the experts after the dense units,
  // one parameter each where the model stacks them (param_match.h).
  const zrt::checkpoint::ParamSources sources =
      zrt::checkpoint::find_params(index, params, (fs::path(dir) / "index.h5").string());
  std::vector<bool> used(index.params.size(), false);
  for (std::size_t p = 0; p < params.size(); ++p) {
    for (const auto& run : sources[p]) used[static_cast<std::size_t>(run.row)] = true;
    access.set_param(static_cast<int>(p), zrt::checkpoint::assemble_param(sources[p], values));
  }
  for (std::size_t q = 0; q < used.size(); ++q) {
    if (!used[q]) {
      ZRT_THROW(zrt::InvalidArgument, "{}: the checkpoint's parameter '{}' is not in the model",
                dir, index.params[q].name);
    }
  }
  const auto bytes = static_cast<std::int64_t>(tokens.size() * sizeof(std::int32_t));
  zrt::Buffer inputs = device->allocate(bytes, zrt::MemCategory::kOther, "tokens");
  device->copy_to_device(inputs.device<std::byte>(), tokens.data(), static_cast<std::size_t>(bytes),
                         *stream);
  zrt::TokenBatch batch;
  batch.inputs = inputs.device<const std::int32_t>();
  batch.batch = 1;
  batch.seq_len = T;
  model->forward(access, batch);
  const int V = def->vocab_size();
  std::vector<float> out(static_cast<std::size_t>(T) * static_cast<std::size_t>(V));
  device->copy_to_host(out.data(), model->logits(), out.size() * sizeof(float), *stream);
  stream->synchronize();
  nlohmann::json doc;
  doc["tokens"] = tokens;
  doc["vocab_size"] = V;
  doc["logits"] = nlohmann::json::array();
  for (int t = 0; t < T; ++t) {
    doc["logits"].push_back(std::vector<float>(out.begin() + std::int64_t{t} * V,
                                               out.begin() + std::int64_t{t + 1} * V));
  }
  std::printf("%s\n", doc.dump().c_str());
  return 0;
}

// The rank files holding a parameter's elements, as ranges ("0-2", "1", "0,2").
std::string holding_ranks(const CheckpointIndex& index, const ParamEntry& p) {
  if (p.unit < 0 || p.unit >= static_cast<std::int64_t>(index.units.size())) return "?";
  const auto& unit = index.units[static_cast<std::size_t>(p.unit)];
  if (unit.shard <= 0 || unit.slices.empty()) return "-";
  std::set<std::int64_t> ranks;
  const std::int64_t first = p.offset / unit.shard;
  const std::int64_t last = p.numel > 0 ? (p.offset + p.numel - 1) / unit.shard : first;
  for (std::int64_t s = first; s <= last && s < static_cast<std::int64_t>(unit.slices.size());
       ++s) {
    ranks.insert(unit.slices[static_cast<std::size_t>(s)].rank);
  }
  std::string text;
  for (auto it = ranks.begin(); it != ranks.end();) {
    std::int64_t end = *it;
    auto next = std::next(it);
    while (next != ranks.end() && *next == end + 1) end = *next++;
    if (!text.empty()) text += ",";
    text += end == *it ? std::to_string(*it) : fmt::format("{}-{}", *it, end);
    it = next;
  }
  return text;
}

int inspect(const std::string& dir) {
  const CheckpointIndex index = open_index(dir);
  std::int64_t total = 0;
  for (const auto& p : index.params) total += p.numel;
  std::printf("checkpoint   %s\n", dir.c_str());
  std::printf("step         %lld (optimizer steps %lld, skipped %lld)\n",
              static_cast<long long>(index.step), static_cast<long long>(index.optimizer_steps),
              static_cast<long long>(index.skipped_steps));
  std::printf("world        %d rank file(s), ZeRO stage %d\n", index.world, index.stage);
  std::printf("dtypes       compute %s, master %s\n", index.compute_dtype.c_str(),
              index.master_dtype.c_str());
  // Only fp16 runs scale the loss; elsewhere the saved scale is an unused default.
  if (index.compute_dtype == "fp16") std::printf("loss scale   %g\n", index.loss_scale.scale);
  std::printf("data         next global sample %lld (shuffle %s, seed %llu)\n",
              static_cast<long long>(index.data.position), index.data.shuffle ? "on" : "off",
              static_cast<unsigned long long>(index.data.seed));
  std::printf("scheduler    %s\n", index.scheduler.c_str());
  std::printf("parameters   %zu tensor%s, %lld elements, %zu unit%s\n", index.params.size(),
              index.params.size() == 1 ? "" : "s", static_cast<long long>(total),
              index.units.size(), index.units.size() == 1 ? "" : "s");
  // Several shard groups (expert parallelism): each group's units and how they were sliced.
  std::map<std::int64_t, std::pair<std::int64_t, std::set<std::size_t>>> groups;
  for (const auto& u : index.units) {
    groups[u.group].first += 1;
    groups[u.group].second.insert(u.slices.size());
  }
  if (groups.size() > 1) {
    for (const auto& [group, units] : groups) {
      std::string slices;
      for (std::size_t n : units.second) slices += (slices.empty() ? "" : "/") + std::to_string(n);
      std::printf("group %-6lld %lld units, each in %s slice(s)\n", static_cast<long long>(group),
                  static_cast<long long>(units.first), slices.c_str());
    }
  }
  std::printf("\n");
  // "rank files": which rank_NNNNN.h5 hold the tensor's elements (the slices its range of the
  // unit falls in), so an expert, or any tensor, can be found on disk.
  std::printf("%-48s %-16s %10s %5s %10s  %s\n", "name", "shape", "numel", "unit", "offset",
              "rank files");
  for (const auto& p : index.params) {
    std::printf("%-48s %-16s %10lld %5lld %10lld  %s\n", p.name.c_str(),
                shape_text(p.shape).c_str(), static_cast<long long>(p.numel),
                static_cast<long long>(p.unit), static_cast<long long>(p.offset),
                holding_ranks(index, p).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0 ||
        (i == 1 && std::strcmp(argv[i], "help") == 0)) {
      usage(stdout);
      return 0;
    }
  }
  if (argc < 3) {
    usage(stderr);
    return 2;
  }
  const std::string command = argv[1];
  try {
    // Warnings (a saved model block's, OpenBLAS's) go to stderr: logits prints JSON on stdout.
    zrt::init_tool_logging("zrt-ckpt");
    const std::string dir = resolve(argv[2]);
    std::string out, hf_dir, dtype, max_shard_size, tokens;
    for (int i = 3; i < argc; ++i) {
      const std::string arg = argv[i];
      if ((arg == "--out" || arg == "--safetensors") && i + 1 < argc) {
        out = argv[++i];
      } else if (arg == "--hf" && i + 1 < argc) {
        hf_dir = argv[++i];
      } else if (arg == "--dtype" && i + 1 < argc) {
        dtype = argv[++i];
      } else if (arg == "--max-shard-size" && i + 1 < argc) {
        max_shard_size = argv[++i];
      } else if (arg == "--tokens" && i + 1 < argc) {
        tokens = argv[++i];
      } else if (arg == "--out" || arg == "--safetensors" || arg == "--hf" || arg == "--dtype" ||
                 arg == "--max-shard-size" || arg == "--tokens") {
        std::fprintf(stderr, "zrt-ckpt: %s needs a value\n", arg.c_str());
        usage(stderr);
        return 2;
      } else {
        std::fprintf(stderr, "zrt-ckpt: unexpected argument '%s'\n", arg.c_str());
        usage(stderr);
        return 2;
      }
    }
    if (command == "logits") {
      if (tokens.empty()) {
        std::fprintf(stderr, "zrt-ckpt logits: needs --tokens 1,2,3\n");
        return 2;
      }
      return logits(dir, tokens);
    }
    if (command == "export" && !hf_dir.empty()) {
      if (!out.empty()) {
        std::fprintf(stderr, "zrt-ckpt export: --hf and --safetensors are alternatives\n");
        return 2;
      }
      export_hf(dir, hf_dir, dtype, max_shard_size);
      return 0;
    }
    if (!dtype.empty() || !max_shard_size.empty()) {
      std::fprintf(stderr, "zrt-ckpt: --dtype and --max-shard-size go with export --hf\n");
      return 2;
    }
    if (command == "inspect") return inspect(dir);
    if (command == "verify") {
      const std::int64_t bytes = verify_checkpoint(dir);
      std::printf("%s: OK (%lld bytes of tensor data, every checksum matches)\n", dir.c_str(),
                  static_cast<long long>(bytes));
      return 0;
    }
    if ((command == "consolidate" || command == "export") && out.empty()) {
      std::fprintf(stderr, "zrt-ckpt %s: needs %s\n", command.c_str(),
                   command == "export" ? "--safetensors FILE or --hf DIR" : "--out FILE");
      return 2;
    }
    if (command == "consolidate" || command == "export") create_parent_folder(out);
    if (command == "consolidate") {
      write_consolidated(dir, out);
      std::printf("wrote %s\n", out.c_str());
      return 0;
    }
    if (command == "export") {
      export_safetensors(dir, out);
      std::printf("wrote %s and %s\n", out.c_str(),
                  (fs::path(out).parent_path() / "config.json").string().c_str());
      return 0;
    }
    std::fprintf(stderr, "zrt-ckpt: unknown command '%s'\n", command.c_str());
    usage(stderr);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-ckpt: %s\n", zrt::error_text(e).c_str());
    return 1;
  }
}
