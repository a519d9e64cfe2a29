#!/usr/bin/env bash
# e2e_server.sh — end-to-end tests of `deltafin serve` on loopback.
#  1. The built-in mock model (--mock): the official openai npm client (pinned in
#     tests/server/package.json) for chat + completions, streamed and not, stop,
#     logprobs, seed, KV reuse; curl for raw SSE framing, keep-alives, auth,
#     bad input (malformed / truncated JSON, wrong types, invalid UTF-8, huge
#     bodies, slow clients), 429 + Retry-After, client disconnects, SIGTERM.
#  2. A real model when one is present (models/* with a tokenizer, else a golden
#     checkpoint in tests/golden/* through token-id prompts): the same client
#     checks, greedy ids equal to `deltafin run`, the TTFT drop from KV reuse. If
#     the engine cannot open it yet, that is reported and the model part skipped.
# Env: DF_BIN (deltafin binary), DF_SRC (repo root), DF_E2E_MODEL (force a model dir).
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${DF_BIN:-$SRC/build/deltafin}
TMP=$(mktemp -d /tmp/df-e2e-server.XXXXXX)
# the real model's first-use conversion goes to a cache in $TMP (removed at exit), never into ~/.cache/deltafin
export XDG_CACHE_HOME="$TMP/xdg-cache"
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
expect() { # expect WHAT GOT WANT
    if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi
}

