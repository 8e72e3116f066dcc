#!/usr/bin/env python3
"""Generates llama_golden.json: transformers' own LlamaForCausalLM and Qwen2ForCausalLM (float64)
on tiny shapes, the reference tests/models/test_llama.cc checks zrt's Llama-family model against:
per-layer outputs, logits, loss and every parameter's gradient, and the rotary frequency tables
(including Llama 3.1's llama3 scaling) as transformers computes them.

Needs torch and transformers (pip install transformers for Debian's python3, which has torch;
run with /usr/bin/python3). The tests read only the JSON. Rerun and commit the output when the
cases change:

    /usr/bin/python3 tests/golden/make_llama_golden.py > tests/golden/llama_golden.json

Weights and tokens are not stored: they come from zrt's counter-based RNG (models/init_rng.h,
implemented again in gen_gpt_golden.py), keyed on (seed, parameter index, element) in zrt's
parameter order, which must equal transformers' (the test checks the names). Every input is
rounded to float32 and the models run in float64 (transformers computes RMSNorm and the rotary
tables in float32 internally, a 1e-7 relative effect). Tensors are base64 of little-endian
float32.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt_golden import b64, counter_hash, normal_tensor  # noqa: E402

from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

SEED = 1601
B, T = 2, 6


def weight_values(name, shape, index):
    """zrt's test weights for parameter `index`: RMSNorm weights near 1, biases and matrices
    with enough spread that every term of the gradient matters."""
    if name.endswith("norm.weight"):
        return normal_tensor(SEED, index, shape, 0.1, 1.0)
    if name.endswith(".bias"):
        return normal_tensor(SEED, index, shape, 0.1)
    return normal_tensor(SEED, index, shape, 0.2)


def run_case(label, model, config, dims):
    model = model.double().eval()
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

    layer_outputs = []

    def keep(_module, _inputs, output):
        layer_outputs.append(output[0] if isinstance(output, tuple) else output)

    hooks = [layer.register_forward_hook(keep) for layer in model.model.layers]
    # The head applied here rather than through model(...), which (transformers 4.45) casts the
    # logits to float32.
    logits = model.lm_head(model.model(input_ids=tokens).last_hidden_state)
    for h in hooks:
        h.remove()
    loss = torch.nn.functional.cross_entropy(logits.reshape(n, V), targets.reshape(n))
    loss.backward()
    grads = {name: b64(p.grad) for name, p in model.named_parameters()}
    inv_freq = model.model.rotary_emb.inv_freq
    return {
        "label": label,
        "architecture": config.model_type,
        "dims": dims,
        "B": B,
        "T": T,
        "seed": SEED,
        "names": names,
        "shapes": shapes,
        "tokens": tokens.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "layer_outputs": [b64(o) for o in layer_outputs],
        "logits": b64(logits),
        "loss": loss.item(),
        "grads": grads,
        "inv_freq": b64(inv_freq),
    }


def llama_dims():
    """Llama 3.1-style: GQA 4/2, head_dim 8 with hidden 16 (q is wider than the residual),
    llama3 rope scaling with all three frequency bands (theta 100 gives wavelengths 6.3, 20,
    63 and 200 against the bands' edges 8 and 32), untied head. (make_llama_packed_golden.py
    uses the same dims.)"""
    return {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 100.0,
        "tie_word_embeddings": False, "attention_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    }


def llama_case():
    dims = llama_dims()
    config = LlamaConfig(**dims, attn_implementation="eager")
    return run_case("llama3-tiny", LlamaForCausalLM(config), config, dims)


def qwen2_case():
    """Qwen2.5-style: q/k/v biases, tied head, GQA 4/2, rms_norm_eps 1e-6."""
    dims = {
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "attention_bias": True,
    }
    hf = {k: v for k, v in dims.items() if k not in ("head_dim", "attention_bias")}
    config = Qwen2Config(**hf, attn_implementation="eager")
    return run_case("qwen2-tiny", Qwen2ForCausalLM(config), config, dims)


def llama31_8b_inv_freq():
    """The rotary table of Llama 3.1 8B (head_dim 128, theta 5e5, llama3 factor 8)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
                         max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return b64(inv_freq)


def main():
    import transformers

    torch.manual_seed(0)
    doc = {
        "generator": "tests/golden/make_llama_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": [llama_case(), qwen2_case()],
        "llama31_8b_inv_freq": llama31_8b_inv_freq(),
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
