// The Llama-family model against transformers itself (tests/golden/llama_golden.json, made by
// make_llama_golden.py from LlamaForCausalLM and Qwen2ForCausalLM in float64): parameter names
// and shapes (the contract with Hugging Face checkpoints), every layer's output, the logits and
// the loss within 1e-5 relative in fp32 and every parameter's gradient within its derived
// tolerance (llama_golden.h's gradient_tolerance: 3e-5, or more where a sum over the rows
// cancels), the same gradients with the batch's sequences swapped, the rotary tables (llama3
// scaling) including Llama 3.1 8B's; activation checkpointing and thread count bit-identical;
// bf16 near fp32; the presets' parameter counts (the published ones); config errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/flat_param_access.h"
#include "models/llama/llama.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/llama_golden.h"

namespace zrt::llama {
namespace {

using Grads = std::vector<std::vector<float>>;
using test::case_config;
using test::golden_weights;
const nlohmann::json& golden() {
  return test::llama_golden();
}

struct Rig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<kernels::KernelContext> ctx;
  std::unique_ptr<Llama> model;
  std::unique_ptr<FlatParamAccess> access;
  Buffer tokens, targets;
  TokenBatch batch;

  Rig(const LlamaConfig& config, DType dtype, DType grad_dtype, bool checkpointing = false,
      int threads = 1) {
    ctx =
        std::make_unique<kernels::KernelContext>(*device, *stream, kernels::KernelOptions{threads});
    model = std::make_unique<Llama>(config, *ctx, LlamaOptions{checkpointing});
    access = std::make_unique<FlatParamAccess>(*device, *stream, model->parameters(),
                                               model->num_modules(), dtype, grad_dtype);
    access->init_from(*model, 1234);
  }
  ~Rig() { stream->synchronize(); }

  // The golden's weights and batch (its two sequences swapped with `swap_sequences`).
  void set_golden(const nlohmann::json& g, bool swap_sequences = false) {
    const auto& params = model->parameters();
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      access->set_param(i, golden_weights(params[i].name, i, params[i].numel(), g["seed"]));
    }
    const auto [in, tgt] = test::golden_batch(g, swap_sequences);
    const auto bytes = static_cast<std::int64_t>(in.size() * sizeof(std::int32_t));
    tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
    targets = device->allocate(bytes, MemCategory::kOther, "targets");
    device->copy_to_device(tokens.device<std::byte>(), in.data(), in.size() * 4, *stream);
    device->copy_to_device(targets.device<std::byte>(), tgt.data(), tgt.size() * 4, *stream);
    stream->synchronize();
    batch = TokenBatch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(),
                       g["B"], g["T"]};
  }

  // fp32 values of an activation tensor of n elements.
  std::vector<float> read_f32(DevicePtr<const std::byte> p, std::size_t n) {
    std::vector<float> out(n);
    device->copy_to_host(out.data(), p, n * sizeof(float), *stream);
    stream->synchronize();
    return out;
  }

  Grads grads() {
    Grads g;
    for (int i = 0; i < static_cast<int>(model->parameters().size()); ++i) {
      g.push_back(access->read_grad(i));
    }
    return g;
  }
};

