#!/usr/bin/env bash
# A rank dies or freezes mid-step under zrt-train; the job must end, and end cleanly.
#
#   fault_test.sh ZRT_TRAIN ZRT_DATA MPIRUN FAULT RANKS TIMEOUT_S WORKDIR
#
# Starts `mpirun -n RANKS zrt-train` on a small corpus with comm.timeout_s = TIMEOUT_S and
# ZRT_FAULT_INJECT=FAULT:rank=2:step=3 (FAULT: sigkill or sigstop), then watches the processes
# by pid: after the victim is dead (sigkill) or stopped (sigstop), every other rank must be
# gone within TIMEOUT_S + 10 s, mpirun must return non-zero, and no process may be left. A
# frozen rank is invisible to mpirun, so for sigstop the log must carry the watchdog's report
# naming the operation, the step and the missing rank. Anything left at the end is killed (and
# the test fails).
set -u
if [ $# -ne 7 ]; then
  echo "usage: $0 ZRT_TRAIN ZRT_DATA MPIRUN FAULT RANKS TIMEOUT_S WORKDIR" >&2
  exit 2
fi
train=$1 data_tool=$2 mpirun=$3 fault=$4 ranks=$5 timeout_s=$6 work=$7
victim=2
fault_step=3
action=${fault%%:*}
# FAULT is an action (sigkill, sigstop: at train.step, mid-step 3) or an action with its own
# fields (sigstop:point=train.start: before the process groups exist;
# sigstop:point=checkpoint.write: while writing its file of the first save, at step 2).
if [ "$action" = "$fault" ]; then
  spec="$fault:rank=$victim:step=$fault_step"
else
  spec="$fault:rank=$victim"
fi
failures=0

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null; }

rm -rf "$work"
mkdir -p "$work"
for _ in $(seq 300); do echo "In the beginning was the Word, and the Word was with God."; done \
  > "$work/text.txt"
"$data_tool" --input "$work/text.txt" --out "$work/t" > /dev/null || exit 1
cat > "$work/run.json" << EOF
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 2,
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 20000},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  "model": {"preset": "gpt2-tiny", "seq_len": 32},
  "data": {"train": "$work/t_train_*.bin", "shuffle": false},
  "train": {"steps": 100000, "log_interval": 1},
  "device": {"type": "cpu"},
  "comm": {"timeout_s": $timeout_s},
  "checkpoint": {"save_interval": $(case "$fault" in *checkpoint.write*) echo 2 ;; *) echo 0 ;; esac)},
  "output_dir": "$work/out"
}
EOF

# setsid: mpirun and everything it starts form one process group we can always clean up.
ZRT_FAULT_INJECT="$spec" \
  setsid "$mpirun" -n "$ranks" --oversubscribe --bind-to none "$train" --config "$work/run.json" \
  > "$work/log" 2>&1 &
launcher=$!
start=$(now)

declare -A pid_of
cleanup() {
  kill -CONT -- "-$launcher" 2>/dev/null
  kill -KILL -- "-$launcher" 2>/dev/null
  for p in "${pid_of[@]}"; do
    kill -CONT "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
}
trap cleanup EXIT

# The ranks are mpirun's children; /proc/PID/environ says which rank each is. A child mpirun
# has just forked matches too (its command line is mpirun's, which names zrt-train) before its
# environment says its rank: look again until every rank has said it (a pid outlives exec).
for _ in $(seq 600); do
  pid_of=()
  for p in $(pgrep -P "$launcher" -f "$(basename "$train")" 2>/dev/null); do
    r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && pid_of[$r]=$p
  done
  [ "${#pid_of[@]}" -ge "$ranks" ] && break
  sleep 0.1
done
if [ "${#pid_of[@]}" -ne "$ranks" ]; then
  echo "could not find the $ranks rank processes (found: ${!pid_of[*]})"
  cat "$work/log"
  exit 1
fi
echo "ranks: $(for r in "${!pid_of[@]}"; do printf 'rank %s pid %s; ' "$r" "${pid_of[$r]}"; done)"

# Wait for the fault to happen (the victim dead or stopped).
vpid=${pid_of[$victim]}
t_fault=""
for _ in $(seq 1200); do
  if [ "$action" = sigkill ] && ! alive "$vpid"; then t_fault=$(now); fi
  if [ "$action" = sigstop ] && [ "$(state "$vpid")" = T ]; then t_fault=$(now); fi
  [ -n "$t_fault" ] && break
  sleep 0.1
done
if [ -z "$t_fault" ]; then
  fail "the fault never happened on rank $victim (pid $vpid)"
  cat "$work/log"
  exit 1
fi
echo "fault $spec hit rank $victim $(elapsed "$start" "$t_fault") s after launch"

