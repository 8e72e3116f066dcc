// The GPT-2 model: loss and gradients of a tiny GPT against PyTorch on the same weights and
// tokens (tests/golden/gpt_golden.json; per-tensor relative error <= 1e-5 in fp32), the
// acquire/release protocol, activation checkpointing and thread count (bit-identical),
// bf16/fp16 against fp32, accumulation and loss scaling, counter-based initialisation, presets.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/gpt/gpt.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::gpt {
namespace {

using Grads = std::vector<std::vector<float>>;

GptConfig golden_config() {
  const auto& c = test::golden()["gpt"]["config"];
  GptConfig config;
  config.name = "golden-tiny";
  config.n_layer = c["n_layer"];
  config.n_head = c["n_head"];
  config.n_embd = c["n_embd"];
  config.vocab_size = c["vocab_size"];
  config.seq_len = c["seq_len"];
  return config;
}

// A CPU device, a compute stream, a kernel context, the model and its flat parameters.
struct Rig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<kernels::KernelContext> ctx;
  std::unique_ptr<Gpt> model;
  std::unique_ptr<FlatParamAccess> access;
  Buffer tokens, targets;
  TokenBatch batch;

  Rig(const GptConfig& config, DType dtype, DType grad_dtype, bool checkpointing = false,
      int threads = 1, std::uint64_t seed = 1234) {
    ctx =
        std::make_unique<kernels::KernelContext>(*device, *stream, kernels::KernelOptions{threads});
    model = std::make_unique<Gpt>(config, *ctx, GptOptions{checkpointing});
    access = std::make_unique<FlatParamAccess>(*device, *stream, model->parameters(),
                                               model->num_modules(), dtype, grad_dtype);
    access->init_from(*model, seed);
  }
  ~Rig() { stream->synchronize(); }  // passes are asynchronous: finish before freeing

  void set_batch(const std::vector<std::int32_t>& in, const std::vector<std::int32_t>& tgt, int B,
                 int T) {
    const auto bytes = static_cast<std::int64_t>(in.size() * sizeof(std::int32_t));
    tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
    targets = device->allocate(bytes, MemCategory::kOther, "targets");
    device->copy_to_device(tokens.device<std::byte>(), in.data(), in.size() * 4, *stream);
    device->copy_to_device(targets.device<std::byte>(), tgt.data(), tgt.size() * 4, *stream);
    stream->synchronize();
    batch =
        TokenBatch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(), B, T};
  }

  void set_golden_batch() {
    const auto& g = test::golden()["gpt"];
    set_batch(g["tokens"].get<std::vector<std::int32_t>>(),
              g["targets"].get<std::vector<std::int32_t>>(), g["B"], g["T"]);
  }

  Grads grads() {
    Grads g;
    for (int i = 0; i < static_cast<int>(model->parameters().size()); ++i) {
      g.push_back(access->read_grad(i));
    }
    return g;
  }
};

TEST_CASE("tiny GPT loss and gradients match PyTorch (fp32)", "[gpt][golden]") {
  const auto& g = test::golden()["gpt"];
  Rig rig(golden_config(), DType::kFloat32, DType::kFloat32, false, 1, g["seed"]);
  // Same initial weights as the generator's (its Python twin of the counter RNG).
  const auto& params = rig.model->parameters();
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    double sum = 0;
    for (float v : rig.access->read_param(i)) sum += v;
    const double want = g["param_sums"][params[i].name];
    INFO(params[i].name);
    CHECK(sum == Approx(want).epsilon(1e-9).margin(1e-12));
  }
  rig.set_golden_batch();
  rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
  const double loss = rig.model->read_loss();
  const double want_loss = g["loss"];
  CHECK(std::abs(loss - want_loss) / want_loss <= 1e-5);
  double worst = 0;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const auto want = test::golden_tensor(g["grads"][params[i].name]);
    const double err = test::rel_error(rig.access->read_grad(i), want);
    worst = std::max(worst, err);
    INFO(params[i].name << ": relative error " << err);
    CHECK(err <= 1e-5);
  }
  WARN("tiny GPT vs PyTorch: loss " << loss << " (torch " << want_loss
                                    << "), worst per-tensor gradient relative error " << worst);
}

