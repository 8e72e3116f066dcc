#!/usr/bin/env python3
"""One training step's kernels, from Nsight Compute's per-launch CSV.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        PROGRAM ... > launches.csv
    tools/bench/ncu_step_table.py launches.csv --first encoder_forward --step 3

A step starts with the launch of its first kernel (--first, a regular expression on the
kernel's name: the token embedding's encoder_forward in zrt and in llm.c, with evaluation off),
so the launches from its step-th match up to the next one are that step's (its optimizer
included); the run needs a step after the one shown, and --step past the first few leaves the
warm-up out. Prints a table of the step's kernels grouped by name (launches, total
microseconds, share), longest first, and their sum: the device time of one step with every
kernel run alone, which set beside the step's wall time says how much of it the device idled.

With --census (tools/bench/standin_census.py's file for the same config, from the CUDA
stand-ins), each kernel's row also gets the bytes its launches declared there and so the
bandwidth it reached, and the cuBLAS kernels (joined by no name: nvjet, cutlass, xmma, gemm)
their FLOPs summed and the rate reached: which kernels run far from the hardware's limits.
"""
import argparse
import csv
import importlib.util
import os
import re
import sys
from collections import OrderedDict

# The units row's names for a duration: older ncu spells them out, recent ncu abbreviates.
_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
          "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def read_launches(lines):
    """[(kernel name, microseconds)] in launch order, from ncu's --csv --page raw output."""
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    if not rows:
        raise ValueError("no CSV rows (was ncu run with --csv --page raw?)")
    header = rows[0]
    names = [h for h in ("Kernel Name", "Function Name", "Name") if h in header]
    if not names or "gpu__time_duration.sum" not in header:
        raise ValueError("the CSV lacks a 'Kernel Name' or 'gpu__time_duration.sum' column")
    name_at = header.index(names[0])
    time_at = header.index("gpu__time_duration.sum")
    scale = 1e-3  # ncu's default unit for durations is nanoseconds
    launches = []
    for row in rows[1:]:
        if len(row) <= max(name_at, time_at):
            continue
        value = row[time_at].replace(",", "")
        if value in _UNITS:  # the units row under the header
            scale = _UNITS[value]
            continue
        try:
            launches.append((row[name_at], float(value) * scale))
        except ValueError:
            if not launches and row[name_at] == "":  # a units row in a unit not known here
                raise ValueError(f"unknown unit '{value}' for gpu__time_duration.sum") from None
            continue
    return launches


def step_launches(launches, first, step):
    """The launches of the step-th step (1-based): from match `step` of `first` to the next."""
    pattern = re.compile(first)
    starts = [i for i, (name, _) in enumerate(launches) if pattern.search(name)]
    if len(starts) < step + 1:
        raise ValueError(
            f"{len(starts)} launches match '{first}': step {step} needs {step + 1} (one more after it)"
        )
    return launches[starts[step - 1]:starts[step]]


def short_name(name, width):
    """The kernel's name without its return type, namespaces' noise and argument list."""
    base = name.replace("(anonymous namespace)::", "")
    base = re.sub(r"^void ", "", base)
    base = re.sub(r"\(.*", "", base)  # the argument list (the first parenthesis left)
    base = base.replace("zrt::kernels::cuda::", "").replace("zrt::detail::", "")
    return base if len(base) <= width else base[: width - 3] + "..."


# cuBLAS's kernels: their names say nothing of the call, so they are joined to the census as one.
_GEMM_KERNEL = re.compile(r"^(void )?(nvjet|cutlass|sm\d+_xmma|.*gemm|.*splitKreduce)", re.IGNORECASE)


def _standin_census():
    """tools/bench/standin_census.py, beside this file."""
    spec = importlib.util.spec_from_file_location(
        "standin_census", os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_census.py"))
    census = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census)
    return census


def census_of(path, first, step):
    """(bytes by bare kernel name, GEMM FLOPs) of a stand-in census's step-th step."""
    census = _standin_census()
    with open(path, encoding="utf-8", errors="replace") as f:
        ops = census.step_ops(census.read_ops(f), first, step)
    by_name, flops = {}, 0
    for _, read, written, what in ops:
        name = census.kernel_name(what)
        if name is not None:
            by_name[name] = by_name.get(name, 0) + read + written
        flops += census.classify(what)[1]
    return by_name, flops


def table(launches, width=70, census=None):
    """The step's table; with census (census_of's result) bytes and rates beside the times."""
    bare_name = _standin_census().bare_name if census else (lambda name: name)
    groups = OrderedDict()
    for name, us in launches:
        key = short_name(name, width)
        count, total, bare = groups.get(key, (0, 0.0, bare_name(name)))
        groups[key] = (count + 1, total + us, bare)
    total = sum(us for _, us in launches)
    extra = f" {'MB':>9} {'GB/s':>7}" if census else ""
    lines = [f"{'kernel':<{width}} {'launches':>8} {'us':>10} {'share':>6}{extra}"]
    for key, (count, us, bare) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        share = 100.0 * us / total if total > 0 else 0.0
        row = f"{key:<{width}} {count:>8} {us:>10.1f} {share:>5.1f}%"
        if census:
            moved = census[0].get(bare)
            row += (f" {moved / 1e6:>9.1f} {moved / 1e3 / us:>7.0f}" if moved and us > 0
                    else f" {'-':>9} {'-':>7}")
        lines.append(row)
    lines.append(f"{'step total':<{width}} {len(launches):>8} {total:>10.1f} {100.0:>5.1f}%")
    if census:
        gemm_us = sum(us for name, us in launches if _GEMM_KERNEL.match(name))
        gemms = sum(1 for name, _ in launches if _GEMM_KERNEL.match(name))
        rate = census[1] / 1e6 / gemm_us if gemm_us > 0 else 0.0
        lines.append(f"cuBLAS kernels: {gemms} launches, {gemm_us:.1f} us; the census's GEMMs "
                     f"{census[1] / 1e9:.1f} GFLOP: {rate:.0f} TFLOP/s")
    return "\n".join(lines), total


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu --csv --page raw output ('-': standard input)")
    parser.add_argument("--first", required=True, help="regex naming the step's first kernel")
    parser.add_argument("--step", type=int, default=3, help="which step (1-based; default 3)")
    parser.add_argument("--label", default="", help="a name for the RESULT line")
    parser.add_argument("--census", default="", help="standin_census.py's file for the same config")
    parser.add_argument("--census-first", default="", help="its step's first kernel (default: --first)")
    parser.add_argument("--census-step", type=int, default=2, help="its step (default 2)")
    args = parser.parse_args(argv)
    if args.step < 1:
        parser.error("--step counts from 1")
    try:
        source = sys.stdin if args.csv == "-" else open(args.csv, encoding="utf-8", errors="replace")
        with source:
            launches = read_launches(source)
        chosen = step_launches(launches, args.first, args.step)
        census = (census_of(args.census, args.census_first or args.first, args.census_step)
                  if args.census else None)
    except (OSError, ValueError) as e:
        print(f"ncu_step_table: {e}", file=sys.stderr)
        return 1
    text, total = table(chosen, census=census)
    print(text)
    label = f" {args.label}" if args.label else ""
    print(f"RESULT ncu-step{label} step={args.step} launches={len(chosen)} kernel_us={total:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
