#!/usr/bin/env bash
# cuda_pack.sh — the CUDA backend's binaries for the accelerator machine: build/deltafin and the test programs
# that tools/device/cuda_check.sh runs (stripped), the shared libraries that machine lacks (as pack.sh), and
# cuda_check.sh itself, into one xz tarball (default .devcarry-cuda.tar.xz; pass the path as $1).
# The binaries are alike, so one xz stream with a large dictionary keeps the tarball small. The tree that travels
# to the device is near its 64 MiB limit: the tarball leaves out libpcre2-8 (grep's library, on the machine's image)
# and, by default, test_golden_model and test_store_golden (BINS overrides the list; cuda_check.sh runs what is there).
set -eu
cd "$(dirname "$0")/../.."
DEST=${1:-.devcarry-cuda.tar.xz}
T=$(mktemp -d)
mkdir -p "$T/lib"
for b in ${BINS:-deltafin test_cuda_kernels test_golden}; do
    cp "build/$b" "$T/$b" && strip "$T/$b"
done
cp tools/device/cuda_check.sh tools/device/cublas_sgemm.py tests/e2e_cuda_cli.sh "$T/"
ldd build/deltafin | awk '/=> \// {print $3}' | grep -E '/lib(cjson|microhttpd|uring|utf8proc|xxhash)\.' |
    while read -r l; do cp -L "$l" "$T/lib/"; done
strip "$T"/lib/* 2>/dev/null || true
tar cf - -C "$T" . | xz -9e --lzma2=dict=64MiB >"$DEST.tmp"
mv "$DEST.tmp" "$DEST"
rm -rf "$T"
ls -la "$DEST"