TEST_CASE("checkpointing and thread count do not change a bit", "[gpt]") {
  const GptConfig config = golden_config();
  Rig plain(config, DType::kFloat32, DType::kFloat32, false, 1);
  Rig ckpt(config, DType::kFloat32, DType::kFloat32, true, 1);
  Rig threads(config, DType::kFloat32, DType::kFloat32, false, 2);
  for (Rig* r : {&plain, &ckpt, &threads}) {
    r->set_golden_batch();
    r->model->forward_backward(*r->access, r->batch, 1.0f);
  }
  const float loss = plain.model->read_loss();
  CHECK(ckpt.model->read_loss() == loss);
  CHECK(threads.model->read_loss() == loss);
  const Grads want = plain.grads();
  CHECK(ckpt.grads() == want);
  CHECK(threads.grads() == want);
  // Checkpointing keeps only the block inputs.
  CHECK(ckpt.model->activation_bytes(2, 12, DType::kFloat32) <
        plain.model->activation_bytes(2, 12, DType::kFloat32));
}

std::vector<std::string> expected_log(int modules, bool checkpointing, bool backward) {
  std::vector<std::string> log;
  const char* fwd = backward ? "forward" : "eval";
  for (int m = 0; m < modules; ++m) {
    log.push_back("acquire " + std::to_string(m) + " " + fwd);
    log.push_back("release " + std::to_string(m) + " " + fwd);
  }
  if (!backward) return log;
  for (int m = modules - 1; m >= 0; --m) {
    if (checkpointing && m > 0 && m < modules - 1) {
      log.push_back("acquire " + std::to_string(m) + " recompute");
      log.push_back("release " + std::to_string(m) + " recompute");
    }
    log.push_back("acquire " + std::to_string(m) + " backward");
    log.push_back("release " + std::to_string(m) + " backward");
  }
  return log;
}

TEST_CASE("acquire/release follow the documented schedule", "[gpt][protocol]") {
  for (bool checkpointing : {false, true}) {
    Rig rig(golden_config(), DType::kFloat32, DType::kFloat32, checkpointing);
    rig.set_golden_batch();
    rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
    CHECK(rig.access->log() == expected_log(rig.model->num_modules(), checkpointing, true));
    rig.access->clear_log();
    rig.model->forward(*rig.access, rig.batch);
    CHECK(rig.access->log() == expected_log(rig.model->num_modules(), checkpointing, false));
  }
  // The parameter table: Hugging Face names and layouts, the tied embedding shared by the first
  // and the last module, decay flags.
  Rig rig(golden_config(), DType::kFloat32, DType::kFloat32);
  const auto& p = rig.model->parameters();
  const int last = rig.model->num_modules() - 1;
  CHECK(p[0].name == "transformer.wte.weight");
  CHECK(p[0].modules == std::vector<int>{0, last});
  CHECK(p[1].name == "transformer.wpe.weight");
  CHECK(p[4].name == "transformer.h.0.attn.c_attn.weight");
  CHECK(p[4].shape == std::vector<std::int64_t>{32, 96});
  CHECK(p[12].name == "transformer.h.0.mlp.c_proj.weight");
  CHECK(p[12].shape == std::vector<std::int64_t>{128, 32});
  CHECK(p[12].modules == std::vector<int>{1});
  CHECK(p.back().name == "transformer.ln_f.bias");
  CHECK(p.back().modules == std::vector<int>{last});
  for (const ParamSpec& s : p) CHECK(s.no_weight_decay == (s.shape.size() == 1));
}

void compare_precision(DType dtype, DType grad_dtype, double loss_tol, double grad_tol) {
  Rig ref(golden_config(), DType::kFloat32, DType::kFloat32);
  Rig low(golden_config(), dtype, grad_dtype);
  ref.set_golden_batch();
  low.set_golden_batch();
  ref.model->forward_backward(*ref.access, ref.batch, 1.0f);
  low.model->forward_backward(*low.access, low.batch, 1.0f);
  const double want = ref.model->read_loss();
  const double got = low.model->read_loss();
  CHECK(std::abs(got - want) / want <= loss_tol);
  const Grads g_ref = ref.grads();
  const Grads g_low = low.grads();
  double worst = 0;
  for (std::size_t i = 0; i < g_ref.size(); ++i) {
    const double err = test::rel_error(g_low[i], g_ref[i]);
    worst = std::max(worst, err);
    INFO(ref.model->parameters()[i].name << ": relative error " << err);
    CHECK(err <= grad_tol);
  }
  WARN(dtype_name(dtype) << " compute, " << dtype_name(grad_dtype) << " grads vs fp32: loss " << got
                         << " vs " << want << ", worst gradient relative error " << worst);
}

