#!/usr/bin/env bash
# Optimizer offload on one GPU, measured the way issue 19 asks: GPT-2 124M at ZeRO stage 3 with
# and without optimizer offload, in the same lease, at one micro-batch per step and with gradient
# accumulation (GAS), and a model that does not fit the GPU without offload (a 6.7B GPT, GPT-3's
# shape with GPT-2's vocabulary: configs/gpu-gpt-6.7b-offload.json). Prints one table row per
# run:
#
#   run  tok/s (median of the logged steps after the first 3)  vs no offload  device peak
#   (zrt's tracker; nvidia-smi's highest reading)  host peak RSS  GPU idle in a traced step
#
# GPU idle is the compute stream's idle time in the first of the traced steps, from zrt-train's
# "trace step" log line (docs/trace.md: the compute spans are the modules' kernels timed by CUDA
# events; the last traced step also holds the drain, so it is not used).
#
#   tools/bench/gpu_offload_bench.sh [--bundle DIR | --bin DIR] [--out DIR] [--gas "1 8"]
#                                    [--steps N] [--threads "16 14"] [--ratios "0.5 0.3"]
#                                    [--split-off]
#                                    [--big-ratio R] [--big-ratio-only] [--no-big] [--big-only]
#                                    [--big-config FILE] [-- OVERRIDES...]
#
# --bundle DIR: a tools/gpu-bundle folder (sources its env.sh; the programs in DIR/bin, the corpus
# in DIR/data; with zrt-bench there too, the host's AdamW speed is measured first); --bin DIR: a
# build's bin folder (default build/bin; the corpus in data/). Logs
# and metrics go to --out (default out/gpu-offload-bench). OMP_NUM_THREADS, when set, is the CPU
# optimizer's thread count; --threads runs each offload row again per listed count (rows named
# ...-ompN), to see whether leaving the launching thread a core of its own helps. --ratios runs
# each offload row again with partial offload (zero_optimization.offload_optimizer.ratio R: the
# forward's last units offloaded, the rest stepped on the GPU; rows ...-rR); --big-ratio adds a
# 6.7B row with that ratio (what of the state fits beside the model on the GPU); --big-ratio-only
# runs that row without the full-offload one (~95 GB of host memory instead of ~69).
# --split-off runs each offload row again with the CPU step in one pass (rows ...-nosplit:
# zero_optimization.offload_optimizer.split_step off; the default on a GPU is the split step).
# --big-config FILE: another model that does not fit without offload for the big rows, named
# after the file (configs/gpu-llama-3.1-8b-offload.json: rows llama-3.1-8b-s3-offload...).
# OVERRIDES go to every zrt-train (e.g. `-- --device.type cpu --model.n_layer 2` to try the
# script without a GPU).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/build/bin"
out="$root/out/gpu-offload-bench"
gas_list="1 8"
steps=16
big=1
small=1
extra=()
threads=""
ratios=""
big_ratio=""
big_full=1
split_off=0
big_config=configs/gpu-gpt-6.7b-offload.json
data_dir="$root/data"  # the KJV shards (tools/prepare-corpus; a bundle carries its own)
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) # shellcheck disable=SC1091
      source "$2/env.sh"; bin="$(cd "$2" && pwd)/bin"; data_dir="$(cd "$2" && pwd)/data"; shift 2 ;;
    --bin) bin="$(cd "$2" && pwd)"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --gas) gas_list="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --ratios) ratios="$2"; shift 2 ;;
    --big-ratio) big_ratio="$2"; shift 2 ;;
    --big-ratio-only) big_full=0; shift ;;
    --no-big) big=0; shift ;;
    --big-only) small=0; shift ;;
    --big-config) big_config="$2"; shift 2 ;;
    --split-off) split_off=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_offload_bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$bin/zrt-train" ] || { echo "gpu_offload_bench: no zrt-train in $bin" >&2; exit 2; }
compgen -G "$data_dir/kjv_train_*.bin" >/dev/null ||
  { echo "gpu_offload_bench: no corpus in $data_dir (tools/prepare-corpus)" >&2; exit 2; }
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 6 ] || { echo "gpu_offload_bench: --steps >= 6" >&2; exit 2; }
mkdir -p "$out"
cd "$root" || exit 2

