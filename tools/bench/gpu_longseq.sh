#!/usr/bin/env bash
# The longest sequence Llama-3.1-8B trains at on one GPU (issue 39), with tokens/s at each length
# tried, in the few minutes of one lease.
#
#   tools/bench/gpu_longseq.sh --bundle DIR|FILE.tar.xz --out DIR [--budget S] [--steps N]
#       [--ratio R] [--fit T] [--cap-gb G|none] [--long "T1 T2 ..."] [--set KEY=JSON ...]
#       [--plan-only]
#
# The bundle: tools/gpu-bundle with zrt-train AND zrt-mem, e.g. on the build machine
#   tools/gpu-bundle .gpu build-cuda/bin/zrt-train build-cuda/bin/zrt-mem
#   tar -C .gpu/.. -cJf gpu.tar.xz "$(basename .gpu)"
# and on the GPU machine, from a checkout of this repository (the configs come from it):
#   tools/bench/gpu_longseq.sh --bundle gpu.tar.xz --out /tmp/longseq --budget 420
# What comes back in --out: summary.txt (the plan, a RESULT line per length, the verdict) and
# logs.tar.gz (each run's log, metrics.jsonl and config, zrt-mem's reports).
#
# The model: configs/gpu-llama-3.1-8b-offload.json (stage 3, optimizer offload) at micro-batch 1,
# one micro-batch a step, with model.activation_checkpointing, activation_checkpointing.
# cpu_checkpointing (the kept block inputs in pinned host memory), the automatic head and MLP
# tiles (model.tiling "auto"), and offload_optimizer.ratio R (default 0.3: zrt-mem's best on a
# 141 GB GPU with ~126 GiB of host, where cpu_checkpointing's host copies, 256 KiB a token at 8B,
# and the offloaded optimizer state share the host; zrt-mem put ratio 0.7 at ~178K tokens,
# stopped by the host, and 0.3 at ~360K; a CUDA build's zrt-mem, the bundle's, also counts the
# CUDA attention's workspace: its (B,NH,T) row term since grouped-query attention runs in place,
# 48 KiB a token of packed q, k, v before, which stopped 0.3 at ~265K). No parameter
# offload: zrt needs ratio 1 with it, 16 bytes a parameter in host memory (128 GB at 8B), more
# than such a machine has (zrt-mem: 6K tokens).
#
# Why not a bisection of full-device runs: a zrt-train start at 8B takes ~150 s (model init and
# pinning), and zrt's fused attention runs ~70 TFLOP/s at head size 128 (BENCHMARKS.md), so a
# step costs ~27 s at 32K tokens, ~85 s at 64K, ~300 s at 128K and ~40 min at zrt-mem's longest.
# So the script proves zrt-mem's prediction where it can afford to, and prints it for the rest:
#   plan   zrt-mem --max-seq-len for this GPU (its memory less --reserve-gb for the CUDA context
#          and cuBLAS, which the tracker does not count) and host (MemTotal less 6 GiB): the
#          predicted longest sequence, the headline.
#   fit    a length F (default: the longest multiple of 4096 whose two runs fit --budget by the
#          time model below) on the whole GPU, --steps steps: tokens/s, MFU, the tracker's device
#          peak beside zrt-mem's figure for F, host RSS.
#   over   1.25 F under device.memory_limit_gb C, the midpoint of zrt-mem's device figures at F
#          and 1.25 F (so zrt-mem says F fits C and 1.25 F does not; the fit run's peak shows
#          whether F really does): must end in the tracker's clean out-of-memory error (exit 1,
#          "out of memory" in the log), not a crash or a hang.
#   long   each --long length on the whole GPU (no cap), when the budget left covers it.
# Each run is skipped when the budget left is below its usual time (start + steps x step time,
# the model: start 150 s; a step 1.5 + layers/32 x (2.56e-4 T + 1.05 (T/8192)^2) s, from the H100
# and H200 figures in BENCHMARKS.md) and cut off at the budget left.
#
# --budget S: seconds for everything (default 420). --steps N: steps of the fit and long runs
# (default 2; tokens/s is the median after the first step, or the only one). --ratio R: the
# optimizer offload ratio. --fit T: the fit run's length (skips the time model). --cap-gb G: the
# over run's cap instead of zrt-mem's midpoint; none: no cap (over on the whole GPU too). --reserve-gb G:
# device memory kept out of zrt-mem's plan (default 3). --host-gb G: host memory for the plan
# (default MemTotal less 6 GiB). --set KEY=JSON: set a dotted config key in
# every run, e.g. --set model.num_hidden_layers=16 (the time model follows), or, to check the
# script on the CPU backend: --set device.type='"cpu"' --set model.num_hidden_layers=1
# --set model.hidden_size=256 ... (tools/bench/gpu_longseq.sh's own check, BENCHMARKS.md).
# --plan-only: the plan and the RESULT lines it would run, nothing trained.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle=""
out=""
budget=420
steps=2
ratio=0.3
fit=""
cap_gb=""
long=""
reserve_gb=3
host_gib=""
plan_only=0
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --ratio) ratio="$2"; shift 2 ;;
    --fit) fit="$2"; shift 2 ;;
    --cap-gb) cap_gb="$2"; shift 2 ;;
    --long) long="$2"; shift 2 ;;
    --reserve-gb) reserve_gb="$2"; shift 2 ;;
    --host-gb) host_gib="$2"; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    --plan-only) plan_only=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_longseq: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_longseq: --out DIR is required" >&2; exit 2; }
