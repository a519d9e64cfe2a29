#!/usr/bin/env bash
# e2e_server_robust.sh — `deltafin serve` behaviours new users hit first (issue 11,
# items 5-10), over HTTP on loopback:
#   6. a second client is queued by default (--queue 16), not refused with 429; a
#      request sent right after a streaming client aborts is served (the aborted
#      generation is stopped first), also with --queue 0;
#   8. a long prefill with --timeout shorter than --keepalive keeps its stream
#      (keep-alives at most every --timeout/2); with --keepalive 0 a stream silent
#      for --timeout ends with an SSE error event, never a 200 with an empty body;
#   9. a busy --port is an error before the model loads; an unwritable --port-file is an error (exit 1); a --port-file left by an earlier server is removed at start
#      (also when binding then fails) and replaced by the new port, and removed at SIGTERM / SIGINT / SIGHUP (a
#      clean exit 0, as SIGTERM; under nohup SIGHUP stays ignored) unless another server has written its own port
#      there since;
#   7. /health names a model whose expert pack failed its checksum (503, status "error");
#  10. max_tokens 0 with echo scores the prompt (its logprobs, nothing generated);
#   5. two requests without a seed sample different texts;
#  11. --ctx N: the mock answers as the engine does on a golden model with the same --ctx (context_length, the 400
#      for a prompt of N tokens, finish_reason and usage when prompt + max_tokens pass N, plain and streamed);
#      above the mock's maximum (65536) --ctx is lowered to it with the engine's note;
#  12. --mock with --model, --ram-budget or --preload: a usage error (exit 2, one line); a bad size or number
#      option quotes its value and names the forms, as run does;
#  13. malformed request lines and headers sent raw over TCP: a 400 (505 for an unsupported HTTP version) where
#      libmicrohttpd or the server answers, never a 2xx or a hang, and the server keeps serving afterwards;
#  14. the log and /metrics: every 400 of a generation request is one line with the message sent (no generation
#      figures) and is not in deltafin_requests_total; a stream whose client leaves after its generation ended but
#      before the stream was sent is logged (client gone) and counted with its 200;
#  15. a token-id prompt with an element that is no token id: a 400 naming it; --host 0.0.0.0 without --api-key warns.
# Env: DF_BIN (deltafin binary), DF_SRC (repo root).
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${DF_BIN:-$SRC/build/deltafin}
TMP=$(mktemp -d /tmp/df-e2e-robust.XXXXXX)
PASS=0
FAIL=0
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
expect() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi; }
json() { # json FILE EXPR: evaluate a JS expression on the parsed file (j)
    node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); console.log(eval(process.argv[2]))' "$1" "$2" 2>/dev/null ||
        echo "not-json"
}
start_server() { # start_server NAME ARGS...: sets PORT, SPID and B
    local name=$1; shift
    rm -f "$TMP/$name.port"
    "$BIN" serve --port 0 --port-file "$TMP/$name.port" "$@" 2>"$TMP/$name.log" &
    SPID=$!
    PIDS+=("$SPID")
    for _ in $(seq 1 600); do
        [ -s "$TMP/$name.port" ] && { PORT=$(cat "$TMP/$name.port"); B="http://127.0.0.1:$PORT"; return 0; }
        kill -0 "$SPID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
stop_server() { # stop_server NAME: SIGTERM; a clean exit 0 (under AddressSanitizer: no leak report)
    local rc
    kill -TERM "$SPID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null; rc=$?
    [ "$rc" = 0 ] && ok "$1: clean exit on SIGTERM" || bad "$1: exit status $rc: $(grep -m3 -E 'Sanitizer|ERROR' "$TMP/$1.log")"
}
[ -x "$BIN" ] || { echo "e2e_server_robust: no deltafin binary at $BIN (set DF_BIN)"; exit 1; }
command -v curl >/dev/null && command -v node >/dev/null || { echo "e2e_server_robust: curl and node are required"; exit 1; }
H=(-H "Content-Type: application/json")
LONGP=$(printf 'y%.0s' $(seq 1 100)) # longer than the mock's text: endless greedy output

# ---- 6. queue by default; an abort frees the engine for the next request
start_server q --mock --mock-delay-ms 5 || { cat "$TMP/q.log"; echo "server did not start"; exit 1; }
curl -s "$B/health" >"$TMP/h"
expect "default --queue is 16 (/health)" "$(json "$TMP/h" j.queue)" 16
expect "an idle server has no request waiting (/health waiting)" "$(json "$TMP/h" j.waiting)" 0
CP=()
for i in 1 2 3; do
    curl -s -o "$TMP/c$i" -w '%{http_code}' "${H[@]}" -d "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":60}" "$B/v1/completions" >"$TMP/c$i.code" &
    CP+=($!)
done
wait "${CP[@]}"
expect "3 concurrent clients without --queue: all served" "$(cat "$TMP/c1.code" "$TMP/c2.code" "$TMP/c3.code" | tr -d '\n')" 200200200
expect "no request refused" "$(curl -s "$B/health" >"$TMP/h"; json "$TMP/h" j.rejected)" 0
stop_server q

