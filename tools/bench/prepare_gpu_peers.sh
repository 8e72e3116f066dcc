#!/usr/bin/env bash
# Builds here, on a machine without a GPU, the peers tools/bench/gpu_peers.sh times beside zrt on a
# lent one, so that the lease spends none of its minutes building them:
#
#   llm.c     train_gpt2cu for sm_90 with cuDNN's flash attention (USE_CUDNN=1), from an llm.c
#             source tree or git directory: its one CUDA 13 incompatibility mended (cudaMemAdvise
#             takes a cudaMemLocation, in a managed-memory fallback never reached on a GPU with
#             room), the cuDNN frontend's headers from tools/install-cudnn-frontend, NVRTC and the
#             driver API linked for that frontend, and NVML linked against an empty library of its
#             soname (the GPU machine's driver provides the real one; llm.c only reads clocks
#             through it when its nvml.h is found, which the toolkit here lacks)
#   deepspeed its wheel built from the PyPI source with no ops (the CPU Adam is JIT-built on the GPU
#             machine: gpu_peers.sh --prebuild-ds), and the wheels of its needs the GPU image
#             lacks (hjson, pydantic and pydantic's own), for CPython 3.12 on manylinux
#
#   tools/bench/prepare_gpu_peers.sh [--llmc-src DIR] [--llmc-out DIR] [--wheels DIR]
#                                    [--deepspeed VERSION] [--python PYTHON]
#
# --llmc-src: a checkout or a bare git directory of karpathy/llm.c (absent: llm.c is not built).
# --llmc-out (default .peers): where train_gpt2cu goes. --wheels (default .whl): the wheels'
# folder. --deepspeed (default 0.19.8; "none" skips it). --python: an interpreter with torch
# (DeepSpeed's setup imports it; default $ZRT_HF_VENV/bin/python3, else python3). Both folders
# should be ignored by git (.git/info/exclude) and named in the device call's carry.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
llmc_src=""
llmc_out="$root/.peers"
wheels="$root/.whl"
deepspeed="0.19.8"
python="${ZRT_HF_VENV:+$ZRT_HF_VENV/bin/python3}"
python="${python:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --llmc-src) llmc_src="$2"; shift 2 ;;
    --llmc-out) llmc_out="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --deepspeed) deepspeed="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "prepare_gpu_peers: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ -n "$llmc_src" ]; then
  command -v nvcc > /dev/null || export PATH="$PATH:/usr/local/cuda/bin"
  command -v nvcc > /dev/null || { echo "prepare_gpu_peers: llm.c needs nvcc" >&2; exit 1; }
  "$root/tools/install-cudnn-frontend" > /dev/null
  frontend="${ZRT_CUDNN_FRONTEND_ROOT:-$(ls -d "$HOME"/.cache/zrt/cudnn-frontend-* | tail -1)}"
  src="$work/llm.c"
  mkdir -p "$src"
  if [ "$(git -C "$llmc_src" rev-parse --is-bare-repository 2>/dev/null)" = true ]; then
    git --git-dir "$llmc_src" archive HEAD | tar -x -C "$src"
    commit="$(git --git-dir "$llmc_src" rev-parse --short HEAD)"
  else
    cp -r "$llmc_src"/. "$src"/
    commit="$(git -C "$llmc_src" rev-parse --short HEAD 2>/dev/null || echo '?')"
  fi
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$src/llmc/cuda_utils.cuh"
  mkdir -p "$src/stub"
  : > "$src/stub/empty.c"
  gcc -shared -o "$src/stub/libnvidia-ml.so.1" -Wl,-soname,libnvidia-ml.so.1 "$src/stub/empty.c"
  ln -sf libnvidia-ml.so.1 "$src/stub/libnvidia-ml.so"
  ln -sfn "$frontend" "$src/cudnn-frontend"
  cuda_lib="$(dirname "$(find /usr/local/cuda/ -name 'libcudnn.so' 2>/dev/null | head -1)")"
  echo "prepare_gpu_peers: building llm.c $commit (train_gpt2cu, sm_90, cuDNN attention; a few minutes)"
  (cd "$src" && make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 \
     "NVCC_LDFLAGS=-lcublas -lcublasLt -lnvidia-ml -lcudnn -lnvrtc -lcuda -L$src/stub \
      -L/usr/local/cuda/lib64/stubs -L$cuda_lib" > "$work/llmc-build.log" 2>&1) ||
    { tail -20 "$work/llmc-build.log" >&2; echo "prepare_gpu_peers: llm.c failed to build" >&2; exit 1; }
  mkdir -p "$llmc_out"
  cp "$src/train_gpt2cu" "$llmc_out/"
  echo "prepare_gpu_peers: $llmc_out/train_gpt2cu (llm.c $commit)"
fi

if [ "$deepspeed" != none ]; then
  mkdir -p "$wheels"
  "$python" -c "import torch" 2> /dev/null ||
    { echo "prepare_gpu_peers: $python has no torch, which DeepSpeed's setup imports (--python)" >&2; exit 1; }
  "$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "deepspeed==$deepspeed"
  echo "prepare_gpu_peers: building the DeepSpeed $deepspeed wheel (no ops)"
  DS_BUILD_OPS=0 "$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$wheels" \
    "$work"/deepspeed-*.tar.gz > "$work/ds-build.log" 2>&1 ||
    { tail -20 "$work/ds-build.log" >&2; echo "prepare_gpu_peers: the DeepSpeed wheel failed" >&2; exit 1; }
  # DeepSpeed's needs the GPU image lacks, for its CPython 3.12: hjson, and pydantic with the
  # pydantic-core it pins; typing_extensions is on the image (two versions of one package stop
  # the whole install there).
  "$python" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --dest "$wheels" hjson pydantic
  rm -f "$wheels"/typing_extensions-*.whl
  echo "prepare_gpu_peers: $(ls "$wheels" | tr '\n' ' ')($(du -sh "$wheels" | cut -f1))"
fi
