#!/usr/bin/env bash
# pack.sh — build/deltafin (stripped) and the shared libraries the accelerator machine lacks (it has no -dev
# packages; its base system has glibc, gnutls, libpcre2-8 and their dependencies) into .devcarry.tar.xz, small enough
# to travel with the working tree (`device` tool: carry [".devcarry.tar.xz"]; the tree's limit is 64 MiB).
# FIO=PATH adds that fio binary (the machine has none; build one that links only libc, libm and libz, e.g.
# Debian's fio source configured with --disable-http --disable-rdma --disable-rbd --disable-rados --disable-gfapi
# --disable-numa --disable-pmem --disable-native; tools/device/bench_host.sh then compares bench io with it).
# NGINX=PATH adds an nginx binary (Debian's nginx-light; for bench/setup_download.sh there); EXTRA_BINS="test_x .."
# adds those programs of build/.
set -eu
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
T=$(mktemp -d)
mkdir -p "$T/lib"
cp "$BIN" "$T/deltafin" && strip "$T/deltafin"
ldd "$BIN" | awk '/=> \// {print $3}' | grep -E '/lib(cjson|microhttpd|uring|utf8proc|xxhash)\.' |
    while read -r l; do cp -L "$l" "$T/lib/"; done
strip "$T"/lib/* 2>/dev/null || true
[ -z "${FIO:-}" ] || { cp "$FIO" "$T/fio" && strip "$T/fio"; }
[ -z "${NGINX:-}" ] || cp "$NGINX" "$T/nginx"
for b in ${EXTRA_BINS:-}; do cp "build/$b" "$T/$b" && strip "$T/$b"; done
tar cf - -C "$T" . | xz -9e --lzma2=dict=64MiB >.devcarry.tar.xz.tmp
mv .devcarry.tar.xz.tmp .devcarry.tar.xz
rm -rf "$T"
ls -la .devcarry.tar.xz
