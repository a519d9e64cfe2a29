#!/usr/bin/env bash
# build_timeline.sh — builds tools/device/gpu_timeline.c into OUT (default build/libgpu_timeline.so) against the CUDA
# toolkit's CUPTI, and copies libcupti beside it (the accelerator machine runs it with LD_LIBRARY_PATH set there).
set -eu
cd "$(dirname "$0")/../.."
CUDA=${CUDA_HOME:-/usr/local/cuda}
OUT=${1:-build/libgpu_timeline.so}
gcc -O2 -shared -fPIC -Wall -o "$OUT" tools/device/gpu_timeline.c -I"$CUDA/include" -L"$CUDA/lib" -L"$CUDA/lib64" \
    -lcupti -lpthread -Wl,-rpath,'$ORIGIN'
cp -L "$(ls "$CUDA"/lib/libcupti.so.* "$CUDA"/lib64/libcupti.so.* 2>/dev/null | head -1)" "$(dirname "$OUT")/"
ls -la "$OUT"
