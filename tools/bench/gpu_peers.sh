#!/usr/bin/env bash
# zrt against the peers users judge it by, on one lent GPU, in the same lease (issue 41):
#
#   llmc      llm.c's train_gpt2cu (GPT-2 124M from scratch, `-e d12`, bf16, cuDNN flash attention
#             when it was built with USE_CUDNN=1), built elsewhere for sm_90 and carried
#   nanogpt   nanoGPT's GPT-2 in PyTorch with flash SDPA, plain and under torch.compile
#             (tools/bench/torch_gpt_train_cuda.py --variants sdpa,compile)
#   zrt-gpt2  zrt-train on the same model, batch and sequence at ZeRO stage 0 and stage 3
#             (configs/gpu-gpt2-124m-bench.json; the default attention, cuDNN's), and stage 0
#             again on zrt's own fused attention kernels, pipelined (ZRT_CUDA_ATTENTION=pipelined)
#             and staged (ZRT_CUDA_ATTENTION=fused); and with what llm.c does differently: cuDNN's
#             attention backward with atomics (cudnn-nondeterministic), gradients kept in bf16,
#             the head's logits in the tiles of the automatic rule before 2026-12-01 (13 tiles of
#             640 rows, model.tiling.head_rows 640; automatic now: whole, 824 MB)
#   attention zrt-bench attention: the fused attention (staged, and pipelined) against PyTorch's
#             flash SDPA at head sizes 64 and 128, forward and forward + backward; and
#             Llama-3.1-8B's grouped-query attention (32 query heads over 8 key/value heads) in
#             place, packed, and SDPA's enable_gqa
#   zrt-llama Llama-3.1-8B at stage 3, 70% of the optimizer state offloaded
#             (configs/gpu-llama-3.1-8b-offload.json: 2048 tokens, 1 x 8 micro-batches a step)
#   zrt-llama-cudnn (not run unless named) the same with cuDNN's attention asked for by name
#             (ZRT_CUDA_ATTENTION=cudnn: no workspace limit)
#   zrt-llama-own (not run unless named) the same on zrt's own fused attention kernels
#             (ZRT_CUDA_ATTENTION=pipelined)
#   ds-llama  DeepSpeed ZeRO-3 + offload_optimizer (ratio 0.7) on transformers' Llama of the same
#             shape, micro-batch, accumulation and sequence (tools/bench/torch_llama_offload_bench.py)
#   fsdp2     FSDP2 with CPUOffloadPolicy, which offloads everything, so at 16 of the 32 layers
#             (4.5B parameters: at 32 its host state, 16 bytes a parameter, is 128 GB, the
#             machine's whole memory) ...
#   zrt-llama16 ... and zrt and DeepSpeed on that model with all of the optimizer state offloaded
#   ds-llama16
#   zrt-moe   a mixture of experts: Qwen3-30B-A3B's shape at 8 of its 48 layers (5.6 B parameters,
#             1.08 B active: 8 of 128 experts a token), stage 3 on the device
#             (configs/gpu-qwen3-moe-bench.json, 2048 tokens, 1 x 8 micro-batches a step)
#   zrt-dense the dense Llama of the same active size beside it (configs/gpu-dense-1b-bench.json:
#             the same attention, an MLP 8 x 768 wide), for the MoE layer's cost per active FLOP
#   moe-tiles (not run unless named) the zrt-moe model at one 32768-token sequence a step with
#             activation checkpointing, its MoE layers whole (model.tiling.mlp_rows -1) and in the
#             automatic tiles (7 of 4992 rows): what tiling costs in time, and saves in the
#             tracked activation peak (mem_peak_bytes), on a GPU
#   gpt2-profile (not run unless named) one warm step of zrt's GPT-2 stage 0 and of llm.c's, each
#             kernel timed alone by Nsight Compute (ncu, when the image has it) and summed by
#             name (tools/bench/ncu_step_table.py): where zrt's step loses to llm.c's, and how
#             much of each step's wall time the device spent idle (its kernel sum against the
#             step time the zrt-gpt2 and llmc phases measure; and zrt's own trace of steps 4-6,
#             the compute stream's busy and idle time a step, without ncu)
#   startup   (not run unless named) zrt-bench startup --device cuda: a large model's start-up
#             host work, 16 GiB of pinned memory from cudaHostAlloc against the device's own
#             (resident pages + cudaHostRegister), the weights' normal draws, fp32 -> bf16
#   moe-capacity (not run unless named) the zrt-moe model's layers (2 of them, stage 2, one
#             16384-token sequence a step, checkpointed) over 2 ranks sharing the GPU at
#             sequence_parallel_size 2, model.capacity_factor 16 (every pair kept: the experts'
#             work is the dropless run's) against 0: what the capacity's routing pre-pass (the
#             router again, the choices to the host per tile, the counts gathered) costs a step
#
#   tools/bench/gpu_peers.sh --bundle DIR|FILE.tar.xz --out DIR [--budget S] [--phases "..."]
#                            [--llmc PATH] [--wheels DIR] [--prebuild-ds]
#
# --bundle: tools/gpu-bundle's folder (zrt-train, zrt-bench, the corpus), or it packed as .tar.xz.
# --llmc: the train_gpt2cu binary. --wheels: a folder of wheels installed first into a private
# site folder (DeepSpeed and what the image lacks of its needs). tools/bench/prepare_gpu_peers.sh
# builds both beforehand on a machine without a GPU. --prebuild-ds compiles DeepSpeed's
# CPU Adam (its JIT build, ~1 min) in the background at low priority, so that a later call on
# the same machine finds it in torch's extension cache. Each phase starts only when the
# budget left covers its usual length and is cut off at what is left. What comes back in --out:
# summary.txt (the machine, a RESULT line per run, each phase's last lines, the time each took),
# ncu-zrt-table.txt and ncu-llmc-table.txt (gpt2-profile's kernel tables) and logs.tar.gz (every
# log). Rows of one table are comparable only within one lease.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle=""
out=""
budget=540
phases="llmc nanogpt zrt-gpt2 attention zrt-llama ds-llama fsdp2 zrt-llama16 ds-llama16 zrt-moe zrt-dense"
llmc=""
wheels=""
prebuild_ds=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --phases) phases="$2"; shift 2 ;;
    --llmc) llmc="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --prebuild-ds) prebuild_ds=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_peers: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_peers: --out DIR is required" >&2; exit 2; }
