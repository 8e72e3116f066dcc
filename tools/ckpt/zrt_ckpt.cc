// zrt-ckpt: look into, check and convert zrt checkpoints (docs/checkpoints.md).
//   zrt-ckpt inspect DIR                      step, world, stage, dtypes, the parameter table
//   zrt-ckpt verify DIR                       every checksum of the index and the rank files
//   zrt-ckpt consolidate DIR --out model.h5   one fp32 dataset per parameter under /params
//   zrt-ckpt export DIR --safetensors F       Hugging Face safetensors + config.json (the saved
//                                             model.type's layout, through the model registry)
// DIR is a checkpoint directory (<save_dir>/<tag>) or a save_dir holding a `latest` file. The
// output's folder is created when missing. Exit status: 0 done (and for --help), 1 an error
// (the message names the file and the system's reason), 2 bad arguments.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "models/model_registry.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/common/error.h"

namespace {

namespace fs = std::filesystem;
using namespace zrt::checkpoint;

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: zrt-ckpt COMMAND DIR [OPTIONS]\n"
               "commands:\n"
               "  inspect DIR                                 step, world, stage, dtypes, the "
               "parameter table\n"
               "  verify DIR                                  every checksum of the index and "
               "the rank files\n"
               "  consolidate DIR --out model.h5              one fp32 dataset per parameter\n"
               "  export DIR --safetensors model.safetensors  Hugging Face GPT-2 safetensors + "
               "config.json\n"
               "DIR: a checkpoint (<save_dir>/<tag>) or a save_dir with a 'latest' file.\n"
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

// A save_dir resolves to the checkpoint its `latest` names.
std::string resolve(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "index.h5")) return dir;
  if (const auto tag = read_latest(dir)) return (fs::path(dir) / *tag).string();
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
  std::printf("parameters   %zu tensors, %lld elements, %zu units\n\n", index.params.size(),
              static_cast<long long>(total), index.units.size());
  std::printf("%-48s %-16s %10s %5s %10s\n", "name", "shape", "numel", "unit", "offset");
  for (const auto& p : index.params) {
    std::printf("%-48s %-16s %10lld %5lld %10lld\n", p.name.c_str(), shape_text(p.shape).c_str(),
                static_cast<long long>(p.numel), static_cast<long long>(p.unit),
                static_cast<long long>(p.offset));
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
    const std::string dir = resolve(argv[2]);
    std::string out;
    for (int i = 3; i < argc; ++i) {
      const std::string arg = argv[i];
      if ((arg == "--out" || arg == "--safetensors") && i + 1 < argc) {
        out = argv[++i];
      } else {
        std::fprintf(stderr, "zrt-ckpt: unexpected argument '%s'\n", arg.c_str());
        usage(stderr);
        return 2;
      }
    }
    if (command == "inspect") return inspect(dir);
    if (command == "verify") {
      const std::int64_t bytes = verify_checkpoint(dir);
      std::printf("%s: OK (%lld bytes of tensor data, every checksum matches)\n", dir.c_str(),
                  static_cast<long long>(bytes));
      return 0;
    }
    if ((command == "consolidate" || command == "export") && out.empty()) {
      std::fprintf(stderr, "zrt-ckpt %s: needs %s FILE\n", command.c_str(),
                   command == "export" ? "--safetensors" : "--out");
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
    std::fprintf(stderr, "zrt-ckpt: %s\n", e.what());
    return 1;
  }
}