// One golden case (make_llama_golden.py's form): the parameter table, every layer's output, the
// logits, the loss and every gradient against transformers', and the rotary table.
void check_golden_case(const nlohmann::json& g) {
  {
    const std::string label = g["label"];
    INFO(label);
    const LlamaConfig config = case_config(g);
    Rig rig(config, DType::kFloat32, DType::kFloat32);
    // The parameter table is transformers' state dict: names, order and shapes.
    const auto& params = rig.model->parameters();
    REQUIRE(params.size() == g["names"].size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].name == g["names"][i].get<std::string>());
      CHECK(params[i].shape == g["shapes"][i].get<std::vector<std::int64_t>>());
    }
    rig.set_golden(g);
    const int B = g["B"], T = g["T"];
    const std::size_t BTC = static_cast<std::size_t>(B) * T * config.hidden_size;
    const std::size_t BTV = static_cast<std::size_t>(B) * T * config.vocab_size;

    rig.model->forward(*rig.access, rig.batch);
    double worst = 0;
    for (int l = 0; l < config.num_hidden_layers; ++l) {
      const auto want = test::golden_tensor(g["layer_outputs"][l]);
      const double err = test::rel_error(rig.read_f32(rig.model->residual(l + 1), BTC), want);
      INFO("layer " << l << " output: relative error " << err);
      CHECK(err <= 1e-5);
      worst = std::max(worst, err);
    }
    // The logits' rows are padded to an aligned stride; the golden rows are dense.
    const std::size_t ld = static_cast<std::size_t>(rig.model->logits_row_stride());
    REQUIRE(ld == static_cast<std::size_t>(kernels::logits_row_stride(config.vocab_size)));
    const auto padded = rig.read_f32(rig.model->logits(), BTV / config.vocab_size * ld);
    std::vector<float> logits;
    for (std::size_t n = 0; n < BTV / config.vocab_size; ++n) {
      logits.insert(logits.end(), padded.begin() + static_cast<std::ptrdiff_t>(n * ld),
                    padded.begin() + static_cast<std::ptrdiff_t>(n * ld + config.vocab_size));
    }
    const double logits_err = test::rel_error(logits, test::golden_tensor(g["logits"]));
    INFO("logits: relative error " << logits_err);
    CHECK(logits_err <= 1e-5);

    rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
    const double loss = rig.model->read_loss();
    const double want_loss = g["loss"];
    CHECK(std::abs(loss - want_loss) / want_loss <= 1e-5);
    // The same gradients with the rows summed in another order: each tensor's tolerance.
    Rig swapped(config, DType::kFloat32, DType::kFloat32);
    swapped.set_golden(g, /*swap_sequences=*/true);
    swapped.model->forward_backward(*swapped.access, swapped.batch, 1.0f);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      const auto want = test::golden_tensor(g["grads"][params[i].name]);
      const std::vector<float> grad = rig.access->read_grad(i);
      const double err = test::rel_error(grad, want);
      const double tolerance = test::gradient_tolerance(grad, swapped.access->read_grad(i));
      INFO(params[i].name << ": relative error " << err << ", tolerance " << tolerance);
      CHECK(err <= tolerance);
      // The swapped batch's gradients are the same in exact arithmetic.
      CHECK(test::rel_error(swapped.access->read_grad(i), want) <= tolerance);
      worst = std::max(worst, err);
    }
    // The rotary table, as transformers computed it (float32 there, double then rounded here).
    const kernels::RopeTable table = rope_table(config);
    const auto inv_freq = test::golden_tensor(g["inv_freq"]);
    REQUIRE(static_cast<int>(inv_freq.size()) == table.pairs);
    for (int i = 0; i < table.pairs; ++i) {
      CHECK(table.inv_freq[i] == Approx(inv_freq[i]).epsilon(1e-6));
    }
    WARN(label << " vs transformers: loss " << loss << " (" << want_loss
               << "), worst relative error of a layer output or gradient " << worst << ", logits "
               << logits_err);
  }
}

TEST_CASE("Llama and Qwen2 match transformers layer by layer (fp32)", "[llama][golden]") {
  for (const auto& g : golden()["cases"]) check_golden_case(g);
}

// tests/golden/qwen3_golden.json (make_qwen3_golden.py, transformers 5's Qwen3ForCausalLM): the
// per-head q_norm / k_norm before the rotation, head_dim 8 twice hidden_size / heads, no biases;
// the second case with Qwen2's window from max_window_layers 1 on and a tied head. q_norm's and
// k_norm's gradients are among those checked; a model without the norms misses the first
// layer's output by far more than 1e-5. The tolerances are make_llama_golden's: the norm adds one
// link of inner length head_dim (8) to the chain of llama_golden.h's gradient_tolerance, 8 u
// against its 10 x 48 u.
TEST_CASE("Qwen3 matches transformers layer by layer (fp32)", "[llama][golden][qwen3]") {
  const auto& cases = test::qwen3_golden()["cases"];
  REQUIRE(cases.size() == 2);
  for (const auto& g : cases) {
    const LlamaConfig config = case_config(g);
    REQUIRE(config.qk_norm());
    check_golden_case(g);
  }
  const LlamaConfig windowed = case_config(cases[1]);
  CHECK(windowed.layer_window(0) == 0);
  CHECK(windowed.layer_window(1) == 4);
}

// tests/golden/llama_window_golden.json (make_llama_window_golden.py, transformers 5): Mistral
// with a 5-token window on both layers and Qwen2 with a 4-token window from max_window_layers 1
// on, over 12-token sequences, so that most rows see only part of their causal context and a
// model that ignored the window (or applied it to Qwen2's first layer) would miss by far more
// than the tolerances (the loss without the window differs in the second digit).
TEST_CASE("Mistral and Qwen2 sliding windows match transformers layer by layer (fp32)",
          "[llama][golden][window]") {
  const auto& cases = test::llama_window_golden()["cases"];
  REQUIRE(cases.size() == 2);
  for (const auto& g : cases) {
    const LlamaConfig config = case_config(g);
    REQUIRE(config.sliding_window > 0);
    REQUIRE(config.sliding_window < static_cast<int>(g["T"]));
    check_golden_case(g);
  }
}