# start_server NAME ARGS... : sets PORT and SPID; returns 1 if it exited instead
start_server() {
    local name=$1; shift
    rm -f "$TMP/$name.port"
    "$BIN" serve --port 0 --port-file "$TMP/$name.port" "$@" 2>"$TMP/$name.log" &
    SPID=$!
    PIDS+=("$SPID")
    for _ in $(seq 1 600); do
        [ -s "$TMP/$name.port" ] && { PORT=$(cat "$TMP/$name.port"); return 0; }
        kill -0 "$SPID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
stop_server() { # stop_server NAME: SIGTERM, must exit 0 within 10 s
    local name=$1 rc
    kill -TERM "$SPID"
    for _ in $(seq 1 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SPID" 2>/dev/null; then bad "$name: still running 10 s after SIGTERM"; kill -9 "$SPID"; fi
    wait "$SPID"; rc=$?
    expect "$name: clean exit on SIGTERM" "$rc" 0
}

[ -x "$BIN" ] || { echo "e2e_server: no deltafin binary at $BIN (set DF_BIN)"; exit 1; }
command -v curl >/dev/null || { echo "e2e_server: curl is required"; exit 1; }
command -v node >/dev/null || { echo "e2e_server: node is required (Debian: apt-get install nodejs npm)"; exit 1; }
if [ ! -f "$SRC/tests/server/node_modules/openai/package.json" ]; then
    echo "e2e_server: installing the pinned openai client (npm ci in tests/server)"
    (cd "$SRC/tests/server" && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) ||
        { cat "$TMP/npm.log"; echo "e2e_server: npm ci failed"; exit 1; }
fi

# ======================================================== 1. mock model
KEY=sk-test
start_server mock --mock --mock-delay-ms 5 --parallel 1 --queue 2 --timeout 3 --max-request-bytes 1M --api-key $KEY --keepalive 0.1 ||
    { cat "$TMP/mock.log"; echo "e2e_server: the mock server did not start"; exit 1; }
B="http://127.0.0.1:$PORT"
AUTH="Authorization: Bearer $KEY"
echo "--- mock server on port $PORT"

if node "$SRC/tests/server/client.mjs" "$B/v1" mock mock $KEY >"$TMP/client.out" 2>&1; then
    ok "openai client against the mock model ($(tail -1 "$TMP/client.out"))"
else cat "$TMP/client.out"; bad "openai client against the mock model"; fi

code() { curl -s -o "$TMP/body" -w '%{http_code}' "$@"; }
etype() { node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
  if(!j.error||typeof j.error.message!=="string"||!("param" in j.error)||!("code" in j.error))process.exit(1);
  console.log(j.error.type)' "$TMP/body" 2>/dev/null || echo "not-an-openai-error"; }

expect "GET /health without key" "$(code "$B/health")" 200
expect "GET /metrics without key (Prometheus text)" "$(code "$B/metrics")" 200
grep -q "^deltafin_requests_rejected_total 0$" "$TMP/body" && ok "/metrics: the exposition names its counters" || bad "/metrics body: $(head -c 200 "$TMP/body")"
expect "GET /v1/metrics" "$(code "$B/v1/metrics")" 200
curl -s -o /dev/null -D - -X POST "$B/metrics" | tr -d '\r' | grep -qi '^Allow: GET, HEAD, OPTIONS$' \
    && ok "405 on POST /metrics names the allowed methods (Allow)" || bad "405 on POST /metrics without Allow"
# CORS (default --cors *): the preflight answered without the key, the origin header on every response
hdr() { curl -s -o /dev/null -D - "$@" | tr -d '\r'; }
PF=$(hdr -X OPTIONS -H "Origin: https://app.example" -H "Access-Control-Request-Method: POST" "$B/v1/chat/completions")
echo "$PF" | grep -q '^HTTP/1.1 204' && echo "$PF" | grep -qi '^Access-Control-Allow-Origin: \*$' &&
    echo "$PF" | grep -qi '^Access-Control-Allow-Methods: POST, OPTIONS$' && echo "$PF" | grep -qi '^Access-Control-Allow-Headers: .*Authorization' &&
    ok "CORS preflight OPTIONS /v1/chat/completions -> 204 with the allow headers" || bad "CORS preflight: $PF"
PF=$(hdr -X OPTIONS -H "Origin: https://app.example" -H "Access-Control-Request-Method: POST" \
    -H "Access-Control-Request-Headers: content-type,authorization,x-stainless-os" "$B/v1/chat/completions")
echo "$PF" | grep -qi '^Access-Control-Allow-Headers: content-type,authorization,x-stainless-os$' \
    && ok "CORS preflight: the headers asked for are allowed (the OpenAI SDKs' X-Stainless-*)" || bad "CORS preflight with request headers: $PF"
PF=$(hdr -X OPTIONS -H "Origin: https://app.example" -H "Access-Control-Request-Method: POST" \
    -H "Access-Control-Request-Headers: a(b)" "$B/v1/chat/completions")
echo "$PF" | grep -qi '^Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key$' \
    && ok "CORS preflight: a request-headers value that is not header names gets the fixed list" || bad "CORS preflight, odd request headers: $PF"
hdr -H "$AUTH" "$B/v1/models" | grep -qi '^Access-Control-Allow-Origin: \*$' && ok "CORS: GET /v1/models carries Access-Control-Allow-Origin" ||
    bad "CORS: no Access-Control-Allow-Origin on GET /v1/models"
hdr "$B/v1/models" | grep -qi '^Access-Control-Allow-Origin: \*$' && ok "CORS: a 401 carries Access-Control-Allow-Origin too" ||
    bad "CORS: no Access-Control-Allow-Origin on the 401"
expect "GET /v1/models without key -> 401" "$(code "$B/v1/models")" 401
expect "401 error shape" "$(etype)" authentication_error
expect "wrong key -> 401" "$(code -H "Authorization: Bearer nope" "$B/v1/models")" 401
expect "key with a trailing space -> 200" "$(code -H "Authorization: Bearer $KEY " "$B/v1/models")" 200
expect "key with a character more -> 401" "$(code -H "Authorization: Bearer ${KEY}x" "$B/v1/models")" 401
expect "key's prefix -> 401" "$(code -H "Authorization: Bearer ${KEY%?}" "$B/v1/models")" 401
expect "GET /models (no /v1)" "$(code -H "$AUTH" "$B/models")" 200
expect "unknown URL -> 404" "$(code -H "$AUTH" "$B/v1/nothing")" 404
expect "Content-Encoding: gzip -> 415" "$(echo '{"prompt":"hi"}' | gzip | code -H "$AUTH" -H "Content-Type: application/json" -H "Content-Encoding: gzip" --data-binary @- "$B/v1/completions")" 415
expect "415 names Content-Encoding" "$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).error.code)' "$TMP/body")" unsupported_content_encoding
expect "GET /v1/models/ (a trailing slash) -> 200" "$(code -H "$AUTH" "$B/v1/models/")" 200
expect "GET /v1/models/ is the list" "$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).object)' "$TMP/body")" list
expect "POST /v1/completions/ (a trailing slash) -> 200" "$(code -H "$AUTH" -H "Content-Type: application/json" -d '{"prompt":"a","max_tokens":1}' "$B/v1/completions/")" 200
expect "two trailing slashes -> 404" "$(code -H "$AUTH" "$B/v1/models//")" 404
expect "GET on a POST endpoint -> 405" "$(code -H "$AUTH" "$B/v1/chat/completions")" 405
P=(-H "$AUTH" -H "Content-Type: application/json")
# HTTP/1.1 keep-alive: GET, POST and GET again on one connection (curl's num_connects: 1, then 0 for each request that
# reuses it); a response queued before its request is read whole would close the connection (Connection: close)
W=(-s -o /dev/null -w '%{http_code}:%{num_connects} ')
expect "keep-alive: GET /health, POST /v1/completions, GET /v1/models on one connection" \
    "$(curl "${W[@]}" "$B/health" --next "${W[@]}" "${P[@]}" -d '{"prompt":"abc","max_tokens":2}' "$B/v1/completions" \
        --next "${W[@]}" -H "$AUTH" "$B/v1/models")" "200:1 200:0 200:0 "
expect "malformed JSON -> 400" "$(code "${P[@]}" -d '{"messages": [nope]}' "$B/v1/chat/completions")" 400
expect "400 error shape" "$(etype)" invalid_request_error
expect "truncated JSON -> 400" "$(code "${P[@]}" -d '{"messages":[{"role":"user","content":"hi"}' "$B/v1/chat/completions")" 400
expect "empty body -> 400" "$(code "${P[@]}" -X POST "$B/v1/completions")" 400
expect "wrong type (max_tokens string) -> 400" "$(code "${P[@]}" -d '{"prompt":"a","max_tokens":"5"}' "$B/v1/completions")" 400
expect "wrong type (messages object) -> 400" "$(code "${P[@]}" -d '{"messages":{"role":"user"}}' "$B/chat/completions")" 400
printf '{"prompt":"\xff\xfe"}' >"$TMP/badutf8.json"
expect "invalid UTF-8 -> 400" "$(code "${P[@]}" --data-binary @"$TMP/badutf8.json" "$B/v1/completions")" 400
head -c 2000000 /dev/zero | tr '\0' 'a' | sed 's/^/{"prompt":"/; s/$/"}/' >"$TMP/big.json"
expect "2 MB body over --max-request-bytes 1M -> 413" "$(code "${P[@]}" --data-binary @"$TMP/big.json" "$B/v1/completions")" 413
expect "chunked 2 MB body -> 413" "$(code "${P[@]}" -H "Transfer-Encoding: chunked" --data-binary @"$TMP/big.json" "$B/v1/completions")" 413
expect "unknown model -> 404" "$(code "${P[@]}" -d '{"model":"gpt-9","prompt":"a"}' "$B/v1/completions")" 404
expect "unknown model: invalid_request_error / model_not_found" "$(node -e 'const e=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).error; console.log(e.type+"/"+e.code)' "$TMP/body")" "invalid_request_error/model_not_found"
expect "GET /v1/models/gpt-9 -> 404" "$(code -H "$AUTH" "$B/v1/models/gpt-9")" 404
expect "GET /v1/models/gpt-9: invalid_request_error / model_not_found" "$(node -e 'const e=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).error; console.log(e.type+"/"+e.code)' "$TMP/body")" "invalid_request_error/model_not_found"
eparam() { node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
  console.log(j.error.param + " | " + j.error.message)' "$TMP/body" 2>/dev/null || echo "not-an-openai-error"; }
# a NUL character (\u0000) would cut the string short (cJSON): 400 naming the field, never a truncated prompt
expect "NUL in prompt -> 400" "$(code "${P[@]}" -d '{"prompt":"a\u0000bcdefgh long text after nul","max_tokens":2,"temperature":0,"echo":true}' "$B/v1/completions")" 400
expect "NUL in prompt: param" "$(eparam | cut -d' ' -f1)" prompt
expect "NUL in chat content -> 400" "$(code "${P[@]}" -d '{"messages":[{"role":"user","content":"hi\u0000 there"}]}' "$B/v1/chat/completions")" 400
expect "NUL in chat content: param" "$(eparam | cut -d' ' -f1)" "messages[0].content"
expect "NUL in stop -> 400" "$(code "${P[@]}" -d '{"prompt":"abc","stop":["x","\u0000"]}' "$B/v1/completions")" 400
expect "NUL in stop: param" "$(eparam | cut -d' ' -f1)" "stop[1]"
expect "escaped backslash + u0000 is text -> 200" "$(code "${P[@]}" -d '{"prompt":"a\\u0000b","max_tokens":1,"temperature":0,"echo":true}' "$B/v1/completions")" 200
expect "escaped backslash + u0000: whole prompt (8 tokens)" "$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).usage.prompt_tokens)' "$TMP/body")" 8
# empty stop strings are ignored in both forms; max_tokens out of range says so
expect "stop \"\" -> 200" "$(code "${P[@]}" -d '{"prompt":"abc","max_tokens":3,"temperature":0,"stop":""}' "$B/v1/completions")" 200
expect "stop [\"\"] -> 200" "$(code "${P[@]}" -d '{"prompt":"abc","max_tokens":3,"temperature":0,"stop":[""]}' "$B/v1/completions")" 200
expect "stop [\"\"]: text not cut" "$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0].text)' "$TMP/body")" "lo,"
expect "max_tokens 1e11 -> 400" "$(code "${P[@]}" -d '{"prompt":"abc","max_tokens":100000000000}' "$B/v1/completions")" 400
# /metrics counts a generation's tokens while it runs (the mock: 5 ms a token), and all of them once it is done
gen_total() { curl -s "$B/metrics" | sed -n 's/^deltafin_generation_tokens_total //p'; }
g0=$(gen_total)
curl -s -o "$TMP/live.json" "${P[@]}" -d '{"prompt":"abc","max_tokens":150,"temperature":0,"ignore_eos":true}' "$B/v1/completions" &
gp=$!
sleep 0.15
g1=$(gen_total)
wait $gp
g2=$(gen_total)
n=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).usage.completion_tokens)' "$TMP/live.json" 2>/dev/null)
[ "${n:-0}" -gt 20 ] && [ "$g1" -gt "$g0" ] 2>/dev/null && [ "$g1" -lt $((g0 + n)) ] && [ "$g2" = $((g0 + n)) ] \
    && ok "/metrics: generated tokens counted while the generation runs ($g0 -> $g1 -> $g2, $n generated)" \
    || bad "/metrics live tokens: $g0 -> $g1 -> $g2 ($n generated: want between, then +$n)"
case "$(eparam)" in "max_tokens | "*"too large"*"between 1 and 1000000000"*) ok "max_tokens 1e11: message";;
    *) bad "max_tokens 1e11: message: $(eparam)";; esac
