#!/usr/bin/env python3
"""Generates moe_window_golden.json: make_moe_golden.py's Mixtral and Qwen3-MoE cases with a
sliding window of 3 tokens over their 8-token sequences (Mixtral's sliding_window; Qwen3-MoE's
use_sliding_window, which transformers 5 applies to every layer), in the same form (router
choices, logits, loss, every gradient), the reference tests/models/test_moe.cc checks zrt's
windowed attention in the mixtures of experts against. Run with the transformers v5 virtual
environment (tools/install-python-deps --hf-venv) and commit the output:

    ~/.cache/zrt/hf-venv/bin/python3 tests/golden/make_moe_window_golden.py \\
        > tests/golden/moe_window_golden.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_moe_golden as base  # noqa: E402

from transformers import (MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,  # noqa: E402
                          Qwen3MoeForCausalLM)

WINDOW = 3


def mixtral_case():
    dims = dict(base.common(), intermediate_size=12, num_local_experts=4, num_experts_per_tok=2,
                sliding_window=WINDOW)
    config = MixtralConfig(**dims)
    assert config.sliding_window == WINDOW
    dims = dict(dims, num_experts=4, norm_topk_prob=True)
    return base.run_case("mixtral-window", MixtralForCausalLM, config, dims, True)


def qwen3_moe_case():
    dims = dict(base.common(), intermediate_size=20, moe_intermediate_size=8, num_experts=8,
                num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], sliding_window=WINDOW)
    config = Qwen3MoeConfig(**dims, use_sliding_window=True)
    assert config.sliding_window == WINDOW
    return base.run_case("qwen3-moe-window", Qwen3MoeForCausalLM, config, dims, True)


def main():
    import transformers

    torch.manual_seed(0)
    cases = [mixtral_case(), qwen3_moe_case()]
    json.dump({"generator": "tests/golden/make_moe_window_golden.py",
               "transformers": transformers.__version__, "torch": torch.__version__,
               "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