# The host's own AdamW speed first, when zrt-bench came along (tools/gpu-bundle ... build/bin/
# zrt-bench): with offload at one micro-batch per step the CPU step over GPT-2 124M is what the
# offload rows wait for, so its GB/s against the plain memory sweep, at a few thread counts, is
# the figure that explains them.
if [ -x "$bin/zrt-bench" ] && [ $small -eq 1 ]; then
  cores=$(nproc)
  counts=""
  for t in $(( cores / 2 )) $(( cores - 2 )) "$cores"; do
    [ "$t" -ge 1 ] && [[ ",$counts," != *",$t,"* ]] && counts="${counts:+$counts,}$t"
  done
  echo "gpu_offload_bench: host AdamW over 124M fp32 parameters (zrt-bench optimizer)" >&2
  "$bin/zrt-bench" optimizer --sizes 124M --threads "$counts" \
    --repeats 5 >"$out/host-adamw.txt" 2>&1 || echo "gpu_offload_bench: zrt-bench optimizer failed" >&2
fi

rows=()
# run NAME CONFIG [overrides...]: trains, samples nvidia-smi and the process's RSS, adds a row.
run() {
  local name="$1" config="$2"; shift 2
  local dir="$out/$name"
  rm -rf "$dir"; mkdir -p "$dir"
  "$bin/zrt-train" --config "$config" --output_dir "$dir" --train.log_interval 1 \
    --data.train "$data_dir/kjv_train_*.bin" --data.val "$data_dir/kjv_val_*.bin" "$@" "${extra[@]}" \
    >"$dir/log" 2>&1 &
  local pid=$! smi_peak=0 rss_peak=0 v
  while kill -0 "$pid" 2>/dev/null; do
    v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$smi_peak" ] && smi_peak=$v
    v=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$rss_peak" ] && rss_peak=$v
    sleep 0.5
  done
  wait "$pid"; local rc=$?
  local summary
  summary=$(python3 - "$dir/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = []
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    pass
steady = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 3]
peak = max((r["mem_peak_bytes"]["total"] for r in rows if "mem_peak_bytes" in r), default=0)
print(f"{statistics.median(steady):.0f}" if steady else "-", f"{peak / 2**30:.2f}")
EOF
)
  local tps="${summary% *}" tracked="${summary#* }"
  local idle
  idle=$(grep -m1 'trace step' "$dir/log" | sed -E 's/.*trace (step [0-9]+: [0-9.]+ ms); compute busy [0-9.]+ ms, idle ([0-9.]+ ms \([0-9]+%\)).*/\1, idle \2/')
  [ $rc -eq 0 ] || tps="FAILED (exit $rc, $dir/log)"
  rows+=("$name|$tps|$tracked GiB|$(awk -v m="$smi_peak" 'BEGIN { printf "%.1f", m / 1024 }') GiB|$(awk -v k="$rss_peak" 'BEGIN { printf "%.1f", k / 1048576 }') GiB|${idle:--}")
  echo "gpu_offload_bench: $name: $tps tok/s" >&2
}

bench=configs/gpu-gpt2-124m-bench.json
if [ $small -eq 1 ]; then
  for g in $gas_list; do
    n=$steps
    [ "$g" -gt 1 ] && n=$(( steps / 2 > 6 ? steps / 2 : 6 ))
    common=(--zero_optimization.stage 3 --gradient_accumulation_steps "$g"
            --train_batch_size $(( 8 * g )) --train.steps "$n"
            --scheduler.params.total_num_steps "$n" --trace.steps "[$((n - 2)), $((n - 1))]")
    run "124m-s3-gas$g" "$bench" "${common[@]}" --trace.path "$out/124m-s3-gas$g/trace.json"
    run "124m-s3-offload-gas$g" "$bench" "${common[@]}" \
      --zero_optimization.offload_optimizer.device cpu \
      --trace.path "$out/124m-s3-offload-gas$g/trace.json"
    if [ $split_off -eq 1 ]; then
      run "124m-s3-offload-gas$g-nosplit" "$bench" "${common[@]}" \
        --zero_optimization.offload_optimizer.device cpu \
        --zero_optimization.offload_optimizer.split_step off \
        --trace.path "$out/124m-s3-offload-gas$g-nosplit/trace.json"
    fi
    for t in $threads; do
      OMP_NUM_THREADS=$t run "124m-s3-offload-gas$g-omp$t" "$bench" "${common[@]}" \
        --zero_optimization.offload_optimizer.device cpu \
        --trace.path "$out/124m-s3-offload-gas$g-omp$t/trace.json"
    done
    for r in $ratios; do
      run "124m-s3-offload-gas$g-r$r" "$bench" "${common[@]}" \
        --zero_optimization.offload_optimizer.device cpu \
        --zero_optimization.offload_optimizer.ratio "$r" \
        --trace.path "$out/124m-s3-offload-gas$g-r$r/trace.json"
    done
  done