// tests/golden/llama_packed_golden.json (make_llama_packed_golden.py): transformers'
// LlamaForCausalLM in float64 on one row of packed documents (lengths 7, 1, 9, 5, then 2 padding
// tokens), run as transformers users train on packed data: position_ids restarting at each
// document, a 4D block-diagonal causal attention mask, labels -100 outside the loss mask, at each
// document's first token and on the padding; the loss is the summed cross-entropy over the
// loss-token count. The generator checked it equals each document run alone to 1e-12. zrt's
// TokenBatch says the same with positions, doc_start, targets -1 and loss_divisor.
TEST_CASE(
    "Llama with packed documents matches transformers (position_ids, block mask, labels "
    "-100)",
    "[llama][golden][packed]") {
  const nlohmann::json g = [] {
    std::ifstream in(ZRT_LLAMA_PACKED_GOLDEN);
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  const LlamaConfig config = case_config(g);
  Rig rig(config, DType::kFloat32, DType::kFloat32);
  const auto& params = rig.model->parameters();
  REQUIRE(params.size() == g["names"].size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].name == g["names"][i].get<std::string>());
  }
  rig.set_golden(g);
  const int B = g["B"], T = g["T"];
  const auto positions = g["positions"].get<std::vector<std::int32_t>>();
  const auto doc_start = g["doc_start"].get<std::vector<std::int32_t>>();
  REQUIRE(positions.size() == static_cast<std::size_t>(B) * T);
  REQUIRE(doc_start.size() == positions.size());
  const auto bytes = static_cast<std::int64_t>(positions.size() * sizeof(std::int32_t));
  Buffer pos = rig.device->allocate(bytes, MemCategory::kOther, "positions");
  Buffer start = rig.device->allocate(bytes, MemCategory::kOther, "doc_start");
  rig.device->copy_to_device(pos.device<std::byte>(), positions.data(), bytes, *rig.stream);
  rig.device->copy_to_device(start.device<std::byte>(), doc_start.data(), bytes, *rig.stream);
  rig.stream->synchronize();
  rig.batch.positions = pos.device<const std::int32_t>();
  rig.batch.doc_start = start.device<const std::int32_t>();
  const int loss_tokens = g["loss_tokens"];
  rig.batch.loss_divisor = static_cast<float>(loss_tokens);

  rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
  const double loss = rig.model->read_loss();
  const double want_loss = g["loss"];
  const double loss_err = std::abs(loss - want_loss) / want_loss;
  INFO("loss " << loss << " (transformers " << want_loss << "): relative error " << loss_err);
  CHECK(loss_err <= 1e-5);
  double worst = 0;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const auto want = test::golden_tensor(g["grads"][params[i].name]);
    const double err = test::rel_error(rig.access->read_grad(i), want);
    INFO(params[i].name << ": relative error " << err);
    CHECK(err <= 1e-5);
    worst = std::max(worst, err);
  }
  WARN("packed documents vs transformers: loss " << loss << " (" << want_loss
                                                 << "), relative error " << loss_err
                                                 << ", worst gradient relative error " << worst);
}

// tests/golden/rope_scaling_golden.json (make_rope_scaling_golden.py, transformers 5): YaRN and
// linear interpolation. The tables: inv_freq as transformers computes it in float32 (a power, a
// division, the factor's product and the ramp's blend: a few roundings of 2^-24 each, so 1e-6
// relative), and the attention factor, a formula of doubles in both (1e-12). The models: a Qwen3
// with YaRN, whose factor of 1.139 on the rotation's cosine and sine scales every q.k by 1.30
// (a model without it misses the first layer's output by far more than 1e-5), and a Llama with
// linear interpolation, checked as the other goldens are.
TEST_CASE("YaRN and linear rotary scaling match transformers", "[llama][golden][rope]") {
  const auto& doc = test::rope_scaling_golden();
  REQUIRE(doc["tables"].size() == 5);
  for (const auto& t : doc["tables"]) {
    const std::string label = t["label"];
    INFO(label);
    const kernels::RopeScalingParams params = [&] {
      LlamaConfig c;
      c.rope_scaling = test::rope_scaling_of(t["rope_scaling"]);
      return c.rope_scaling.params();
    }();
    const kernels::RopeTable table =
        kernels::make_rope_table(t["head_dim"], t["rope_theta"].get<double>(), params);
    const auto inv_freq = test::golden_tensor(t["inv_freq"]);
    REQUIRE(static_cast<int>(inv_freq.size()) == table.pairs);
    for (int i = 0; i < table.pairs; ++i) {
      INFO("pair " << i);
      CHECK(table.inv_freq[i] == Approx(inv_freq[i]).epsilon(1e-6));
    }
    const double factor = t["attention_factor"];  // 1 for linear
    if (params.rope_type == "yarn") {
      CHECK(kernels::yarn_attention_factor(params) == Approx(factor).epsilon(1e-12));
    }
    CHECK(table.attention_scaling == static_cast<float>(factor));
  }
  const auto& cases = doc["cases"];
  REQUIRE(cases.size() == 2);
  for (const auto& g : cases) {
    const LlamaConfig config = case_config(g);
    REQUIRE(config.rope_scaling.rope_type != "default");
    check_golden_case(g);
  }
}

