#!/usr/bin/env python3
"""Causal attention in PyTorch: the reference `zrt-bench attention` prints beside its own.
torch.nn.functional.scaled_dot_product_attention(is_causal=True) on (B, NH, T, hs) tensors, on a
GPU restricted to its flash kernel (FlashAttention-2) where this torch has the selector; times
are medians of --iters calls, each synchronised, after two warm-ups. --kv-heads N (default: --heads)
gives k and v N heads, grouped-query attention: SDPA's enable_gqa where this torch has it (2.5+),
else k and v repeated to --heads inside the timed calls (backend then says so). Prints one line:

    forward_ms=... forward_backward_ms=... backend=...

    python3 tools/bench/torch_attention_bench.py --device cuda --batch 1 --seq 4096 \
        --heads 32 --head-size 128
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument('--device', default='cuda')
p.add_argument('--dtype', default='bf16', choices=['bf16', 'fp16', 'fp32'])
p.add_argument('--batch', type=int, default=8)
p.add_argument('--seq', type=int, default=1024)
p.add_argument('--heads', type=int, default=12)
p.add_argument('--head-size', type=int, default=64)
p.add_argument('--kv-heads', type=int, default=0)
p.add_argument('--iters', type=int, default=20)
a = p.parse_args()

dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}[a.dtype]
dev = torch.device(a.device)
gen = torch.Generator(device='cpu').manual_seed(11)
kv_heads = a.kv_heads or a.heads
if a.heads % kv_heads:
    p.error(f'--kv-heads {kv_heads} does not divide --heads {a.heads}')
shape = (a.batch, a.heads, a.seq, a.head_size)
kv_shape = (a.batch, kv_heads, a.seq, a.head_size)
q, k, v, dout = (torch.randn(s, generator=gen).to(dev, dtype)
                 for s in (shape, kv_shape, kv_shape, shape))
for t in (q, k, v):
    t.requires_grad_(True)

backend = 'default'
select = contextlib.nullcontext()
if dev.type == 'cuda':
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        select = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        backend = 'flash'
    except ImportError:
        pass


def sync():
    if dev.type == 'cuda':
        torch.cuda.synchronize()


def median_ms(fn):
    samples = []
    for i in range(a.iters + 2):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if i >= 2:
            samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def written_out(q, k, v, is_causal):
    """Attention as matrix products, for a torch without scaled_dot_product_attention (< 2.0)."""
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)).float() / q.shape[-1] ** 0.5
    keep = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~keep, float('-inf')), dim=-1).to(q.dtype) @ v


sdpa = getattr(F, 'scaled_dot_product_attention', None)
if sdpa is None:
    sdpa, backend, select = written_out, 'matrix products (torch < 2.0)', contextlib.nullcontext()


attend = lambda q, k, v: sdpa(q, k, v, is_causal=True)
if kv_heads != a.heads:
    group = a.heads // kv_heads
    try:
        with select:
            sdpa(q[:, :, :64], k[:, :, :64], v[:, :, :64], is_causal=True, enable_gqa=True)
        attend = lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True)
    except (TypeError, RuntimeError):
        attend = lambda q, k, v: sdpa(q, k.repeat_interleave(group, dim=1),
                                      v.repeat_interleave(group, dim=1), is_causal=True)
        backend += ' (k, v repeated)'


def forward():
    with torch.no_grad():
        attend(q, k, v)


def forward_backward():
    out = attend(q, k, v)
    torch.autograd.grad(out, (q, k, v), dout)


with select:
    f = median_ms(forward)
    fb = median_ms(forward_backward)
print(f'forward_ms={f:.4f} forward_backward_ms={fb:.4f} backend={backend}')
