#!/usr/bin/env bash
# e2e_server_stream.sh — `deltafin serve` on a streamed install (`deltafin setup --stream`: routed experts fetched
# from the mirror on first use) when the mirror goes away and comes back:
#   - mirror stopped: a request that needs experts not yet local fails with HTTP 500 naming the mirror and saying to
#     retry once it answers (not setup's "resumes" advice); /health is 503 "model_io_error" and deltafin_model_healthy 0;
#   - mirror started again: the very next request succeeds (a failed fetch is tried again at the next need: no
#     failure kept per expert), /health is 200 "ok" and deltafin_model_healthy 1 again (an I/O error is transient;
#     corrupt data stays sticky: e2e_server_robust.sh), and the following requests succeed too.
# The mirror is nginx serving models/kimi-mini in the hub's layout (tests/hub/mirror.py, as e2e_setup.sh).
# Skips (0 failed) only when nginx is not installed and cannot be.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DF_BIN:-$ROOT/build/deltafin}
PASS=0; FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
finish() { echo "$PASS passed, $FAIL failed"; [ $FAIL -eq 0 ]; exit $?; }
[ -x "$BIN" ] || { echo "e2e_server_stream: no deltafin binary at $BIN (set DF_BIN)"; exit 1; }
. "$ROOT/tests/hub/nginx.sh"
find_nginx e2e_server_stream
command -v python3 >/dev/null && command -v curl >/dev/null || { echo "e2e_server_stream: python3 and curl are required"; exit 1; }

TMP=$(mktemp -d /tmp/df_e2e_server_stream.XXXXXX)
chmod 755 "$TMP"
SPID=""
cleanup() {
    [ -f "$TMP/nginx.pid" ] && kill "$(cat "$TMP/nginx.pid")" 2>/dev/null
    [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
read -r P1 P2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]; print(*[x.getsockname()[1] for x in s])')
M=http://127.0.0.1:$P1
python3 "$ROOT/tests/hub/mirror.py" build "$TMP" "$P1" "$P2" || { bad "build the mirror tree"; finish; }
mirror_up() {
    "$NGINX" -c "$TMP/nginx.conf" -p "$TMP" 2>"$TMP/nginx.start" || { bad "start nginx: $(cat "$TMP/nginx.start")"; return 1; }
    for _ in $(seq 1 50); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$M/api/models/test/kimi-mini")" = 200 ] && return 0; sleep 0.1; done
    bad "nginx does not answer on $M"; return 1
}
mirror_down() {
    local p; p=$(cat "$TMP/nginx.pid" 2>/dev/null) && kill "$p"
    for _ in $(seq 1 50); do curl -s -o /dev/null "$M/" || return 0; sleep 0.1; done
    bad "nginx still answers on $M"; return 1
}
mirror_up || finish
export DELTAFIN_REGISTRY=$TMP/registry.json
unset HF_TOKEN HF_ENDPOINT

