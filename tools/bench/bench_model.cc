// zrt-bench model: forward+backward tokens/s of the GPT-2 model on the CPU kernels, next to
// PyTorch on the same shapes and thread count (tools/bench/torch_gpt_bench.py, when python3
// can import torch). fp32, no optimizer step; time per iteration is the median over --iters
// (after one warm-up), measured from enqueue to stream completion.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/init_rng.h"
#include "models/model_registry.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

// torch_gpt_bench.py next to zrt-bench (tools/CMakeLists.txt copies it), else the source tree.
std::string torch_script(const std::string& requested) {
  return requested.empty() ? find_script("torch_gpt_bench.py", ZRT_TORCH_GPT_SCRIPT) : requested;
}

struct ZrtResult {
  double seconds = 0;  // median per iteration
  float loss = 0;
};

ZrtResult run_zrt(const ModelDef& model_def, int B, int T, int threads, int iters,
                  bool checkpointing, int mlp_tile_rows) {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream, kernels::KernelOptions{threads});
  ModelOptions options{checkpointing};
  options.mlp_tile_rows = mlp_tile_rows;
  const std::unique_ptr<Model> model_owner = model_def.build(ctx, options);
  Model& model = *model_owner;
  FlatParamAccess access(*device, *stream, model.parameters(), model.num_modules(), DType::kFloat32,
                         DType::kFloat32);
  access.init_from(model, 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(counter_hash(7, 0, i) % model_def.vocab_size());
    targets[i] = static_cast<std::int32_t>(counter_hash(7, 1, i) % model_def.vocab_size());
  }
  Buffer tok = device->allocate(static_cast<std::int64_t>(tokens.size() * 4), MemCategory::kOther,
                                "bench tokens");
  Buffer tgt = device->allocate(static_cast<std::int64_t>(targets.size() * 4), MemCategory::kOther,
                                "bench targets");
  device->copy_to_device(tok.device<std::byte>(), tokens.data(), tokens.size() * 4, *stream);
  device->copy_to_device(tgt.device<std::byte>(), targets.data(), targets.size() * 4, *stream);
  stream->synchronize();
  const TokenBatch batch{tok.device<const std::int32_t>(), tgt.device<const std::int32_t>(), B, T};
  ZrtResult result;
  std::vector<double> samples;
  for (int i = 0; i < iters + 1; ++i) {
    const auto start = std::chrono::steady_clock::now();
    model.forward_backward(access, batch, 1.0f);
    device->copy_to_host(&result.loss, model.loss().as<const std::byte>(), sizeof result.loss,
                         *stream);
    stream->synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) samples.push_back(s);  // the first iteration allocates and warms up
  }
  result.seconds = median(samples);
  return result;
}

// PyTorch tokens/s for the same shapes, or 0 when unavailable.
// The script builds the model from its dimensions, passed as --<name> <value>.
double run_torch(const std::string& python, const std::string& script, const ModelDef& model_def,
                 int B, int T, int threads, int iters) {
  if (python.empty()) return 0.0;
  std::string dimensions;
  for (const auto& [name, value] : model_def.dimensions()) {
    dimensions += fmt::format("--{} {} ", name, value);
  }
  const std::string line =
      run_capture(fmt::format("'{}' '{}' {}--batch {} --seq {} --threads {} --iters {} 2>/dev/null",
                              python, script, dimensions, B, T, threads, iters));
  const auto pos = line.find("tokens_per_s=");
  return pos == std::string::npos ? 0.0 : std::stod(line.substr(pos + 13));
}

}  // namespace

