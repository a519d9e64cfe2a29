#!/usr/bin/env bash
# e2e_server_parallel.sh — `deltafin serve --parallel N`: concurrent requests decode together (one row per
# running request per forward pass) and each request's output is byte-identical to serving it alone.
# On the golden checkpoints bf16_kimi (MLA + MoE) and k3_a (KDA + MLA + latent MoE), token-id prompts:
# 8 requests of different prompt and output lengths, greedy and seeded sampling, streamed and not,
#  1. one at a time on --parallel 1 (the reference);
#  2. 4 at once on --parallel 4, while a 5th streamed request hangs up after 3 chunks;
#  3. 8 at once on --parallel 8 (and k3_a: under --ram-budget at 1/4 of the expert bytes);
# each: ids, text and finish reason equal the reference, /health shows batched decode steps, and /metrics
# (Prometheus text) counts the requests, the generated tokens and the batched rows
# (decode_batch_rows > decode_batches). Env: DF_BIN, DF_SRC.
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${DF_BIN:-$SRC/build/deltafin}
TMP=$(mktemp -d /tmp/df-e2e-par.XXXXXX)
PASS=0
FAIL=0
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
command -v curl >/dev/null || { echo "e2e_server_parallel: curl is required"; exit 1; }
command -v python3 >/dev/null || { echo "e2e_server_parallel: python3 is required"; exit 1; }

start_server() { # start_server NAME ARGS...
    local name=$1; shift
    "$BIN" serve --port 0 --port-file "$TMP/$name.port" --threads 2 "$@" 2>"$TMP/$name.log" &
    SPID=$!
    PIDS+=("$SPID")
    for _ in $(seq 1 600); do
        [ -s "$TMP/$name.port" ] && { PORT=$(cat "$TMP/$name.port"); return 0; }
        kill -0 "$SPID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
stop_server() { kill -TERM "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; }
health() { curl -s "http://127.0.0.1:$PORT/health" | python3 -c "import json,sys;h=json.load(sys.stdin);print(h.get('$1',0))"; }

# run NAME C [CANCEL] ARGS... : start a server with ARGS, send the 8 requests at most C at once, compare
run() {
    local name=$1 c=$2 cancel=$3; shift 3
    if ! start_server "$name" "$@"; then bad "$name: server did not start: $(tail -2 "$TMP/$name.log")"; return; fi
    python3 "$SRC/tests/server/parallel.py" "http://127.0.0.1:$PORT/v1" "$SPECS" "$c" $cancel >"$TMP/$name.out" 2>"$TMP/$name.err" ||
        bad "$name: client failed: $(tail -2 "$TMP/$name.err")"
    for _ in $(seq 1 100); do [ "$(health in_flight)" = 0 ] && break; sleep 0.05; done
    local steps rows
    steps=$(health decode_batches)
    rows=$(health decode_batch_rows)
    curl -s "http://127.0.0.1:$PORT/metrics" >"$TMP/$name.metrics"
    stop_server
    # /metrics: a well-formed exposition; 8 finished requests (9 with the one that hangs up); generated tokens = the
    # outputs' ids (plus, there, what the hung-up one got); the decode steps' rows as /health says; engine counters
    local mres
    mres=$(python3 - "$TMP/$name.metrics" "$TMP/$name.out" "$cancel" "$rows" <<'PY'
import json, re, sys
text, out, cancel, rows = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], int(sys.argv[4] or 0)
m, types = {}, {}
for ln in text.splitlines():
    if ln.startswith("# TYPE "):
        _, _, name, kind = ln.split(" ", 3)
        types[name] = kind
        continue
    if ln.startswith("#") or not ln:
        continue
    g = re.fullmatch(r'([a-z_]+)(\{[^}]*\})? (\S+)', ln)
    if not g:
        sys.exit(f"malformed line: {ln!r}")
    m[g.group(1) + (g.group(2) or "")] = float(g.group(3))
def total(prefix):
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))
gen = [len(json.loads(l)["ids"] or []) for l in open(out)]
want = sum(gen)
req = total("deltafin_requests_total")
got = m.get("deltafin_generation_tokens_total", -1)
bad = []
nreq = 9 if cancel == "CANCEL" else 8  # the run that hangs up a 5th, streamed request
if req != nreq: bad.append(f"requests_total {req}, want {nreq}")
if (cancel == "CANCEL" and got < want) or (cancel != "CANCEL" and got != want):
    bad.append(f"generation_tokens_total {got}, outputs {want}")
if m.get("deltafin_decode_batch_rows_total", -1) != rows: bad.append(f"decode_batch_rows_total vs /health {rows}")
if total("deltafin_expert_hits_total") + total("deltafin_expert_misses_total") <= 0: bad.append("no expert lookups")
if m.get("deltafin_engine_decode_tokens_total", 0) <= 0: bad.append("no engine decode tokens")
if m.get('deltafin_time_to_first_token_seconds_bucket{le="+Inf"}') != m.get("deltafin_time_to_first_token_seconds_count"):
    bad.append("ttft histogram +Inf bucket != count")
if types.get("deltafin_requests_total") != "counter" or types.get("deltafin_request_duration_seconds") != "histogram":
    bad.append("TYPE lines")
print("; ".join(bad) if bad else f"ok {int(req)} requests, {int(got)} generated tokens, {rows} batched rows")
PY
)
    case "$mres" in ok*) ok "$name: /metrics ${mres#ok }" ;; *) bad "$name: /metrics: $mres" ;; esac
    if [ -n "$REF" ]; then
        if cmp -s "$TMP/$REF.out" "$TMP/$name.out" && [ -s "$TMP/$name.out" ]; then ok "$name: 8 outputs byte-identical to one at a time"
        else bad "$name: outputs differ from one at a time: $(diff "$TMP/$REF.out" "$TMP/$name.out" | head -4)"; fi
        if [ "$rows" -gt "$steps" ] 2>/dev/null; then ok "$name: $rows decode rows in $steps batched forward passes"
        else bad "$name: no batched decode steps (rows $rows, passes $steps)"; fi
    else
        REF=$name
        if [ "$(wc -l <"$TMP/$name.out")" = 8 ] && ! grep -q '"ids": null' "$TMP/$name.out"; then ok "$name: 8 reference outputs (first: $(head -1 "$TMP/$name.out" | cut -c1-120))"
        else bad "$name: reference run: $(head -c 300 "$TMP/$name.out")"; fi
    fi
    if [ "$cancel" = CANCEL ]; then
        if grep -q 'client gone' "$TMP/$name.log"; then ok "$name: a request that hung up mid-stream stopped, the others unchanged"
        else bad "$name: the hung-up request was not seen as gone: $(grep 'serve:' "$TMP/$name.log" | tail -2)"; fi
    fi
}

