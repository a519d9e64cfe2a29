#!/usr/bin/env bash
# e2e_server_load.sh — bounded load test of `deltafin serve` under
# AddressSanitizer: 32 concurrent clients (tests/server/load.mjs) loop for
# DF_LOAD_SECONDS (default 12) against the mock model with --queue 4, mixing
# chat / completions, streamed / not, malformed bodies and mid-stream
# disconnects. Passes when every response is well-formed (200 bodies complete,
# SSE ending in [DONE], 429 with Retry-After, 400 for bad JSON), the server
# exits 0 on SIGTERM, and ASan/LeakSanitizer report nothing.
# The ASan binary is build-asan/deltafin (`make asan`); the deltafin target there
# is (re)built first unless DF_ASAN_BIN names a binary. Env: DF_SRC, DF_ASAN_BIN, DF_LOAD_SECONDS.
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
ABIN=${DF_ASAN_BIN:-$SRC/build-asan/deltafin}
SECS=${DF_LOAD_SECONDS:-12}
TMP=$(mktemp -d /tmp/df-e2e-load.XXXXXX)
SPID=
trap '[ -n "$SPID" ] && kill -9 $SPID 2>/dev/null; rm -rf "$TMP"' EXIT

if [ -z "${DF_ASAN_BIN:-}" ]; then # (re)build it: incremental, so cheap when up to date
    echo "e2e_server_load: building the AddressSanitizer binary in $SRC/build-asan (deltafin target)"
    { [ -f "$SRC/build-asan/CMakeCache.txt" ] || cmake -S "$SRC" -B "$SRC/build-asan" -DDF_ASAN=ON -DCMAKE_BUILD_TYPE=Debug; } \
        >"$TMP/build.log" 2>&1 &&
        cmake --build "$SRC/build-asan" -j "$(nproc)" --target deltafin >>"$TMP/build.log" 2>&1 ||
        { tail -20 "$TMP/build.log"; echo "e2e_server_load: ASan build failed"; exit 1; }
fi
[ -x "$ABIN" ] || { echo "e2e_server_load: no ASan binary at $ABIN"; exit 1; }
command -v node >/dev/null || { echo "e2e_server_load: node is required"; exit 1; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=23
"$ABIN" serve --mock --mock-delay-ms 2 --queue 4 --timeout 5 --port 0 --port-file "$TMP/port" 2>"$TMP/server.log" &
SPID=$!
for _ in $(seq 1 300); do [ -s "$TMP/port" ] && break; sleep 0.1; done
[ -s "$TMP/port" ] || { cat "$TMP/server.log"; echo "e2e_server_load: server did not start"; exit 1; }
PORT=$(cat "$TMP/port")
echo "--- ASan server on port $PORT: 32 clients for $SECS s"
node "$SRC/tests/server/load.mjs" "http://127.0.0.1:$PORT/v1" mock 32 "$SECS"
lrc=$?
for _ in $(seq 1 40); do # idle within 2 s (an aborted stream is noticed within 100 ms)
    health=$(curl -s "http://127.0.0.1:$PORT/health")
    case "$health" in *'"in_flight":0'*) break ;; esac
    sleep 0.05
done
echo "--- health after load: $health"
kill -TERM $SPID
for _ in $(seq 1 150); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
wait $SPID
src=$?
SPID=
tail -2 "$TMP/server.log"
fail=0
[ $lrc = 0 ] || { echo "FAIL load client"; fail=1; }
[ $src = 0 ] || { echo "FAIL server exit status $src (23 = ASan report)"; fail=1; }
if grep -q -E "ERROR: (AddressSanitizer|LeakSanitizer)" "$TMP/server.log"; then
    grep -A30 -m1 -E "ERROR: (AddressSanitizer|LeakSanitizer)" "$TMP/server.log"
    echo "FAIL sanitizer report"
    fail=1
fi
case "$health" in *'"in_flight":0'*) ;; *) echo "FAIL server not idle after the load: $health"; fail=1 ;; esac
[ $fail = 0 ] && echo "e2e_server_load: PASS (no crash, no leak, well-formed responses, 429s as specified)"
echo "$((1 - fail)) passed, $fail failed"
exit $fail