start_server q0 --mock --mock-delay-ms 5 --queue 0 || { cat "$TMP/q0.log"; echo "server did not start"; exit 1; }
codes=""
for i in 1 2 3 4 5; do
    # a streaming client gives up after 0.3 s; the next request follows at once
    curl -sN --max-time 0.3 "${H[@]}" -d "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":2000,\"stream\":true}" \
        "$B/v1/completions" >/dev/null
    codes="$codes$(curl -s -o "$TMP/after" -w '%{http_code}' "${H[@]}" -d '{"prompt":"abc","max_tokens":3,"temperature":0}' "$B/v1/completions")"
done
expect "request right after an aborted stream (--queue 0): served, never 429" "$codes" 200200200200200
expect "its text" "$(json "$TMP/after" j.choices[0].text)" "lo,"
# the log: each aborted generation ends (client gone) before the next one is logged
order=$(grep -o 'status 200: prompt [0-9]* tokens.*' "$TMP/q0.log" | sed -n 's/.*(client gone)$/gone/p; s/.*generated.*[0-9] s$/ok/p' | tr '\n' ' ')
expect "engine freed before the next request runs (log order)" "$order" "gone ok gone ok gone ok gone ok gone ok "
stop_server q0

# ---- 8. long prefill: 600 tokens x 5 ms = 3 s of silence before the first token
: >"$TMP/ka"; : >"$TMP/ka0"
IDS=$(seq 1 600 | awk '{print $1 % 200}' | paste -sd, -)
start_server ka --mock --mock-delay-ms 5 --timeout 1 --keepalive 5 || { cat "$TMP/ka.log"; exit 1; }
curl -sN -o "$TMP/ka" -w '%{http_code}' "${H[@]}" -d "{\"prompt\":[$IDS],\"max_tokens\":3,\"temperature\":0,\"stream\":true}" \
    "$B/v1/completions" >"$TMP/ka.code"
n_ka=$(grep -c '^: keep-alive$' "$TMP/ka")
n_data=$(grep -c '^data: {' "$TMP/ka")
if [ "$(cat "$TMP/ka.code")" = 200 ] && [ "$n_ka" -ge 3 ] && [ "$n_data" -ge 2 ] && tail -c 14 "$TMP/ka" | grep -q 'data: \[DONE\]'; then
    ok "--timeout 1 --keepalive 5: 3 s prefill kept open ($n_ka keep-alives, $n_data events, [DONE])"
else bad "--timeout 1 --keepalive 5: code $(cat "$TMP/ka.code"), $n_ka keep-alives, $n_data events: $(head -c 300 "$TMP/ka")"; fi
# chat too (its role chunk goes out before the prefill)
curl -sN -o "$TMP/kac" "${H[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$(printf 'z%.0s' $(seq 1 600))\"}],\"max_tokens\":3,\"temperature\":0,\"stream\":true}" \
    "$B/v1/chat/completions"
if tail -c 14 "$TMP/kac" | grep -q 'data: \[DONE\]' && [ "$(grep -c '"finish_reason":"length"' "$TMP/kac")" = 1 ]; then ok "chat stream over a 3 s prefill completes"
else bad "chat stream over a long prefill: $(tail -c 300 "$TMP/kac")"; fi
stop_server ka

start_server ka0 --mock --mock-delay-ms 5 --timeout 1 --keepalive 0 || { cat "$TMP/ka0.log"; exit 1; }
curl -sN -o "$TMP/ka0" -w '%{http_code}' "${H[@]}" -d "{\"prompt\":[$IDS],\"max_tokens\":3,\"temperature\":0,\"stream\":true}" \
    "$B/v1/completions" >"$TMP/ka0.code"
ev=$(grep '^data: {' "$TMP/ka0" | head -1 | cut -c7-)
echo "$ev" >"$TMP/ev.json"
if [ "$(cat "$TMP/ka0.code")" = 200 ] && [ "$(json "$TMP/ev.json" j.error.code)" = timeout ] && tail -c 14 "$TMP/ka0" | grep -q 'data: \[DONE\]'; then
    ok "--keepalive 0 --timeout 1: the silent stream ends with an SSE error event (timeout) and [DONE]"
else bad "--keepalive 0: code $(cat "$TMP/ka0.code"), body '$(head -c 300 "$TMP/ka0")'"; fi
for _ in $(seq 1 50); do grep -q 'client gone' "$TMP/ka0.log" && break; sleep 0.1; done
if grep -q 'prompt 600 tokens.*0 generated.*(client gone)' "$TMP/ka0.log"; then ok "and its prefill was cancelled"
else bad "prefill not cancelled: $(tail -2 "$TMP/ka0.log")"; fi
expect "still serving" "$(curl -s -o /dev/null -w '%{http_code}' "${H[@]}" -d '{"prompt":"abc","max_tokens":2}' "$B/v1/completions")" 200
stop_server ka0

