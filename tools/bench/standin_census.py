#!/usr/bin/env python3
"""One training step's device work as the CUDA stand-ins see it: what it launches and moves.

    ZRT_STANDIN_CENSUS=census.tsv build-standin/bin/zrt-train --config C --train.steps 3
    tools/bench/standin_census.py census.tsv --first encoder_forward --step 2

The stand-in build (-DZRT_CUDA_STANDIN=ON) runs the CUDA backend's host path with CPU twins, and
with ZRT_STANDIN_CENSUS set writes a line per stream operation as the host enqueues it: its
stream, the bytes it reads and writes by its declared accesses (a kernel's twin declares them;
a GEMM's are its matrices' elements, C read too when beta != 0), and what it is. A step runs
from the step-th launch of --first (a regular expression on the kernel's name) to the next.

Prints the step's operations grouped (kernels by name, GEMMs by call and shape, copies and
fills by kind), with launches, MB read and written, GFLOP (GEMMs: 2 m n k each), and a floor:
the time at --bandwidth TB/s or --tflops TFLOP/s, whichever is longer, for each group and
summed. Allocations, frees and collectives move nothing here and are listed without a floor.
A kernel that reaches memory through a device-side table (the fused optimizer's slices)
declares only the table: its traffic is not counted. The floor is a model, not a measurement:
set it beside Nsight Compute's times (tools/bench/ncu_step_table.py) to see which kernels run
far from the hardware's limit.
"""
import argparse
import re
import sys
from collections import OrderedDict

_GEMM = re.compile(r"^(\S+) \((\d+) GEMMs? m (\d+) n (\d+) k (\d+)\)$")
_KERNEL = re.compile(r"^kernel (.*)$")


def read_ops(lines):
    """[(stream, read, written, what)] from the census file's lines."""
    ops = []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        fields = line.split("\t", 3)
        if len(fields) != 4:
            raise ValueError(f"line {number}: {len(fields)} fields, want 4 (stream, read, "
                             f"written, what)")
        try:
            ops.append((int(fields[0]), int(fields[1]), int(fields[2]), fields[3]))
        except ValueError:
            raise ValueError(f"line {number}: stream and bytes must be integers: {line!r}") from None
    return ops


def kernel_name(what):
    """A kernel launch's demangled name without return type, namespaces and arguments."""
    m = _KERNEL.match(what)
    return bare_name(m.group(1)) if m else None


def bare_name(name):
    """A demangled kernel name (the census's or Nsight Compute's) without its return type, the
    function's namespaces and its arguments: the key both tools group kernels by."""
    base = name.replace("(anonymous namespace)::", "")
    base = re.sub(r"^void ", "", base)
    base = re.sub(r"\(.*", "", base)  # the argument list
    # Drop the namespaces of the function (not of template arguments): the last :: before '<'.
    head, bracket, tail = base.partition("<")
    return head.rsplit("::", 1)[-1] + bracket + tail


def step_ops(ops, first, step):
    """The operations of the step-th step (1-based): from kernel match `step` of `first` on."""
    pattern = re.compile(first)
    starts = [i for i, op in enumerate(ops)
              if (name := kernel_name(op[3])) is not None and pattern.search(name)]
    if len(starts) < step + 1:
        raise ValueError(f"{len(starts)} launches match '{first}': step {step} needs {step + 1} "
                         f"(one more after it)")
    return ops[starts[step - 1]:starts[step]]


def classify(what):
    """(group key, flops, moves memory) of one operation."""
    name = kernel_name(what)
    if name is not None:
        return name, 0, True
    m = _GEMM.match(what)
    if m:
        call, count, M, N, K = m.group(1), *map(int, m.groups()[1:])
        return f"{call} m {M} n {N} k {K}", 2 * count * M * N * K, True
    if what.startswith("cudaMemsetAsync"):
        return "cudaMemsetAsync", 0, True
    m = re.match(r"^(cudaMemcpy(?:Async)?) \(([\w-]+),", what)
    if m:
        return f"{m.group(1)} ({m.group(2)})", 0, True
    # Allocations and frees declare their whole range written (for the hazard checks), and
    # collectives' traffic is the network's: no floor for either.
    return re.sub(r" of \d+ B$", "", what), 0, False


def table(ops, tb_per_s, tflops):
    groups = OrderedDict()
    for _, read, written, what in ops:
        key, flops, moves = classify(what)
        g = groups.setdefault(key, [0, 0, 0, 0, moves])
        g[0] += 1
        if moves:
            g[1] += read
            g[2] += written
        g[3] += flops

    def floor_us(read, written, flops):
        return max((read + written) / (tb_per_s * 1e12), flops / (tflops * 1e12)) * 1e6

    width = 72
    lines = [f"{'operation':<{width}} {'launches':>8} {'MB read':>9} {'MB written':>10} "
             f"{'GFLOP':>8} {'floor us':>9}"]
    totals = [0, 0, 0, 0, 0.0]
    order = sorted(groups.items(), key=lambda kv: -floor_us(kv[1][1], kv[1][2], kv[1][3]))
    for key, (count, read, written, flops, moves) in order:
        us = floor_us(read, written, flops)
        label = key if len(key) <= width else key[: width - 3] + "..."
        floor = f"{us:>9.1f}" if moves else f"{'-':>9}"
        lines.append(f"{label:<{width}} {count:>8} {read / 1e6:>9.1f} {written / 1e6:>10.1f} "
                     f"{flops / 1e9:>8.1f} {floor}")
        totals = [totals[0] + count, totals[1] + read, totals[2] + written, totals[3] + flops,
                  totals[4] + us]
    lines.append(f"{'step total':<{width}} {totals[0]:>8} {totals[1] / 1e6:>9.1f} "
                 f"{totals[2] / 1e6:>10.1f} {totals[3] / 1e9:>8.1f} {totals[4]:>9.1f}")
    return "\n".join(lines), totals


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("census", help="ZRT_STANDIN_CENSUS's file ('-': standard input)")
    parser.add_argument("--first", required=True, help="regex naming the step's first kernel")
    parser.add_argument("--step", type=int, default=2, help="which step (1-based; default 2)")
    parser.add_argument("--bandwidth", type=float, default=4.8,
                        help="memory bandwidth for the floor, TB/s (default 4.8: an H200's)")
    parser.add_argument("--tflops", type=float, default=989.0,
                        help="dense 16-bit tensor throughput for the floor (default 989: H100/H200)")
    parser.add_argument("--label", default="", help="a name for the RESULT line")
    args = parser.parse_args(argv)
    if args.step < 1:
        parser.error("--step counts from 1")
    if args.bandwidth <= 0 or args.tflops <= 0:
        parser.error("--bandwidth and --tflops must be positive")
    try:
        source = sys.stdin if args.census == "-" else open(args.census, encoding="utf-8",
                                                            errors="replace")
        with source:
            ops = read_ops(source)
        chosen = step_ops(ops, args.first, args.step)
    except (OSError, ValueError) as e:
        print(f"standin_census: {e}", file=sys.stderr)
        return 1
    text, (count, read, written, flops, us) = table(chosen, args.bandwidth, args.tflops)
    print(text)
    label = f" {args.label}" if args.label else ""
    print(f"RESULT census{label} step={args.step} operations={count} mb_read={read / 1e6:.1f} "
          f"mb_written={written / 1e6:.1f} gflop={flops / 1e9:.1f} floor_us={us:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
