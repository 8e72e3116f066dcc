#!/usr/bin/env bash
# One lent GPU, one call: every check issue 19 needs, most important first, inside a time budget,
# with what comes back kept to two files (remote runs may bring back only a few). Phases, each started only if the budget left covers its usual length and each cut off by
# `timeout` at what is left:
#
#   selftest   tools/gpu-selftest --bundle: every GPU test program, the tiny GPT against the CPU
#              backend, and GPT-2 124M's throughput against PyTorch with flash SDPA (~3 min)
#   attention  zrt-bench attention: the fused attention kernels' forward and forward+backward time
#              and TFLOP/s against the batched path they replace and PyTorch's flash SDPA at GPT-2
#              124M's shape (head size 64), the
#              6.7B GPT's (4 x 1024, 32 heads of 128) and Llama-3 8B's at 4k tokens (~30 s)
#   profile    (not run unless named) Nsight Compute, when `ncu` is on the image, over the fused
#              attention kernels of zrt-bench attention at head sizes 64 and 128: speed of light,
#              warp stalls, instruction mix, the facts the next attention change needs (~60 s)
#   offload    tools/bench/gpu_offload_bench.sh --no-big: GPT-2 124M at stage 3 with and without
#              optimizer offload, one micro-batch per step and 8, partial offload (--ratios),
#              fewer CPU-optimizer threads (--threads), the CPU step in one pass instead of
#              split (--split-off), the host's AdamW speed (~3 min)
#   big        the 6.7B GPT (configs/gpu-gpt-6.7b-offload.json: 122 GB of device memory without
#              offload) at stage 3 with partial offload at --big-ratio, which leaves the host's
#              memory room (~3 min)
#   llama8b    Llama-3.1-8B (configs/gpu-llama-3.1-8b-offload.json: 2048 tokens a sequence, 8
#              micro-batches a step, 141 GB of device memory without offload) at stage 3 with
#              30% of its optimizer state on the GPU, the rest offloaded (~3 min)
#   ab         tools/bench/gpu_ab.sh against bin/zrt-train-base when the bundle has it (~2 min
#              at one repeat)
#   bigfull    the 6.7B GPT with all of its optimizer state offloaded (~95 GB of pinned host
#              memory; last, as it may not fit the host)
#
#   tools/bench/gpu_session.sh --bundle DIR|FILE.tar.xz --out DIR [--budget SECONDS] [--phases "selftest
#       attention offload llama8b big ab bigfull"] [--ratios "0.5"] [--threads 14] [--split-off]
#       [--big-ratio 0.7]
#       [-- OVERRIDES...]
#
# --bundle: a tools/gpu-bundle folder, or that folder packed with `tar -cJf FILE.tar.xz -C PARENT
# NAME` (unpacked here into a temporary folder; a third of the size to carry). --budget (default
# 540) is the wall time the phases may take together. What comes back in
# --out: summary.txt (the machine, each phase's table and status, the time each took) and
# logs.tar.gz (every log, metrics.jsonl and trace summary; the trace JSON files when they fit in
# 12 MiB compressed). OVERRIDES go to every training run of the offload, big and ab phases (e.g.
# `-- --device.type cpu --model.n_layer 2 --model.n_embd 128 --model.n_head 2` to try the script
# without a GPU; the selftest phase then reports "no GPU found").
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle=""
out=""
budget=540
phases="selftest attention offload llama8b big ab bigfull"
ratios="0.5"
threads="14"
split_off=()
big_ratio="0.7"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --phases) phases="$2"; shift 2 ;;
    --ratios) ratios="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --split-off) split_off=(--split-off); shift ;;
    --big-ratio) big_ratio="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_session: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_session: --out DIR is required" >&2; exit 2; }
work="$(mktemp -d)"  # everything the phases write; packed into logs.tar.gz at the end
source "$root/tools/bench/gpu_bundle_open.sh"
bundle="$(open_bundle gpu_session "$bundle" "$work")" || exit 2
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "gpu_session: --budget needs seconds" >&2; exit 2; }
for p in $phases; do
  case "$p" in selftest|attention|profile|offload|llama8b|big|ab|bigfull) ;; *) echo "gpu_session: unknown phase '$p'" >&2; exit 2 ;; esac
done
bundle="$(cd "$bundle" && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: >"$summary"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
say() { echo "$*" | tee -a "$summary"; }

say "gpu_session $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${budget}s"
gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
say "GPU: ${gpu_name:-none (nvidia-smi found no GPU)}"
say "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), memlock $(ulimit -l)"

# phase NAME USUAL_SECONDS COMMAND...: runs COMMAND under the time left, output to the work folder
# and its last lines (the tables) into the summary.
phase() {
  local name="$1" usual="$2"; shift 2
  local remaining; remaining=$(left)
  if [ "$remaining" -lt "$usual" ]; then
    say ""; say "== $name: skipped (${remaining}s left, it usually takes ${usual}s)"
    return
  fi
  say ""; say "== $name (up to ${remaining}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$remaining" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  local status="exit $rc"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="cut off at the budget"
  # The tables are at the end of each tool's output; the progress lines before them go to the log.
  grep -v -E '^(gpu_offload_bench|gpu_ab): ' "$work/$name.log" | tail -n 60 >>"$summary"
  say "-- $name: $status after $(( SECONDS - t0 ))s"
}

