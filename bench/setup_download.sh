#!/usr/bin/env bash
# setup_download.sh [SIZE_MB] [SETUP FLAGS...] — `deltafin setup --download-only` vs plain curl from the same
# loopback nginx mirror (tests/hub/mirror.py): SIZE_MB (default 2048) of random bytes in SHARDS (env, default 1)
# LFS shards beside kimi-mini's config.json. curl fetches the shards one after another over one connection (its
# exit leaves the bytes in the page cache), again followed by `sync` (the bytes on the disk), and (SHARDS > 1) all at
# once (curl -Z, one connection per shard, at most 8). deltafin runs twice: with DF_SETUP_WRITEBACK=0, as the
# default `setup --full` downloads, split in two from its own status lines: the download phase (start to every
# file sha256-checked and at its final name, process start included) and the final sync (`setup: synced ... in
# S s`: every file fdatasynced); then as --download-only runs by default (each hashed range handed to writeback,
# so the final sync is short), timed whole. Prints MB/s of each (files written to the same
# disk; before each, the page cache dropped when root and the mirror's files read back into it), the ratios
# download phase / curl and (download + sync) / (curl + sync), and deltafin's peak RSS (/usr/bin/time).
# Figures go to bench/RESULTS.md.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DF_BIN:-$ROOT/build/deltafin}
MB=${1:-2048}; shift || true
TMP=$(mktemp -d /tmp/df_bench_setup.XXXXXX); chmod 755 "$TMP"
trap '[ -f "$TMP/nginx.pid" ] && kill "$(cat "$TMP/nginx.pid")"; rm -rf "$TMP"' EXIT
read -r P1 P2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]; print(*[x.getsockname()[1] for x in s])')
mkdir -p "$TMP/big-src"
cp "$ROOT/models/kimi-mini/config.json" "$TMP/big-src/"
SHARDS=${SHARDS:-1}
NAMES=()
for k in $(seq 1 "$SHARDS"); do
    nm=model.safetensors
    [ "$SHARDS" = 1 ] || nm=$(printf 'model-%05d-of-%05d.safetensors' "$k" "$SHARDS")
    head -c $((MB * 1048576 / SHARDS)) /dev/urandom > "$TMP/big-src/$nm"
    NAMES+=("$nm")
