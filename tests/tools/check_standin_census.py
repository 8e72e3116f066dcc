#!/usr/bin/env python3
"""tools/bench/standin_census.py, and what a training step launches on the CUDA stand-ins.

    check_standin_census.py TOOL                      the tool on a planted census
    check_standin_census.py TOOL --zrt-train BIN --config CONFIG --workdir DIR

The second form runs zrt-train (a stand-in build) on CONFIG, a GPT-2 with GPT-2's vocabulary
shrunk to 2 layers of 128, with ZRT_STANDIN_CENSUS set, and checks one step of it against the
model's arithmetic: its GEMMs do exactly the model's matrix products (2 N K FLOPs a product of
N tokens by a K-parameter matrix: the forward, then the input and the weight gradients; blocks
recomputed once more under activation checkpointing; the head's forward over its padded rows),
with the head whole and in tiles, at stage 0 and 3; one optimizer launch; no reduction at one
rank; tens of bytes to the host (the loss, the
step's decision, the control stream's vote).
A GEMM run twice, a head tile recomputed or a gradient copied to the host fails it.
"""
import importlib.util
import os
import struct
import subprocess
import sys

spec = importlib.util.spec_from_file_location("standin_census", sys.argv[1])
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def finish():
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)
    print("standin_census: all checks passed")
    sys.exit(0)


def planted():
    k = "kernel void zrt::kernels::cuda::(anonymous namespace)::"
    lines = [
        f"1\t0\t64\t{k}init_kernel(float*)",
        f"1\t100\t200\t{k}encoder_forward_kernel<__nv_bfloat16>(__nv_bfloat16*, int const*)",
        "1\t5000\t1000\tcublasLtMatmul (1 GEMM m 64 n 32 k 16)",
        "1\t0\t4096\tcudaMallocAsync of 4096 B",
        "1\t300\t300\tcublasGemmStridedBatchedEx (4 GEMMs m 8 n 8 k 8)",
        "1\t0\t1000000\tcudaMemsetAsync (1000000 B)",
        "2\t4\t4\tcudaMemcpyAsync (device-to-host, 4 B)",
        "0\t0\t0\tncclAllReduce on communicator 'control'",
        f"1\t100\t200\t{k}encoder_forward_kernel<__nv_bfloat16>(__nv_bfloat16*, int const*)",
        f"1\t100\t200\t{k}encoder_forward_kernel<__nv_bfloat16>(__nv_bfloat16*, int const*)",
    ]
    ops = tool.read_ops([line + "\n" for line in lines])
    check(len(ops) == len(lines), f"read {len(ops)} operations")
    step1 = tool.step_ops(ops, "encoder_forward", 1)
    check(len(step1) == 7 and step1[0][3] == lines[1].split("\t")[3], f"step 1 is {step1}")
    text, (count, read, written, flops, us) = tool.table(step1, 1.0, 1.0)
    check(count == 7, f"{count} operations")
    # Allocations and collectives move nothing; the rest is summed as declared.
    check(read == 100 + 5000 + 300 + 4 and written == 200 + 1000 + 300 + 1000000 + 4,
          f"read {read} written {written}")
    check(flops == 2 * 64 * 32 * 16 + 4 * 2 * 8 * 8 * 8, f"flops {flops}")
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines()[1:-1]}
    check("encoder_forward_kernel<__nv_bfloat16>" in rows, f"kernel rows {list(rows)}")
    check("cublasLtMatmul m 64 n 32 k 16" in rows and "cudaMemcpyAsync (device-to-host)" in rows,
          f"rows {list(rows)}")
    check("cudaMallocAsync" in rows and rows["cudaMallocAsync"].rstrip().endswith("-"),
          f"allocation row {rows.get('cudaMallocAsync')}")
    # The floor: the longer of bytes at 1 TB/s and FLOPs at 1 TFLOP/s, per group, in us.
    check(abs(us - ((100 + 200) + max(6000, 2 * 64 * 32 * 16) + max(600, 4096) + 1000000 + 8)
              / 1e6) < 1e-9, f"floor {us}")
    check(text.splitlines()[1].startswith("cudaMemsetAsync"), "longest floor first")
    try:
        tool.step_ops(ops, "encoder_forward", 3)
        failures.append("step 3 with no step after it was not refused")
    except ValueError as e:
        check("3 launches match" in str(e) and "needs 4" in str(e), f"refusal says {e}")
    try:
        tool.read_ops(["1\t2\tx\n"])
        failures.append("a short line was not refused")
    except ValueError as e:
        check("line 1: 3 fields" in str(e), f"refusal says {e}")
    try:
        tool.read_ops(["1\ttwo\t3\tkernel k()\n"])
        failures.append("a line without byte counts was not refused")
    except ValueError as e:
        check("must be integers" in str(e), f"refusal says {e}")