# a number in a message is the text sent (a double would print 9007199254740993 as 9.00719925474099e+15)
expect "seed 2^53 + 1 -> 400" "$(code "${P[@]}" -d '{"prompt":"abc","seed":9007199254740993}' "$B/v1/completions")" 400
expect "seed 2^53 + 1: the value sent in the message" "$(eparam)" \
    "seed | Invalid 'seed': 9007199254740993. Expected an integer of magnitude below 2^53."
# a prompt that fills the context: the message names the server's --ctx (default 4096 here), not the model's limit
IDS4096=$(seq 1 4096 | awk '{print $1 % 200 + 1}' | paste -sd, -)
expect "4096-token prompt -> 400" "$(code "${P[@]}" -d "{\"prompt\":[$IDS4096],\"max_tokens\":1}" "$B/v1/completions")" 400
expect "its message names --ctx" "$(eparam)" "prompt | This server's context is 4096 tokens (deltafin serve --ctx 4096); the prompt has \
4096 tokens, which leaves no room for a completion: shorten the prompt, or restart the server with a larger --ctx (up to the model's \
maximum context)."
# completions top_logprobs hold the sampled (or echoed prompt) token too: up to logprobs + 1 keys, the top first; with
# logprobs 0 the token alone; its value is its token_logprobs value. The mock after "a" predicts "e", after "ab" "l".
lp_keys() { node -e 'const l=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).choices[0].logprobs;
  console.log(l.top_logprobs.map((t,i)=>t===null?"null":Object.keys(t).join(",")+(t[l.tokens[i]]===l.token_logprobs[i]?"":"!")).join("|"))' "$TMP/body" 2>/dev/null; }
expect "logprobs 1 + echo -> 200" "$(code "${P[@]}" -d '{"prompt":"abc","echo":true,"max_tokens":2,"temperature":0,"logprobs":1}' "$B/v1/completions")" 200
expect "logprobs 1: top token, then the token itself when not the top" "$(lp_keys)" "null|e,b|l,c|l|o"
expect "logprobs 0 + echo -> 200" "$(code "${P[@]}" -d '{"prompt":"abc","echo":true,"max_tokens":2,"temperature":0,"logprobs":0}' "$B/v1/completions")" 200
expect "logprobs 0: the token alone" "$(lp_keys)" "null|b|c|l|o"
expect "still serving after bad input" "$(code "${P[@]}" -d '{"prompt":"abc","max_tokens":3,"temperature":0}' "$B/v1/completions")" 200
expect "greedy completion text" "$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0].text)' "$TMP/body")" "lo,"
# without max_tokens /v1/completions generates 16 tokens (OpenAI's default; finish_reason "length"); chat keeps its default
# (what fits in the context: the mock's text to its end)
summary() { node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));
  console.log(j.usage.completion_tokens, j.choices[0].finish_reason, j.choices[0].text ?? "")' "$TMP/body"; }
