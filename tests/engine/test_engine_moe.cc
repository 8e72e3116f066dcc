// The mixtures of experts under the engine, every expert local: a tiny Qwen2-MoE (a shared expert
// behind its sigmoid gate, a dense layer, q/k/v biases, no renormalisation) and a tiny Qwen3-MoE
// (q/k norms, renormalised top-3 of 8) train for 10 steps of AdamW at every stage (stage 3 also
// with activation checkpointing, and with offload) at the world size mpirun gives (1, 2, 4), to
// the parameters and per-step losses of a single-process loop (tests/engine/model_parity.h).
//
// The load-balancing term is transformers' per forward: each rank's forward computes it over its
// own rows, and the engine averages the ranks' gradients and losses. The reference therefore runs
// one forward per rank's rows, each scaled by 1 / world (per_forward_terms), which is also what
// gradient accumulation over that many micro-batches gives in one process. The tolerance's
// derivation is test_engine_gpt.cc's, from the model's re-association sensitivity with the term
// switched off (router_aux_loss_coef 0: then how the batch is split changes only roundings).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/engine/model_parity.h"

using namespace zrt;

namespace {

// Qwen2-MoE's key bias has an exactly zero gradient (test_engine_llama.cc): compared absolutely.
bool is_key_bias(const std::string& name) {
  const std::string suffix = "self_attn.k_proj.bias";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

test::ParityCase moe_case(const std::string& spec) {
  test::ParityCase pc;
  pc.spec = spec + ",router_aux_loss_coef=0.02";
  pc.bounds_spec = spec + ",router_aux_loss_coef=0";
  pc.per_forward_terms = true;
  pc.steps = 10;
  // At these sizes a step's loss varies with its batch by +-0.02, more than ten steps of lr 3e-3
  // lower it (the loss trajectories of the tiny Qwen2 and MoE models alike): the gradients'
  // correctness is test_moe's, against transformers.
  pc.expect_learning = false;
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

TEST_CASE("the tiny Qwen2-MoE trains to the single-process parameters at every stage", "[moe]") {
  test::check_engine_parity(moe_case(
      "qwen2_moe:hidden_size=32,intermediate_size=48,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=2,vocab_size=256,max_position_embeddings=32,num_experts=4,"
      "num_experts_per_tok=2,moe_intermediate_size=16,shared_expert_intermediate_size=24,"
      "norm_topk_prob=false,mlp_only_layers=1"));
}

TEST_CASE("the tiny Qwen3-MoE trains to the single-process parameters at every stage", "[moe]") {
  test::check_engine_parity(moe_case(
      "qwen3_moe:hidden_size=32,intermediate_size=48,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=2,head_dim=8,vocab_size=256,max_position_embeddings=32,"
      "num_experts=8,num_experts_per_tok=3,moe_intermediate_size=12,norm_topk_prob=true"));
}