# ---- 9. an unwritable --port-file
t0=$(date +%s)
"$BIN" serve --mock --port 0 --port-file "$TMP/no/such/dir/port" >"$TMP/pf.out" 2>&1 &
PF=$!
PIDS+=("$PF")
for _ in $(seq 1 100); do kill -0 "$PF" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PF" 2>/dev/null; then bad "--port-file in a missing directory: still running"; kill -9 "$PF"; fi
wait "$PF"; rc=$?
expect "--port-file that cannot be written: exit 1" "$rc" 1
if grep -q "cannot write --port-file $TMP/no/such/dir/port" "$TMP/pf.out"; then ok "and says why"; else bad "message: $(cat "$TMP/pf.out")"; fi

# ---- 9b. a --port-file left by an earlier server: removed before binding (so a script never reads the dead port),
# written once the new port is known, and removed at SIGTERM / SIGINT (unless another server has replaced it since)
wait_port() { # wait_port FILE PID: the port FILE holds once the server PID wrote it (never the stale "1")
    for _ in $(seq 1 600); do
        [ -s "$1" ] && [ "$(cat "$1")" != 1 ] && { cat "$1"; return 0; }
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
listening_port() { sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\)\/v1.*/\1/p' "$1"; }
stopped() { # stopped PID: SIGTERM'd or SIGINT'd server exited; its status
    for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
PFA="$TMP/shared.port"
echo 1 >"$PFA"
"$BIN" serve --mock --port 0 --port-file "$PFA" 2>"$TMP/pfa.log" &
PA=$!; PIDS+=("$PA")
pa=$(wait_port "$PFA" "$PA")
expect "stale --port-file (1): replaced by the bound port, the one the server listens on" "$pa" "$(listening_port "$TMP/pfa.log")"
expect "that port serves" "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pa/health")" 200
[ -e "$PFA.tmp" ] && bad "PATH.tmp left behind" || ok "no PATH.tmp left"
# a server that cannot bind (the port of the one above) removed the stale file at start: none is left to read
PFB="$TMP/busy.port"
echo 1 >"$PFB"
"$BIN" serve --mock --port "$pa" --port-file "$PFB" >"$TMP/pfb.out" 2>&1
expect "--port in use: exit 1" "$?" 1
grep -q "the port is in use" "$TMP/pfb.out" && ok "and says why" || bad "busy port message: $(cat "$TMP/pfb.out")"
[ -e "$PFB" ] && bad "stale --port-file still there after a failed bind: '$(cat "$PFB")'" || ok "stale --port-file removed before binding"
# with a real model the busy port is said before the model loads (no model line, no first-use conversion into the
# cache) and at once
rm -rf "$TMP/busy-cache"
t0=$(date +%s%N)
"$BIN" serve --model "$SRC/tests/golden/bf16_kimi" --cache-dir "$TMP/busy-cache" --port "$pa" >"$TMP/pfm.out" 2>&1
rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
expect "--port in use with a model: exit 1" "$rc" 1
grep -q "^deltafin serve: cannot listen on 127.0.0.1:$pa: Address already in use (the port is in use: try another --port, or --port 0 for any free one); the model was not loaded$" "$TMP/pfm.out" \
    && ! grep -q "^model \|convert" "$TMP/pfm.out" && [ ! -e "$TMP/busy-cache" ] && [ "$ms" -lt 2000 ] \
    && ok "busy port: said before the model loads (${ms} ms)" || bad "busy port with a model (${ms} ms): $(cat "$TMP/pfm.out"); cache: $(ls "$TMP/busy-cache" 2>&1)"
# a second server with the same PATH replaces it; the first, stopped, leaves the second's file alone
"$BIN" serve --mock --port 0 --port-file "$PFA" 2>"$TMP/pfc.log" &
PC=$!; PIDS+=("$PC")
pc=""
for _ in $(seq 1 600); do
    [ -s "$PFA" ] && [ "$(cat "$PFA")" != "$pa" ] && { pc=$(cat "$PFA"); break; }
    kill -0 "$PC" 2>/dev/null || break; sleep 0.1
done
lc=$(listening_port "$TMP/pfc.log")
if [ -n "$pc" ] && [ "$pc" = "$lc" ]; then ok "second server on the same --port-file: its own port"
else bad "second server on the same --port-file: file '$pc' (now '$(cat "$PFA" 2>/dev/null)'), log port '$lc', first '$pa', alive $(kill -0 "$PC" 2>/dev/null && echo yes || echo no), log: $(tail -3 "$TMP/pfc.log")"; fi
kill -TERM "$PA"; stopped "$PA"
expect "first server: exit 0 on SIGTERM" "$?" 0
expect "--port-file still the second server's port after the first stopped" "$(cat "$PFA" 2>/dev/null)" "$pc"
kill -TERM "$PC"; stopped "$PC"
expect "second server: exit 0 on SIGTERM" "$?" 0
[ -e "$PFA" ] && bad "--port-file left after SIGTERM: '$(cat "$PFA")'" || ok "--port-file removed at SIGTERM"
# signal_stop SIG: a server given SIG (its default disposition restored: background jobs of a script ignore SIGINT)
# shuts down cleanly: exit 0, "SIG received" logged, its --port-file removed
signal_stop() {
    local pf="$TMP/$1.port" log="$TMP/$1.log" pid port
    env --default-signal="$1" "$BIN" serve --mock --port 0 --port-file "$pf" 2>"$log" &
    pid=$!; PIDS+=("$pid")
    port=$(wait_port "$pf" "$pid")
    expect "SIG$1 case: --port-file written" "$port" "$(listening_port "$log")"
    kill -"$1" "$pid"; stopped "$pid"
    expect "exit 0 on SIG$1" "$?" 0
    grep -q "SIG$1 received, shutting down" "$log" && ok "SIG$1 received" || bad "SIG$1 log: $(tail -2 "$log")"
    [ -e "$pf" ] && bad "--port-file left after SIG$1: '$(cat "$pf")'" || ok "--port-file removed at SIG$1"
}
signal_stop INT
# SIGHUP (a closed terminal, a service manager): the same clean shutdown as SIGTERM (it used to end the server by the
# signal, exit 129, the --port-file left behind); under nohup (SIGHUP ignored at start) it stays ignored
signal_stop HUP
PFN="$TMP/nohup.port"
nohup "$BIN" serve --mock --port 0 --port-file "$PFN" >/dev/null 2>"$TMP/pfn.log" &
PN=$!; PIDS+=("$PN")
pn=$(wait_port "$PFN" "$PN")
kill -HUP "$PN"; sleep 0.3
if kill -0 "$PN" 2>/dev/null && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pn/health")" = 200 ]; then
    ok "under nohup SIGHUP is ignored: still serving"