work="$(mktemp -d)"
source "$root/tools/bench/gpu_bundle_open.sh"
bundle="$(open_bundle gpu_longseq "$bundle" "$work")" || exit 2
# zrt-mem: the bundle's, else a build of this checkout's (it needs no GPU).
zrt_mem=""
for candidate in "$bundle/bin/zrt-mem" "$root/build-cuda/bin/zrt-mem" "$root/build/bin/zrt-mem"; do
  [ -x "$candidate" ] && { zrt_mem="$candidate"; break; }
done
[ -n "$zrt_mem" ] || { echo "gpu_longseq: no zrt-mem in the bundle (tools/gpu-bundle OUT .../zrt-train .../zrt-mem)" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: >"$summary"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
say() { echo "$*" | tee -a "$summary"; }
source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data="$bundle/data"
[ -d "$data" ] || data="$root/data"

say "gpu_longseq $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${budget}s"
gpu="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)"
say "GPU: ${gpu:-none}"
[ -n "$host_gib" ] || host_gib=$(awk '/MemTotal/ {printf "%.1f", $2 / 1048576 - 6}' /proc/meminfo)
say "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) (${host_gib} GiB planned)"

# config T CAP_GB FILE: the base config with this script's settings, the --set keys, seq_len T and
# device.memory_limit_gb CAP_GB (0: the whole GPU).
config() {
  python3 - "$root/configs/gpu-llama-3.1-8b-offload.json" "$1" "$2" "$3" "$ratio" "$steps" \
    "$data" "${sets[@]}" <<'EOF'
import json, sys
base, seq, cap, path, ratio, steps, data = sys.argv[1:8]
c = json.load(open(base))
c.update(train_batch_size=1, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
c["zero_optimization"]["offload_optimizer"]["ratio"] = float(ratio)
c["activation_checkpointing"] = {"cpu_checkpointing": True}
m = c["model"]
m.update(activation_checkpointing=True, tiling={"head_rows": "auto", "mlp_rows": "auto"})
c["train"].update(steps=int(steps), eval_interval=0, sample_tokens=0, log_interval=1)
c["data"] = {"train": data + "/kjv_train_*.bin"}
c["device"]["memory_limit_gb"] = float(cap)
# Never resume from, or save into, the base config's checkpoint folder.
c["checkpoint"] = {"load": "none", "save_interval": 0}
for kv in sys.argv[8:]:
    key, value = kv.split("=", 1)
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = json.loads(value)
# The rotary table holds frequencies, not positions: lengths past the preset's 131072 cost
# nothing there, and zrt-mem's search must not stop at them.
m["seq_len"] = int(seq)
m["max_position_embeddings"] = max(int(seq), 1 << 22)
json.dump(c, open(path, "w"), indent=1)
EOF
}
# layers: the model's block count for the time model (32 unless --set changes it).
layers=$(printf '%s\n' "${sets[@]}" | sed -n 's/^model.num_hidden_layers=//p' | tail -1)
layers=${layers:-32}
step_s() { awk -v t="$1" -v l="$layers" 'BEGIN { printf "%.0f", 1.5 + l / 32 * (2.56e-4 * t + 1.05 * (t / 8192) ^ 2) }'; }
start_s=150
# device_gb T CAP: zrt-mem's device total (GB = 10^9 bytes) at T for the config's own setting.
device_gb() {
  config "$1" "$2" "$work/mem-$1.json" &&
    "$zrt_mem" --config "$work/mem-$1.json" --device-gb 100000 >"$work/zrt-mem-$1.txt" 2>&1 &&
    awk '/device total \(peak\)/ {  # the exact bytes where zrt-mem prints them, else its GB
      v = $4; for (i = 1; i < NF; ++i) if ($(i + 1) == "bytes") v = sprintf("%.2f", $i / 1e9)
      print v; exit }' "$work/zrt-mem-$1.txt"
}

# The plan: the longest sequence zrt-mem predicts on this GPU and host.
gpu_gib=$(echo "$gpu" | awk -F', *' -v r="$reserve_gb" 'NF >= 2 { printf "%.1f", $2 / 1024 - r }')
gpu_gib=${gpu_gib:-$(awk -v r="$reserve_gb" 'BEGIN { printf "%.1f", 141 / 1.073741824 - r }')}
config 8192 0 "$work/plan.json" || { say "gpu_longseq: cannot write the config"; exit 1; }
"$zrt_mem" --config "$work/plan.json" --max-seq-len --seq-multiple 1024 \
  --device-gb "$gpu_gib" --host-gb "$host_gib" >"$work/zrt-mem-plan.txt" 2>&1
predicted=$(awk '/stage 3 \+ optimizer offload/ { for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens") { print $i; exit } }' \
  "$work/zrt-mem-plan.txt")
say ""
say "== plan: zrt-mem --max-seq-len at ${gpu_gib} GiB device, ${host_gib} GiB host (ratio $ratio)"
grep "stage 3 + optimizer offload\|longest sequence per setting" "$work/zrt-mem-plan.txt" | tee -a "$summary"
say "PREDICTED longest=${predicted:-?} tokens (its step: ~$(step_s "${predicted:-0}") s by the time model)"

# The fit length: the longest multiple of 4096 whose fit and over runs fit the budget.
if [ -z "$fit" ]; then
  fit=4096
  for (( t = 4096; t <= ${predicted:-4096}; t += 4096 )); do
    over_t=$(( t * 5 / 4 ))
    need=$(( 2 * start_s + steps * $(step_s "$t") + $(step_s "$over_t") + 20 ))
    [ "$need" -le "$budget" ] && fit=$t
  done
fi
over=$(( (fit * 5 / 4 + 255) / 256 * 256 ))
fit_gb=$(device_gb "$fit" 0)
over_gb=$(device_gb "$over" 0)
# The over run's cap: zrt-mem's midpoint between the two lengths, or, once the fit run has
# trained, its tracked peak plus half of zrt-mem's growth from F to 1.25 F, so that an offset
# common to both lengths (a workspace zrt-mem misses on this backend) cannot make the over run
# fit; the fit run's peak against zrt-mem's figure is the accuracy check.
cap_mode="$cap_gb"
case "$cap_mode" in
  "") cap_gb=$(awk -v a="$fit_gb" -v b="$over_gb" 'BEGIN { printf "%.2f", (a + b) / 2 / 1.073741824 }') ;;
  none) cap_gb=0 ;;