for p in $phases; do
  case "$p" in llmc|nanogpt|zrt-gpt2|gpt2-profile|attention|zrt-llama|zrt-llama-cudnn|zrt-llama-own|ds-llama|fsdp2|zrt-llama16|ds-llama16|zrt-moe|zrt-dense|moe-tiles|moe-capacity|startup) ;;
    *) echo "gpu_peers: unknown phase '$p'" >&2; exit 2 ;; esac
done
work="$(mktemp -d)"
source "$root/tools/bench/gpu_bundle_open.sh"
bundle="$(open_bundle gpu_peers "$bundle" "$work")" || exit 2
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: >"$summary"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
say() { echo "$*" | tee -a "$summary"; }

say "gpu_peers $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${budget}s"
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
say "python: $(python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"

if [ -n "$wheels" ] && compgen -G "$wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/peer-site "$wheels"/*.whl >"$work/wheels.log" 2>&1 &&
    export PYTHONPATH="/tmp/peer-site${PYTHONPATH:+:$PYTHONPATH}" ||
    say "wheels: install failed (wheels.log)"
fi

if [ $prebuild_ds -eq 1 ]; then
  MAX_JOBS=4 nice -n 19 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
    >"$work/ds-prebuild.log" 2>&1 &
  ds_prebuild_pid=$!
fi