else bad "under nohup SIGHUP stopped the server: $(tail -2 "$TMP/pfn.log")"; fi
kill -TERM "$PN"; stopped "$PN"
expect "nohup'd server: exit 0 on SIGTERM" "$?" 0
[ -e "$PFN" ] && bad "--port-file left after SIGTERM (nohup): '$(cat "$PFN")'" || ok "--port-file removed at SIGTERM (nohup)"

# ---- 10. max_tokens 0 + echo: scoring the prompt
start_server sc --mock || { cat "$TMP/sc.log"; exit 1; }
expect "max_tokens 0 + echo + logprobs -> 200" \
    "$(curl -s -o "$TMP/sc" -w '%{http_code}' "${H[@]}" -d '{"prompt":"abc","max_tokens":0,"echo":true,"logprobs":1}' "$B/v1/completions")" 200
expect "text = prompt, 3 prompt logprobs (first null), 0 completion tokens" \
    "$(json "$TMP/sc" '[j.choices[0].text, j.choices[0].logprobs.tokens.join(""), j.choices[0].logprobs.token_logprobs.length, j.choices[0].logprobs.token_logprobs[0], j.usage.completion_tokens, j.choices[0].finish_reason].join("|")')" \
    "abc|abc|3||0|length"
for _ in $(seq 1 50); do grep -q 'status 200: prompt 3 tokens' "$TMP/sc.log" && break; sleep 0.05; done
line=$(grep 'status 200: prompt 3 tokens' "$TMP/sc.log" | head -1)
case $line in "serve: completion json status 200: prompt 3 tokens (0 reused), 0 generated, no token, "*) ok "logged: 0 generated, no token" ;;
    *) bad "max_tokens 0 log line: '$line'" ;; esac
expect "max_tokens 0 without echo -> 400" \
    "$(curl -s -o "$TMP/sc" -w '%{http_code}' "${H[@]}" -d '{"prompt":"abc","max_tokens":0}' "$B/v1/completions")" 400
# ---- 5. no seed: "regenerate" gives another text
a=$(curl -s "${H[@]}" -d '{"prompt":"abc","max_tokens":40,"temperature":1.5}' "$B/v1/completions")
b=$(curl -s "${H[@]}" -d '{"prompt":"abc","max_tokens":40,"temperature":1.5}' "$B/v1/completions")
ta=$(echo "$a" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).choices[0].text)))')
tb=$(echo "$b" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).choices[0].text)))')
if [ -n "$ta" ] && [ "$ta" != "$tb" ]; then ok "two requests without seed in the same second differ"; else bad "same text without seed: $ta"; fi
stop_server sc