source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One node: shared memory between ranks, no UCX (CUDA images ship one that OpenMPI 4.1's plugin
# may not load); PMIx's zlib warning silenced. The caller's settings win.
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}" OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export PMIX_MCA_pcompress_base_silence_warning=1
# The fused attention kernels at head size 128 (Llama-3 8B, the 6.7B GPT) are checked against
# their CPU twin once, before the first run that trains with them; should they fail, the runs
# after take the batched path at that size (ZRT_CUDA_ATTENTION=hs64, which leaves cuDNN's
# attention out too: the runs then time neither) and the summary says so.
hs128_checked=0
check_hs128() {
  [ $hs128_checked -eq 0 ] && [ -n "$gpu_name" ] || return 0
  hs128_checked=1
  if timeout 120 "$bundle/bin/test_cuda_kernels" \
       "CUDA fused attention at head size 128 matches its CPU twin" >"$work/hs128-check.log" 2>&1 &&
     timeout 120 "$bundle/bin/test_cuda_llama_kernels" \
       "grouped-query attention at head size 128: CUDA twin matches the CPU twin" \
       >>"$work/hs128-check.log" 2>&1; then
    say ""; say "fused attention at head size 128: matches its CPU twin"
  else
    export ZRT_CUDA_ATTENTION=hs64
    say ""; say "fused attention at head size 128 FAILED its check (hs128-check.log in logs.tar.gz):"
    say "the runs after this take the batched path there, without cuDNN (ZRT_CUDA_ATTENTION=hs64)"
  fi
}

for p in $phases; do
  case "$p" in llama8b|big|bigfull) check_hs128 ;; esac
  case "$p" in
    selftest)
      phase selftest 150 "$root/tools/gpu-selftest" --bundle "$bundle"
      [ -d "$bundle/selftest" ] && cp -r "$bundle/selftest" "$work/selftest-logs" ;;
    attention)
      if [ -x "$bundle/bin/zrt-bench" ]; then
        # Without a GPU (trying the plumbing) zrt-bench's small CPU shapes.
        shapes=(--iters 3)
        [ -n "$gpu_name" ] && shapes=(--iters 20 --shapes "8,1024,12,64;4,1024,32,128;1,4096,32,128")
        phase attention 40 "$bundle/bin/zrt-bench" attention --python python3 \
          --torch-script "$root/tools/bench/torch_attention_bench.py" "${shapes[@]}"
      else
        say ""; say "== attention: skipped (no bin/zrt-bench in the bundle)"
      fi ;;
    profile)
      if command -v ncu >/dev/null && [ -x "$bundle/bin/zrt-bench" ]; then
        # 2 warm-ups + 1 timed call of each pass per shape: forward 3x, then forward, dK/dV, dQ 3x.
        phase profile 60 ncu -k regex:flash_mma -c 24 --section SpeedOfLight \
          --section WarpStateStats --section InstructionStats --section Occupancy \
          "$bundle/bin/zrt-bench" attention --no-torch --iters 1 \
          --shapes "8,1024,12,64;1,4096,32,128"
      else
        say ""; say "== profile: skipped (no ncu on this image, or no bin/zrt-bench in the bundle)"
      fi ;;
    offload)
      phase offload 150 "$root/tools/bench/gpu_offload_bench.sh" --bundle "$bundle" --no-big \
        --out "$work/offload" --ratios "$ratios" --threads "$threads" "${split_off[@]}" \
        -- "${extra[@]}" ;;
    big)
      phase big 150 "$root/tools/bench/gpu_offload_bench.sh" --bundle "$bundle" --big-only \
        --big-ratio "$big_ratio" --big-ratio-only --out "$work/big" -- "${extra[@]}" ;;
    llama8b)
      phase llama8b 150 "$root/tools/bench/gpu_offload_bench.sh" --bundle "$bundle" --big-only \
        --big-config configs/gpu-llama-3.1-8b-offload.json --big-ratio 0.7 --big-ratio-only \
        --out "$work/llama8b" -- "${extra[@]}" ;;
    bigfull)
      phase bigfull 150 "$root/tools/bench/gpu_offload_bench.sh" --bundle "$bundle" --big-only \
        --out "$work/bigfull" -- "${extra[@]}" ;;
    ab)
      if [ -x "$bundle/bin/zrt-train-base" ]; then
        phase ab 100 "$root/tools/bench/gpu_ab.sh" --bundle "$bundle" --base \
          "$bundle/bin/zrt-train-base" --repeats 1 --out "$work/ab" -- "${extra[@]}"
      else
        say ""; say "== ab: skipped (no bin/zrt-train-base in the bundle)"
      fi ;;
  esac
done

# What comes back: the summary and one archive. Large traces are left out first.
say ""
tar -C "$work" -czf "$out/logs.tar.gz" --exclude='./.bundle' --exclude='*.bin' . 2>/dev/null
if [ "$(stat -c %s "$out/logs.tar.gz")" -gt $(( 12 * 1048576 )) ]; then
  tar -C "$work" -czf "$out/logs.tar.gz" --exclude='./.bundle' --exclude='*.bin' \
    --exclude='trace*.json' . 2>/dev/null
  say "logs.tar.gz: trace JSON files left out (over 12 MiB compressed)"
fi
say "gpu_session: done in $(( SECONDS - start ))s; $out/summary.txt, $out/logs.tar.gz ($(du -h "$out/logs.tar.gz" | cut -f1))"
rm -rf "$work"
