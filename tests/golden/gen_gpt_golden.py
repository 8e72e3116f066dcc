#!/usr/bin/env python3
"""Generates gpt_golden.json: PyTorch (float64) forward and backward of every GPT-2 layer and of
a whole tiny GPT-2, the reference tests/kernels/test_kernels_golden and tests/models/test_gpt
check zrt's kernels and model against.

Needs Debian's python3-torch (apt-get install python3-torch; run with /usr/bin/python3). The
tests read only the JSON, so torch is not needed to build or test zrt. Rerun and commit the
output when the cases change:

    /usr/bin/python3 tests/golden/gen_gpt_golden.py > tests/golden/gpt_golden.json

Inputs are not stored: they come from the counter-based RNG of models/init_rng.h, implemented
again below (splitmix64 + Box-Muller in double precision), which the C++ tests call with the same
(seed, stream, element) keys. The tiny GPT's weights are zrt's own initialisation
(Gpt::init_parameter, GPT-2's scheme), so the test also proves that the two RNGs agree (it
compares per-tensor checksums first). Every input is rounded to float32 and then computed on in
float64, so the golden values are the exact answer for the float32 inputs; tensors are stored as
base64 of little-endian float32.
"""
import base64
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

MASK = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
LAYER_SEED = 20240601  # kLayerSeed in the C++ tests
GPT_SEED = 1234


# ---- models/init_rng.h ------------------------------------------------------------------------
def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def counter_hash(seed, stream, counter):
    key = mix64((mix64((seed + GOLDEN_GAMMA) & MASK) + stream * GOLDEN_GAMMA) & MASK)
    return mix64((key + (counter + 1) * GOLDEN_GAMMA) & MASK)


def counter_uniform(seed, stream, counter):
    return (float(counter_hash(seed, stream, counter) >> 11) + 0.5) * (1.0 / 9007199254740992.0)


