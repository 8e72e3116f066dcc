#!/usr/bin/env python3
"""The machine code of each fused-attention kernel's tile loop, counted without a GPU.

Reads the SASS that `cuobjdump -sass` prints for a CUDA object of the build (by default
build/kernels/CMakeFiles/zrt_kernels.dir/cuda/flash_attention_mma.cu.o, at sm_90) and, per
kernel whose name matches --kernels, prints the instructions of its tile loop (the longest
backward branch that encloses a barrier, as the loop over key or query tiles is) by opcode:
tensor-core products (HMMA), shared-memory operand reads (LDS, LDSM), the rest. A static count:
what one trip of the loop holds, not how long it takes (the timing is zrt-bench attention's on a
GPU); where a loop holds two versions of its softmax (the pipelined kernels' unmasked tiles
beside the masked ones, without documents) both are counted, so the kernels with documents
(docs) are the like-for-like comparison of one trip. The CUDA toolkit's Debian install lacks cuobjdump; PyPI's nvidia-cuda-cuobjdump wheel has
it (unpack it and pass --cuobjdump, or put its bin/ on PATH).

  tools/bench/sass_tile_loop.py [--object FILE.o] [--arch 90] [--kernels REGEX] [--cuobjdump PATH]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = ["HMMA", "LDSM", "LDS", "LDGSTS", "LDG", "MUFU", "FMUL", "FADD", "FSEL", "ISETP", "IMAD"]


def functions(sass, arch):
    """(mangled name, [instruction text]) of each function compiled for sm_<arch>."""
    name, body, in_arch = None, [], False
    for line in sass.splitlines():
        m = re.match(r"\s*arch = sm_(\d+)", line)
        if m:
            in_arch = m.group(1) == arch
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name and body:
                yield name, body
            name, body = (m.group(1) if in_arch else None), []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);", line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2).strip()))
    if name and body:
        yield name, body


def tile_loop(body):
    """The instructions of the longest backward branch's range that holds a BAR.SYNC."""
    where = {addr: i for i, (addr, _) in enumerate(body)}
    bars = [i for i, (_, text) in enumerate(body) if "BAR.SYNC" in text]
    best = None
    for i, (addr, text) in enumerate(body):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        j = where.get(target)
        if j is None or target >= addr or not any(j <= b <= i for b in bars):
            continue
        if best is None or i - j > best[1] - best[0]:
            best = (j, i)
    return [] if best is None else [text for _, text in body[best[0]:best[1] + 1]]


def opcode(text):
    return re.sub(r"^@!?U?P[0-9T] ", "", text).split()[0].split(".")[0]


def readable(mangled):
    m = re.search(r"(flash_mma_(?:forward|dq|dkdv)_kernel)I(.*?)EEvP", mangled)
    if not m:
        return mangled
    args = m.group(2)
    storage = "bf16" if "bfloat16" in args else "fp16" if "half" in args else "?"
    ints = re.findall(r"Li(\d+)E", args)
    bools = re.findall(r"Lb([01])E", args)
    docs = " docs" if bools and bools[0] == "1" else ""
    way = "pipelined" if len(bools) > 1 and bools[1] == "1" else "staged"
    hs = ints[0] if ints else "?"
    cols = ints[1] if len(ints) > 1 else "?"
    return f"{m.group(1)} {storage} hs{hs}/{cols}{docs} {way}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--object", default=os.path.join(
        ROOT, "build/kernels/CMakeFiles/zrt_kernels.dir/cuda/flash_attention_mma.cu.o"))
    p.add_argument("--arch", default="90")
    p.add_argument("--kernels", default="flash_mma_.*bfloat16")
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    a = p.parse_args()
    try:
        sass = subprocess.run([a.cuobjdump, "-sass", a.object], check=True, capture_output=True,
                              text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"sass_tile_loop: cannot run {a.cuobjdump} -sass {a.object}: {e} (cuobjdump: "
                 "PyPI's nvidia-cuda-cuobjdump wheel)")
    rows = []
    for name, body in functions(sass, a.arch):
        if not re.search(a.kernels, name):
            continue
        loop = tile_loop(body)
        count = collections.Counter(opcode(t) for t in loop)
        rows.append((readable(name), len(body), len(loop), count))
    if not rows:
        sys.exit(f"sass_tile_loop: no sm_{a.arch} kernel matching '{a.kernels}' in {a.object}")
    print(f"# {a.object}, sm_{a.arch}: instructions of each kernel and of one trip of its tile loop")
    print(f"{'kernel':50} {'all':>6} {'loop':>6} " + " ".join(f"{o:>6}" for o in OPS))
    for name, total, loop, count in sorted(rows):
        print(f"{name:50} {total:6d} {loop:6d} " + " ".join(f"{count[o]:6d}" for o in OPS))


if __name__ == "__main__":
    main()
