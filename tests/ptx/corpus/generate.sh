#!/usr/bin/env bash
# Regenerates the corpus PTX from the CUDA sources: nvcc -ptx for sm_80 and sm_90.
# Triton PTX (triton/*.ptx) comes from triton_kernels.py run in a throwaway venv with triton installed.
set -euo pipefail
cd "$(dirname "$0")"
for arch in sm_80 sm_90; do
  mkdir -p "$arch"
  for cu in cuda/*.cu; do
    nvcc -ptx -O3 -arch="$arch" -o "$arch/$(basename "${cu%.cu}").ptx" "$cu"
  done
done
