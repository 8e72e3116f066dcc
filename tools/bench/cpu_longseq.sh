#!/usr/bin/env bash
# The longest sequence zrt-train trains at under device.memory_limit_gb on the CPU backend, at
# each sequence_parallel_size, beside zrt-mem's --max-seq-len for the same setting (issue 39;
# BENCHMARKS.md, "Long sequences ... at sp 1, 2, 4").
#
#   tools/bench/cpu_longseq.sh [--ranks 4] [--sp "1 2 4"] [--multiple 256] [--steps 2]
#       [--config configs/long-sequence-cpu.json] [--build build] [--out DIR] [--set KEY=VALUE ...]
#
# For each sp: zrt-mem's longest length L (a multiple of --multiple) for the config at --ranks
# ranks, stage and device.memory_limit_gb from the config; then zrt-train (mpirun -n RANKS,
# --steps steps (2; 1 halves the time on a loaded machine), train_batch_size RANKS / sp) at
# L: if it trains, at L + M, L + 2M ... until one fails; if not, at L - M, L - 2M ... until one
# trains. Printed per sp: the longest length that trained those steps, the next multiple and
# why it failed (the tracker's out-of-memory line), zrt-mem's length, and the tracked device
# peak at the longest beside zrt-mem's figure for it. Each run's
# log and metrics stay in --out (default a temporary folder). --set KEY=VALUE: a zrt-train
# override for every run (and zrt-mem's config), e.g. --set model.tiling='{"head_rows": -1}'.
# Rerun after a kernel change (the tiled CPU attention): the lengths should then approach
# zrt-mem's and grow about linearly in sp.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ranks=4
sps="1 2 4"
multiple=256
steps=2
config="$root/configs/long-sequence-cpu.json"
build="$root/build"
out=""
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --sp) sps="$2"; shift 2 ;;
    --multiple) multiple="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "cpu_longseq: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$build/bin/zrt-train" ] && [ -x "$build/bin/zrt-mem" ] ||
  { echo "cpu_longseq: no $build/bin/zrt-train and zrt-mem (build them first)" >&2; exit 2; }
[ -n "$out" ] || out="$(mktemp -d)"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive ZRT_LOG_LEVEL=warn

# config_for SP FILE: the config with --set's keys and the batch rule for RANKS / SP (zrt-mem
# reads the same file, so both see one setting).
config_for() {
  python3 - "$config" "$1" "$ranks" "$2" "${sets[@]}" <<'EOF'
import json, sys
src, sp, ranks, path = sys.argv[1:5]
c = json.load(open(src))
for kv in sys.argv[5:]:
    key, value = kv.split("=", 1)
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    try:
        node[leaf] = json.loads(value)
    except ValueError:
        node[leaf] = value
c["sequence_parallel_size"] = int(sp)
c["train_batch_size"] = (c.get("train_micro_batch_size_per_gpu", 1) *
                         c.get("gradient_accumulation_steps", 1) * int(ranks) // int(sp))
json.dump(c, open(path, "w"), indent=1)
EOF
}
# zrt_mem_longest CONFIG: zrt-mem's longest length for the config's own stage.
zrt_mem_longest() {
  local stage
  stage=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["zero_optimization"]["stage"])' "$1")
  "$build/bin/zrt-mem" --config "$1" --world "$ranks" --stage "$stage" --max-seq-len \
    --seq-multiple "$multiple" | awk -v s="$stage" '$1 == "stage" && $2 == s && $4 == "tokens" { print $3; exit }'
}
# zrt_mem_device_bytes CONFIG T: zrt-mem's device total at T.
zrt_mem_device_bytes() {
  local stage
  stage=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["zero_optimization"]["stage"])' "$1")
  "$build/bin/zrt-mem" --config "$1" --world "$ranks" --stage "$stage" --seq "$2" |
    awk '/device total \(peak\)/ { for (i = 1; i < NF; ++i) if ($(i + 1) == "bytes") print $i; exit }'
}
# train SP T CONFIG: 0 when zrt-train trains $steps steps at T; the log in $out.
train() {
  local name="sp$1-T$2"
  rm -rf "${out:?}/$name"
  nice -n 10 mpirun -n "$ranks" --oversubscribe --bind-to none "$build/bin/zrt-train" \
    --config "$3" --model.seq_len "$2" --train.steps "$steps" --output_dir "$out/$name" \
    >"$out/$name.log" 2>&1
}
peak_of() {  # the tracked device peak (bytes) of a run's last step
  python3 -c 'import json,sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "mem_peak_bytes" in l]
print(rows[-1]["mem_peak_bytes"]["total"] if rows else "")' "$out/sp$1-T$2/metrics.jsonl" 2>/dev/null
}

echo "cpu_longseq $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')," \
  "$(basename "$config"), $ranks ranks, multiples of $multiple, $(nproc) cores; logs in $out"
for sp in $sps; do
  cfg="$out/config-sp$sp.json"
  config_for "$sp" "$cfg"
  predicted=$(zrt_mem_longest "$cfg")
  [ -n "$predicted" ] || { echo "RESULT sp=$sp zrt-mem found no length (see zrt-mem)"; continue; }
  t=$predicted
  good=""
  bad=""
  if train "$sp" "$t" "$cfg"; then
    good=$t
    while :; do
      t=$(( t + multiple ))
      if train "$sp" "$t" "$cfg"; then good=$t; else bad=$t; break; fi
    done
  else
    bad=$t
    while [ $(( t - multiple )) -ge "$multiple" ]; do
      t=$(( t - multiple ))
      if train "$sp" "$t" "$cfg"; then good=$t; break; else bad=$t; fi
    done
  fi
  why=$(grep -m1 -o "out of memory: .*asked for [^;]*" "$out/sp$sp-T$bad.log" 2>/dev/null | cut -c1-120)
  [ -n "$why" ] || why="exit without an out-of-memory line: see $out/sp$sp-T$bad.log"
  peak=""
  [ -n "$good" ] && peak=$(peak_of "$sp" "$good")
  echo "RESULT sp=$sp trains=${good:-none} next=$bad zrt_mem=$predicted" \
    "peak_bytes_at_trains=${peak:-none}" \
    "zrt_mem_bytes_at_trains=$( [ -n "$good" ] && zrt_mem_device_bytes "$cfg" "$good") fails_on=\"$why\""
done
