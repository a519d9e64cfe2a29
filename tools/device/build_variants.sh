#!/usr/bin/env bash
# build_variants.sh — builds of deltafin with extra CUDA compile flags, for A/B runs on the accelerator machine
# (tools/device/acceptance.sh parts 21, 41, 42: carried binaries next to this build's deltafin).
# Usage: tools/device/build_variants.sh NAME:FLAGS ...   e.g.  pf2:-DDF_T1_PF=2 pf3:-DDF_T1_PF=3
# Each NAME gets its own build directory build-v-NAME (RelWithDebInfo, CMAKE_CUDA_FLAGS=FLAGS; ccache keeps the C
# files cheap) and its binary copied to build/deltafin.NAME; then pack with
#   EXTRA_BINS="test_cuda_kernels test_golden test_batch deltafin.NAME ..." tools/device/pack.sh
# A FLAGS value holds no spaces (several -D flags: separate them with commas, turned into spaces here).
set -eu
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 NAME:FLAGS ..." >&2; exit 2; }
mkdir -p build
for v in "$@"; do
    name=${v%%:*} flags=${v#*:}
    case "$name" in ''|*[!A-Za-z0-9_-]*) echo "$0: bad variant name '$name' in '$v'" >&2; exit 2 ;; esac
    [ "$name" != "$v" ] || { echo "$0: '$v': expected NAME:FLAGS" >&2; exit 2; }
    flags=${flags//,/ }
    echo "== $name: CMAKE_CUDA_FLAGS='$flags'"
    cmake -S . -B "build-v-$name" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CUDA_FLAGS=$flags" >/dev/null
    cmake --build "build-v-$name" -j"${JOBS:-2}" --target deltafin >"build-v-$name/build.log" 2>&1 ||
        { tail -20 "build-v-$name/build.log" >&2; echo "$0: $name failed (build-v-$name/build.log)" >&2; exit 1; }
    cp "build-v-$name/deltafin" "build/deltafin.$name"
    ls -la "build/deltafin.$name"
done