out=$("$BIN" setup test/kimi-mini --mirror "$M" --stream --dir "$TMP/st" --no-default --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "installed (stream" && ok "setup --stream" || { bad "setup --stream: rc $rc $out"; finish; }

"$BIN" serve --model "$TMP/st/native" --port 0 --port-file "$TMP/port" 2>"$TMP/serve.log" & SPID=$!
for _ in $(seq 1 300); do [ -s "$TMP/port" ] && break; kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
[ -s "$TMP/port" ] || { bad "serve did not start: $(tail -3 "$TMP/serve.log")"; finish; }
U=http://127.0.0.1:$(cat "$TMP/port")
chat() { # chat OUTFILE: a greedy chat completion; prints the HTTP status
    curl -s -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Tell me about pointers in C."}],"max_tokens":8,"temperature":0}' "$U/v1/chat/completions"
}
health() { curl -s -o "$TMP/health.json" -w '%{http_code}' "$U/health"; }
healthy_metric() { curl -s "$U/metrics" | sed -n 's/^deltafin_model_healthy \([0-9]*\)$/\1/p'; }

# ---- the mirror goes away: the request fails (500 naming the mirror), /health says why
mirror_down
code=$(chat "$TMP/r0.json")
[ "$code" = 500 ] && grep -q "streaming expert [0-9]* of layer [0-9]* from $M: cannot reach the mirror" "$TMP/r0.json" \
    && ok "mirror stopped: 500 naming the mirror" || bad "mirror stopped: HTTP $code $(head -c 400 "$TMP/r0.json")"
# what to do, for a server: retry once the mirror answers (the expert is fetched again); not setup's advice (nothing for
# setup to resume; the mirror is the install's, not --mirror / HF_ENDPOINT), and the message is whole (not cut short)
grep -q "cannot reach the mirror $M ([^)]*): no network, or the mirror is down? check the connection; the expert is fetched again the next time it is needed: retry once the mirror answers (I/O error)\"" "$TMP/r0.json" \
    && ! grep -q "setup\|HF_ENDPOINT\|--mirror" "$TMP/r0.json" \
    && ok "mirror stopped: the message says to retry once the mirror answers, nothing about setup" || bad "mirror stopped, advice: $(cat "$TMP/r0.json")"
code=$(health)
[ "$code" = 503 ] && grep -q '"code":"model_io_error"' "$TMP/health.json" && [ "$(healthy_metric)" = 0 ] \
    && ok "mirror stopped: /health 503 model_io_error, deltafin_model_healthy 0" || bad "/health while the mirror is down: HTTP $code $(head -c 300 "$TMP/health.json")"

# ---- the mirror is back: the very next request succeeds and /health is OK again
mirror_up || finish
code=$(chat "$TMP/r1.json")
[ "$code" = 200 ] && grep -q '"finish_reason":"length"' "$TMP/r1.json" \
    && ok "mirror back: the next request succeeds (no failure kept per expert)" || bad "mirror back, next request: HTTP $code $(head -c 400 "$TMP/r1.json")"
n_err=1; k=1
while [ "$code" != 200 ] && [ $k -lt 8 ]; do # (only after the failure above) how many more until one succeeds
    n_err=$((n_err + 1)); k=$((k + 1)); code=$(chat "$TMP/r1.json")
done
[ $k -gt 1 ] && echo "     (the request that succeeded was the ${k}th after the mirror came back)"
code=$(health)
[ "$code" = 200 ] && grep -q '"status":"ok"' "$TMP/health.json" && ! grep -q '"error"' "$TMP/health.json" && [ "$(healthy_metric)" = 1 ] \
    && ok "after a successful request: /health 200 ok, deltafin_model_healthy 1" || bad "/health after a successful request: HTTP $code $(head -c 300 "$TMP/health.json")"
n_ok=0
for i in 2 3; do [ "$(chat "$TMP/r$i.json")" = 200 ] && n_ok=$((n_ok + 1)); done
content() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$1" 2>/dev/null; }
c1=$(content "$TMP/r1.json"); c3=$(content "$TMP/r3.json")
[ -n "$c1" ] && [ "$c1" = "$c3" ] && [ $n_ok = 2 ] && ok "later requests succeed with the same greedy answer" || bad "later requests: $n_ok of 2 succeeded: $(head -c 300 "$TMP/r3.json")"
[ "$(health)" = 200 ] && [ "$(curl -s "$U/metrics" | sed -n 's/^deltafin_model_errors_total \([0-9]*\)$/\1/p')" = $n_err ] \
    && ok "still healthy; deltafin_model_errors_total counts the failed requests ($n_err)" || bad "model errors total: $(curl -s "$U/metrics" | grep model_errors)"

kill -TERM $SPID; wait $SPID; rc=$?; SPID=""
[ $rc -eq 0 ] && grep -q "^stream: network .* [1-9][0-9]* expert fetches" "$TMP/serve.log" && ok "serve exits 0 on SIGTERM, stream stats" \
    || bad "serve exit: rc $rc $(tail -3 "$TMP/serve.log")"
finish