done
DF_MIRROR_EXTRA="test/big=$TMP/big-src" python3 "$ROOT/tests/hub/mirror.py" build "$TMP" "$P1" "$P2"
$(command -v nginx || echo /usr/sbin/nginx) -c "$TMP/nginx.conf" -p "$TMP"
CURLARGS=()
for nm in "${NAMES[@]}"; do CURLARGS+=(-o "$TMP/curl.$nm" "http://127.0.0.1:$P1/test/big/resolve/main/$nm"); done
# the page cache dropped (root only), then the mirror's files read back into it: every run starts with nothing of
# the destination cached and nginx serving from memory (the source drive's speed is not part of any figure)
drop() { { [ "$(id -u)" = 0 ] && sync && echo 3 > /proc/sys/vm/drop_caches; } || true; cat "$TMP"/big-src/* >/dev/null; }
# curl, then sync: the bytes on the disk, as deltafin's final sync leaves them
drop; ts0=$(date +%s.%N); curl -s "${CURLARGS[@]}"; sync; ts1=$(date +%s.%N); rm -f "$TMP"/curl.*
drop; t0=$(date +%s.%N); curl -s "${CURLARGS[@]}"; t1=$(date +%s.%N)
if command -v openssl >/dev/null; then openssl dgst -sha256 "$TMP"/curl.* >/dev/null; else sha256sum "$TMP"/curl.* >/dev/null; fi; t1h=$(date +%s.%N); rm -f "$TMP"/curl.*
# curl with every shard in parallel (-Z, one connection per file), the faster way to use curl alone on a
# multi-shard checkpoint; with one shard it equals the run above and is skipped
tp0=0; tp1=0
if [ "$SHARDS" -gt 1 ]; then
    drop; tp0=$(date +%s.%N); curl -s -Z --parallel-max 8 "${CURLARGS[@]}"; tp1=$(date +%s.%N); rm -f "$TMP"/curl.*
fi
# deltafin twice: DF_SETUP_WRITEBACK=0 (as the default `setup --full` downloads: no writeback hint; its download
# phase and its final sync apart), then as `--download-only` runs (each hashed range handed to writeback at once)
TIMEV=(/usr/bin/time -f "%M" -o "$TMP/rss"); [ -x /usr/bin/time ] || { TIMEV=(); echo 0 >"$TMP/rss"; }
setup_run() { # setup_run WRITEBACK: prints start end sync_seconds peak_rss_kB
    rm -rf "$TMP/inst"; drop; local a b s
    a=$(date +%s.%N)
    DF_SETUP_WRITEBACK=$1 "${TIMEV[@]}" "$BIN" setup test/big --mirror "http://127.0.0.1:$P1" --dir "$TMP/inst" --download-only \
        --registry "$TMP/reg.json" --quiet "${SETUP_ARGS[@]}" >/dev/null 2>"$TMP/setup.err" || { cat "$TMP/setup.err" >&2; exit 1; }
    b=$(date +%s.%N)
    s=$(sed -n 's/^setup: synced [0-9.]* MB of the download to the disk in \([0-9.]*\) s$/\1/p' "$TMP/setup.err")
    echo "$a $b ${s:-0} $(cat "$TMP/rss")"
}
SETUP_ARGS=("$@")
read -r t2 t3 SYNC RSS0 < <(setup_run 0)
read -r t4 t5 SYNC1 RSS1 < <(setup_run "")
python3 - "$MB" "$t0" "$t1" "$t1h" "$t2" "$t3" "$RSS0" "$tp0" "$tp1" "$SHARDS" "$ts0" "$ts1" "$SYNC" "$t4" "$t5" "$SYNC1" "$RSS1" <<'PY'
import sys
mb, t0, t1, t1h, t2, t3, rss = float(sys.argv[1]), *map(float, sys.argv[2:7]), int(sys.argv[7])
tp0, tp1, shards = float(sys.argv[8]), float(sys.argv[9]), int(sys.argv[10])
ts0, ts1, sync = float(sys.argv[11]), float(sys.argv[12]), float(sys.argv[13])
t4, t5, sync1, rss = float(sys.argv[14]), float(sys.argv[15]), float(sys.argv[16]), max(rss, int(sys.argv[17]))
MB = mb * 1.048576
cs = MB / (ts1 - ts0)
c, ch = (MB / t for t in (t1 - t0, t1h - t0))
dl = (t3 - t2) - sync
d, dt, dw = MB / dl, MB / (t3 - t2), MB / (t5 - t4)
cp = MB / (tp1 - tp0) if tp1 > tp0 else 0
print(f"{shards} shard(s), {mb:.0f} MiB: " + (f"curl -Z (shards in parallel): {cp:.0f} MB/s ({tp1 - tp0:.2f} s); " if cp else "")
      + f"curl: {c:.0f} MB/s ({t1 - t0:.2f} s); curl + sync: {cs:.0f} MB/s ({ts1 - ts0:.2f} s); "
      f"curl + openssl sha256: {ch:.0f} MB/s ({t1h - t0:.2f} s); "
      f"deltafin, no writeback hint (the default --full path's download): download phase (sha256-checked, in place) "
      f"{d:.0f} MB/s ({dl:.2f} s), final sync {sync:.2f} s, download + sync {dt:.0f} MB/s ({t3 - t2:.2f} s); "
      f"deltafin --download-only (writeback hint): download + sync {dw:.0f} MB/s ({t5 - t4:.2f} s, of which final sync {sync1:.2f} s); "
      f"download phase / curl {d / c:.2f}" + (f", / curl -Z {d / cp:.2f}" if cp else "")
      + f"; (download + sync) / (curl + sync): {dt / cs:.2f} without the hint, {dw / cs:.2f} with it; deltafin peak RSS "
      + (f"{rss / 1024:.1f} MB" if rss else "not measured (no /usr/bin/time)"))
PY
