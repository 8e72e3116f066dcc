#!/usr/bin/env bash
# A/B of two zrt-train builds on one GPU, side by side in one lease: GPT-2 124M
# (configs/gpu-gpt2-124m-bench.json, bf16, 8 x 1024 tokens a step) at each listed ZeRO stage,
# runs alternating base, new, base, new, ... so that drift of the machine hits both alike.
# Prints per stage the median over the repeats of each run's median tok/s (logged steps after
# the first 3), new / base, and both runs' last-step loss (kernel changes that reorder fp32 sums
# or round once instead of twice move it in the 3rd-4th digit, not more).
#
#   tools/bench/gpu_ab.sh --base BASE_ZRT_TRAIN [--bundle DIR | --bin DIR] [--out DIR]
#                         [--stages "0 3"] [--repeats 3] [--steps 20] [-- OVERRIDES...]
#
# --base: the other build's zrt-train (e.g. one built from an earlier commit and copied into
# the bundle as bin/zrt-train-base: both then find the same libraries through env.sh).
# --bundle / --bin / the corpus as tools/bench/gpu_offload_bench.sh. OVERRIDES go to every run
# (e.g. `-- --device.type cpu --model.n_layer 2` to try the script without a GPU).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/build/bin"
out="$root/out/gpu-ab"
base=""
stages="0 3"
repeats=3
steps=20
extra=()
data_dir="$root/data"
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift 2 ;;
    --bundle) # shellcheck disable=SC1091
      source "$2/env.sh"; bin="$(cd "$2" && pwd)/bin"; data_dir="$(cd "$2" && pwd)/data"; shift 2 ;;
    --bin) bin="$(cd "$2" && pwd)"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --stages) stages="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_ab: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$base" ] && [ -x "$base" ] || { echo "gpu_ab: --base must name an executable zrt-train" >&2; exit 2; }
[ -x "$bin/zrt-train" ] || { echo "gpu_ab: no zrt-train in $bin" >&2; exit 2; }
compgen -G "$data_dir/kjv_train_*.bin" >/dev/null ||
  { echo "gpu_ab: no corpus in $data_dir (tools/prepare-corpus)" >&2; exit 2; }
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 6 ] || { echo "gpu_ab: --steps >= 6" >&2; exit 2; }
[[ "$repeats" =~ ^[0-9]+$ ]] && [ "$repeats" -ge 1 ] || { echo "gpu_ab: --repeats >= 1" >&2; exit 2; }
mkdir -p "$out"
cd "$root" || exit 2

# one PROGRAM DIR STAGE: trains; prints "median_tok/s last_loss" (or "FAILED").
one() {
  local program="$1" dir="$2" stage="$3"
  rm -rf "$dir"; mkdir -p "$dir"
  if ! "$program" --config configs/gpu-gpt2-124m-bench.json --output_dir "$dir" \
      --train.log_interval 1 --train.steps "$steps" --scheduler.params.total_num_steps "$steps" \
      --zero_optimization.stage "$stage" \
      --data.train "$data_dir/kjv_train_*.bin" --data.val "$data_dir/kjv_val_*.bin" "${extra[@]}" \
      >"$dir/log" 2>&1; then
    echo "FAILED"; return
  fi
  python3 - "$dir/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "tokens_per_s" in r]
steady = [r["tokens_per_s"] for r in train if r["step"] > 3]
print(f"{statistics.median(steady):.0f}" if steady else "-", f"{train[-1]['loss']:.6f}")
EOF
}

printf '%-8s %14s %14s %9s %12s %12s\n' stage "base tok/s" "new tok/s" "new/base" "base loss" "new loss"
for stage in $stages; do
  base_tps=() new_tps=() base_loss="-" new_loss="-"
  for r in $(seq "$repeats"); do
    read -r t l <<<"$(one "$base" "$out/s$stage-base-$r" "$stage")"
    [[ "$t" =~ ^[0-9]+$ ]] && base_tps+=("$t") && base_loss=$l
    read -r t l <<<"$(one "$bin/zrt-train" "$out/s$stage-new-$r" "$stage")"
    [[ "$t" =~ ^[0-9]+$ ]] && new_tps+=("$t") && new_loss=$l
    echo "gpu_ab: stage $stage repeat $r: base ${base_tps[*]:-FAILED} new ${new_tps[*]:-FAILED}" >&2
  done
  median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "-" }'; }
  mb=$(median "${base_tps[@]}") mn=$(median "${new_tps[@]}")
  ratio=$(awk -v a="$mn" -v b="$mb" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "-" }')
  printf '%-8s %14s %14s %9s %12s %12s\n' "$stage" "$mb" "$mn" "$ratio" "$base_loss" "$new_loss"
done
# The epilogues only the stand-ins had run fall back with one warning per run if this cuBLASLt
# fails them (kernels/cuda/gemm.cu): the new build's figure is then the unfused path's.
fallbacks=$(cat "$out"/s*-new-*/log 2>/dev/null | grep -o "cuBLASLt epilogue [A-Z_]* failed.*" | sort -u)
if [ -n "$fallbacks" ]; then
  echo "gpu_ab: the new build fell back to unfused kernels:" >&2
  sed 's/^/  /' <<<"$fallbacks" >&2
fi
echo "gpu_ab ($(date -u +%Y-%m-%dT%H:%MZ); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); repeats $repeats, $steps steps; base $base)"