expect "completions without max_tokens -> 200" "$(code "${P[@]}" -d '{"prompt":"abc","temperature":0}' "$B/v1/completions")" 200
expect "completions without max_tokens: 16 tokens (OpenAI's default)" "$(summary)" "16 length lo, world! The q"
expect "chat without max_tokens -> 200" "$(code "${P[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"temperature":0}' "$B/v1/chat/completions")" 200
case "$(summary)" in "16 "*|[0-9]" "*|1[0-5]" "*) bad "chat without max_tokens: capped at 16 or fewer: $(summary)";; *" stop "*) ok "chat without max_tokens: generates to the end ($(summary | cut -d' ' -f1) tokens)";;
    *) bad "chat without max_tokens: $(summary)";; esac

# raw SSE framing (curl): headers, events, usage chunk, [DONE]
curl -sN -D "$TMP/h" "${P[@]}" -d '{"prompt":"abc","max_tokens":30,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"stop":"quick"}' \
    "$B/v1/completions" >"$TMP/sse"
expect "SSE content type" "$(grep -i '^content-type:' "$TMP/h" | tr -d '\r' | cut -d' ' -f2)" text/event-stream
if node -e '
const t = require("fs").readFileSync(process.argv[1], "utf8");
if (!t.endsWith("data: [DONE]\n\n")) throw "no [DONE] at the end";
const ev = t.split("\n\n").slice(0, -1); let text = "", usage = 0, fin = null;
for (const e of ev) {
  if (e.startsWith(":")) continue;
  if (!e.startsWith("data: ") || e.includes("\n")) throw "bad event: " + e;
  if (e === "data: [DONE]") continue;
  const j = JSON.parse(e.slice(6));
  if (j.object !== "text_completion") throw "object";
  if (j.choices.length === 0) { usage++; if (!j.usage || j.usage.completion_tokens < 1) throw "usage"; continue; }
  if (!("usage" in j) || j.usage !== null) throw "usage:null on content chunks";
  text += j.choices[0].text; if (j.choices[0].finish_reason) fin = j.choices[0].finish_reason;
}
if (text !== "lo, world! The " || fin !== "stop" || usage !== 1) throw new Error(JSON.stringify({text, fin, usage}));
' "$TMP/sse" 2>"$TMP/err"; then ok "raw SSE framing, stop across tokens, usage chunk"; else bad "raw SSE: $(grep -m1 Error "$TMP/err")"; fi

