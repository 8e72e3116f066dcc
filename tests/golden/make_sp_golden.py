#!/usr/bin/env python3
"""Generates sp_golden.json: transformers' own LlamaForCausalLM in float64 trained for a few steps
of Adam on the global batches zrt's tests/train/test_train_sp.cc trains on, at any
sequence_parallel_size: the per-step losses every split of the batch (ranks, sp chunks,
micro-batches) must reproduce. With --model gpt2, sp_gpt2_golden.json: the same for transformers'
GPT2LMHeadModel (tests/train/test_train_sp_gpt.cc).

The model is llama-tiny (hidden 64, 4 query and 2 key/value heads of 16, 2 layers, untied head)
at seq_len 32. Weights come from zrt's counter RNG (models/init_rng.h, gen_gpt_golden.py) keyed
on the parameter index in transformers' order: matrices float32(0.2 * normal), RMSNorm weights
float32(1 + float32(0.1 * normal)), large enough that attention is far from uniform, so rotary
positions and the causal mask move the loss. The data is test_train_sp.cc's corpus: token i of
its one llm.c shard is counter_hash(SEED, 3000, i) % 64 + 32 when i % 8 < 4, else the token 4
before it plus one (modulo 256): half repeats, so attention to the right earlier position pays.
Sample k is the window of tokens [k*T, k*T+T]; step s trains on samples 4s .. 4s+3 (the global
batch of 4, data.shuffle off), the mean cross-entropy over their 4*T targets, the gradient
clipped to norm 1 (zrt's coefficient 1 / (norm + 1e-6)), then Adam (lr 3e-3, betas 0.9/0.999,
eps 1e-8, no weight decay), everything in float64.

The GPT-2 is gpt2-tiny (n_embd 64, 4 heads of 16, 2 layers, tied head, tanh GELU, no dropout)
with 32 learned positions. Its weights follow the same rule (LayerNorm weights, the 1-D
".weight" tensors, float32(1 + float32(0.1 * normal)); every other tensor, the embeddings and
biases included, float32(0.2 * normal)): large position embeddings, so a chunk that read the
wrong rows of wpe would move the loss.

    python3 tests/golden/make_sp_golden.py > tests/golden/sp_golden.json
    python3 tests/golden/make_sp_golden.py --model gpt2 > tests/golden/sp_gpt2_golden.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt_golden import counter_hash, normal_tensor  # noqa: E402

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

SEED = 2101
T = 32
BATCH = 4
STEPS = 4
LR = 3e-3
CLIP = 1.0


def corpus(n):
    tokens = []
    for i in range(n):
        if i % 8 < 4:
            tokens.append(counter_hash(SEED, 3000, i) % 64 + 32)
        else:
            tokens.append((tokens[i - 4] + 1) % 256)
    return tokens


def weights(name, shape, index):
    if name.endswith("norm.weight"):
        return (normal_tensor(SEED, index, shape, 0.1).float() + 1.0).double()
    return normal_tensor(SEED, index, shape, 0.2)


def gpt2_weights(name, shape, index):
    if len(shape) == 1 and name.endswith(".weight"):  # the LayerNorms
        return (normal_tensor(SEED, index, shape, 0.1).float() + 1.0).double()
    return normal_tensor(SEED, index, shape, 0.2)


def llama():
    dims = {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "attention_bias": False,
    }
    config = LlamaConfig(**dims, attn_implementation="eager")
    model = LlamaForCausalLM(config).double()
    return dims, model, weights, lambda inputs: model.lm_head(
        model.model(input_ids=inputs).last_hidden_state)


def gpt2():
    dims = {
        "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": T,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
    }
    config = GPT2Config(**dims, attn_implementation="eager")
    model = GPT2LMHeadModel(config).double()
    return dims, model, gpt2_weights, lambda inputs: model.lm_head(
        model.transformer(input_ids=inputs).last_hidden_state)


def main():
    import transformers

    name = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "llama"
    dims, model, init, logits_of = {"llama": llama, "gpt2": gpt2}[name]()
    with torch.no_grad():
        for index, (name, p) in enumerate(model.named_parameters()):
            p.copy_(init(name, tuple(p.shape), index))
    tokens = corpus(STEPS * BATCH * T + 1)
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses = []
    for step in range(STEPS):
        first = step * BATCH
        rows = [tokens[(first + b) * T:(first + b) * T + T + 1] for b in range(BATCH)]
        inputs = torch.tensor([r[:T] for r in rows])
        targets = torch.tensor([r[1:] for r in rows])
        model.zero_grad()
        logits = logits_of(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params)).item()
        coef = min(1.0, CLIP / (norm + 1e-6))
        t = step + 1
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad * coef
                mi.mul_(0.9).add_(g, alpha=0.1)
                vi.mul_(0.999).addcmul_(g, g, value=0.001)
                mhat = mi / (1 - 0.9 ** t)
                vhat = vi / (1 - 0.999 ** t)
                p.sub_(LR * mhat / (vhat.sqrt() + 1e-8))
    doc = {
        "generator": "tests/golden/make_sp_golden.py" + ("" if name == "llama" else " --model " + name),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "T": T,
        "batch": BATCH,
        "dims": dims,
        "names": [name for name, _ in model.named_parameters()],
        "losses": losses,
    }
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
