#!/usr/bin/env bash
# e2e_make.sh — the top-level Makefile's `make run` freshness check (SRC_NEWER): in a scratch tree, a source
# of every kind CMake builds (.c, .h, .cu, .cuh, CMakeLists.txt, cmake/*.cmake) edited after the binary makes
# the check report it (so `make run` rebuilds); nothing newer than the binary, or a file of another kind
# (a .md), reports nothing (the build is skipped).
set -u
SRC=${DF_SRC:-.}
fail=0; pass=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
command -v make >/dev/null || { echo "no make: skipped"; echo "$pass passed, $fail failed"; exit 0; }
TMP=$(mktemp -d /tmp/df_e2e_make.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# the check's find command as the Makefile expands it (BUILD=b: the scratch tree's binary is b/deltafin)
cmd=$(make -s --no-print-directory -C "$SRC" BUILD=b --eval 'df-print-src-newer: ; @true $(info $(SRC_NEWER))' \
      df-print-src-newer 2>&1)
[[ "$cmd" == find\ * ]] && ok "SRC_NEWER: $cmd" || bad "SRC_NEWER not printed: $cmd"
mkdir -p "$TMP/src/kernels/cuda" "$TMP/include" "$TMP/cmake" "$TMP/b"
for f in src/a.c src/a.h src/kernels/cuda/k.cu src/kernels/cuda/k.cuh src/store/README.md include/x.h cmake/m.cmake \
         CMakeLists.txt; do
    mkdir -p "$TMP/$(dirname "$f")"; : >"$TMP/$f"
done
# every file and directory older than the binary
find "$TMP" -exec touch -d '2001-01-01 00:00:00' {} +
touch -d '2002-01-01 00:00:00' "$TMP/b/deltafin"
newer() { (cd "$TMP" && bash -c "$cmd"); }
out=$(newer)
[ -z "$out" ] && ok "nothing newer: the build is skipped" || bad "nothing newer, but: '$out'"
for f in src/a.c src/a.h src/kernels/cuda/k.cu src/kernels/cuda/k.cuh include/x.h cmake/m.cmake CMakeLists.txt; do
    touch -d '2003-01-01 00:00:00' "$TMP/$f"
    out=$(newer)
    [ "$out" = "$f" ] && ok "$f newer: rebuilt" || bad "$f newer: the check printed '$out'"
    touch -d '2001-01-01 00:00:00' "$TMP/$f"
done
touch -d '2003-01-01 00:00:00' "$TMP/src/store/README.md"
out=$(newer)
[ -z "$out" ] && ok "a newer .md: no rebuild" || bad "a newer .md: '$out'"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
