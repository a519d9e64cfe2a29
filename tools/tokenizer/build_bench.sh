#!/usr/bin/env bash
# build_bench.sh — build tok_bench into tests/.cache/tokbench/ with PCRE2, utf8proc and
# xxHash linked statically and libcjson.so.1 copied beside it, so the binary runs on a
# machine without our -dev packages (the GPU machine): LD_LIBRARY_PATH=tests/.cache/tokbench.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
B="${BUILD:-$SRC/build-tok}"
O="$SRC/tests/.cache/tokbench"
cmake -S "$SRC" -B "$B" >/dev/null
cmake --build "$B" -j2 --target df_tokenizer >/dev/null
mkdir -p "$O"
gcc -std=gnu11 -O2 -I"$SRC/include" "$SRC/tools/tokenizer/tok_bench.c" "$B/libdf_tokenizer.a" \
    -Wl,-Bstatic -lpcre2-8 -lutf8proc -lxxhash -Wl,-Bdynamic -lcjson -lm -o "$O/tok_bench"
cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 "$O/"
echo "$O/tok_bench"