# ---- 7. /health reports a model whose expert pack fails its checksum
G="$SRC/tests/golden/bf16_dsv3_groups"
if "$BIN" convert "$G" "$TMP/nat" >"$TMP/conv.log" 2>&1; then
    for f in "$TMP"/nat/experts-L*.pack; do # same size, every expert's bytes wrong
        sz=$(stat -c %s "$f"); head -c "$sz" /dev/zero | tr '\0' '\125' >"$f"
    done
    if start_server bad --model "$TMP/nat"; then
        curl -s -o "$TMP/h0" -w '%{http_code}' "$B/health" >"$TMP/h0.code"
        expect "/health before the corrupt pack is read: 200 ok" "$(cat "$TMP/h0.code") $(json "$TMP/h0" j.status)" "200 ok"
        expect "a generation that reads the corrupt pack -> 500" \
            "$(curl -s -o "$TMP/g" -w '%{http_code}' "${H[@]}" -d '{"prompt":[155,147,48,220,111,131,250,60,58,86],"max_tokens":2,"temperature":0}' "$B/v1/completions")" 500
        curl -s -o "$TMP/h1" -w '%{http_code}' "$B/health" >"$TMP/h1.code"
        expect "/health after: 503, status error, code model_corrupt" \
            "$(cat "$TMP/h1.code") $(json "$TMP/h1" j.status) $(json "$TMP/h1" j.error.code)" "503 error model_corrupt"
        case "$(json "$TMP/h1" j.error.message)" in
            *"checksum mismatch in layer"*"experts-L00"*) ok "/health names the error: $(json "$TMP/h1" j.error.message | cut -c1-90)...";;
            *) bad "/health error message: $(cat "$TMP/h1")";;
        esac
        stop_server bad
    else bad "serve on the converted model did not start: $(tail -3 "$TMP/bad.log")"; fi
else bad "convert $G: $(tail -2 "$TMP/conv.log")"; fi

