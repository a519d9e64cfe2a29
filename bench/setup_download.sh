#!/usr/bin/env bash
# setup_download.sh [SIZE_MB] — `deltafin setup --download-only` vs plain curl from the same loopback nginx
# mirror (tests/hub/mirror.py): SIZE_MB (default 2048) of random bytes in SHARDS (env, default 1) LFS shards
# beside kimi-mini's config.json; curl fetches the shards one after another over one connection, and (SHARDS > 1)
# again all at once (curl -Z, one connection per shard, at most 8), and once followed by sync (the bytes on the disk,
# as deltafin leaves them: it fsyncs each file before its rename). Prints MB/s
# of each (files written to the same disk, page cache dropped before each when root), the ratio, and deltafin's
# peak RSS (/usr/bin/time). Figures go to bench/RESULTS.md.
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
drop() { [ "$(id -u)" = 0 ] && sync && echo 3 > /proc/sys/vm/drop_caches || true; }
# curl, then sync: the same bytes on the disk (deltafin fsyncs each file before its rename; curl's exit leaves
# them in the page cache)
drop; ts0=$(date +%s.%N); curl -s "${CURLARGS[@]}"; sync; ts1=$(date +%s.%N); rm -f "$TMP"/curl.*
drop; t0=$(date +%s.%N); curl -s "${CURLARGS[@]}"; t1=$(date +%s.%N)
if command -v openssl >/dev/null; then openssl dgst -sha256 "$TMP"/curl.* >/dev/null; else sha256sum "$TMP"/curl.* >/dev/null; fi; t1h=$(date +%s.%N); rm -f "$TMP"/curl.*
# curl with every shard in parallel (-Z, one connection per file), the faster way to use curl alone on a
# multi-shard checkpoint; with one shard it equals the run above and is skipped
tp0=0; tp1=0
if [ "$SHARDS" -gt 1 ]; then
    drop; tp0=$(date +%s.%N); curl -s -Z --parallel-max 8 "${CURLARGS[@]}"; tp1=$(date +%s.%N); rm -f "$TMP"/curl.*
fi
drop; t2=$(date +%s.%N)
TIMEV=(/usr/bin/time -f "%M" -o "$TMP/rss"); [ -x /usr/bin/time ] || { TIMEV=(); echo 0 >"$TMP/rss"; }
"${TIMEV[@]}" "$BIN" setup test/big --mirror "http://127.0.0.1:$P1" --dir "$TMP/inst" --download-only \
    --registry "$TMP/reg.json" --quiet "$@" >/dev/null
t3=$(date +%s.%N)
python3 - "$MB" "$t0" "$t1" "$t1h" "$t2" "$t3" "$(cat "$TMP/rss")" "$tp0" "$tp1" "$SHARDS" "$ts0" "$ts1" <<'PY'
import sys
mb, t0, t1, t1h, t2, t3, rss = float(sys.argv[1]), *map(float, sys.argv[2:7]), int(sys.argv[7])
tp0, tp1, shards = float(sys.argv[8]), float(sys.argv[9]), int(sys.argv[10])
ts0, ts1 = float(sys.argv[11]), float(sys.argv[12])
cs = mb * 1.048576 / (ts1 - ts0)
c, ch, d = (mb * 1.048576 / t for t in (t1 - t0, t1h - t0, t3 - t2))
cp = mb * 1.048576 / (tp1 - tp0) if tp1 > tp0 else 0
best = max(c, cp)
print(f"{shards} shard(s), {mb:.0f} MiB: " + (f"curl -Z (shards in parallel): {cp:.0f} MB/s ({tp1 - tp0:.2f} s); " if cp else "")
      + f"curl: {c:.0f} MB/s ({t1 - t0:.2f} s); curl + openssl sha256: {ch:.0f} MB/s ({t1h - t0:.2f} s); "
      f"deltafin setup --download-only (sha256 included): {d:.0f} MB/s ({t3 - t2:.2f} s); "
      f"ratio to curl {d / c:.2f}" + (f", to curl -Z {d / cp:.2f}, to the faster curl {d / best:.2f}" if cp else "")
      + f", to curl + sync ({cs:.0f} MB/s) {d / cs:.2f}"
      + f", to curl + openssl sha256 {d / ch:.2f}; deltafin peak RSS "
      + (f"{rss / 1024:.1f} MB" if rss else "not measured (no /usr/bin/time)"))
PY