int model(int argc, char** argv) {
  Args args(argc, argv,
            {"models", "batch", "seq", "threads", "iters", "checkpointing", "mlp-tile-rows",
             "no-torch", "python", "torch-script", "help"});
  if (args.has("help")) {
    std::printf(
        "zrt-bench model [--models gpt2-tiny,gpt2] [--batch 4] [--seq 256] [--threads 1,2]\n"
        "                [--iters N] [--checkpointing] [--mlp-tile-rows N] [--no-torch]\n"
        "                [--python PATH]\n"
        "Forward+backward tokens/s of a registry model on the CPU kernels (fp32), next to\n"
        "PyTorch on the same shapes and thread count for GPT-2 when python3 can import torch.\n"
        "--models takes presets or specs such as 'gpt2-tiny:n_layer=4' or 'llama-tiny' (separated\n"
        "by ';' instead of ',' when a spec has commas). --iters defaults to 20\n"
        "for models under 10M parameters, else 3 (median after one warm-up iteration).\n"
        "--mlp-tile-rows: model.tiling.mlp_rows (0 automatic, the default; -1 never tiled).\n");
    return 0;
  }
  const std::string model_list = args.get("models", "gpt2-tiny,gpt2");
  const auto models = split_list(model_list, model_list.find(';') != std::string::npos ? ';' : ',');
  const int B = static_cast<int>(args.get_double("batch", 4));
  const int T = static_cast<int>(args.get_double("seq", 256));
  std::vector<int> thread_counts;
  for (const auto& t : split_list(args.get("threads", "1,2")))
    thread_counts.push_back(std::stoi(t));
  const bool checkpointing = args.has("checkpointing");
  const int mlp_tile_rows = static_cast<int>(args.get_double("mlp-tile-rows", 0));
  const std::string python = args.has("no-torch") ? "" : find_python(args.get("python", ""));
  const std::string script = torch_script(args.get("torch-script", ""));

  std::printf(
      "# zrt-bench model: forward+backward, fp32, micro-batch %d x seq %d%s, MLP tiles %s\n", B, T,
      checkpointing ? ", activation checkpointing" : "",
      mlp_tile_rows == 0    ? "automatic"
      : mlp_tile_rows == -1 ? "off"
                            : std::to_string(mlp_tile_rows).c_str());
  const std::string torch_note =
      args.has("no-torch") ? "skipped (--no-torch)"
      : python.empty()     ? "not available (no python3 with torch; apt-get install python3-torch)"
                           : python + " " + script;
  std::printf("# tokens/s = B*T / median time per iteration; torch: %s\n", torch_note.c_str());
  Table table(
      {"model", "params", "threads", "zrt_ms", "zrt_tok/s", "torch_tok/s", "zrt/torch", "loss"});
  for (const auto& spec : models) {
    const std::unique_ptr<ModelDef> model_def = builtin_models().parse_spec(spec);
    if (T > model_def->seq_len()) {
      ZRT_THROW(InvalidArgument, "--seq {} exceeds {}'s seq_len {}", T, spec, model_def->seq_len());
    }
    const int iters = static_cast<int>(
        args.get_double("iters", model_def->num_parameters() < 10'000'000 ? 20 : 3));
    for (int threads : thread_counts) {
      const ZrtResult z = run_zrt(*model_def, B, T, threads, iters, checkpointing, mlp_tile_rows);
      const double zrt_tps = B * T / z.seconds;
      const double torch_tps = run_torch(python, script, *model_def, B, T, threads, iters);
      // A custom model is labelled by its architecture (gpt2, llama, ...).
      const std::string label =
          model_def->name() == "custom" ? model_def->type() + " (custom)" : model_def->name();
      table.add({label, fmt::format("{:.1f}M", model_def->num_parameters() / 1e6),
                 std::to_string(threads), fmt::format("{:.1f}", z.seconds * 1e3),
                 fmt::format("{:.0f}", zrt_tps),
                 torch_tps > 0 ? fmt::format("{:.0f}", torch_tps) : "-",
                 torch_tps > 0 ? fmt::format("{:.2f}", zrt_tps / torch_tps) : "-",
                 fmt::format("{:.3f}", z.loss)});
      std::fflush(stdout);
    }
  }
  std::printf("%s", table.str().c_str());
  return 0;
}

}  // namespace zrt::bench