def counter_normal(seed, stream, counter):
    u1 = counter_uniform(seed, stream, 2 * counter)
    u2 = counter_uniform(seed, stream, 2 * counter + 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def normal_tensor(seed, stream, shape, scale=1.0, offset=0.0):
    """float32(offset + scale * normal) per element, as zrt's tests build their inputs."""
    n = int(np.prod(shape))
    vals = [offset + scale * counter_normal(seed, stream, i) for i in range(n)]
    return torch.tensor(np.array(vals, dtype=np.float32).reshape(shape), dtype=torch.float64)


def token_tensor(seed, stream, shape, vocab):
    n = int(np.prod(shape))
    vals = [counter_hash(seed, stream, i) % vocab for i in range(n)]
    return torch.tensor(np.array(vals, dtype=np.int64).reshape(shape))


def b64(t):
    arr = t.detach().to(torch.float64).numpy().astype("<f4")
    return base64.b64encode(arr.tobytes()).decode("ascii")


# ---- the layers (Hugging Face GPT-2 math) ------------------------------------------------------
def attention(qkv, n_head):
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // n_head
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, n_head, hs).transpose(1, 2)
    k = k.view(B, T, n_head, hs).transpose(1, 2)
    v = v.view(B, T, n_head, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return y, att


def gelu(x):
    return F.gelu(x, approximate="tanh")


def layer_cases():
    s = LAYER_SEED
    out = {}

    # encoder: streams 1..4
    B, T, C, V = 2, 8, 32, 64
    wte = normal_tensor(s, 1, (V, C)).requires_grad_()
    wpe = normal_tensor(s, 2, (T, C)).requires_grad_()
    dout = normal_tensor(s, 3, (B, T, C))
    tokens = token_tensor(s, 4, (B, T), V)
    y = wte[tokens] + wpe[torch.arange(T)]
    y.backward(dout)
    out["encoder"] = {"dims": {"B": B, "T": T, "C": C, "V": V},
                      "tensors": {"out": b64(y), "dwte": b64(wte.grad), "dwpe": b64(wpe.grad)}}

    # layernorm: streams 11..14
    N, C = 16, 32
    x = normal_tensor(s, 11, (N, C), scale=2.0, offset=0.5).requires_grad_()
    w = normal_tensor(s, 12, (C,), scale=0.1, offset=1.0).requires_grad_()
    b = normal_tensor(s, 13, (C,), scale=0.1).requires_grad_()
    dout = normal_tensor(s, 14, (N, C))
    y = F.layer_norm(x, (C,), w, b, eps=1e-5)
    mean = x.mean(dim=1)
    rstd = 1.0 / torch.sqrt(x.var(dim=1, unbiased=False) + 1e-5)
    y.backward(dout)
    out["layernorm"] = {"dims": {"N": N, "C": C},
                        "tensors": {"out": b64(y), "mean": b64(mean), "rstd": b64(rstd),
                                    "dinp": b64(x.grad), "dweight": b64(w.grad),
                                    "dbias": b64(b.grad)}}

    # matmul (Conv1D): streams 21..24
    N, C, OC = 16, 32, 96
    x = normal_tensor(s, 21, (N, C)).requires_grad_()
    w = normal_tensor(s, 22, (C, OC), scale=0.1).requires_grad_()
    b = normal_tensor(s, 23, (OC,), scale=0.1).requires_grad_()
    dout = normal_tensor(s, 24, (N, OC))
    y = x @ w + b
    y.backward(dout)
    out["matmul"] = {"dims": {"N": N, "C": C, "OC": OC},
                     "tensors": {"out": b64(y), "dinp": b64(x.grad), "dweight": b64(w.grad),
                                 "dbias": b64(b.grad)}}

    # gelu: streams 31..32
    n = 512
    x = normal_tensor(s, 31, (n,), scale=2.0).requires_grad_()
    dout = normal_tensor(s, 32, (n,))
    y = gelu(x)
    y.backward(dout)
    out["gelu"] = {"dims": {"n": n}, "tensors": {"out": b64(y), "dinp": b64(x.grad)}}

    # residual: streams 41..43
    n = 256
    a = normal_tensor(s, 41, (n,)).requires_grad_()
    c = normal_tensor(s, 42, (n,)).requires_grad_()
    dout = normal_tensor(s, 43, (n,))
    y = a + c
    y.backward(dout)
    out["residual"] = {"dims": {"n": n},
                       "tensors": {"out": b64(y), "da": b64(a.grad), "db": b64(c.grad)}}

    # attention: streams 51..52
    B, T, C, NH = 2, 8, 32, 4
    qkv = normal_tensor(s, 51, (B, T, 3 * C)).requires_grad_()
    dout = normal_tensor(s, 52, (B, T, C))
    y, att = attention(qkv, NH)
    y.backward(dout)
    out["attention"] = {"dims": {"B": B, "T": T, "C": C, "NH": NH},
                        "tensors": {"out": b64(y), "att": b64(att), "dqkv": b64(qkv.grad)}}

    # logits through the tied embedding: streams 61..63
    N, C, V = 16, 32, 64
    x = normal_tensor(s, 61, (N, C)).requires_grad_()
    wte = normal_tensor(s, 62, (V, C), scale=0.1).requires_grad_()
    dout = normal_tensor(s, 63, (N, V))
    y = x @ wte.t()
    y.backward(dout)
    out["logits"] = {"dims": {"N": N, "C": C, "V": V},
                     "tensors": {"logits": b64(y), "dinp": b64(x.grad), "dwte": b64(wte.grad)}}

    # cross-entropy: streams 71..72, dloss = 1/N (the mean)
    N, V = 16, 64
    logits = normal_tensor(s, 71, (N, V), scale=2.0).requires_grad_()
    targets = token_tensor(s, 72, (N,), V)
    losses = F.cross_entropy(logits, targets, reduction="none")
    losses.mean().backward()
    out["crossentropy"] = {"dims": {"N": N, "V": V},
                           "tensors": {"losses": b64(losses), "dlogits": b64(logits.grad)}}
    return out


# ---- the tiny GPT -----------------------------------------------------------------------------
def gpt_param_table(L, C, V, T):
    """(name, shape) in Hugging Face order: zrt's Gpt parameter table."""
    table = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (T, C))]
    for l in range(L):
        p = f"transformer.h.{l}."
        table += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                  (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                  (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                  (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                  (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                  (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    table += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return table


def gpt_init(index, name, shape, seed, n_layer):
    """Gpt::init_parameter: GPT-2's initialisation from the counter RNG."""
    if len(shape) == 1:
        value = 1.0 if (".ln_" in name and name.endswith(".weight")) else 0.0
        return torch.full(shape, value, dtype=torch.float64)
    std = 0.02 / math.sqrt(2.0 * n_layer) if "c_proj.weight" in name else 0.02
    n = int(np.prod(shape))
    vals = [std * counter_normal(seed, index, i) for i in range(n)]
    return torch.tensor(np.array(vals, dtype=np.float32).reshape(shape), dtype=torch.float64)


def gpt_forward(P, tokens, targets, L, NH):
    B, T = tokens.shape
    x = P["transformer.wte.weight"][tokens] + P["transformer.wpe.weight"][:T]
    C = x.shape[-1]
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        y, _ = attention(qkv, NH)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps=1e-5)
        h = gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps=1e-5)
    logits = x @ P["transformer.wte.weight"].t()  # tied lm_head
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def gpt_case():
    L, NH, C, V, SEQ = 2, 4, 32, 64, 16
    B, T = 2, 12  # T < seq_len: rows T.. of wpe get no gradient
    table = gpt_param_table(L, C, V, SEQ)
    P = {}
    checksums = {}
    for index, (name, shape) in enumerate(table):
        P[name] = gpt_init(index, name, shape, GPT_SEED, L).requires_grad_()
        checksums[name] = float(P[name].detach().sum())
    tokens = token_tensor(GPT_SEED, 1000, (B, T), V)
    targets = token_tensor(GPT_SEED, 1001, (B, T), V)
    loss = gpt_forward(P, tokens, targets, L, NH)
    loss.backward()
    return {
        "config": {"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "seq_len": SEQ},
        "B": B, "T": T, "seed": GPT_SEED,
        "tokens": tokens.view(-1).tolist(), "targets": targets.view(-1).tolist(),
        "loss": float(loss),
        "param_sums": checksums,
        "grads": {name: b64(P[name].grad) for name, _ in table},
    }


def main():
    doc = {
        "generator": "tests/golden/gen_gpt_golden.py",
        "torch_version": torch.__version__,
        "layer_seed": LAYER_SEED,
        "layers": layer_cases(),
        "gpt": gpt_case(),
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    main()