TEST_CASE("Llama 3.1 8B's llama3 rotary table matches transformers", "[llama][golden]") {
  const kernels::RopeTable table = rope_table(LlamaConfig::preset("llama-3.1-8b"));
  const auto want = test::golden_tensor(golden()["llama31_8b_inv_freq"]);
  REQUIRE(static_cast<int>(want.size()) == table.pairs);
  for (int i = 0; i < table.pairs; ++i) {
    INFO(i);
    CHECK(table.inv_freq[i] == Approx(want[i]).epsilon(1e-6));
  }
}

TEST_CASE("Llama checkpointing and thread count do not change a bit; bf16 is near fp32",
          "[llama]") {
  for (const auto& g : golden()["cases"]) {
    INFO(g["label"].get<std::string>());
    const LlamaConfig config = case_config(g);
    Rig plain(config, DType::kFloat32, DType::kFloat32, false, 1);
    Rig ckpt(config, DType::kFloat32, DType::kFloat32, true, 1);
    Rig threads(config, DType::kFloat32, DType::kFloat32, false, 3);
    Rig bf16(config, DType::kBFloat16, DType::kFloat32, true, 2);
    for (Rig* r : {&plain, &ckpt, &threads, &bf16}) {
      r->set_golden(g);
      r->model->forward_backward(*r->access, r->batch, 1.0f);
    }
    const float loss = plain.model->read_loss();
    CHECK(ckpt.model->read_loss() == loss);
    CHECK(threads.model->read_loss() == loss);
    const Grads want = plain.grads();
    CHECK(ckpt.grads() == want);
    CHECK(threads.grads() == want);
    // bf16 storage (8 bits of mantissa) of weights and activations: percent-level agreement.
    CHECK(std::abs(bf16.model->read_loss() - loss) <= 0.02 * loss);
    const Grads low = bf16.grads();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(test::rel_error(low[i], want[i]) <= 0.1);
    CHECK(Llama::activation_bytes(config, 2, 6, DType::kFloat32, true) <
          Llama::activation_bytes(config, 2, 6, DType::kFloat32, false));
  }
}

TEST_CASE("Llama-family presets have the published parameter counts", "[llama]") {
  const std::pair<const char*, std::int64_t> counts[] = {
      {"llama-3.2-1b", 1235814400},
      {"llama-3.2-3b", 3212749824},
      {"llama-3.1-8b", 8030261248},
      {"llama-3.1-70b", 70553706496},
      {"qwen2.5-0.5b", 494032768},
      {"qwen2.5-7b", 7615616512},
      {"smollm2-135m", 134515008},
      // transformers' Qwen3ForCausalLM of each config.json, counted on the meta device (the
      // model cards' 0.6B and 8.2B).
      {"qwen3-0.6b", 596049920},
      {"qwen3-8b", 8190735360},
  };
  for (const auto& [name, count] : counts) {
    INFO(name);
    const LlamaConfig c = LlamaConfig::preset(name);
    CHECK_NOTHROW(c.validate());
    CHECK(c.num_parameters() == count);
    std::int64_t table = 0;
    for (const ParamSpec& p : Llama::parameter_table(c)) table += p.numel();
    CHECK(table == count);
  }
  CHECK(LlamaConfig::preset("llama-3.1-8b").seq_len == 8192);
  CHECK(LlamaConfig::preset("qwen2.5-0.5b").attention_bias);
  CHECK(LlamaConfig::parse("qwen2", "qwen2.5-0.5b").architecture == "qwen2");
  const LlamaConfig qwen3 = LlamaConfig::preset("qwen3-0.6b");
  CHECK(qwen3.qk_norm());
  CHECK_FALSE(qwen3.attention_bias);
  CHECK(qwen3.head_dim * qwen3.num_attention_heads == 2 * qwen3.hidden_size);
  CHECK_FALSE(LlamaConfig::preset("qwen2.5-7b").qk_norm());
}