fi
[ $big_full -eq 0 ] && [ -z "$big_ratio" ] &&
  { echo "gpu_offload_bench: --big-ratio-only needs --big-ratio R" >&2; exit 2; }
if [ $big -eq 1 ]; then
  [ -f "$big_config" ] || { echo "gpu_offload_bench: no config $big_config" >&2; exit 2; }
  # configs/gpu-gpt-6.7b-offload.json -> 6.7b; configs/gpu-llama-3.1-8b-offload.json -> llama-3.1-8b
  big_name=$(basename "$big_config" .json); big_name=${big_name#gpu-}; big_name=${big_name#gpt-}
  big_name=${big_name%-offload}
  if [ $big_full -eq 1 ]; then
    run "$big_name-s3-offload" "$big_config" --zero_optimization.offload_optimizer.ratio 1 \
      --trace.path "$out/$big_name-s3-offload/trace.json" --trace.steps "[2, 3]"
  fi
  if [ -n "$big_ratio" ]; then
    run "$big_name-s3-offload-r$big_ratio" "$big_config" \
      --zero_optimization.offload_optimizer.ratio "$big_ratio" \
      --trace.path "$out/$big_name-s3-offload-r$big_ratio/trace.json" --trace.steps "[2, 3]"
  fi
fi

echo
echo "gpu_offload_bench ($(date -u +%Y-%m-%dT%H:%MZ); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(nproc) host cores; OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset})"
printf '%-30s %12s %9s %12s %12s %9s  %s\n' run "tok/s" "vs s3" "tracked" "nvidia-smi" "host RSS" "GPU idle (first traced step)"
for r in "${rows[@]}"; do
  IFS='|' read -r name tps tracked smi rss idle <<<"$r"
  ratio="-"
  base=""
  case "$name" in
    *-offload-gas*) base="${name/-offload/}"; base="${base%-omp*}"; base="${base%-r*}"; base="${base%-nosplit}" ;;
  esac
  if [ -n "$base" ]; then
    for b in "${rows[@]}"; do
      IFS='|' read -r bname btps _ <<<"$b"
      if [ "$bname" = "$base" ] && [[ "$tps" =~ ^[0-9]+$ ]] && [[ "$btps" =~ ^[0-9]+$ ]]; then
        ratio=$(awk -v a="$tps" -v b="$btps" 'BEGIN { printf "%.0f%%", 100 * a / b }')
      fi
    done
  fi
  printf '%-30s %12s %9s %12s %12s %9s  %s\n' "$name" "$tps" "$ratio" "$tracked" "$smi" "$rss" "$idle"
done
if [ -s "$out/host-adamw.txt" ]; then
  echo
  echo "host AdamW (zrt-bench optimizer; GB/s at 28 bytes/parameter, 30 with the bf16 copy):"
  grep -E '^(params|  *[0-9])' "$out/host-adamw.txt"
fi
# Where each run's traced step went, per stream (docs/trace.md): what to look at when a row is slow.
echo
echo "traced steps (the first of each run): busy time per track"
for r in "${rows[@]}"; do
  name="${r%%|*}"
  line=$(grep -m1 'trace step' "$out/$name/log" 2>/dev/null | sed -E 's/.*trace (step .*)/\1/')
  printf '%-30s %s\n' "$name" "${line:--}"
done