# keep-alive comments during a long prefill (400 tokens x 5 ms, keepalive 0.1 s)
IDS=$(seq 1 400 | awk '{print $1 % 200}' | paste -sd, -)
curl -sN "${P[@]}" -d "{\"prompt\":[$IDS],\"max_tokens\":2,\"stream\":true}" "$B/v1/completions" >"$TMP/ka"
n_ka=$(grep -c '^: keep-alive$' "$TMP/ka")
if [ "$n_ka" -ge 3 ] && tail -c 14 "$TMP/ka" | grep -q 'data: \[DONE\]'; then ok "keep-alives during prefill ($n_ka)"; else bad "keep-alives: $n_ka: $(head -c 300 "$TMP/ka")"; fi

# UTF-8: byte tokens split characters; every streamed delta must be whole characters
X=$(printf 'x%.0s' $(seq 1 59))
curl -sN "${P[@]}" -d "{\"prompt\":\"$X\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}" "$B/v1/completions" >"$TMP/u8"
if node -e '
const t = require("fs").readFileSync(process.argv[1]);
const s = t.toString("utf8"); if (s.includes("\ufffd")) throw "U+FFFD in stream";
let text = "";
for (const e of s.split("\n\n")) if (e.startsWith("data: {")) text += JSON.parse(e.slice(6)).choices[0].text;
if (text !== "Café naïve 日本語 🙂 done.") throw text;' "$TMP/u8" 2>"$TMP/err"; then ok "UTF-8 never split across chunks"
else bad "UTF-8 chunks: $(tail -1 "$TMP/err")"; fi

# one running + --queue 2 waiting; the 4th concurrent request gets 429 + Retry-After
LONGP=$(printf 'y%.0s' $(seq 1 100)) # a prompt longer than the mock's text: endless greedy output (requests use temperature 0: sampling can end early)
inflight() { curl -s "$B/health" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).in_flight))'; }
QP=()
for i in 1 2 3; do
    curl -s -o "$TMP/q$i" -w '%{http_code}' "${P[@]}" -d "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":200}" "$B/v1/completions" >"$TMP/q$i.code" &
    QP+=($!)
