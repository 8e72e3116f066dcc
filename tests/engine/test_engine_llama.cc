// The Llama family under the engine: a tiny Llama (grouped-query attention, untied head) and a
// tiny Qwen2 (q/k/v biases, tied head) train for 10 steps of AdamW at every stage (stage 3 also
// with activation checkpointing, and with offload), at the world size mpirun gives (1, 2, 4), to
// the parameters and per-step losses of a plain single-process loop over the whole global batch
// (tests/engine/model_parity.h; the tolerance's derivation is test_engine_gpt.cc's).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/engine/model_parity.h"

using namespace zrt;

namespace {

// Qwen2's key bias has an exactly zero gradient (it adds q.b_k to every score of a query's row,
// which softmax ignores): its rounding noise becomes Adam updates of up to lr per step, so it is
// compared absolutely and left out of the relative comparison.
bool is_key_bias(const std::string& name) {
  const std::string suffix = "self_attn.k_proj.bias";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

test::ParityCase llama_case(const std::string& spec) {
  test::ParityCase pc;
  pc.spec = spec;
  pc.steps = 10;
  pc.parts = [](const std::string& name, const std::vector<float>& x) {
    if (is_key_bias(name)) return std::vector<std::vector<float>>{};
    return std::vector<std::vector<float>>{x};
  };
  pc.absolute = [pc](const std::string& name, const std::vector<float>& got,
                     const std::vector<float>& want) {
    if (!is_key_bias(name)) return;
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(std::abs(got[i] - want[i]) <= pc.steps * pc.lr);
    }
  };
  return pc;
}

}  // namespace

TEST_CASE("the tiny Llama trains to the single-process parameters at every stage", "[llama]") {
  test::check_engine_parity(llama_case("llama-tiny:seq_len=32"));
}

TEST_CASE("the tiny Qwen2 (biases, tied head) trains to the single-process parameters", "[llama]") {
  test::check_engine_parity(llama_case(
      "qwen2:hidden_size=64,intermediate_size=96,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=2,vocab_size=256,max_position_embeddings=32,"
      "tie_word_embeddings=true"));
}

// model.frozen's engine side: the tied embedding (a unit of its own), every query projection,
// layer 0's key bias, layer 1's MLP and input norm and the final norm (parts of units, beside
// trained parameters) frozen: no gradient buffer for them (the engine throws if the model asks). At
// every stage, with checkpointing and offload, the frozen ones come back bit for bit, the gradient
// norm is the trained parameters' (what clipping scales by), and the trained ones match a reference
// that never touches the frozen ones.
TEST_CASE("the tiny Qwen2 with frozen parameters trains only the others, at every stage",
          "[llama][frozen]") {
  test::ParityCase pc = llama_case(
      "qwen2:hidden_size=64,intermediate_size=96,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=2,vocab_size=256,max_position_embeddings=32,"
      "tie_word_embeddings=true");
  pc.steps = 4;
  pc.expect_learning = false;
  pc.frozen = [](const std::string& name) {
    const auto has = [&](const std::string& part) { return name.find(part) != std::string::npos; };
    return name == "model.embed_tokens.weight" || has(".self_attn.q_proj.") ||
           has("model.layers.1.mlp.") || name == "model.layers.0.self_attn.k_proj.bias" ||
           name == "model.layers.1.input_layernorm.weight" || name == "model.norm.weight";
  };
  pc.first_backward_module = 1;  // the tied embedding's backward is not run
  test::check_engine_parity(pc);
}

// Freezing the lower layers (LLaMA-Factory's freeze mode, the embedding and layer 0 here): the
// backward ends at layer 1, the lowest module with a trained parameter, with no gradient, gather,
// recompute or reduction below it, and trains layer 1 and the head as the reference's whole
// backward does, at every stage, with checkpointing and offload.
TEST_CASE("the tiny Llama with its lower layer frozen: the backward ends above it",
          "[llama][frozen]") {
  test::ParityCase pc = llama_case("llama-tiny:seq_len=32");
  pc.steps = 4;
  pc.expect_learning = false;
  pc.frozen = [](const std::string& name) {
    return name == "model.embed_tokens.weight" || name.rfind("model.layers.0.", 0) == 0;
  };
  pc.first_backward_module = 2;
  test::check_engine_parity(pc);
}
