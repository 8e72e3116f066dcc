#!/bin/bash
# A packed SFT step against a plain causal one at the same model and tokens (BENCHMARKS.md,
# "Fine-tuning data"): demo-sft's GPT at T = 512 on the verse SFT shards and on the KJV llm.c
# shards, alternately, three times; prints each run's median tokens/s of steps 11-40. Needs
# build/bin/zrt-train, data/verses-sft (docs/fine-tuning.md) and data/kjv_train_*.bin.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
run() { # name data
  rm -rf /tmp/st-$1
  build/bin/zrt-train --config configs/demo-sft.json --train.steps 40 --train.log_interval 1 --train_batch_size 4 \
    --zero_optimization.stage 1 --zero_optimization.offload_optimizer.device none --train.eval_interval 0 --data.train "$2" --data.val "" \
    --output_dir /tmp/st-$1 > /tmp/st-$1.log 2>&1 || { echo "$1 failed"; tail -5 /tmp/st-$1.log; }
  python3 - /tmp/st-$1/metrics.jsonl $1 <<'PY'
import json, statistics, sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t=[r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"]>10]
print(sys.argv[2], "median tok/s %.0f over %d steps" % (statistics.median(t), len(t)))
PY
}
for i in 1 2 3; do
  run packed data/verses-sft/train
  run causal "data/kjv_train_*.bin"
done
