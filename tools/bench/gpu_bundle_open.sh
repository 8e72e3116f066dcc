# Sourced by the tools/bench/gpu_*.sh scripts: open_bundle NAME BUNDLE WORK prints the absolute
# path of a tools/gpu-bundle folder given as a folder or as its .tar.xz (unpacked under
# WORK/.bundle), or says why not on stderr (prefixed NAME) and exits the script with status 2.
open_bundle() {
  local name="$1" bundle="$2" work="$3"
  if [[ "$bundle" == *.tar.xz ]] && [ -f "$bundle" ]; then
    mkdir -p "$work/.bundle"
    tar -xJf "$bundle" -C "$work/.bundle" || { echo "$name: cannot unpack $bundle" >&2; exit 2; }
    bundle="$(dirname "$(find "$work/.bundle" -maxdepth 2 -name env.sh | head -1)")"
  fi
  [ -n "$bundle" ] && [ -f "$bundle/env.sh" ] && [ -x "$bundle/bin/zrt-train" ] ||
    { echo "$name: --bundle must be a tools/gpu-bundle folder (or its .tar.xz) with zrt-train" >&2
      exit 2; }
  (cd "$bundle" && pwd)
}
