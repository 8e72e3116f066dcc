#!/usr/bin/env bash
# How long a preempted zrt-train takes from the signal to its exit, with the checkpoint it saved
# on the way: starts `tools/zrt-run -n RANKS CONFIG [overrides]`, waits until step AT is logged,
# sends SIGUSR1 to mpirun (as Slurm's `--signal=B:USR1@...` does) and times until mpirun exits.
# Prints one line per run:
#
#   preempt ranks=R at_step=A exit=75 signal_to_exit_s=S save_s=T saved=global_stepN
#
# save_s is zrt-train's own figure for the save ("checkpoint ... saved in T s"); the rest of
# signal_to_exit_s is the step in flight (the stop is agreed at the next step boundary) and the
# processes' shutdown. Exit 75 is zrt-train's "preempted, checkpoint saved" (docs/launching.md).
#
#   tools/bench/preempt_exit_bench.sh [--runs N] [--at STEP] -n RANKS CONFIG [--KEY VALUE ...]
#
# e.g. the demo at 4 ranks, and GPT-2 124M at 2 (fp32, stage 2, seq_len 128):
#   tools/bench/preempt_exit_bench.sh --runs 3 --at 20 -n 4 configs/demo.json
#   tools/bench/preempt_exit_bench.sh --at 2 -n 2 configs/gpt2-124m.json --device.type cpu \
#     --bf16.enabled false --zero_optimization.stage 2 --train_batch_size 2 \
#     --train_micro_batch_size_per_gpu 1 --gradient_accumulation_steps 1 --model.seq_len 128
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
runs=1
at=20
ranks=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --at) at="$2"; shift 2 ;;
    -n) ranks="$2"; shift 2 ;;
    *) break ;;
  esac
done
[[ -n "$ranks" && $# -ge 1 ]] || {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
config="$1"
shift
work="$(mktemp -d /tmp/zrt_preempt_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
for ((r = 0; r < runs; ++r)); do
  rm -rf "$work/ckpt" "$work/out"
  log="$work/run$r.log"
  # Steps well past AT, so the signal always lands mid-run; checkpoints only from the signal.
  "$here/tools/zrt-run" -n "$ranks" "$config" "$@" --train.steps $((at * 100 + 1000)) \
    --train.log_interval 1 --train.eval_interval 0 --checkpoint.save_dir "$work/ckpt" \
    --checkpoint.save_interval 0 --checkpoint.load none --output_dir "$work/out" \
    >"$log" 2>&1 &
  launcher=$!
  until grep -qE "step +$at/" "$log" 2>/dev/null; do
    if ! kill -0 "$launcher" 2>/dev/null; then
      echo "preempt_exit_bench: the run ended before step $at; its log:" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    sleep 0.05
  done
  start=$(date +%s.%N)
  kill -USR1 "$launcher"
  rc=0
  wait "$launcher" || rc=$?
  end=$(date +%s.%N)
  save_s=$(grep -oE "saved in [0-9.]+ s" "$log" | tail -1 | grep -oE "[0-9.]+" || echo "?")
  saved=$(cat "$work/ckpt/latest" 2>/dev/null || echo none)
  printf 'preempt ranks=%s at_step=%s exit=%s signal_to_exit_s=%.2f save_s=%s saved=%s\n' \
    "$ranks" "$at" "$rc" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$save_s" "$saved"
done
