#!/usr/bin/env python3
"""Generates llama_window_golden.json: transformers' own MistralForCausalLM and Qwen2ForCausalLM
(float64) with sliding-window attention shorter than the sequence, the reference
tests/models/test_llama.cc checks zrt's windowed attention against, case for case as
make_llama_golden.py's (per-layer outputs, logits, loss, every parameter's gradient):

  - mistral-window: a window of 5 tokens on every layer, 12-token sequences;
  - qwen2-window: use_sliding_window with a window of 4 from max_window_layers 1 on, so layer 0
    attends over the whole sequence and layer 1 over the window (transformers' layer_types).

The window semantics are transformers 5's (masking_utils' sliding_window_overlay: query q sees
key k when q - window < k <= q), so this runs with the transformers v5 virtual environment that
tools/install-python-deps --hf-venv makes (make_llama_golden.py's Debian transformers 4.45 masks
Qwen2's windows on every layer). Rerun and commit the output when the cases change:

    ~/.cache/zrt/hf-venv/bin/python3 tests/golden/make_llama_window_golden.py \\
        > tests/golden/llama_window_golden.json

Weights and tokens come from zrt's counter-based RNG as in make_llama_golden.py.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_golden as base  # noqa: E402

from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

T = 12  # longer than both windows, so most rows see only a part of their causal context


def mistral_case():
    dims = {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 100.0,
        "tie_word_embeddings": False, "attention_bias": False, "sliding_window": 5,
    }
    hf = {k: v for k, v in dims.items() if k != "attention_bias"}
    config = MistralConfig(**hf, attn_implementation="eager")
    return base.run_case("mistral-window", MistralForCausalLM(config), config, dims)


def qwen2_case():
    dims = {
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "attention_bias": True, "sliding_window": 4,
        "max_window_layers": 1,
    }
    hf = {k: v for k, v in dims.items() if k not in ("head_dim", "attention_bias")}
    config = Qwen2Config(**hf, use_sliding_window=True, attn_implementation="eager")
    assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
    return base.run_case("qwen2-window", Qwen2ForCausalLM(config), config, dims)


def main():
    import transformers

    base.T = T  # run_case reads the batch shape from make_llama_golden's globals
    torch.manual_seed(0)
    doc = {
        "generator": "tests/golden/make_llama_window_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": [mistral_case(), qwen2_case()],
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