def write_shard(path, tokens):
    # llm.c's shard: 256 int32 of header (magic, version, count), then uint16 tokens.
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def run(args):
    zrt_train, config, workdir = args
    os.makedirs(workdir, exist_ok=True)
    tokens = [(i * 7919 + i // 13) % 50257 for i in range(20000)]
    write_shard(os.path.join(workdir, "c_train_000000.bin"), tokens)
    write_shard(os.path.join(workdir, "c_val_000000.bin"), tokens[:4000])
    L, C, heads, T, B, V = 2, 128, 2, 128, 2, 50257
    ldl = (V + 127) // 128 * 128  # kernels::logits_row_stride
    N = B * T
    shape = ["--model.n_layer", str(L), "--model.n_embd", str(C), "--model.n_head", str(heads),
             "--model.seq_len", str(T), "--train_micro_batch_size_per_gpu", str(B),
             "--train_batch_size", str(B), "--train.steps", "3", "--train.log_interval", "1",
             "--data.train", os.path.join(workdir, "c_train_*.bin"),
             "--data.val", os.path.join(workdir, "c_val_*.bin")]
    variants = {
        "whole": (["--model.tiling.head_rows", "-1"], 0),
        "head-tiles": (["--model.tiling.head_rows", "96"], 0),  # 3 tiles, the last short
        "checkpointed": (["--model.activation_checkpointing", "true"], 1),
        "stage3": (["--zero_optimization.stage", "3"], 0),
    }
    for name, (extra, recomputes) in variants.items():
        census = os.path.join(workdir, f"{name}.tsv")
        env = dict(os.environ, ZRT_STANDIN_CENSUS=census)
        cmd = [zrt_train, "--config", config, "--output_dir", os.path.join(workdir, name)] + \
            shape + extra
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if done.returncode != 0:
            failures.append(f"{name}: zrt-train exited {done.returncode}:\n{done.stdout[-3000:]}")
            continue
        with open(census, encoding="utf-8") as f:
            step = tool.step_ops(tool.read_ops(f), "encoder_forward", 2)
        text, _ = tool.table(step, 4.8, 989.0)
        # The blocks' four matrices hold 12 C^2 parameters: forward, input and weight gradients
        # (and the recomputed forward); the tied head: its forward over the ldl padded rows (the
        # padding's weights are zeros), its gradients over the V real ones.
        blocks = 2 * N * 12 * C * C * L * (3 + recomputes)
        head = 2 * N * C * ldl + 2 * 2 * N * C * V
        gemm_flops = sum(tool.classify(op[3])[1] for op in step)
        check(gemm_flops == blocks + head,
              f"{name}: the step's GEMMs do {gemm_flops} FLOPs, the model's products "
              f"{blocks + head} (blocks {blocks}, head {head})\n{text}")
        optimizer = sum(1 for op in step if "optimizer_kernel" in op[3])
        check(optimizer == 1, f"{name}: {optimizer} optimizer launches in a step\n{text}")
        to_host = sum(op[2] for op in step if "device-to-host" in op[3])
        check(0 < to_host <= 128, f"{name}: {to_host} bytes to the host in a step (the loss, "
              f"the step's decision and the control stream's vote: tens of bytes)\n{text}")
        # One rank: its reduce-scatters and all-reduces are their input (no reduction kernels, no
        # copy of the gradients through the collectives' scratch).
        reductions = sum(1 for op in step if "reduce_float_kernel" in op[3])
        copied = sum(op[2] for op in step if "device-to-device" in op[3])
        check(reductions == 0 and copied < 4096,
              f"{name}: {reductions} reduction kernels and {copied} bytes copied on the device at "
              f"one rank\n{text}")
        print(f"{name}: {len(step)} operations, {gemm_flops} GEMM FLOPs")


if len(sys.argv) == 2:
    planted()
elif len(sys.argv) == 8 and sys.argv[2::2] == ["--zrt-train", "--config", "--workdir"]:
    run(sys.argv[3::2])
else:
    print(f"usage: {sys.argv[0]} TOOL [--zrt-train BIN --config CONFIG --workdir DIR]",
          file=sys.stderr)
    sys.exit(2)
finish()