TEST_CASE("Llama-family config errors name the key", "[llama]") {
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "llama-9"), Catch::Contains("llama-3.2-1b"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "qwen2.5-0.5b"),
                    Catch::Contains("qwen2.5-0.5b is a qwen2 model"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "llama-tiny:num_key_value_heads=3"),
                    Catch::Contains("num_key_value_heads=3"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "llama-tiny:seq_len=512"),
                    Catch::Contains("seq_len=512"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "llama-tiny:hidden=3"),
                    Catch::Contains("unknown key 'hidden'"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", "llama-tiny:rope_scaling.rope_type=yarn"),
                    Catch::Contains("yarn"));
  CHECK_THROWS_WITH(LlamaConfig::parse("qwen2",
                                       "hidden_size=32,intermediate_size=64,"
                                       "num_hidden_layers=1,num_attention_heads=4,"
                                       "vocab_size=16,max_position_embeddings=32,"
                                       "attention_bias=false"),
                    Catch::Contains("attention_bias"));
  // Sliding windows: Mistral's on every layer, Qwen2's from max_window_layers on; a negative
  // window or first layer, or max_window_layers on another architecture, is refused.
  const std::string mistral =
      "hidden_size=32,intermediate_size=64,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=2,vocab_size=16,max_position_embeddings=64,seq_len=64";
  const LlamaConfig windowed = LlamaConfig::parse("mistral", mistral + ",sliding_window=16");
  CHECK(windowed.layer_window(0) == 16);
  CHECK(windowed.layer_window(1) == 16);
  CHECK_THAT(windowed.describe(), Catch::Contains("window 16"));
  CHECK_THROWS_WITH(LlamaConfig::parse("mistral", mistral + ",sliding_window=-1"),
                    Catch::Contains("sliding_window=-1"));
  CHECK_THROWS_WITH(LlamaConfig::parse("llama", mistral + ",sliding_window=16"),
                    Catch::Contains("not a Llama setting"));
  CHECK_THROWS_WITH(
      LlamaConfig::parse("mistral", mistral + ",sliding_window=16,max_window_layers=1"),
      Catch::Contains("max_window_layers=1") && Catch::Contains("Qwen2's"));
  // Qwen3: Qwen2's windows, and no attention biases (transformers' would put one on o_proj).
  const LlamaConfig qwen3 =
      LlamaConfig::parse("qwen3", mistral + ",sliding_window=16,max_window_layers=1");
  CHECK(qwen3.layer_window(0) == 0);
  CHECK(qwen3.layer_window(1) == 16);
  CHECK_THROWS_WITH(LlamaConfig::parse("qwen3", mistral + ",attention_bias=true"),
                    Catch::Contains("attention_bias=true") && Catch::Contains("o_proj"));
  CHECK_THROWS_WITH(LlamaConfig::parse("qwen3", "qwen2.5-0.5b"),
                    Catch::Contains("qwen2.5-0.5b is a qwen2 model"));
  const LlamaConfig qwen = LlamaConfig::parse(
      "qwen2", mistral + ",attention_bias=true,sliding_window=16,max_window_layers=1");
  CHECK(qwen.layer_window(0) == 0);
  CHECK(qwen.layer_window(1) == 16);
  CHECK_THAT(qwen.describe(), Catch::Contains("window 16 from layer 1"));
  CHECK_THROWS_WITH(LlamaConfig::parse("qwen2", mistral + ",attention_bias=true,"
                                                          "sliding_window=16,max_window_layers=-2"),
                    Catch::Contains("max_window_layers=-2"));
  const LlamaConfig ok = LlamaConfig::parse("mistral", mistral + ",sliding_window=64");
  CHECK(ok.head_dim == 8);
  CHECK(ok.num_key_value_heads == 2);
  CHECK_THAT(ok.describe(), !Catch::Contains("window"));  // as long as the sequence: none
  // config.json's defaults: no num_key_value_heads is multi-head attention.
  CHECK(LlamaConfig::parse("llama",
                           "hidden_size=32,intermediate_size=64,num_hidden_layers=1,"
                           "num_attention_heads=4,vocab_size=16,"
                           "max_position_embeddings=32")
            .num_key_value_heads == 4);
}

}  // namespace
}  // namespace zrt::llama