TEST_CASE("bf16 and fp16 storage track fp32", "[gpt][precision]") {
  // The whole network in 16-bit storage: per-value rounding up to 2^-8 (bf16) and 2^-11 (fp16),
  // compounded over 2 blocks.
  SECTION("bf16, fp32 grads") {
    compare_precision(DType::kBFloat16, DType::kFloat32, 5e-3, 5e-2);
  }
  SECTION("bf16, bf16 grads") {
    compare_precision(DType::kBFloat16, DType::kBFloat16, 5e-3, 5e-2);
  }
  SECTION("fp16, fp32 grads") {
    compare_precision(DType::kFloat16, DType::kFloat32, 1e-3, 1e-2);
  }
  SECTION("fp16, fp16 grads") {
    compare_precision(DType::kFloat16, DType::kFloat16, 1e-3, 1e-2);
  }
}

TEST_CASE("gradients accumulate over micro-batches and scale with the loss scale", "[gpt]") {
  Rig once(golden_config(), DType::kFloat32, DType::kFloat32);
  Rig twice(golden_config(), DType::kFloat32, DType::kFloat32);
  Rig scaled(golden_config(), DType::kFloat32, DType::kFloat32);
  for (Rig* r : {&once, &twice, &scaled}) r->set_golden_batch();
  once.model->forward_backward(*once.access, once.batch, 1.0f);
  twice.model->forward_backward(*twice.access, twice.batch, 1.0f);
  twice.model->forward_backward(*twice.access, twice.batch, 1.0f);
  scaled.model->forward_backward(*scaled.access, scaled.batch, 1024.0f);
  const Grads g1 = once.grads(), g2 = twice.grads(), gs = scaled.grads();
  for (std::size_t i = 0; i < g1.size(); ++i) {
    std::vector<float> doubled(g1[i]), scaled_ref(g1[i]);
    for (float& v : doubled) v *= 2.0f;
    for (float& v : scaled_ref) v *= 1024.0f;
    // BLAS accumulates into the existing gradient block by block (beta = 1), so a second
    // micro-batch is not bit-for-bit 2x; a power-of-two loss scale commutes with rounding.
    CHECK(test::rel_error(g2[i], doubled) <= 1e-6);
    CHECK(gs[i] == scaled_ref);
  }
  CHECK(scaled.model->read_loss() == once.model->read_loss());  // the loss is not scaled
}

TEST_CASE("forward-only evaluation gives the training loss; shapes can change", "[gpt]") {
  Rig rig(golden_config(), DType::kFloat32, DType::kFloat32);
  rig.set_golden_batch();
  rig.model->forward(*rig.access, rig.batch);
  const float eval = rig.model->read_loss();
  rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
  CHECK(rig.model->read_loss() == eval);
  // A smaller batch (re-allocated activations): the first sequence alone, full seq_len.
  const GptConfig c = golden_config();
  std::vector<std::int32_t> in(c.seq_len), tgt(c.seq_len);
  for (int t = 0; t < c.seq_len; ++t) {
    in[t] = (7 * t) % c.vocab_size;
    tgt[t] = (7 * t + 3) % c.vocab_size;
  }
  rig.set_batch(in, tgt, 1, c.seq_len);
  rig.model->forward(*rig.access, rig.batch);
  const float loss = rig.model->read_loss();
  CHECK(std::isfinite(loss));
  CHECK(loss > 0.5f * std::log(static_cast<float>(c.vocab_size)));
  // Activations are accounted as such.
  CHECK(rig.device->tracker()
            .usage(MemorySpace::kDevice)
            .current[static_cast<int>(MemCategory::kActivations)] >=
        rig.model->activation_bytes(1, c.seq_len, DType::kFloat32));
  // T beyond seq_len is refused.
  TokenBatch too_long = rig.batch;
  too_long.seq_len = c.seq_len + 1;
  CHECK_THROWS_AS(rig.model->forward(*rig.access, too_long), InvalidArgument);
}

