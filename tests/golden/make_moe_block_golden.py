#!/usr/bin/env python3
"""Generates moe_block_golden.json: transformers' own sparse MoE blocks in float64, the reference
tests/kernels/test_moe_block_golden.cc composes zrt's MoE kernels (kernels/moe_ops.h) against:
MixtralSparseMoeBlock (top-2 of 8, weights renormalised) and Qwen3MoeSparseMoeBlock (top-2 of 6,
norm_topk_prob False; Qwen2-MoE's router and experts are the same code, its block adds a shared
expert that is no MoE kernel). For each: the input, the weights, the router logits, the chosen
experts and their weights, the block output, the load-balancing loss of
load_balancing_loss_func over two layers (the block's router logits and a second, stored set),
the router z-loss, and the gradients of

    total = sum(out * R) + AUX * load_balancing_loss + Z * z_loss

with respect to the input, every weight and the second layer's logits.

Needs torch and transformers (tools/install-python-deps); the test reads only the JSON. Rerun and
commit the output when the cases change:

    python3 tests/golden/make_moe_block_golden.py > tests/golden/moe_block_golden.json

Inputs come from torch's seeded generator and are stored, rounded to float32 first so the fp32
kernels see them exactly. The blocks run in float64 except where transformers' router itself
computes in float32 (the softmax and top-k: `router_logits.float()` / `dtype=torch.float`), as it
does for every model dtype. Tensors are base64 of little-endian float64, with their shapes.
"""
import base64
import json
import sys

import torch
import transformers
from transformers.models.mixtral.configuration_mixtral import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import (MixtralSparseMoeBlock,
                                                          load_balancing_loss_func)
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

N, C, I = 12, 16, 12
AUX, Z = 0.25, 0.125


def f64(t):
    t = t.detach().to(torch.float64).contiguous()
    return {"shape": list(t.shape), "f64": base64.b64encode(t.numpy().tobytes()).decode()}


def rounded(shape, gen, scale):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).float().double()


def run_case(name, block, E, k, renormalize, seed):
    gen = torch.Generator().manual_seed(seed)
    block = block.double().train()
    with torch.no_grad():
        block.gate.weight.copy_(rounded((E, C), gen, 0.5))
        block.experts.gate_up_proj.copy_(rounded((E, 2 * I, C), gen, 0.3))
        block.experts.down_proj.copy_(rounded((E, C, I), gen, 0.3))
    x = rounded((1, N, C), gen, 1.0).requires_grad_(True)
    R = rounded((1, N, C), gen, 1.0)
    logits2 = rounded((N, E), gen, 1.0).requires_grad_(True)

    captured = {}

    def keep(_module, _inputs, output):
        captured["logits"], captured["weights"], captured["experts"] = output

    hook = block.gate.register_forward_hook(keep)
    out = block(x)
    hook.remove()
    logits = captured["logits"]
    # fp32 kernels must choose the same experts: no near-ties around any of the k picks.
    top = torch.softmax(logits.detach(), dim=-1).sort(dim=-1, descending=True).values[:, :k + 1]
    assert (top[:, :-1] - top[:, 1:]).min() > 1e-4, "a near-tie in the routing: change the seed"
    logits.retain_grad()
    lb = load_balancing_loss_func((logits, logits2), E, k)
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    total = (out * R).sum() + AUX * lb + Z * z
    total.backward()
    return {
        "name": name,
        "E": E,
        "k": k,
        "renormalize": renormalize,
        "x": f64(x.reshape(N, C)),
        "R": f64(R.reshape(N, C)),
        "router_weight": f64(block.gate.weight),
        "gate_up_proj": f64(block.experts.gate_up_proj),
        "down_proj": f64(block.experts.down_proj),
        "logits2": f64(logits2),
        "logits": f64(logits),
        "experts": captured["experts"].tolist(),
        "weights": f64(captured["weights"]),
        "out": f64(out.reshape(N, C)),
        "lb_loss": lb.item(),
        "z_loss": z.item(),
        "dx": f64(x.grad.reshape(N, C)),
        "drouter_weight": f64(block.gate.weight.grad),
        "dgate_up_proj": f64(block.experts.gate_up_proj.grad),
        "ddown_proj": f64(block.experts.down_proj.grad),
        "dlogits2": f64(logits2.grad),
    }


def main():
    mixtral = MixtralConfig(hidden_size=C, intermediate_size=I, num_local_experts=8,
                            num_experts_per_tok=2, router_jitter_noise=0.0)
    mixtral._experts_implementation = "eager"
    qwen3 = Qwen3MoeConfig(hidden_size=C, moe_intermediate_size=I, num_experts=6,
                           num_experts_per_tok=2, norm_topk_prob=False)
    qwen3._experts_implementation = "eager"
    cases = [
        run_case("mixtral", MixtralSparseMoeBlock(mixtral), 8, 2, True, 20260101),
        run_case("qwen3_moe", Qwen3MoeSparseMoeBlock(qwen3), 6, 2, False, 20260102),
    ]
    json.dump({"generator": "tests/golden/make_moe_block_golden.py",
               "transformers": transformers.__version__, "torch": torch.__version__,
               "N": N, "C": C, "I": I, "aux_coef": AUX, "z_coef": Z, "cases": cases},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