# USUAL_SECONDS: what a phase took on the H200 (2026-11-30: llmc 5 s, zrt-gpt2 14 s, attention
# 130 s with the cuDNN columns, the 8B runs 40-46 s now that start-up runs on the host's threads,
# startup 66 s), with room; the others as first measured.
phase() {  # phase NAME USUAL_SECONDS COMMAND...
  local name="$1" usual="$2"; shift 2
  local remaining; remaining=$(left)
  if [ "$remaining" -lt "$usual" ]; then
    say ""; say "== $name: skipped (${remaining}s left, it usually takes ${usual}s)"; return
  fi
  say ""; say "== $name (up to ${remaining}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$remaining" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  local status="exit $rc"
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status="cut off at the budget"
  tail -n 25 "$work/$name.log" >>"$summary"
  say "-- $name: $status after $(( SECONDS - t0 ))s"
}

source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data="$bundle/data"
# median_zrt METRICS SKIP: the median tokens/s and MFU of the logged steps after the first SKIP.
median_zrt() {
  python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "tokens_per_s" in r and r.get("step", 0) > int(sys.argv[2])]
if rows:
    print("tok_s=%.0f mfu=%.1f%% steps=%d" % (statistics.median(r["tokens_per_s"] for r in rows),
          100 * statistics.median(r.get("mfu", 0) for r in rows), len(rows)))
EOF
}
zrt_run() {  # zrt_run NAME SKIP CONFIG OVERRIDES...
  local name="$1" skip="$2" config="$3"; shift 3
  (cd "$root" && "$bundle/bin/zrt-train" --config "$config" --output_dir "$work/$name" \
     --train.log_interval 1 --data.train "$data/kjv_train_*.bin" --data.val "$data/kjv_val_*.bin" "$@")
  local rc=$?
  echo "RESULT zrt $name $(median_zrt "$work/$name/metrics.jsonl" "$skip") exit=$rc"
}
moe_tiles_run() {  # the zrt-moe model at 32K tokens, MoE layers whole then in automatic tiles
  local tiles name
  for tiles in -1 0; do
    name="qwen3-moe-l8-32k-tiles$tiles"
    zrt_run "$name" 1 configs/gpu-qwen3-moe-bench.json --train.steps 4 \
      --scheduler.params.total_num_steps 4 --model.seq_len 32768 --train_batch_size 1 \
      --gradient_accumulation_steps 1 --model.activation_checkpointing true \
      --model.tiling.mlp_rows "$tiles"
    python3 - "$work/$name/metrics.jsonl" "$tiles" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if "mem_peak_bytes" in l]
except OSError:
    rows = []
peak = rows[-1]["mem_peak_bytes"] if rows else {}
print("RESULT moe-tiles mlp_rows", sys.argv[2], "activations_peak", peak.get("activations", "none"),
      "total_peak", peak.get("total", "none"))