TEST_CASE("initialisation is counter-based GPT-2 init", "[gpt][init]") {
  GptConfig config = GptConfig::preset("gpt2-tiny");
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  Gpt model(config, ctx);
  const int qkv = model.block_param(0, 2);
  const int proj = model.block_param(1, 10);
  const std::int64_t n = model.parameters()[qkv].numel();
  std::vector<float> full(n), part(100);
  model.init_parameter(qkv, 42, 0, n, full.data());
  model.init_parameter(qkv, 42, 5000, 100, part.data());  // any slice, any rank: same values
  CHECK(std::vector<float>(full.begin() + 5000, full.begin() + 5100) == part);
  std::vector<float> other(n);
  model.init_parameter(qkv, 43, 0, n, other.data());
  CHECK(other != full);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
    }
    const double m = s / v.size();
    return std::sqrt(s2 / v.size() - m * m);
  };
  CHECK(stddev(full) == Approx(0.02).epsilon(0.03));
  std::vector<float> pw(model.parameters()[proj].numel());
  model.init_parameter(proj, 42, 0, static_cast<std::int64_t>(pw.size()), pw.data());
  CHECK(stddev(pw) == Approx(0.02 / std::sqrt(2.0 * config.n_layer)).epsilon(0.03));
  std::vector<float> ln(config.n_embd), bias(config.n_embd);
  model.init_parameter(model.lnf_weight(), 42, 0, config.n_embd, ln.data());
  model.init_parameter(model.lnf_bias(), 42, 0, config.n_embd, bias.data());
  CHECK(ln == std::vector<float>(config.n_embd, 1.0f));
  CHECK(bias == std::vector<float>(config.n_embd, 0.0f));
}

TEST_CASE("presets and config parsing", "[gpt][config]") {
  CHECK(GptConfig::preset("gpt2").num_parameters() == 124439808);
  CHECK(GptConfig::preset("gpt2-medium").num_parameters() == 354823168);
  CHECK(GptConfig::preset("gpt2-large").num_parameters() == 774030080);
  CHECK(GptConfig::preset("gpt2-xl").num_parameters() == 1557611200);
  const GptConfig tiny = GptConfig::preset("gpt2-tiny");
  CHECK(tiny.n_layer == 2);
  CHECK(tiny.vocab_size == 256);
  const GptConfig custom = GptConfig::parse("gpt2-tiny:seq_len=128,n_layer=3");
  CHECK(custom.seq_len == 128);
  CHECK(custom.n_layer == 3);
  CHECK(custom.n_embd == 64);
  const GptConfig plain = GptConfig::parse("n_layer=1,n_head=2,n_embd=8,vocab_size=10,seq_len=4");
  CHECK(plain.num_parameters() == 10 * 8 + 4 * 8 + (12 * 64 + 13 * 8) + 16);
  CHECK_THROWS_AS(GptConfig::preset("gpt3"), InvalidArgument);
  CHECK_THROWS_AS(GptConfig::parse("gpt2:n_head=7"), InvalidArgument);  // 768 % 7 != 0
  CHECK_THROWS_AS(GptConfig::parse("gpt2:dropout=1"), InvalidArgument);
  // The model's table adds up to the config's count.
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  Gpt gpt2(GptConfig::preset("gpt2"), ctx);
  std::int64_t total = 0;
  for (const ParamSpec& s : gpt2.parameters()) total += s.numel();
  CHECK(total == 124439808);
  CHECK(gpt2.num_modules() == 14);
  CHECK(gpt2.parameters()[0].modules == std::vector<int>{0, 13});
}

TEST_CASE("the parameter protocol is enforced by FlatParamAccess", "[gpt][protocol]") {
  Rig rig(golden_config(), DType::kFloat32, DType::kFloat32);
  FlatParamAccess& a = *rig.access;
  CHECK_THROWS_AS(a.param(0), Error);  // nothing acquired
  a.acquire(0, Phase::kForward);
  CHECK_NOTHROW(a.param(0));
  CHECK_THROWS_AS(a.grad(0), Error);  // forward: no gradients
  CHECK_THROWS_AS(a.acquire(0, Phase::kForward), Error);
  CHECK_THROWS_AS(a.release(0, Phase::kBackward), Error);
  a.release(0, Phase::kForward);
  const int last = rig.model->num_modules() - 1;
  a.acquire(last, Phase::kBackward);
  CHECK_NOTHROW(a.grad(0));            // the tied embedding, through the head
  CHECK_THROWS_AS(a.param(1), Error);  // wpe belongs to module 0 only
  a.release(last, Phase::kBackward);
}

}  // namespace
}  // namespace zrt::gpt