# ---- 11. --ctx N: the mock as the engine (token-id prompts: the golden model has no tokenizer)
ctx_case() { # ctx_case NAME ARGS...: the answers of a --ctx 32 server, one line each, into $TMP/NAME.ctx
    local name=$1; shift
    if ! start_server "$name" --ctx 32 "$@"; then bad "serve $* --ctx 32 did not start: $(tail -2 "$TMP/$name.log")"; return; fi
    local i32 i20
    i32=$(seq -s, 1 32); i20=$(seq -s, 1 20)
    {
        curl -s "$B/v1/models" >"$TMP/m"; json "$TMP/m" 'j.data[0].context_length'
        curl -s -o "$TMP/r" -w '%{http_code} ' "${H[@]}" -d "{\"prompt\":[$i32],\"max_tokens\":1,\"temperature\":0}" "$B/v1/completions"
        json "$TMP/r" 'j.error.message + " " + j.error.param'
        curl -s -o "$TMP/r" -w '%{http_code} ' "${H[@]}" -d "{\"prompt\":[$i20],\"max_tokens\":100,\"temperature\":0}" "$B/v1/completions"
        json "$TMP/r" 'j.choices[0].finish_reason + " " + JSON.stringify(j.usage)'
        curl -s "${H[@]}" -d "{\"prompt\":[$i20],\"max_tokens\":100,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
            "$B/v1/completions" | grep '^data: {' | sed 's/^data: //' | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{
                const ev=s.trim().split("\n").map(l=>JSON.parse(l)); let f="", u=null;
                for (const e of ev) { if (e.choices.length) { if (e.choices[0].finish_reason) f=e.choices[0].finish_reason; } else u=e.usage; }
                console.log("stream " + f + " " + JSON.stringify(u)); })'
    } >"$TMP/$name.ctx" 2>&1
    grep -q "context 32, listening" "$TMP/$name.log" && ok "$name: serve --ctx 32 says context 32" || bad "$name: startup line: $(tail -1 "$TMP/$name.log")"
    stop_server "$name"
}
ctx_case ctxmock --mock
ctx_case ctxreal --model "$SRC/tests/golden/bf16_kimi" --cache-dir "$TMP/cache"
want_ctx="32
400 This server's context is 32 tokens (deltafin serve --ctx 32); the prompt has 32 tokens, which leaves no room for a completion: shorten the prompt, or restart the server with a larger --ctx (up to the model's maximum context). prompt
200 length {\"prompt_tokens\":20,\"completion_tokens\":12,\"total_tokens\":32,\"prompt_tokens_details\":{\"cached_tokens\":0}}
stream length {\"prompt_tokens\":20,\"completion_tokens\":12,\"total_tokens\":32,\"prompt_tokens_details\":{\"cached_tokens\":19}}"
expect "engine --ctx 32: context_length, 400 for a 32-token prompt, 12 of max_tokens 100 then length (plain, streamed reusing 19)" \
    "$(cat "$TMP/ctxreal.ctx")" "$want_ctx"
expect "mock --ctx 32 answers as the engine" "$(cat "$TMP/ctxmock.ctx")" "$(cat "$TMP/ctxreal.ctx")"
if start_server ctxbig --mock --ctx 70000; then
    curl -s "$B/v1/models" >"$TMP/m"
    expect "mock --ctx 70000: lowered to the mock's maximum" "$(json "$TMP/m" 'j.data[0].context_length')" 65536
    grep -q "^deltafin serve: note: --ctx 70000 is more than the model's maximum of 65536 positions; using 65536" "$TMP/ctxbig.log" \
        && ok "mock --ctx 70000: the engine's note" || bad "mock --ctx 70000 note: $(head -2 "$TMP/ctxbig.log")"
    stop_server ctxbig
else bad "serve --mock --ctx 70000 did not start: $(tail -2 "$TMP/ctxbig.log")"; fi

# ---- 12. --mock serves the built-in test model: flags about a real model's weights are usage errors (exit 2, one
# line, nothing served), never silently ignored; --ram-budget 0 means no budget, as leaving it out
usage2() { # usage2 WHAT PATTERN ARGS...
    local what=$1 pat=$2; shift 2
    local out rc; out=$(timeout 20 "$BIN" serve --port 0 "$@" 2>&1); rc=$?
    [ $rc -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && printf '%s\n' "$out" | grep -q -- "$pat" && ok "$what" \
        || bad "$what: rc $rc (want 2, one line /$pat/): $out"
}
usage2 "serve --mock --model: usage error" "^deltafin serve: --mock serves the built-in byte-level test model: drop --model" \
    --mock --model "$SRC/models/kimi-mini"
usage2 "serve --mock --ram-budget 8G: usage error" "^deltafin serve: --ram-budget applies to a real model, not --mock" --mock --ram-budget 8G
usage2 "serve --ram-budget 8G --mock-kimi: usage error" "^deltafin serve: --ram-budget applies to a real model, not --mock" \
    --ram-budget 8G --mock-kimi
usage2 "serve --mock --preload: usage error" "^deltafin serve: --preload applies to a real model, not --mock" --mock --preload
# a bad size or number: the value quoted and the forms named, as run words them
usage2 "serve --ram-budget 12X: run's message" \
    '^deltafin serve: --ram-budget "12X": expected a size such as 4G or 512M (K, M, G, T: powers of 1024), or 0 for no budget$' \
    --mock --ram-budget 12X
usage2 "serve --gpu-budget 0: run's message" '^deltafin serve: --gpu-budget "0" is not a size (e.g. 40G, 512M)$' --mock --gpu-budget 0
usage2 "serve --parallel 0: the value quoted" '^deltafin serve: --parallel "0": expected an integer in \[1, 64\]$' --mock --parallel 0
usage2 "serve --max-request-bytes 10: the value quoted" '^deltafin serve: --max-request-bytes "10": expected a size of at least 64' \
    --mock --max-request-bytes 10
if start_server rb0 --mock --ram-budget 0; then ok "serve --mock --ram-budget 0 (no budget) starts"; stop_server rb0
else bad "serve --mock --ram-budget 0 did not start: $(tail -2 "$TMP/rb0.log")"; fi

# ---- 13. malformed requests, raw over TCP (docs/server.md "Malformed requests")
raw() { # raw BYTES (escapes \r \n \xHH): send them on a new connection; prints the status line ("closed" when the
        # server closes without a byte, "timeout" when nothing came for 5 s), then the response body
    node -e '
const bytes = process.argv[2].replace(/\\(r|n|x[0-9a-fA-F]{2})/g,
    (m, e) => (e === "r" ? "\r" : e === "n" ? "\n" : String.fromCharCode(parseInt(e.slice(1), 16))));
const s = require("net").connect(+process.argv[1], "127.0.0.1");
let d = Buffer.alloc(0);
const done = (none) => {
    const t = d.toString("latin1"), i = t.indexOf("\r\n\r\n");
    console.log(t ? t.split("\r\n")[0] : none);
    console.log(i >= 0 ? t.slice(i + 4) : "");
    process.exit(0);
};
s.setTimeout(5000, () => done("timeout"));
s.on("connect", () => s.write(Buffer.from(bytes, "latin1")));
s.on("data", (c) => { d = Buffer.concat([d, c]); });
s.on("error", () => {});
s.on("close", () => done("closed"));' "$PORT" "$1"
}
raw_status() { raw "$1" | head -1; }
raw_code() { # raw_code BYTES: the JSON error code of the response body
    raw "$1" | tail -n +2 >"$TMP/raw.body"
    json "$TMP/raw.body" j.error.code
}
if start_server mal --mock; then
    # no space in the request line, or none before the target: libmicrohttpd 0.9.75 closes without a response
    # (newer versions answer 400), the server never sees the request
    for req in 'GARBAGE\r\n\r\n' 'GET\r\n\r\n' ' GET /health HTTP/1.1\r\nHost: x\r\n\r\n'; do
        st=$(raw_status "$req")
        case $st in "HTTP/1.1 400 "* | closed) ok "request line '$req': $st" ;; *) bad "request line '$req': got '$st', want a 400 or a close" ;; esac
    done
    # answered by libmicrohttpd: a version other than HTTP/d.d, no version, a header line without ':'
    expect "request line 'GET / FOO/1.1': 400" "$(raw_status 'GET / FOO/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    expect "request line 'GET /health' (no version): 400" "$(raw_status 'GET /health\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    st=$(raw_status 'GET / HTTP/9.9\r\n\r\n')
    case $st in "HTTP/1.1 505 "* | "HTTP/1.1 400 "*) ok "request line 'GET / HTTP/9.9': $st" ;; *) bad "request line 'GET / HTTP/9.9': got '$st', want 505 or 400" ;; esac
    expect "header line without ':': 400" "$(raw_status 'GET /health HTTP/1.1\r\nHost: x\r\nBadHeader\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    # answered by the server (JSON error): what libmicrohttpd lets through
    expect "target with a space: 400" "$(raw_status 'GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    expect "target with a space: code invalid_request_line" "$(raw_code 'GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n')" invalid_request_line
    expect "target not a path: 400" "$(raw_status 'GET health HTTP/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    expect "method not a token: code invalid_request_line" "$(raw_code 'G(T /health HTTP/1.1\r\nHost: x\r\n\r\n')" invalid_request_line
    expect "header name with a space: 400" "$(raw_status 'GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n')" "HTTP/1.1 400 Bad Request"
    expect "header name with a space: code invalid_header" "$(raw_code 'GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n')" invalid_header
    expect "empty header name: code invalid_header" "$(raw_code 'GET /health HTTP/1.1\r\n: v\r\nHost: x\r\n\r\n')" invalid_header
    expect "control character in a header value: code invalid_header" "$(raw_code 'GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n')" invalid_header
    expect "POST with a malformed header: code invalid_header" \
        "$(raw_code 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"prompt":""}')" invalid_header
    # well-formed requests are still served, raw and by curl
    expect "well-formed raw GET /health: 200" "$(raw_status 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 200 OK"
    expect "raw GET with a percent-encoded space in the query: 200" "$(raw_status 'GET /v1/models?a=%20b HTTP/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 200 OK"
    expect "after malformed requests: /health 200" "$(curl -s -o /dev/null -w '%{http_code}' "$B/health")" 200
    expect "after malformed requests: /v1/models 200" "$(curl -s -o /dev/null -w '%{http_code}' "$B/v1/models")" 200
    expect "after malformed requests: a completion 200" \
        "$(curl -s -o /dev/null -w '%{http_code}' "${H[@]}" -d '{"prompt":"hi","max_tokens":4}' "$B/v1/completions")" 200
    stop_server mal
