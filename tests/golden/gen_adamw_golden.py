#!/usr/bin/env python3
"""Generates adamw_golden.json: torch.optim.AdamW / torch.optim.Adam on fixed inputs, the
reference test_optimizers checks zrt's CPU (and CUDA) Adam against.

Needs Debian's python3-torch (apt-get install python3-torch; run with /usr/bin/python3). The
tests read only the JSON, so torch is not needed to build or test zrt. Rerun and commit the
output when the cases change:

    /usr/bin/python3 tests/golden/gen_adamw_golden.py > tests/golden/adamw_golden.json

Every case carries the DeepSpeed "optimizer" block it corresponds to (the test parses it with
parse_optimizer_config), the lr of each step, the initial fp32 parameters, each step's fp32
gradients and torch's final param / exp_avg / exp_avg_sq. Floats are written as the shortest
decimal that reads back (through a double) as the same float32.
"""
import json
import sys

import numpy as np
import torch

NUMEL = 16
STEPS = 6


def f32_list(tensor):
    out = []
    for x in tensor.detach().to(torch.float32).reshape(-1).tolist():
        text = np.format_float_positional(np.float32(x), unique=True, trim="-")
        if float(np.float32(float(text))) != float(np.float32(x)):  # double rounding guard
            raise RuntimeError(f"{text} does not read back as float32 {x!r}")
        out.append(json.loads(text))
    return out


def run_case(name, ds_block, make_optimizer, lrs, seed):
    gen = torch.Generator().manual_seed(seed)
    param0 = torch.randn(NUMEL, generator=gen, dtype=torch.float32)
    # Gradients of varying scale, a few exact zeros, one large outlier per step.
    grads = []
    for step in range(STEPS):
        g = torch.randn(NUMEL, generator=gen, dtype=torch.float32) * (0.1 * (step + 1))
        g[step % NUMEL] = 0.0
        g[(3 * step + 5) % NUMEL] *= 40.0
        grads.append(g)

    param = torch.nn.Parameter(param0.clone())
    opt = make_optimizer([param])
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        param.grad = grads[step].clone()
        opt.step()
    state = opt.state[param]
    return {
        "name": name,
        "optimizer": ds_block,
        "lr": lrs,
        "param": f32_list(param0),
        "grads": [f32_list(g) for g in grads],
        "expected": {
            "param": f32_list(param),
            "exp_avg": f32_list(state["exp_avg"]),
            "exp_avg_sq": f32_list(state["exp_avg_sq"]),
        },
    }


def main():
    torch.set_num_threads(1)
    cases = [
        run_case(
            "adamw_wd0.1",
            {"type": "AdamW",
             "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}},
            lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8,
                                        weight_decay=0.1),
            [0.01] * STEPS, seed=1234),
        run_case(
            "adamw_varying_lr",
            {"type": "AdamW",
             "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.01}},
            lambda p: torch.optim.AdamW(p, lr=0.003, betas=(0.9, 0.95), eps=1e-6,
                                        weight_decay=0.01),
            [0.003 * (k + 1) / STEPS for k in range(STEPS)], seed=99),
        run_case(
            "adam_l2",
            {"type": "Adam",
             "params": {"lr": 0.02, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.05,
                        "adam_w_mode": False}},
            lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-7,
                                       weight_decay=0.05),
            [0.02] * STEPS, seed=7),
    ]
    doc = {
        "generator": "tests/golden/gen_adamw_golden.py",
        "torch_version": torch.__version__,
        "steps": STEPS,
        "numel": NUMEL,
        "cases": cases,
    }
    # One case field per line keeps the file small and diffable.
    lines = ["{"]
    for key in ("generator", "torch_version", "steps", "numel"):
        lines.append(f'  "{key}": {json.dumps(doc[key])},')
    lines.append('  "cases": [')
    for i, case in enumerate(cases):
        lines.append("    {")
        fields = list(case.items())
        for j, (key, value) in enumerate(fields):
            sep = "," if j + 1 < len(fields) else ""
            lines.append(f'      "{key}": {json.dumps(value, separators=(",", ":"))}{sep}')
        lines.append("    }" + ("," if i + 1 < len(cases) else ""))
    lines.append("  ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # well-formed
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
