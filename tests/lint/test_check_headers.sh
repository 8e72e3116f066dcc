#!/usr/bin/env bash
# Every header compiles on its own (tools/lint/check-headers), and the check does fail on one that
# does not (a scratch tree with a header missing an include), so it cannot pass vacuously.
set -euo pipefail
python="$1"; check="$2"; build="$3"; tree="$4"
"$python" "$check" "$build" "$tree"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch"/runtime/common
printf '#pragma once\n#include <string>\ninline std::string good() { return "x"; }\n' \
  >"$scratch/runtime/common/good.h"
if ! "$python" "$check" "$build" "$scratch" >/dev/null; then
  echo "FAIL: a self-contained header was refused"; exit 1
fi
# std::vector without <vector>: compiles only after a header that includes it.
printf '#pragma once\ninline int bad() { return static_cast<int>(std::vector<int>(3).size()); }\n' \
  >"$scratch/runtime/common/bad.h"
if out="$("$python" "$check" "$build" "$scratch")"; then
  echo "FAIL: a header missing an include was accepted:"; echo "$out"; exit 1
fi
for want in 'runtime/common/bad.h: does not compile on its own' '2 headers, 1 not self-contained'; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: missing '$want' in:"; echo "$out"; exit 1; }
done
echo "check-headers: passes the tree, refuses a header missing an include"
