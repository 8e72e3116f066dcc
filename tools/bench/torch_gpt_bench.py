#!/usr/bin/env python3
"""PyTorch forward+backward tokens/s of a GPT-2 (no dropout, tied head, fp32) on the CPU, for
zrt-bench model's comparison: the same shapes and thread count as zrt's run.

Prints one line: "tokens_per_s=X median_s=S loss=L threads=T torch=VERSION". Run by zrt-bench
model when torch is importable (Debian: apt-get install python3-torch, which installs for
/usr/bin/python3); it can also be run by hand:

    /usr/bin/python3 tools/bench/torch_gpt_bench.py --n_layer 12 --n_head 12 --n_embd 768 \
        --vocab_size 50257 --seq_len 1024 --batch 4 --seq 256 --threads 2
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, n_head, C, V, seq_len):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(seq_len, C)
        self.h = nn.ModuleList(Block(C, n_head) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("n_layer", "n_head", "n_embd", "vocab_size", "seq_len", "batch", "seq"):
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(args.n_layer, args.n_head, args.n_embd, args.vocab_size, args.seq_len)
    idx = torch.randint(args.vocab_size, (args.batch, args.seq))
    targets = torch.randint(args.vocab_size, (args.batch, args.seq))
    samples = []
    loss = None
    for i in range(args.warmup + args.iters):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = model(idx, targets)
        loss.backward()
        if i >= args.warmup:
            samples.append(time.perf_counter() - start)
    median = statistics.median(samples)
    print(f"tokens_per_s={args.batch * args.seq / median:.3f} median_s={median:.6f} "
          f"loss={float(loss):.4f} threads={args.threads} torch={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