done
for _ in $(seq 1 100); do [ "$(inflight)" = 3 ] && break; sleep 0.02; done
expect "4th concurrent request -> 429" "$(curl -s -D "$TMP/h429" -o "$TMP/body" -w '%{http_code}' "${P[@]}" -d '{"prompt":"abc"}' "$B/v1/completions")" 429
expect "429 Retry-After" "$(grep -i '^retry-after:' "$TMP/h429" | tr -d '\r' | cut -d' ' -f2)" 1
expect "429 error shape" "$(etype)" rate_limit_error
wait "${QP[@]}"
expect "queued requests complete" "$(cat "$TMP/q1.code" "$TMP/q2.code" "$TMP/q3.code" | tr -d '\n')" 200200200
# a queued request whose client leaves counts neither in in_flight nor in waiting (in_flight - waiting = running)
curl -s -o /dev/null "${P[@]}" -d "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":200}" "$B/v1/completions" &
QA=$!
for _ in $(seq 1 100); do [ "$(inflight)" = 1 ] && break; sleep 0.02; done
curl -s -o /dev/null --max-time 0.3 "${P[@]}" -d '{"prompt":"abc","max_tokens":5}' "$B/v1/completions"
expect "a gone queued client: /health in_flight 1, waiting 0" "$(curl -s "$B/health" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);console.log(j.in_flight+" "+j.waiting)})')" "1 0"
wait $QA

# a client that disconnects stops its generation: during decode (5 ms per token:
# ~50 tokens in 0.25 s, of 1000 asked) and during a long prefill (2000 tokens)
disconnect_check() { # WHAT MAX_TIME BODY PATTERN
    curl -sN --max-time "$2" "${P[@]}" -d "$3" "$B/v1/completions" >/dev/null
    local t0 busy=1 ms line
    t0=$(date +%s%N)
    # idle (in_flight 0 counts a gone client at once) and the generation's "client gone" line logged once it stopped
    for _ in $(seq 1 100); do
        busy=$(inflight)
        line=$(tail -n +$((LOGSEEN + 1)) "$TMP/mock.log" | grep 'client gone' | tail -1)
        [ "$busy" = 0 ] && [ -n "$line" ] && break
        sleep 0.02
    done
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [ "$busy" = 0 ] && [ -n "$line" ] && echo "$line" | grep -q "$4"; then ok "$1 (idle ${ms} ms after the disconnect): ${line#serve: }"
    else bad "$1: in_flight $busy after ${ms} ms; log: $(tail -2 "$TMP/mock.log")"; fi
    LOGSEEN=$(wc -l <"$TMP/mock.log")
}
LOGSEEN=0
disconnect_check "disconnect during decode stops generation" 0.25 "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":1000,\"stream\":true}" \
    ', [1-9]\?[0-9] generated'
IDS=$(seq 1 2000 | awk '{print $1 % 250}' | paste -sd, -)
disconnect_check "disconnect during prefill cancels df_eval" 0.5 "{\"prompt\":[$IDS],\"max_tokens\":5,\"stream\":true}" \
    ' 0 generated'

# slow clients: headers dribbled / body never finished; others are served meanwhile, the slow ones time out
exec 7<>/dev/tcp/127.0.0.1/"$PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{"prompt":' $KEY >&7
exec 8<>/dev/tcp/127.0.0.1/"$PORT"
printf 'GET /health HTTP/1.1\r\nHo' >&8
expect "served while slow clients hang" "$(code "${P[@]}" -d '{"prompt":"abc","max_tokens":2}' "$B/v1/completions")" 200
if timeout 10 cat <&7 >"$TMP/slow7" && timeout 10 cat <&8 >/dev/null; then ok "slow clients closed by --timeout"; else bad "slow clients not closed"; fi
exec 7>&- 8>&-
expect "still serving after slow clients" "$(code "$B/health")" 200

# SIGTERM during a stream: the stream ends cleanly, the server exits 0
curl -sN "${P[@]}" -d "{\"prompt\":\"$LONGP\",\"temperature\":0,\"max_tokens\":3000,\"stream\":true}" "$B/v1/completions" >"$TMP/term" &
CPID=$!
sleep 0.4
stop_server mock
wait $CPID
if tail -c 14 "$TMP/term" | grep -q 'data: \[DONE\]' && grep -q 'shutting down' "$TMP/term"; then ok "SIGTERM: stream ended with an error event and [DONE]"
else bad "SIGTERM stream end: $(tail -c 200 "$TMP/term")"; fi

