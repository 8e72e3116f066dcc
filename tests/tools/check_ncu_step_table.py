#!/usr/bin/env python3
"""tools/bench/ncu_step_table.py on a planted Nsight Compute CSV: the launches from one step's
first kernel to the next step's, grouped and summed, the units row honoured, a run without a
step after the one asked for refused, and a stand-in census joined for bytes and rates."""
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("ncu_step_table", sys.argv[1])
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

HEADER = '"ID","Process ID","Kernel Name","Context","gpu__time_duration.sum"'


def csv_text(units, launches):
    lines = ["==PROF== Connected to process 1", HEADER, f'"","","","","{units}"']
    for i, (name, t) in enumerate(launches):
        lines.append(f'"{i}","1","{name}","1","{t}"')
    return [line + "\n" for line in lines]


LAUNCHES = [
    ("init_kernel(float*)", 900),
    ("encoder_forward_kernel(int)", 1), ("ce(float*, int)", 5), ("optimizer_kernel(Desc*)", 3),
    ("encoder_forward_kernel(int)", 2), ("gemm_a(int)", 11), ("ce(float*, int)", 6),
    ("ce(float*, int)", 7), ("optimizer_kernel(Desc*)", 4),
    ("encoder_forward_kernel(int)", 1000),
]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


launches = tool.read_launches(csv_text("usecond", LAUNCHES))
check(len(launches) == len(LAUNCHES), f"read {len(launches)} launches")
step2 = tool.step_launches(launches, "encoder_forward", 2)
check([n for n, _ in step2] == [n for n, _ in LAUNCHES[4:9]], f"step 2 is {step2}")
text, total = tool.table(step2)
check(total == 30.0, f"step 2 total {total}")
ce_line = [line for line in text.splitlines() if line.startswith("ce ")]
check(len(ce_line) == 1 and " 2 " in ce_line[0] and "13.0" in ce_line[0], f"ce row {ce_line}")
check(text.splitlines()[1].startswith("ce ") and text.splitlines()[2].startswith("gemm_a"), "longest first")
step1 = tool.step_launches(launches, "encoder_forward", 1)
check([n for n, _ in step1] == [n for n, _ in LAUNCHES[1:4]], f"step 1 is {step1}")

# Demangled names as ncu prints them: an anonymous namespace's parenthesis is not the argument
# list, so two kernels there stay two rows.
named = [("void zrt::kernels::cuda::(anonymous namespace)::encoder_forward_kernel<__nv_bfloat16>"
          "(__nv_bfloat16*, int const*)", 1.0),
         ("void zrt::kernels::cuda::(anonymous namespace)::layernorm_finish_kernel<float>"
          "(float*, float*, float const*, float const*, int, int)", 2.0),
         ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", 3.0)]
text, _ = tool.table(named)
rows = [line.split()[0] for line in text.splitlines()[1:-1]]
check(rows == ["nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "layernorm_finish_kernel<float>",
               "encoder_forward_kernel<__nv_bfloat16>"], f"named rows {rows}")

ns = tool.read_launches(csv_text("nsecond", LAUNCHES))
check(abs(ns[5][1] - 0.011) < 1e-12, f"nanoseconds to microseconds: {ns[5]}")
# Recent ncu abbreviates the units ("ns", "us"): read as spelled-out ones, never as the default.
for short, spelled in (("ns", "nsecond"), ("us", "usecond"), ("ms", "msecond")):
    check(tool.read_launches(csv_text(short, LAUNCHES)) == tool.read_launches(csv_text(spelled, LAUNCHES)),
          f"units row '{short}' read as '{spelled}'")
try:
    tool.read_launches(csv_text("cycle", LAUNCHES))
    failures.append("a duration in an unknown unit was not refused")
except ValueError as e:
    check("unknown unit 'cycle'" in str(e), f"refusal says {e}")

try:
    tool.step_launches(launches, "encoder_forward", 3)
    failures.append("step 3 with no step after it was not refused")
except ValueError as e:
    check("3 launches match" in str(e) and "needs 4" in str(e), f"refusal says {e}")

try:
    tool.read_launches(['"ID","Name"\n', '"1","x"\n'])
    failures.append("a CSV without the columns was not refused")
except ValueError as e:
    check("Kernel Name" in str(e), f"refusal says {e}")

# --census: a stand-in census of the same steps gives each kernel's bytes, hence its rate, and
# the cuBLAS kernels (joined by no name) the GEMMs' FLOPs.
import os
import tempfile

K = "kernel void zrt::kernels::cuda::(anonymous namespace)::"
census_lines = [
    f"1\t0\t10\t{K}encoder_forward_kernel(int)",
    f"1\t5\t5\t{K}ce(float*, int)",
    f"1\t0\t10\t{K}encoder_forward_kernel(int)",
    "1\t100\t100\tcublasLtMatmul (1 GEMM m 1000 n 1000 k 1100)",
    f"1\t3000000\t1000000\t{K}ce(float*, int)",
    f"1\t3000000\t1000000\t{K}ce(float*, int)",
    "1\t0\t4096\tcudaMallocAsync of 4096 B",
    f"1\t0\t10\t{K}encoder_forward_kernel(int)",
]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "census.tsv")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in census_lines))
    census = tool.census_of(path, "encoder_forward", 2)
    check(census[0].get("ce") == 8000000 and census[1] == 2 * 1000 * 1000 * 1100,
          f"census of step 2: {census}")
    text, total = tool.table(step2, census=census)
    ce_line = [line for line in text.splitlines() if line.startswith("ce ")]
    # 8 MB in 13 us: 615 GB/s.
    check(len(ce_line) == 1 and ce_line[0].split()[-2:] == ["8.0", "615"], f"ce row {ce_line}")
    gemm_line = [line for line in text.splitlines() if line.startswith("cuBLAS kernels")]
    # gemm_a: 11 us for 2.2 GFLOP: 200 TFLOP/s.
    check(gemm_line == ["cuBLAS kernels: 1 launches, 11.0 us; the census's GEMMs 2.2 GFLOP: "
                        "200 TFLOP/s"], f"GEMM line {gemm_line}")
    opt_line = [line for line in text.splitlines() if line.startswith("optimizer_kernel")]
    check(len(opt_line) == 1 and opt_line[0].split()[-2:] == ["-", "-"],
          f"a kernel the census lacks: {opt_line}")
    check(total == 30.0, f"the total with a census {total}")
    check(tool.main([path, "--first", "x"]) == 1, "a census given as the ncu CSV was not refused")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("ncu_step_table: all checks passed")