esac
say "fit: $fit tokens on the whole GPU (zrt-mem ${fit_gb} GB); over: $over tokens (zrt-mem ${over_gb} GB)" \
  "under a cap (zrt-mem's midpoint: ${cap_gb} GiB; 0: none)"

# run NAME T CAP STEPS EXPECT: one zrt-train run; prints its RESULT line.
run() {
  local name="$1" t="$2" cap="$3" n="$4" expect="$5"
  local usual=$(( start_s + n * $(step_s "$t") ))
  local remaining; remaining=$(left)
  local mem_gb; mem_gb=$(device_gb "$t" "$cap")
  if [ "$remaining" -lt "$usual" ]; then
    say "RESULT longseq $name T=$t cap_gib=$cap status=skipped (${remaining}s left, usually ${usual}s) zrt_mem_gb=$mem_gb"
    return
  fi
  if [ $plan_only -eq 1 ]; then
    say "RESULT longseq $name T=$t cap_gib=$cap status=planned (usually ${usual}s) zrt_mem_gb=$mem_gb"
    return
  fi
  local cfg="$work/$name.json" dir="$work/$name"
  config "$t" "$cap" "$cfg"
  say ""; say "== $name: $t tokens, cap ${cap} GiB, $n step(s), expect $expect (up to ${remaining}s, usually ${usual}s)"
  local t0=$SECONDS
  (cd "$root" && exec timeout --kill-after=10 "$remaining" "$bundle/bin/zrt-train" --config "$cfg" \
     --output_dir "$dir" --train.steps "$n") >"$work/$name.log" 2>&1 &
  local pid=$! hwm=0 kb
  # The peak resident set of zrt-train (the child of timeout), sampled: VmHWM only grows.
  while kill -0 "$pid" 2>/dev/null; do
    for p in $(pgrep -P "$pid" 2>/dev/null); do
      kb=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null)
      [ -n "$kb" ] && [ "$kb" -gt "$hwm" ] && hwm=$kb
    done
    sleep 1
  done
  wait "$pid"
  local rc=$?
  local wall=$(( SECONDS - t0 ))
  local status
  if [ $rc -eq 0 ]; then status="trained"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="cut-off-at-budget"
  elif grep -q "out of memory" "$work/$name.log"; then status="out-of-memory"
  elif [ $rc -gt 128 ]; then status="crash-signal-$(( rc - 128 ))"
  else status="failed-exit-$rc"; fi
  local metrics
  metrics=$(python3 - "$dir/metrics.jsonl" <<'EOF'
import json, os, statistics, sys
rows = []
if os.path.exists(sys.argv[1]):
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "tokens_per_s" in r]
if rows:
    timed = [r for r in rows if r["step"] > 1] or rows
    peak = max(r.get("mem_peak_bytes", {}).get("total", 0) for r in rows)
    print("steps=%d tok_s=%.0f mfu=%.1f%% device_peak_gb=%.2f loss=%.3f" % (
        len(rows), statistics.median(r["tokens_per_s"] for r in timed),
        100 * statistics.median(r.get("mfu", 0) for r in timed), peak / 1e9, rows[-1]["loss"]))