else bad "serve --mock (malformed requests) did not start: $(tail -2 "$TMP/mal.log")"; fi

# ---- 14. the log and /metrics: a 400 (found on arrival or once the prompt is tokenized) is one line with the
# message sent and is not in deltafin_requests_total; a stream whose client leaves after its generation ended, before
# the rest of the stream was sent, is marked (client gone) and counted with the 200 it was sent
if start_server lg --mock; then
    IDS5001=$(seq 1 5001 | awk '{print $1 % 200}' | paste -sd, -)
    n400=0
    for req in "completions|{\"prompt\":[99999]}" "completions|{\"prompt\":[$IDS5001],\"max_tokens\":1}" \
        "completions|{\"prompt\":\"hi\",\"n\":2}" "completions|{\"prompt\":\"hi\",\"max_tokens\":\"x\"}" \
        "completions|{\"prompt\":\"hi\",\"prompt\":\"ho\"}" "chat/completions|{\"messages\":[]}"; do
        ep=${req%%|*}
        code=$(curl -s -o "$TMP/lg.body" -w '%{http_code}' "${H[@]}" -d "${req#*|}" "$B/v1/$ep")
        msg=$(json "$TMP/lg.body" j.error.message)
        [ "$ep" = chat/completions ] && kind=chat || kind=completion
        n400=$((n400 + 1))
        for _ in $(seq 1 50); do [ "$(grep -c 'status 400' "$TMP/lg.log")" -ge $n400 ] && break; sleep 0.05; done
        line=$(grep 'status 400' "$TMP/lg.log" | tail -1)
        if [ "$code" = 400 ] && [ "$line" = "serve: $kind status 400: $msg" ]; then ok "400 logged with its reason: $line"
        else bad "400 for ${req:0:60}: code $code, log line '$line', message '$msg'"; fi
    done
    # a model this server does not serve: 404 model_not_found (as the OpenAI API), logged with its message
    code=$(curl -s -o "$TMP/lg.body" -w '%{http_code}' "${H[@]}" -d '{"prompt":"hi","model":"nope"}' "$B/v1/completions")
    msg=$(json "$TMP/lg.body" j.error.message)
    for _ in $(seq 1 50); do grep -q 'status 404' "$TMP/lg.log" && break; sleep 0.05; done
    line=$(grep 'status 404' "$TMP/lg.log" | tail -1)
    if [ "$code" = 404 ] && [ "$(json "$TMP/lg.body" j.error.code)" = model_not_found ] && [ "$line" = "serve: completion status 404: $msg" ]; then
        ok "unknown model: 404 model_not_found, logged: $line"
    else bad "unknown model: code $code, body $(head -c 300 "$TMP/lg.body"), log line '$line'"; fi
    curl -s "$B/metrics" >"$TMP/lg.metrics"
    if ! grep -q 'status 400: prompt' "$TMP/lg.log" && ! grep -q 'status="400"' "$TMP/lg.metrics"; then
        ok "no 400 logged with generation figures nor counted in deltafin_requests_total"
    else bad "400s: $(grep 'status 400' "$TMP/lg.log" | head -2) / $(grep 'status="400"' "$TMP/lg.metrics")"; fi
    # a stream ended normally: one line, no marker
    curl -sN -o /dev/null "${H[@]}" -d '{"prompt":"abc","max_tokens":3,"temperature":0,"stream":true}' "$B/v1/completions"
    for _ in $(seq 1 50); do grep -q 'completion stream status 200' "$TMP/lg.log" && break; sleep 0.05; done
    line=$(grep 'completion stream status 200' "$TMP/lg.log" | tail -1)
    case $line in *" 3 generated, "*" s") ok "a stream read to its end: logged without a marker" ;; *) bad "stream line: '$line'" ;; esac
    stop_server lg
