#!/usr/bin/env python3
"""Generates rope_scaling_golden.json: transformers' own rotary scalings (modeling_rope_utils'
ROPE_INIT_FUNCTIONS) for the rope_types zrt implements besides default and llama3, and two tiny
models that use them, the reference tests/models/test_llama.cc checks against:

  - tables: YaRN as Qwen3 and Qwen2.5 ship it past 32K tokens (factor 4, original 32768, head_dim
    128), with truncate false, in DeepSeek's form (mscale / mscale_all_dim), with an explicit
    attention_factor and betas, and linear interpolation: each one's inv_freq and attention
    factor (the cosine's and sine's multiplier);
  - cases (make_llama_golden.py's form: per-layer outputs, logits, loss, every gradient):
    qwen3-yarn, a Qwen3ForCausalLM with YaRN factor 4 over an original context of 16 (so the
    ramp crosses the head's dimensions and the attention factor is 1.139), and llama-linear, a
    LlamaForCausalLM with linear factor 2.

Runs with the transformers v5 virtual environment that tools/install-python-deps --hf-venv
makes. Rerun and commit the output when the cases change:

    ~/.cache/zrt/hf-venv/bin/python3 tests/golden/make_rope_scaling_golden.py \\
        > tests/golden/rope_scaling_golden.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_golden as base  # noqa: E402
from gen_gpt_golden import b64  # noqa: E402

from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

T = 12


def table(label, head_dim, theta, max_position_embeddings, scaling):
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=max_position_embeddings,
                         rope_parameters=dict(scaling, rope_theta=theta))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    return {"label": label, "head_dim": head_dim, "rope_theta": theta,
            "max_position_embeddings": max_position_embeddings, "rope_scaling": scaling,
            "inv_freq": b64(inv_freq), "attention_factor": float(attention_factor)}


def tables():
    qwen = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    return [
        table("qwen3-8b-yarn", 128, 1000000.0, 131072, qwen),
        table("yarn-untruncated", 128, 1000000.0, 131072, dict(qwen, truncate=False)),
        table("deepseek-yarn", 64, 10000.0, 163840,
              {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}),
        table("yarn-explicit", 64, 500000.0, 65536,
              {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
               "attention_factor": 1.5, "beta_fast": 16.0, "beta_slow": 2.0}),
        table("linear", 128, 10000.0, 8192, {"rope_type": "linear", "factor": 2.0}),
    ]


def dims(**overrides):
    d = {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 100.0,
        "tie_word_embeddings": False, "attention_bias": False,
    }
    d.update(overrides)
    return d


def hf_fields(d):
    hf = {k: v for k, v in d.items() if k != "rope_scaling"}
    hf["rope_parameters"] = dict(d["rope_scaling"], rope_theta=d["rope_theta"])
    del hf["rope_theta"]
    return hf


def qwen3_yarn_case():
    d = dims(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 16})
    config = Qwen3Config(**hf_fields(d), attn_implementation="eager")
    model = Qwen3ForCausalLM(config)
    assert abs(model.model.rotary_emb.attention_scaling - 1.1386294361) < 1e-9
    return base.run_case("qwen3-yarn", model, config, d)


def llama_linear_case():
    d = dims(rope_scaling={"rope_type": "linear", "factor": 2.0}, rms_norm_eps=1e-5)
    config = LlamaConfig(**hf_fields(d), attn_implementation="eager")
    return base.run_case("llama-linear", LlamaForCausalLM(config), config, d)


def main():
    import transformers

    base.T = T
    torch.manual_seed(0)
    doc = {
        "generator": "tests/golden/make_rope_scaling_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tables": tables(),
        "cases": [qwen3_yarn_case(), llama_linear_case()],
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