else:
    print("steps=0")
EOF
)
  say "RESULT longseq $name T=$t cap_gib=$cap status=$status expect=$expect $metrics zrt_mem_gb=$mem_gb host_rss_gib=$(awk -v k="$hwm" 'BEGIN { printf "%.1f", k / 1048576 }') wall_s=$wall"
  grep -m1 "out of memory" "$work/$name.log" | cut -c1-400 | tee -a "$summary"
  tail -n 4 "$work/$name.log" >>"$summary"
}

run fit "$fit" 0 "$steps" trained
fit_peak=$(sed -n 's/^RESULT longseq fit .*device_peak_gb=\([^ ]*\).*/\1/p' "$summary" | tail -1)
if [ -z "$cap_mode" ] && [ -n "$fit_peak" ]; then
  cap_gb=$(awk -v p="$fit_peak" -v a="$fit_gb" -v b="$over_gb" \
    'BEGIN { printf "%.2f", (p + (b - a) / 2) / 1.073741824 }')
  say "over's cap: ${cap_gb} GiB (the fit's tracked peak ${fit_peak} GB + half of zrt-mem's $fit -> $over growth)"
fi
run over "$over" "$cap_gb" 1 out-of-memory
for t in $long; do run "long-$t" "$t" 0 "$steps" trained; done

say ""
say "== results"
grep "^RESULT\|^PREDICTED" "$summary" >"$work/results.txt"
tee -a "$summary" <"$work/results.txt"
fit_status=$(sed -n 's/^RESULT longseq fit .*status=\([^ ]*\).*/\1/p' "$summary" | tail -1)
over_status=$(sed -n 's/^RESULT longseq over .*status=\([^ ]*\).*/\1/p' "$summary" | tail -1)
if [ -n "$fit_peak" ]; then
  say "ACCURACY fit T=$fit: tracked device peak ${fit_peak} GB, zrt-mem ${fit_gb} GB" \
    "(difference $(awk -v p="$fit_peak" -v e="$fit_gb" 'BEGIN { printf "%+.2f", p - e }') GB)"
fi
if [ "$fit_status" = trained ] && [ "$over_status" = out-of-memory ]; then
  say "VERDICT $fit tokens train (tokens/s above); $over end in the tracker's clean out-of-memory" \
    "error under the ${cap_gb} GiB cap; zrt-mem's longest on this GPU: ${predicted:-?} tokens"
else
  say "VERDICT fit=$fit_status over=$over_status (expected trained / out-of-memory)"
fi
cp "$work"/*.json "$work"/zrt-mem-*.txt "$out/" 2>/dev/null
tar -C "$work" -czf "$out/logs.tar.gz" --exclude='./.bundle' --exclude='*.bin' . 2>/dev/null
say "gpu_longseq: done in $(( SECONDS - start ))s"
rm -rf "$work"