# Every other rank must be gone within the timeout plus 10 s; mpirun must return.
limit=$(awk -v t="$timeout_s" 'BEGIN { print t + 10 }')
declare -A gone_at
while :; do
  t=$(now)
  for r in "${!pid_of[@]}"; do
    [ "$r" = "$victim" ] && continue
    if [ -z "${gone_at[$r]:-}" ] && ! alive "${pid_of[$r]}"; then gone_at[$r]=$(elapsed "$t_fault" "$t"); fi
  done
  # Done when mpirun has returned and every other rank is gone (a rank may still be exiting
  # when mpirun returns: keep watching it until the limit rather than stop at mpirun's exit).
  all_gone=1
  for r in "${!pid_of[@]}"; do
    [ "$r" = "$victim" ] && continue
    [ -n "${gone_at[$r]:-}" ] || all_gone=0
  done
  if ! kill -0 "$launcher" 2>/dev/null && [ "$all_gone" = 1 ]; then break; fi
  if awk -v e="$(elapsed "$t_fault" "$t")" -v l="$limit" 'BEGIN { exit !(e > l) }'; then break; fi
  sleep 0.2
done
t_end=$(now)
if kill -0 "$launcher" 2>/dev/null; then
  fail "mpirun still running $(elapsed "$t_fault" "$t_end") s after the fault"
  rc=-1
else
  wait "$launcher"
  rc=$?
  echo "mpirun returned $rc, $(elapsed "$t_fault" "$t_end") s after the fault"
  [ "$rc" -ne 0 ] || fail "mpirun returned 0 after a rank was lost"
fi
for r in "${!pid_of[@]}"; do
  [ "$r" = "$victim" ] && continue
  if [ -n "${gone_at[$r]:-}" ]; then
    echo "rank $r (pid ${pid_of[$r]}) gone ${gone_at[$r]} s after the fault"
  else
    fail "rank $r (pid ${pid_of[$r]}) still alive $limit s after the fault"
  fi
done
sleep 0.5
for r in "${!pid_of[@]}"; do
  if alive "${pid_of[$r]}"; then
    fail "rank $r (pid ${pid_of[$r]}, state $(state "${pid_of[$r]}")) left behind"
  fi
done
left=$(pgrep -g "$launcher" 2>/dev/null | tr '\n' ' ')
[ -z "$left" ] || fail "processes left in the job's process group: $left"

if [ "$action" = sigstop ] && [[ "$fault" == *checkpoint.write* ]]; then
  # Frozen while writing its rank file: the others time out in the save's agreement, naming
  # the tag and the stage, and end the job with the watchdog's status, 3. Under load a rank's
  # training collective of the same step can time out first (a CI run saw the others in step
  # 2's all_gather while the victim stood in the save): then the watchdog's report must name
  # the step and the frozen rank. OpenMPI's teardown sends SIGCONT before SIGTERM, so the
  # victim may yet write its file and the save commit, complete, before rank 0 is killed (a CI
  # run did): a committed save must then verify, every checksum.
  report=$(grep -m1 "the ranks did not agree within" "$work/log")
  echo "checkpoint report: ${report:-none}"
  if [ -n "$report" ]; then
    echo "$report" | grep -q "checkpoint: global_step2, writing the files" ||
      fail "the report does not name the save's tag and stage"
  else
    report=$(grep -m1 "watchdog:" "$work/log")
    echo "watchdog report: ${report:-none}"
    echo "$report" | grep -q "at training step 2" ||
      fail "neither the save's report nor a watchdog report naming step 2"
    echo "$report" | grep -Eq "ranks missing: ([0-9]+, )*$victim[ ,]" ||
      fail "the watchdog's report does not name rank $victim as missing"
  fi
  if [ -e "$work/out/checkpoints/latest" ]; then
    "$(dirname "$train")/zrt-ckpt" verify "$work/out/checkpoints" > "$work/verify.log" 2>&1 ||
      fail "the save committed after the fault does not verify: $(cat "$work/verify.log")"
  fi
  [ "$rc" -eq 3 ] || fail "mpirun returned $rc, not 3 (a hung rank)"
elif [ "$action" = sigstop ]; then
  # Only the watchdog can see a frozen rank: its report must say where the job stood.
  report=$(grep -m1 "watchdog:" "$work/log")
  echo "watchdog report: ${report:-none}"
  [ -n "$report" ] || fail "no watchdog report in the log"
  if [ "$spec" = "$fault:rank=$victim:step=$fault_step" ]; then
    echo "$report" | grep -q "did not complete within" ||
      fail "the report does not name the operation's timeout"
    echo "$report" | grep -q "at training step $fault_step" ||
      fail "the report does not name step $fault_step"
    echo "$report" | grep -Eq "ranks missing: ([0-9]+, )*$victim[ ,]" ||
      fail "the report does not name rank $victim as missing"
  else
    # Group creation (MPI_Comm_dup) cannot time out: the monitor thread reports it.
    echo "$report" | grep -q "MPI_Comm_dup creating group '[a-z]*' has been in flight" ||
      fail "the report does not name the blocked group creation"
  fi
fi
if [ "$failures" -ne 0 ]; then
  echo "--- log"
  cat "$work/log"
  exit 1
fi
echo "PASS"
