#!/usr/bin/env python3
"""Generates qwen3_golden.json: transformers' own Qwen3ForCausalLM (float64), the reference
tests/models/test_llama.cc checks zrt's dense Qwen3 against, case for case as
make_llama_golden.py's (per-layer outputs, logits, loss, every parameter's gradient):

  - qwen3-tiny: q_norm / k_norm (an RMSNorm over each query and key head before the rotation),
    no attention biases, head_dim 8 wider than hidden_size / num_attention_heads (4), GQA 4/2,
    an untied head;
  - qwen3-window: the same with use_sliding_window, a window of 4 from max_window_layers 1 on
    (layer 0 attends over the whole sequence, layer 1 over the window), a tied head.

Sequences of 12 tokens, longer than the window. Qwen3 came to transformers after Debian's 4.45,
so this runs with the transformers v5 virtual environment that tools/install-python-deps
--hf-venv makes. Rerun and commit the output when the cases change:

    ~/.cache/zrt/hf-venv/bin/python3 tests/golden/make_qwen3_golden.py \\
        > tests/golden/qwen3_golden.json

Weights and tokens come from zrt's counter-based RNG as in make_llama_golden.py (the norm
weights, q_norm's and k_norm's among them, near 1 with a spread of 0.1).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_golden as base  # noqa: E402

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

T = 12


def dims(**overrides):
    d = {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 100.0,
        "tie_word_embeddings": False, "attention_bias": False,
    }
    d.update(overrides)
    return d


def qwen3_case(label, d, use_sliding_window):
    config = Qwen3Config(**d, use_sliding_window=use_sliding_window, attn_implementation="eager")
    model = Qwen3ForCausalLM(config)
    names = [n for n, _ in model.named_parameters()]
    assert "model.layers.0.self_attn.q_norm.weight" in names, names
    return base.run_case(label, model, config, d)


def main():
    import transformers

    base.T = T  # run_case reads the batch shape from make_llama_golden's globals
    torch.manual_seed(0)
    plain = qwen3_case("qwen3-tiny", dims(), False)
    windowed_dims = dims(tie_word_embeddings=True, sliding_window=4, max_window_layers=1)
    config = Qwen3Config(**windowed_dims, use_sliding_window=True)
    assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
    windowed = qwen3_case("qwen3-window", windowed_dims, True)
    doc = {
        "generator": "tests/golden/make_qwen3_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": [plain, windowed],
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
