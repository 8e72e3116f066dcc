#!/usr/bin/env python3
"""Generates moe_golden.json: transformers' own mixture-of-experts models in float64 on tiny
shapes, the reference zrt's MoE models are checked against: for MixtralForCausalLM,
Qwen2MoeForCausalLM (a shared expert with its sigmoid gate, one dense layer through
mlp_only_layers) and Qwen3MoeForCausalLM (q/k norms, norm_topk_prob), the router's choices and
weights per layer, the logits, the training loss as transformers adds it up (cross-entropy +
router_aux_loss_coef x the load-balancing term), the term alone, and every parameter's gradient.

Run with a Python that has torch and a transformers with Qwen3-MoE (>= 4.51; the parameters are
then the fused per-layer experts, experts.gate_up_proj (E, 2I, C) and experts.down_proj
(E, C, I), as transformers v5 holds them), and commit the output:

    python3 tests/golden/make_moe_golden.py > tests/golden/moe_golden.json

Weights and tokens come from zrt's counter RNG as in make_llama_golden.py (keyed on the parameter
index in transformers' order). The routing must not hinge on rounding: the script checks that, in
every layer, each token's k-th and (k+1)-th router probabilities differ by at least MIN_MARGIN (so
an fp32 run picks the same experts) and stores the smallest margin; it exits with an error if a
case falls short. The routers' softmax and RMSNorm run in float64 (the script patches out
transformers' float32 round trips in them). The loss is computed from the float64 logits (transformers' loss_function
casts them to float32) and checked against the model's own loss to 1e-6; the load-balancing term
likewise in float64 (transformers sums it in float32) and checked against its function.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt_golden import b64, counter_hash  # noqa: E402
from make_llama_golden import weight_values  # noqa: E402

import transformers  # noqa: E402
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,  # noqa: E402
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402

SEED = 1701
B, T = 2, 8
AUX_COEF = 0.02
MIN_MARGIN = 1e-4


def router_choices(logits, top_k, norm_topk_prob):
    """transformers' router: softmax in float, top-k, optionally renormalised."""
    probs = F.softmax(logits, dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    ordered = torch.sort(probs, dim=-1, descending=True).values
    margin = (ordered[:, top_k - 1] - ordered[:, top_k]).min().item() if top_k < probs.shape[-1] \
        else float("inf")
    return weights, experts, margin


def router_in_input_dtype(self, hidden_states):
    """The routers' forward (Mixtral's, Qwen2-MoE's, Qwen3-MoE's) with the softmax in the input
    dtype: transformers takes it in float32, which would put float32 roundings into the float64
    golden's routing weights and the router's gradient. Mixtral always renormalises."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = F.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def rms_norm_in_input_dtype(self, hidden_states):
    """RMSNorm without its float32 round trip (the same formula in float64)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


for module, prefix in ((modeling_mixtral, "Mixtral"), (modeling_qwen2_moe, "Qwen2Moe"),
                       (modeling_qwen3_moe, "Qwen3Moe")):
    getattr(module, prefix + "TopKRouter").forward = router_in_input_dtype
    getattr(module, prefix + "RMSNorm").forward = rms_norm_in_input_dtype


def load_balancing(router_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func (no attention mask) in float64: it sums its counts
    and probabilities in float32. Over the L layers' N rows each: E x sum_e (selections of e /
    (L N)) x (probability mass of e / (L N)); only the probabilities carry a gradient."""
    counts = torch.zeros(num_experts, dtype=torch.float64)
    mass = torch.zeros(num_experts, dtype=torch.float64)
    rows = 0
    for r in router_logits:
        probs = F.softmax(r, dim=-1)
        experts = torch.topk(probs, top_k, dim=-1).indices
        counts = counts + torch.bincount(experts.reshape(-1), minlength=num_experts).double()
        mass = mass + probs.sum(dim=0)
        rows += r.shape[0]
    return num_experts * torch.sum((counts / rows) * (mass / rows))


def run_case(label, model_cls, config, dims, norm_topk_prob):
    model = model_cls(config).double().train()
    names, shapes = [], []
    with torch.no_grad():
        for index, (name, p) in enumerate(model.named_parameters()):
            names.append(name)
            shapes.append(list(p.shape))
            p.copy_(weight_values(name, tuple(p.shape), index))
    V = config.vocab_size
    n = B * T
    tokens = torch.tensor([counter_hash(SEED, 1000, i) % V for i in range(n)]).reshape(B, T)
    targets = torch.tensor([counter_hash(SEED, 1001, i) % V for i in range(n)]).reshape(B, T)

    out = model.model(input_ids=tokens, output_router_logits=True)
    logits = model.lm_head(out.last_hidden_state)
    router_logits = [r for r in out.router_logits if r is not None]
    top_k = config.num_experts_per_tok
    E = dims["num_experts"]
    aux = load_balancing(router_logits, E, top_k)
    theirs = load_balancing_loss_func(tuple(router_logits), E, top_k).item()
    if abs(theirs - aux.item()) > 1e-6 * max(1.0, abs(theirs)):
        sys.exit(f"{label}: transformers' load-balancing term {theirs} != {aux.item()}")
    ce = F.cross_entropy(logits.reshape(n, V), targets.reshape(n))
    loss = ce + AUX_COEF * aux
    # transformers' own training loss (labels are the inputs shifted inside it, so give it the
    # targets one place to the right: labels[t+1] = targets[t]).
    labels = torch.cat([torch.full((B, 1), -100), targets], dim=1)[:, :T + 1]
    ids = torch.cat([tokens, torch.zeros((B, 1), dtype=tokens.dtype)], dim=1)
    own = model(input_ids=ids, labels=labels, output_router_logits=True)
    # Its forward saw one more token per row, so its load-balancing term differs; compare the
    # cross-entropy part (what it adds on top is coef x its own aux_loss).
    own_ce = (own.loss - AUX_COEF * own.aux_loss).item()
    if abs(own_ce - ce.item()) > 1e-6:
        sys.exit(f"{label}: transformers' loss {own_ce} != {ce.item()}")
    loss.backward()

    layers = []
    min_margin = float("inf")
    for r in router_logits:
        weights, experts, margin = router_choices(r.detach(), top_k, norm_topk_prob)
        min_margin = min(min_margin, margin)
        layers.append({"router_logits": b64(r.detach()), "experts": experts.reshape(-1).tolist(),
                       "weights": b64(weights)})
    if min_margin < MIN_MARGIN:
        sys.exit(f"{label}: routing margin {min_margin} below {MIN_MARGIN}; change SEED")
    return {
        "label": label,
        "architecture": config.model_type,
        "dims": dims,
        "B": B,
        "T": T,
        "seed": SEED,
        "router_aux_loss_coef": AUX_COEF,
        "names": names,
        "shapes": shapes,
        "tokens": tokens.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "moe_layers": layers,
        "min_routing_margin": min_margin,
        "logits": b64(logits.detach()),
        "cross_entropy": ce.item(),
        "aux_loss": aux.item(),
        "loss": loss.item(),
        "grads": {name: b64(p.grad) for name, p in model.named_parameters()},
    }


def common(hidden=16, heads=4, kv=2, head_dim=8):
    return {"vocab_size": 32, "hidden_size": hidden, "num_hidden_layers": 2,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 100.0,
            "tie_word_embeddings": False, "router_aux_loss_coef": AUX_COEF,
            "attn_implementation": "eager", "experts_implementation": "eager"}


def mixtral_case():
    """Mixtral: softmax router, top-2 of 4 SwiGLU experts, always renormalised."""
    dims = dict(common(), intermediate_size=12, num_local_experts=4, num_experts_per_tok=2)
    config = MixtralConfig(**dims)
    dims = dict(dims, num_experts=4, norm_topk_prob=True)
    return run_case("mixtral-tiny", MixtralForCausalLM, config, dims, True)


def qwen2_moe_case():
    """Qwen2-MoE: top-2 of 6 experts without renormalising, a shared expert behind a sigmoid
    gate, q/k/v biases, layer 1 a dense MLP (mlp_only_layers)."""
    dims = dict(common(), intermediate_size=20, moe_intermediate_size=12,
                shared_expert_intermediate_size=24, num_experts=6, num_experts_per_tok=2,
                norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1])
    config = Qwen2MoeConfig(**dims)
    return run_case("qwen2-moe-tiny", Qwen2MoeForCausalLM, config, dims, False)


def qwen3_moe_case():
    """Qwen3-MoE: top-3 of 8 small experts, renormalised, per-head q/k RMSNorm, no shared
    expert, no attention biases."""
    dims = dict(common(), intermediate_size=20, moe_intermediate_size=8, num_experts=8,
                num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[])
    config = Qwen3MoeConfig(**dims)
    return run_case("qwen3-moe-tiny", Qwen3MoeForCausalLM, config, dims, True)


def main():
    torch.manual_seed(0)
    cases = [mixtral_case(), qwen2_moe_case(), qwen3_moe_case()]
    json.dump({"generator": "tests/golden/make_moe_golden.py",
               "transformers": transformers.__version__, "torch": torch.__version__,
               "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
