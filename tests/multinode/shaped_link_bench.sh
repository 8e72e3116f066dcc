#!/usr/bin/env bash
# Benchmark over a shaped link between the two network-namespace hosts of netns-hosts.sh:
# zrt-train on configs/demo.json (2 + 2 ranks, the nodes from MPI) at ZeRO stage 3, plain vs
# MiCS (mics_shard_size 2: a shard group per host) vs qwZ + qgZ, with the link shaped by tc (tbf
# at RATE, netem DELAY where the kernel has it). Per variant, printed as a table row:
#   - step time: the median over the logged steps of the time between metrics.jsonl rows
#     (log_interval 1), the first WARMUP steps left out;
#   - zrt's inter-node bytes per step (comm_inter_node_bytes, rank 0's; the ranks are symmetric,
#     so the four ranks send 4x that across);
#   - the kernel's bytes on the link per step: the veth pair's tx bytes (ip -s link, both ends),
#     taken from two runs of LONG and SHORT steps (identical start-up and shut-down), divided by
#     the LONG - SHORT steps between them. Its ratio to 4x zrt's figure is the TCP/IP and MPI
#     overhead (headers, acknowledgements).
#
#   shaped_link_bench.sh ZRT_TRAIN WORKDIR [RATE [DELAY [SHORT LONG]]]
#   (defaults: 1gbit 0.5ms 10 30; RATE none: unshaped; run as root; data: tools/prepare-corpus)
# Exit 77 where namespaces cannot be made.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 ZRT_TRAIN WORKDIR [RATE [DELAY [SHORT LONG]]]" >&2; exit 2; }
train=$(readlink -f "$1") work=$2 rate=${3:-1gbit} delay=${4:-0.5ms} short=${5:-10} long=${6:-30}
warmup=3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
hosts="$here/netns-hosts.sh"
state=/run/zrt-multinode
"$hosts" check > /dev/null || exit 77
compgen -G "$root/data/kjv_train_*.bin" > /dev/null ||
  { echo "no data/kjv_train_*.bin: run tools/prepare-corpus first" >&2; exit 2; }
exec 9> /run/zrt-multinode.lock && flock 9  # one user of the test hosts at a time
"$hosts" up > /dev/null
trap '"$hosts" down > /dev/null' EXIT
[ "$rate" = none ] || "$hosts" shape "$rate" "$delay"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
printf 'zrt-h1 slots=2\nzrt-h2 slots=2\n' > "$work/hostfile"

link_tx_bytes() {  # tx bytes of both ends of the veth pair
  local n total=0
  for n in 1 2; do
    total=$((total + $(ip -n "zrtmn$n" -s -j link show "veth-zrtmn$n" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])')))
  done
  echo "$total"
}

run() {  # run NAME STEPS ARGS...: zrt-train across the hosts; prints the link bytes it moved
  local name=$1 steps=$2; shift 2
  local before after
  before=$(link_tx_bytes)
  (cd "$root" && "$hosts" exec 1 env ZRT_LOG_LEVEL=warn "$root/tools/zrt-run" -n 4 \
    --hostfile "$work/hostfile" --mca plm_rsh_agent "$state/rsh-agent" \
    --mca oob_tcp_if_include 10.231.0.0/24 --mca btl_tcp_if_include 10.231.0.0/24 -- \
    "$train" --config configs/demo.json --zero_optimization.stage 3 \
    --output_dir "$work/$name-$steps" --train.steps "$steps" --train.log_interval 1 \
    --train.eval_interval 0 --train.sample_tokens 0 "$@") > "$work/$name-$steps.log" 2>&1 ||
    { echo "FAIL: $name ($steps steps):" >&2; tail -20 "$work/$name-$steps.log" >&2; exit 1; }
  after=$(link_tx_bytes)
  echo $((after - before))
}

echo "link: tbf $rate, delay $delay (none: unshaped); zrt-train configs/demo.json, stage 3, 2 + 2 ranks on zrt-h1 + zrt-h2"
printf '%-10s %14s %22s %22s %10s\n' variant "step ms (med)" "zrt inter B/step/rank" \
  "link B/step (tx both)" "link/4xzrt"
variants=("plain:" "mics:--zero_optimization.mics_shard_size 2"
  "qwz+qgz:--zero_optimization.zero_quantized_weights true --zero_optimization.zero_quantized_gradients true")
for v in "${variants[@]}"; do
  name=${v%%:*}
  read -r -a args <<< "${v#*:}"
  b_short=$(run "$name" "$short" "${args[@]}")
  b_long=$(run "$name" "$long" "${args[@]}")
  python3 - "$work/$name-$long/metrics.jsonl" "$warmup" "$name" "$b_short" "$b_long" \
    "$((long - short))" << 'PY'
import json, statistics, sys
path, warmup, name, b_short, b_long, steps = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "loss" in r and "comm_inter_node_bytes" in r]
warmup = int(warmup)
times = [b["time"] - a["time"] for a, b in zip(rows[warmup:], rows[warmup + 1:])]
inter = statistics.median(r["comm_inter_node_bytes"] for r in rows[warmup:])
link = (int(b_long) - int(b_short)) / int(steps)
print(f"{name:<10} {1e3 * statistics.median(times):14.1f} {inter:22.0f} {link:22.0f} {link / (4 * inter):10.3f}")
PY
done
