#!/usr/bin/env bash
# pack.sh — build/deltafin (stripped) and the shared libraries the accelerator machine lacks (it has no -dev
# packages, and its base system has glibc, gnutls and their dependencies) into .devcarry.tar.xz, small enough
# to travel with the working tree (`device` tool: carry [".devcarry.tar.xz"]; the tree's limit is 64 MiB).
set -eu
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
T=$(mktemp -d)
mkdir -p "$T/lib"
cp "$BIN" "$T/deltafin" && strip "$T/deltafin"
ldd "$BIN" | awk '/=> \// {print $3}' | grep -E '/lib(cjson|microhttpd|uring|utf8proc|xxhash|pcre2-8)\.' |
    while read -r l; do cp -L "$l" "$T/lib/"; done
strip "$T"/lib/* 2>/dev/null || true
tar cJf .devcarry.tar.xz -C "$T" .
rm -rf "$T"
ls -la .devcarry.tar.xz
