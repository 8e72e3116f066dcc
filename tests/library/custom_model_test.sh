#!/usr/bin/env bash
# zrt as another project uses it: installs this build tree to a prefix, builds
# examples/custom_model against the install (find_package(zrt), zrt::zrt, the example's own
# flags), trains it at 2 ranks at ZeRO stage 3 and checks that its loss falls. The corpus is
# made here from the repository's documentation (zrt-data), so the test needs no download.
#
# usage: custom_model_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
cmake="$1" build="$2" source="$3" work="$4"

rm -rf "$work"
mkdir -p "$work/data"
"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log"
"$cmake" -S "$source/examples/custom_model" -B "$work/build" \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
"$cmake" --build "$work/build" -j 2

cat "$source"/README.md "$source"/docs/*.md > "$work/data/text.txt"
"$work/prefix/bin/zrt-data" --input "$work/data/text.txt" --out "$work/data/docs" \
  --val-fraction 0.05
# The example's config with this test's data and output directory.
python3 - "$source/examples/custom_model/config.json" "$work" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
work = sys.argv[2]
config["data"] = {"train": f"{work}/data/docs_train_*.bin", "val": f"{work}/data/docs_val_*.bin"}
config["output_dir"] = f"{work}/out"
json.dump(config, open(f"{work}/config.json", "w"), indent=2)
PY

"$work/prefix/bin/zrt-run" -n 2 "$work/build/custom_model" --config "$work/config.json"
python3 "$source/examples/custom_model/check_loss_falls.py" "$work/out/metrics.jsonl"
