#!/usr/bin/env bash
# A cut cable between two hosts: zrt-train runs on 2 + 2 ranks on the network-namespace hosts of
# netns-hosts.sh (started by tools/zrt-run, so with its keep-alive settings), the link is taken
# down mid-training, and both every rank and mpirun itself must be gone within
# comm_timeout_s + 30 s. Prints the measured times. Exit 77 where namespaces cannot be made.
#
#   cut_link_test.sh ZRT_TRAIN ZRT_DATA TIMEOUT_S WORKDIR
set -u
[ $# -eq 4 ] || { echo "usage: $0 ZRT_TRAIN ZRT_DATA TIMEOUT_S WORKDIR" >&2; exit 2; }
train=$1 data_tool=$2 timeout_s=$3 work=$4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hosts="$here/netns-hosts.sh"
zrt_run="$here/../../tools/zrt-run"
state=/run/zrt-multinode
"$hosts" check > /dev/null || exit 77
exec 9> /run/zrt-multinode.lock && flock 9  # one user of the test hosts at a time
"$hosts" up > /dev/null || exit 1
trap '"$hosts" down' EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# The job trains with 2 ms of modelled latency on every collective (comm.simulated_latency_us,
# a sleep): a cut finds it inside a collective just the same, but it no longer keeps both cores
# busy. Flat out, 4 ranks on 2 cores polling their transfers over the veth pair's TCP (most of
# it system time) starved this script for tens of seconds at a time: it saw the training only
# after 20-80 thousand steps and the ranks' end late, and failed runs that were not failures.
rm -rf "$work" && mkdir -p "$work"
for _ in $(seq 300); do echo "In the beginning was the Word, and the Word was with God."; done > "$work/text.txt"
"$data_tool" --input "$work/text.txt" --out "$work/t" > /dev/null || exit 1
cat > "$work/run.json" << JSON
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "zero_optimization": {"stage": 3},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  "model": {"preset": "gpt2-tiny", "seq_len": 32},
  "data": {"train": "$work/t_train_*.bin", "shuffle": false},
  "train": {"steps": 1000000, "log_interval": 1},
  "device": {"type": "cpu"},
  "comm": {"timeout_s": $timeout_s, "simulated_latency_us": 2000},
  "output_dir": "$work/out"
}
JSON
printf 'zrt-h1 slots=2\nzrt-h2 slots=2\n' > "$work/hostfile"

# The job, as its own session so that everything it starts can be cleaned up.
# The job does not inherit the lock (fd 9): a rank that outlived a killed test would hold it.
setsid "$hosts" exec 1 env ZRT_LOG_LEVEL=warn "$zrt_run" -n 4 --hostfile "$work/hostfile" \
  --mca plm_rsh_agent "$state/rsh-agent" --mca oob_tcp_if_include 10.231.0.0/24 \
  --mca btl_tcp_if_include 10.231.0.0/24 -- "$train" --config "$work/run.json" \
  > "$work/log.txt" 2>&1 9>&- &
launcher=$!
# Wait for training on both hosts (metrics.jsonl gets a row per step), two minutes at most.
started=$SECONDS
while [ $((SECONDS - started)) -lt 120 ]; do
  [ -s "$work/out/metrics.jsonl" ] && [ "$(wc -l < "$work/out/metrics.jsonl")" -ge 3 ] && break
  alive "$launcher" || { echo "FAIL: the job ended before the cut:"; tail -20 "$work/log.txt"; exit 1; }
  sleep 0.1
done
ranks=$(pgrep -f -- "--config $work/run.json" | while read -r p; do
  [ "$(readlink "/proc/$p/exe")" = "$(readlink -f "$train")" ] && echo "$p"; done)
[ "$(echo "$ranks" | wc -w)" -eq 4 ] || { echo "FAIL: expected 4 ranks, found: $ranks"; exit 1; }
mpirun_pid=$(pgrep -s "$launcher" -x mpirun | head -1)
[ -n "$mpirun_pid" ] || { echo "FAIL: no mpirun in session $launcher"; exit 1; }
"$hosts" cut
cut_at=$(now)
waited=$((SECONDS - started))
limit=$((timeout_s + 30))
ranks_gone="" mpirun_gone="" last=0 stall=0
while :; do
  t=$(elapsed "$cut_at" "$(now)")
  # How long this loop went unscheduled (its sleep is 0.2 s): a figure far above that says the
  # machine, not the job, decided the times below.
  stall=$(awk -v t="$t" -v l="$last" -v s="$stall" 'BEGIN { g = t - l - 0.2; print (g > s ? g : s) }')
  last=$t
  if [ -z "$ranks_gone" ]; then
    left=0
    for p in $ranks; do alive "$p" && left=$((left + 1)); done
    [ "$left" -eq 0 ] && ranks_gone=$t
  fi
  [ -z "$mpirun_gone" ] && ! alive "$mpirun_pid" && mpirun_gone=$t
  [ -n "$ranks_gone" ] && [ -n "$mpirun_gone" ] && break
  awk -v t="$t" -v l="$limit" 'BEGIN { exit !(t > l + 30) }' && break
  sleep 0.2
done
pkill -KILL -s "$launcher" 2>/dev/null
echo "cut at step $(wc -l < "$work/out/metrics.jsonl"), ${waited} s after the start;" \
     "comm_timeout_s $timeout_s: every rank gone after ${ranks_gone:-never} s, mpirun after" \
     "${mpirun_gone:-never} s (limit $limit s; this loop's longest stall $(printf %.1f "$stall") s)"
failures=0
for what in "every rank:$ranks_gone" "mpirun:$mpirun_gone"; do
  t=${what#*:}
  if [ -z "$t" ] || awk -v t="$t" -v l="$limit" 'BEGIN { exit !(t > l) }'; then
    echo "FAIL: ${what%%:*} not gone within $limit s of the cut"; failures=1
  fi
done
[ $failures -eq 0 ] || tail -30 "$work/log.txt"
exit $failures
