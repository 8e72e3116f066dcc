#!/usr/bin/env bash
# The layer rule (tools/lint/check-layers): the tree has no forbidden include, and the check
# does fail on one (a copy of the rule's own cases in a scratch tree), so it cannot pass vacuously.
set -euo pipefail
python="$1"; check="$2"; tree="$3"
"$python" "$check" "$tree"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch"/runtime/engine "$scratch"/runtime/common "$scratch"/models "$scratch"/kernels
printf '#include "runtime/common/error.h"\n#include <vector>\n' >"$scratch/runtime/engine/ok.h"
printf '#include "kernels/ops.h"\n#include "config/config.h"\n' >"$scratch/models/ok.h"
if ! "$python" "$check" "$scratch" >/dev/null; then
  echo "FAIL: a tree that follows the rule was refused"; exit 1
fi
printf '#include "optimizers/optimizer.h"\n' >"$scratch/runtime/engine/bad.h"
printf '#include "runtime/engine/zero_engine.h"\n' >"$scratch/runtime/common/bad.cc"
printf '#include "models/gpt/gpt.h"\n' >"$scratch/kernels/bad.cu"
if out="$("$python" "$check" "$scratch")"; then
  echo "FAIL: forbidden includes were accepted:"; echo "$out"; exit 1
fi
for want in 'runtime/engine/bad.h:1: includes "optimizers/optimizer.h"' \
            'runtime/common/bad.cc:1: includes "runtime/engine/zero_engine.h"' \
            'kernels/bad.cu:1: includes "models/gpt/gpt.h"' '3 forbidden include(s)'; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: missing '$want' in:"; echo "$out"; exit 1; }
done

# The training loop's layer: train/ sits on every library and under the tools.
train_scratch="$(mktemp -d)"
trap 'rm -rf "$scratch" "$train_scratch"' EXIT
mkdir -p "$train_scratch"/train "$train_scratch"/models "$train_scratch"/tools
printf '#include "models/model_registry.h"\n#include "offload/cpu_optimizer_offload.h"\n' \
  >"$train_scratch/train/ok.h"
printf '#include "train/trainer.h"\n' >"$train_scratch/tools/ok.cc"
if ! "$python" "$check" "$train_scratch" >/dev/null; then
  echo "FAIL: a train/ layer that follows the rule was refused"; exit 1
fi
printf '#include "train/trainer.h"\n' >"$train_scratch/models/bad.h"
printf '#include "tools/mem/memory_estimate.h"\n' >"$train_scratch/train/bad.cc"
if out="$("$python" "$check" "$train_scratch")"; then
  echo "FAIL: forbidden includes of or from train/ were accepted:"; echo "$out"; exit 1
fi
for want in 'models/bad.h:1: includes "train/trainer.h"' \
            'train/bad.cc:1: includes "tools/mem/memory_estimate.h"' '2 forbidden include(s)'; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: missing '$want' in:"; echo "$out"; exit 1; }
done
echo "test_check_layers: the rule holds and refuses 3 planted violations, and 2 around train/"
