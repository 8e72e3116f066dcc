#!/usr/bin/env python3
"""torch.optim.AdamW step time on one flat fp32 tensor, for zrt-bench optimizer's comparison.

Prints one line: "numel=N threads=T median_s=S params_per_s=P torch=VERSION". Run by
zrt-bench optimizer when torch is importable (Debian: apt-get install python3-torch, which
installs for /usr/bin/python3); it can also be run by hand:

    /usr/bin/python3 tools/bench/torch_adamw_bench.py --numel 10000000 --threads 2
"""
import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(args.numel, generator=gen))
    param.grad = torch.randn(args.numel, generator=gen) * 1e-3
    # The same hyper-parameters as zrt-bench's own AdamW (decoupled decay, bias correction).
    opt = torch.optim.AdamW([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(args.warmup):
        opt.step()
    samples = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        opt.step()
        samples.append(time.perf_counter() - start)
    median = statistics.median(samples)
    print(f"numel={args.numel} threads={args.threads} median_s={median:.6f} "
          f"params_per_s={args.numel / median:.6e} torch={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