for case in bf16_kimi k3_a; do
    dir="$SRC/tests/golden/$case"
    nat="$TMP/$case.native"
    "$BIN" convert "$dir" "$nat" >/dev/null 2>&1 || { bad "$case: convert failed"; continue; }
    SPECS=$(python3 - "$dir/golden.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["prompt_ids"]
specs = []
for i in range(8):
    n = 2 + (i * 5) % len(p)
    s = {"prompt": p[:n] + [i + 1], "max_tokens": 6 + (i * 7) % 17, "stream": i % 4 >= 2}
    if i % 2:
        s.update(temperature=0.8, top_p=0.9, seed=100 + i)
    else:
        s["temperature"] = 0
    specs.append(s)
print(json.dumps(specs))
PY
)
    REF=
    run "$case-p1" 1 - --model "$nat" --parallel 1
    run "$case-p4" 4 CANCEL --model "$nat" --parallel 4
    run "$case-p8" 8 - --model "$nat" --parallel 8
    if [ "$case" = k3_a ]; then
        eb=$(python3 -c 'import json,sys;m=json.load(open(sys.argv[1]));e=m["experts"];print(-(-e["stride"]*e["n_experts"]*len(e.get("layers",[]))//4))' "$nat/manifest.json")
        sb=$(stat -c %s "$nat/spine.bin")
        run "$case-p4-budget" 4 - --model "$nat" --parallel 4 --ctx 256 --ram-budget $((sb + eb + 4 * 1024 * 1024))
    fi
done
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