EOF
  done
}
moe_capacity_run() {  # the zrt-moe layers at sp 2 over 2 ranks: capacity 16 (no drop) vs dropless
  local factor name rc
  for factor in 0 16; do
    name="qwen3-moe-l8-sp2-capacity$factor"
    (cd "$root" && mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 \
       "$bundle/bin/zrt-train" --config configs/gpu-qwen3-moe-bench.json --output_dir "$work/$name" \
       --train.log_interval 1 --data.train "$data/kjv_train_*.bin" --data.val "$data/kjv_val_*.bin" \
       --train.steps 5 --scheduler.params.total_num_steps 5 --sequence_parallel_size 2 \
       --model.num_hidden_layers 2 --model.seq_len 16384 --model.activation_checkpointing true \
       --train_batch_size 1 --gradient_accumulation_steps 1 --zero_optimization.stage 2 \
       --model.capacity_factor "$factor")
    rc=$?
    echo "RESULT zrt $name $(median_zrt "$work/$name/metrics.jsonl" 1) exit=$rc"
  done
}
llmc_run() {
  # llm.c divides by -v and -s: large values, not 0, turn evaluation and sampling off. cuDNN and
  # NVRTC (its flash attention) come from the PyTorch wheels or the toolkit, wherever they are.
  local libs
  libs=$(find /usr /opt -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' 2>/dev/null |
    xargs -r -n1 dirname | sort -u | tr '\n' ':')
  LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" "$llmc" -i "$data/kjv_train_*.bin" \
    -j "$data/kjv_val_*.bin" -e d12 -b 8 -t 1024 -d 8192 -x 40 -v 1000 -m 1 -s 1000 -h 0 \
    -l 6e-4 -u 5 -c 0.1
}
llmc_phase() {
  llmc_run
  local rc=$?
  # Steps after the 10th: "step   12/40 | loss ... | 17.23 ms | 40.1% bf16 MFU | ...": tokens/s
  # only, as its MFU reads -100% on a GPU missing from its table (the H200 is)
  python3 - "$work/llmc.log" <<'EOF'
import re, statistics, sys
ms = []
for line in open(sys.argv[1]):
    m = re.match(r"step\s+(\d+)/\d+ .*\|\s*([\d.]+) ms \|", line)
    if m and int(m.group(1)) > 10:
        ms.append(float(m.group(2)))
if ms:
    med = statistics.median(ms)
    print("RESULT llmc tok_s=%.0f step_ms=%.2f steps=%d" % (8192 / (med / 1e3), med, len(ms)))
EOF
  return $rc
}

# gpt2_profile_run: ncu over 4 training steps of each, per launch, then a warm step's table:
# zrt's third (the 3rd encoder_forward; an evaluation closes the run), llm.c's third too, its 4th
# encoder_forward (llm.c evaluates at step 0, before its first training step). The clocks are
# left alone and the caches not flushed (--cache-control none: a kernel finds in L2 what the one
# before left, as in training); ncu still runs the kernels one at a time, so a step's sum has
# no overlap between streams. Each ncu has its own timeout (its CSV is written when the program
# ends: a run cut off gives nothing), and a profile without counter access (ERR_NVGPUCTRPERM)
# says so once instead of profiling llm.c for nothing.
gpt2_profile_run() {
  local ncu_args=(--clock-control none --cache-control none --metrics gpu__time_duration.sum
                  --csv --page raw --print-units base)
  (cd "$root" && timeout --kill-after=5 150 ncu "${ncu_args[@]}" --launch-count 2600 \
     --log-file "$work/ncu-zrt.csv" "$bundle/bin/zrt-train" \
     --config configs/gpu-gpt2-124m-bench.json --output_dir "$work/gpt2-ncu" --train.steps 4 \
     --data.train "$data/kjv_train_*.bin" --data.val "$data/kjv_val_*.bin" >/dev/null)
  if ! grep -q '^"' "$work/ncu-zrt.csv" 2>/dev/null; then
    echo "RESULT ncu-step zrt-gpt2-s0 error=$(grep -m1 -E '==ERROR==|ERR_' "$work/ncu-zrt.csv" 2>/dev/null ||
      echo 'no CSV rows (cut off at 150 s?)')"
    return 1
  fi
  python3 "$root/tools/bench/ncu_step_table.py" "$work/ncu-zrt.csv" --first encoder_forward \
    --step 3 --label zrt-gpt2-s0 > "$work/ncu-zrt-table.txt"
  grep '^RESULT' "$work/ncu-zrt-table.txt"
  # zrt's own timeline of steps 4-6 without ncu: the compute stream's busy and idle time a step
  (cd "$root" && "$bundle/bin/zrt-train" --config configs/gpu-gpt2-124m-bench.json \
     --output_dir "$work/gpt2-trace" --train.steps 7 --train.log_interval 1 \
     --data.train "$data/kjv_train_*.bin" --data.val "$data/kjv_val_*.bin" \
     --trace.path "$work/gpt2-trace/trace.json" --trace.steps "[4, 6]" 2>&1 |
     grep -E "step [0-9]+: .* ms; compute busy" | sed 's/^/RESULT trace zrt-gpt2-s0 /')
  if [ -n "$llmc" ] && [ -x "$llmc" ]; then
    local libs
    libs=$(find /usr /opt -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' 2>/dev/null |
      xargs -r -n1 dirname | sort -u | tr '\n' ':')
    LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" timeout --kill-after=5 150 ncu "${ncu_args[@]}" \
      --launch-count 2400 --log-file "$work/ncu-llmc.csv" "$llmc" -i "$data/kjv_train_*.bin" \
      -j "$data/kjv_val_*.bin" -e d12 -b 8 -t 1024 -d 8192 -x 5 -v 1000 -m 1 -s 1000 -h 0 \
      -l 6e-4 -u 5 -c 0.1 >/dev/null
    python3 "$root/tools/bench/ncu_step_table.py" "$work/ncu-llmc.csv" --first encoder_forward \
      --step 4 --label llmc > "$work/ncu-llmc-table.txt"
    grep '^RESULT' "$work/ncu-llmc-table.txt"
  fi
}