# --cors off: no CORS headers, and OPTIONS is not an allowed method; a bad origin is refused
if start_server nocors --mock --cors off; then
    B2="http://127.0.0.1:$PORT"
    hdr "$B2/v1/models" | grep -qi '^Access-Control-Allow-Origin' && bad "--cors off: Access-Control-Allow-Origin sent" ||
        ok "--cors off: no Access-Control-Allow-Origin"
    expect "--cors off: OPTIONS /v1/models" "$(code -X OPTIONS "$B2/v1/models")" 405
    stop_server nocors
else bad "the --cors off server did not start"; fi
out=$("$BIN" serve --mock --cors "$(printf 'a\nb')" 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q 'expected an origin' && ok "--cors with a newline -> rc 2" || bad "--cors with a newline: rc $rc: $out"

# Kimi reasoning_content + tool_calls through the openai client (mock speaking Kimi)
if start_server kimi --mock-kimi; then
    if node "$SRC/tests/server/tools.mjs" "http://127.0.0.1:$PORT/v1" mock-kimi >"$TMP/tools.out" 2>&1; then
        ok "Kimi reasoning + tool calls via the openai client ($(tail -1 "$TMP/tools.out"))"
    else cat "$TMP/tools.out"; bad "Kimi reasoning + tool calls"; fi
    # sampled byte tokens (temperature 1) need not continue a character: the JSON stays valid UTF-8 (U+FFFD for
    # ill-formed bytes), whole and streamed
    for st in false true; do
        curl -s -o "$TMP/k1.body" "http://127.0.0.1:$PORT/v1/chat/completions" -H "Content-Type: application/json" \
            -d "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":300,\"seed\":1,\"stream\":$st}"
        if python3 -c 'import sys; sys.stdin.buffer.read().decode("utf-8", "strict")' <"$TMP/k1.body"; then
            ok "--mock-kimi at temperature 1 (stream $st): valid UTF-8"
        else bad "--mock-kimi at temperature 1 (stream $st): the body is not valid UTF-8"; fi
    done
    stop_server kimi
else bad "the --mock-kimi server did not start"; fi

# ========================================================= 2. real model
MODEL=${DF_E2E_MODEL:-}
if [ -z "$MODEL" ]; then
    for d in $(ls -d "$SRC"/models/*/ 2>/dev/null | grep -v draft) "$SRC"/models/*/ "$SRC"/tests/golden/*/; do
        [ -f "$d/manifest.json" ] || [ -f "$d/config.json" ] || continue
        MODEL=${d%/}
        break
    done
fi
if [ -z "$MODEL" ]; then
    echo "--- no model in models/ or tests/golden/: model checks skipped"
elif ! start_server model --model "$MODEL" --ctx 1024; then
    echo "--- the engine could not open $MODEL: model checks skipped. Server said:"
    tail -3 "$TMP/model.log"
else
    B="http://127.0.0.1:$PORT"
    NAME=$(curl -s "$B/v1/models" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).data[0].id))')
    echo "--- model $MODEL ($NAME) on port $PORT"
    st=$(curl -s -o "$TMP/body" -w '%{http_code}' -d '{"prompt":"Hello","max_tokens":1}' "$B/v1/completions")
    MODE=model
    if [ "$st" = 400 ] && grep -q 'no tokenizer' "$TMP/body"; then MODE=ids; fi
    export DF_PROMPT_IDS=${DF_PROMPT_IDS:-1,2,3,4}
    if [ $MODE = ids ] && [ -f "$MODEL/golden.json" ]; then
        # the transformers reference's prompt and greedy continuation (first 8 tokens)
        DF_PROMPT_IDS=$(node -e 'console.log(require(process.argv[1]).prompt_ids.join(","))' "$MODEL/golden.json")
        DF_GREEDY_IDS=$(node -e 'console.log(require(process.argv[1]).greedy_ids.join(","))' "$MODEL/golden.json")
        export DF_GREEDY_IDS
        echo "--- expecting the transformers greedy ids $DF_GREEDY_IDS"
    elif [ $MODE = model ]; then
        # greedy ids of the CLI for the client's completion prompt (10 tokens)
        G=$("$BIN" run --model "$MODEL" --prompt "The capital of France is" --max-new 10 --print-ids 2>/dev/null | tail -1 | tr -d ' ')
        case "$G" in *[0-9]*) export DF_RUN_IDS=$G; echo "--- deltafin run greedy ids: $G" ;; esac
        G=$("$BIN" run --model "$MODEL" --chat --prompt "Say hello." --max-new 10 --print-ids 2>/dev/null | tail -1 | tr -d ' ')
        case "$G" in *[0-9]*) export DF_RUN_CHAT_IDS=$G; echo "--- deltafin run --chat greedy ids: $G" ;; esac
    elif [ $MODE = ids ]; then
        G=$("$BIN" run --model "$MODEL" --prompt-ids "$DF_PROMPT_IDS" --max-new 8 --print-ids 2>/dev/null | tail -1 | tr -d ' ')
        case "$G" in *[0-9]*) export DF_GREEDY_IDS=$G ;; esac
    fi
    if timeout 180 node "$SRC/tests/server/client.mjs" "$B/v1" "$NAME" $MODE >"$TMP/client2.out" 2>&1; then
        ok "openai client against $NAME ($MODE mode: $(tail -1 "$TMP/client2.out"))"
    else cat "$TMP/client2.out"; bad "openai client against $NAME ($MODE mode)"; fi
    # TTFT with and without KV reuse (server log: "prompt N tokens (K reused) ... ttft T s")
    if [ $MODE = model ]; then
        LONG=$(printf 'The history of the city is long and varied. %.0s' $(seq 1 12))
        curl -s -o /dev/null -d "{\"prompt\":\"$LONG\",\"max_tokens\":1,\"temperature\":0}" "$B/v1/completions"
        curl -s -o /dev/null -d "{\"prompt\":\"$LONG Today\",\"max_tokens\":1,\"temperature\":0}" "$B/v1/completions"
        echo "--- KV reuse (server log):"
        grep 'completion json' "$TMP/model.log" | tail -2 | sed 's/^/    /'
    fi
    # the log line's engine figures: a request alone gets its own; overlapping ones are marked as the batch's
    if [ $MODE = model ]; then
        curl -s -o /dev/null -d '{"prompt":"Alone","max_tokens":4,"temperature":0}' "$B/v1/completions"
        grep 'completion json' "$TMP/model.log" | tail -1 | grep -q 'experts .* hits' \
            && ! grep 'completion json' "$TMP/model.log" | tail -1 | grep -q 'shared with overlapping' \
            && ok "a request alone: its own engine figures" || bad "a request alone: $(grep 'completion json' "$TMP/model.log" | tail -1)"
        cp=()
        for i in 1 2 3; do curl -s -o /dev/null -d "{\"prompt\":\"Together $i\",\"max_tokens\":24,\"temperature\":0}" "$B/v1/completions" & cp+=($!); done
        wait "${cp[@]}"
        n=$(grep 'completion json' "$TMP/model.log" | tail -3 | grep -c 'engine (shared with overlapping requests')
        # two generations that overlap both say so (the later saw the other running, the earlier saw it start); when
        # the machine ran the three one after another, none does
        if [ "$n" -ge 2 ]; then ok "overlapping requests: $n of 3 log lines mark the engine figures as shared"
        elif [ "$n" = 0 ]; then echo "--- the 3 concurrent requests did not overlap here: the shared mark not checked"
        else bad "overlapping requests: $n of 3 lines marked: $(grep 'completion json' "$TMP/model.log" | tail -3)"; fi
    fi
    # the live view: /store.json (a digit and two hex digits per expert, one entry per MoE layer) and the page
    # itself, run against this server, counting the same tiers
    curl -s "$B/store.json" >"$TMP/store.json"
    sj=$(node -e 'const s=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
      const ok=s.object==="expert_map"&&s.layers.length===s.moe_layers&&s.layers.every(l=>l.state.length===s.experts&&
        /^[0-7]+$/.test(l.state)&&l.heat.length===2*s.experts&&/^[0-9a-f]+$/.test(l.heat));
      const n=[0,0,0,0];for(const l of s.layers)for(const c of l.state){const v=+c;v&4?n[3]++:n[v&3]++}
      console.log(ok?`${s.moe_layers} layers x ${s.experts} experts: drives only ${n[0]}, being read ${n[1]}, host cache ${n[2]}, GPU ${n[3]}`:"bad")' "$TMP/store.json")
    [ "$sj" != bad ] && [ -n "$sj" ] && ok "/store.json: $sj" || bad "/store.json: $(head -c 300 "$TMP/store.json")"
    ui=$(timeout 30 node "$SRC/tests/server/ui_check.mjs" "$B" 2>&1)
    echo "$ui" | grep -qF "\"tiers\":\"$sj\"" && echo "$ui" | grep -qF "\"model\":\"$NAME (exact)\"" \
        && ok "GET / (live view) runs and shows the store's tiers" || bad "live view: $ui (store.json: $sj)"
    stop_server model
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