else bad "serve --mock (log) did not start: $(tail -2 "$TMP/lg.log")"; fi
# a client that reads the first bytes and stops (then leaves): 60000 tokens with 20 logprobs each, ~50 MB, more than
# the socket buffers of both ends hold (loopback autotuning grows them to megabytes), so the generation ends while
# most of the stream is still to be sent
if start_server us --mock --ctx 65536; then
    node -e '
const port = +process.argv[1], body = process.argv[2];
const s = require("net").connect(port, "127.0.0.1");
s.on("connect", () => s.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
    "Content-Length: " + Buffer.byteLength(body) + "\r\n\r\n" + body));
s.on("data", () => s.pause());
s.on("error", () => {});
process.on("SIGTERM", () => { s.destroy(); process.exit(0); });
setTimeout(() => process.exit(1), 180000);' "$PORT" \
        "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":60000,\"logprobs\":20,\"stream\":true}" &
    NPID=$!
    PIDS+=("$NPID")
    ok200() { curl -s "$B/metrics" | sed -n 's/^deltafin_requests_total{endpoint="completions",status="200"} //p'; }
    for _ in $(seq 1 1800); do [ "$(ok200)" = 1 ] && break; sleep 0.1; done # the worker has finished it
    expect "the unread stream's generation finished, counted with status 200" "$(ok200)" 1
    kill -TERM "$NPID" 2>/dev/null; wait "$NPID" 2>/dev/null
    for _ in $(seq 1 100); do grep -q '60000 generated.*(client gone)$' "$TMP/us.log" && break; sleep 0.05; done
    line=$(grep '60000 generated' "$TMP/us.log")
    case $line in "serve: completion stream status 200: "*"(client gone)") ok "a stream whose client left before its end was sent: (client gone)" ;;
        *) bad "unread stream's log line: '$line'" ;; esac
    expect "still counted once, with the 200 it was sent" "$(ok200)" 1
    stop_server us
else bad "serve --mock --ctx 65536 did not start: $(tail -2 "$TMP/us.log")"; fi

# ---- 15. a token-id prompt with an element that is no token id: the 400 names the element and what it is; --host
# reachable from other machines without --api-key: a one-line warning (none on loopback, none with a key)
WARN="deltafin serve: warning: --host 0.0.0.0 accepts connections from other machines and there is no --api-key: anyone who can reach the port can use this server (add --api-key KEY, or --host 127.0.0.1 for this machine only)"
if start_server pub --mock --host 0.0.0.0; then
    for req in '[1,"a"]|prompt[1]|a string' '[1,2.5]|prompt[1]|2.5' '[null]|prompt[0]|null' '[3,[4]]|prompt[1]|an array'; do
        IFS='|' read -r p el what <<<"$req"
        code=$(curl -s -o "$TMP/pub.body" -w '%{http_code}' "${H[@]}" -d "{\"prompt\":$p}" "$B/v1/completions")
        expect "prompt $p: 400 naming $el" "$code $(json "$TMP/pub.body" j.error.message)" \
            "400 Invalid '$el': expected a token id (a non-negative integer), got $what."
    done
    code=$(curl -s -o "$TMP/pub.body" -w '%{http_code}' "${H[@]}" -d '{"prompt":["a","b"]}' "$B/v1/completions")
    expect "two prompts: only one per request" "$code $(json "$TMP/pub.body" j.error.message)" \
        "400 Invalid 'prompt': only one prompt per request is supported (n = 1)."
    expect "--host 0.0.0.0 without --api-key: the warning, once" "$(grep -cxF "$WARN" "$TMP/pub.log")" 1
    stop_server pub
else bad "serve --mock --host 0.0.0.0 did not start: $(tail -2 "$TMP/pub.log")"; fi
if start_server pubk --mock --host 0.0.0.0 --api-key k; then
    expect "--host 0.0.0.0 with --api-key: no warning" "$(grep -c 'warning' "$TMP/pubk.log")" 0
    stop_server pubk
else bad "serve --mock --host 0.0.0.0 --api-key did not start: $(tail -2 "$TMP/pubk.log")"; fi
expect "loopback (the default host): no warning" "$(grep -c 'warning' "$TMP/q.log")" 0

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