for p in $phases; do
  case "$p" in
    llmc)
      if [ -n "$llmc" ] && [ -x "$llmc" ]; then
        llmc="$(cd "$(dirname "$llmc")" && pwd)/$(basename "$llmc")"
        phase llmc 15 bash -c "$(declare -f llmc_run llmc_phase); llmc='$llmc' data='$data' \
          work='$work'; llmc_phase"
      else say ""; say "== llmc: skipped (no --llmc binary)"; fi ;;
    nanogpt)
      phase nanogpt 150 python3 "$root/tools/bench/torch_gpt_train_cuda.py" --batch 8 --seq 1024 \
        --iters 30 --variants sdpa,compile ;;
    zrt-gpt2)
      phase zrt-gpt2 30 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; zrt_run gpt2-s0 10 configs/gpu-gpt2-124m-bench.json --train.steps 40;
        zrt_run gpt2-s3 10 configs/gpu-gpt2-124m-bench.json --train.steps 40 --zero_optimization.stage 3;
        ZRT_CUDA_ATTENTION=pipelined zrt_run gpt2-s0-piped 10 configs/gpu-gpt2-124m-bench.json --train.steps 40;
        ZRT_CUDA_ATTENTION=fused zrt_run gpt2-s0-staged 10 configs/gpu-gpt2-124m-bench.json --train.steps 40;
        ZRT_CUDA_ATTENTION=cudnn-nondeterministic zrt_run gpt2-s0-cudnn-nondet 10 configs/gpu-gpt2-124m-bench.json --train.steps 40;
        zrt_run gpt2-s0-bf16-grads 10 configs/gpu-gpt2-124m-bench.json --train.steps 40 --data_types.grad_accum_dtype bf16;
        zrt_run gpt2-s0-head-640 10 configs/gpu-gpt2-124m-bench.json --train.steps 40 --model.tiling.head_rows 640" ;;
    gpt2-profile)
      # ncu off PATH in the toolkit's or Nsight Compute's own folder
      for d in /usr/local/cuda/bin /opt/nvidia/nsight-compute/*; do
        command -v ncu >/dev/null || { [ -x "$d/ncu" ] && PATH="$PATH:$d"; }
      done
      if command -v ncu >/dev/null; then
        [ -n "$llmc" ] && llmc="$(cd "$(dirname "$llmc")" && pwd)/$(basename "$llmc")"
        phase gpt2-profile 120 bash -c "$(declare -f gpt2_profile_run); root='$root' \
          bundle='$bundle' work='$work' data='$data' llmc='$llmc'; gpt2_profile_run"
      else say ""; say "== gpt2-profile: skipped (no ncu on this image)"; fi ;;
    attention)
      phase attention 140 "$bundle/bin/zrt-bench" attention --python python3 \
        --torch-script "$root/tools/bench/torch_attention_bench.py" --iters 20 \
        --shapes "8,1024,12,64;4,1024,32,128;1,4096,32,128;1,8192,32,128;1,4096,32,128,8;1,8192,32,128,8" ;;
    zrt-llama)
      phase zrt-llama 60 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; zrt_run llama8b-r0.7 1 configs/gpu-llama-3.1-8b-offload.json --train.steps 5" ;;
    zrt-llama-cudnn)
      phase zrt-llama-cudnn 60 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; ZRT_CUDA_ATTENTION=cudnn zrt_run llama8b-r0.7-cudnn 1 configs/gpu-llama-3.1-8b-offload.json --train.steps 5" ;;
    zrt-llama-own)
      phase zrt-llama-own 60 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; ZRT_CUDA_ATTENTION=pipelined zrt_run llama8b-r0.7-own 1 configs/gpu-llama-3.1-8b-offload.json --train.steps 5" ;;
    ds-llama)
      phase ds-llama 200 python3 "$root/tools/bench/torch_llama_offload_bench.py" --engine deepspeed \
        --layers 32 --ratio 0.7 --steps 4 ;;
    fsdp2)
      phase fsdp2 150 python3 "$root/tools/bench/torch_llama_offload_bench.py" --engine fsdp2 \
        --layers 16 --steps 3 ;;
    zrt-llama16)
      phase zrt-llama16 90 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; zrt_run llama16-full 1 configs/gpu-llama-3.1-8b-offload.json \
        --train.steps 4 --model.num_hidden_layers 16 --zero_optimization.offload_optimizer.ratio 1.0" ;;
    ds-llama16)
      phase ds-llama16 150 python3 "$root/tools/bench/torch_llama_offload_bench.py" --engine deepspeed \
        --layers 16 --ratio 1.0 --steps 3 ;;
    zrt-moe)
      phase zrt-moe 90 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; zrt_run qwen3-moe-l8 2 configs/gpu-qwen3-moe-bench.json \
        --train.steps 6 --scheduler.params.total_num_steps 6" ;;
    zrt-dense)
      phase zrt-dense 60 bash -c "$(declare -f zrt_run median_zrt); root='$root' bundle='$bundle' \
        work='$work' data='$data'; zrt_run dense-1b 2 configs/gpu-dense-1b-bench.json \
        --train.steps 6 --scheduler.params.total_num_steps 6" ;;
    moe-tiles)
      phase moe-tiles 150 bash -c "$(declare -f zrt_run median_zrt moe_tiles_run); root='$root' \
        bundle='$bundle' work='$work' data='$data'; moe_tiles_run" ;;
    startup)
      phase startup 75 "$bundle/bin/zrt-bench" startup --device cuda --bytes 16G --repeats 2 ;;
    moe-capacity)
      phase moe-capacity 150 bash -c "$(declare -f median_zrt moe_capacity_run); root='$root' \
        bundle='$bundle' work='$work' data='$data'; moe_capacity_run" ;;
  esac
done

if [ -n "${ds_prebuild_pid:-}" ]; then
  wait "$ds_prebuild_pid"; say ""; say "DeepSpeed CPU Adam prebuild: exit $? ($(tail -n 1 "$work/ds-prebuild.log"))"
fi
say ""
say "== results"
grep -h "^RESULT" "$work"/*.log | tee -a "$summary"
grep -h "sdpa(flash)" "$work/nanogpt.log" 2>/dev/null | tee -a "$summary"
# gpt2-profile's kernel tables, whole, beside the summary (the phase log's tail shows neither)
for t in "$work"/ncu-*-table.txt; do [ -f "$t" ] && cp "$t" "$out/"; done
tar -C "$work" -czf "$out/logs.tar.gz" --exclude='./.bundle' --exclude='*.bin' . 2>/dev/null
say "gpu_peers: done in $(( SECONDS - start ))s"
rm -rf "$work"
