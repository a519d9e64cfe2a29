#!/usr/bin/env bash
# e2e_server_kimi.sh — `deltafin serve` on the Kimi Linear / Kimi K3 golden checkpoints
# (tests/golden/kl_*, k3_*: models with recurrent KDA layers), token-id prompts:
#  1. greedy completion == the reference's greedy ids (first 8);
#  2. a second turn that extends the first (prompt + generated ids) reuses the cached prefix
#     (cached_tokens > 0) and continues with the reference's ids 8..11;
#  3. a third turn that diverges inside the second turn's text (the KDA state must be rolled
#     back: prompt snapshot + re-evaluation) gives the same ids as a server without prefix
#     reuse, and under --ram-budget at 1/4 of the expert bytes.
# Env: DF_BIN, DF_SRC.
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${DF_BIN:-$SRC/build/deltafin}
TMP=$(mktemp -d /tmp/df-e2e-kimi.XXXXXX)
# the first-use conversions of the checkpoints served below go to a cache in $TMP (removed at exit), never into the
# user's ~/.cache/deltafin (its key names this checkout: every test run used to leave its conversions there)
export XDG_CACHE_HOME="$TMP/xdg-cache"
PASS=0
FAIL=0
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
expect() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi; }
command -v curl >/dev/null || { echo "e2e_server_kimi: curl is required"; exit 1; }
command -v node >/dev/null || { echo "e2e_server_kimi: node is required"; exit 1; }

start_server() { # start_server NAME ARGS...
    local name=$1; shift
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
# compl PORT IDS(comma) MAXTOK -> prints "ids|cached"
compl() {
    curl -s -d "{\"prompt\":[$2],\"max_tokens\":$3,\"temperature\":0}" "http://127.0.0.1:$1/v1/completions" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);
          if(!j.choices){console.log("ERROR "+s);return;}
          const c=((j.usage||{}).prompt_tokens_details||{}).cached_tokens||0;
          console.log(j.choices[0].token_ids.join(",")+"|"+c)})'
}
jget() { node -e 'const j=require(process.argv[1]);console.log(j[process.argv[2]].join(","))' "$1" "$2"; }

n=0
for dir in "$SRC"/tests/golden/kl_* "$SRC"/tests/golden/k3_*; do
    [ -f "$dir/golden.json" ] || continue
    n=$((n + 1))
    case=$(basename "$dir")
    P=$(jget "$dir/golden.json" prompt_ids)
    G=$(jget "$dir/golden.json" greedy_ids)
    G8=$(echo "$G" | cut -d, -f1-8)
    G12=$(echo "$G" | cut -d, -f9-12)
    for mode in plain budget; do
        args=(--model "$dir" --threads 2)
        if [ $mode = budget ]; then
            # 1/4 of the expert bytes: convert once to read the manifest's expert sizes
            nat="$TMP/$case.native"
            [ -d "$nat" ] || "$BIN" convert "$dir" "$nat" >/dev/null 2>&1
            eb=$(node -e 'const m=require(process.argv[1]);const e=m.experts;console.log(e?Math.ceil(e.stride*e.n_experts*(m.experts.layers||[]).length/4):0)' "$nat/manifest.json" 2>/dev/null)
            sb=$(stat -c %s "$nat/spine.bin" 2>/dev/null || echo 0)
            args=(--model "$nat" --threads 2 --parallel 1 --ram-budget $((sb + eb + 4 * 1024 * 1024)))
        fi
        if ! start_server "$case-$mode" "${args[@]}"; then bad "$case/$mode: server did not start: $(tail -2 "$TMP/$case-$mode.log")"; continue; fi
        A=$(compl "$PORT" "$P" 8)
        expect "$case/$mode: greedy == reference" "${A%|*}" "$G8"
        B=$(compl "$PORT" "$P,${A%|*}" 4)
        expect "$case/$mode: turn 2 continues the reference" "${B%|*}" "$G12"
        c=${B#*|}
        [ "${c:-0}" -gt 0 ] && ok "$case/$mode: turn 2 reused $c cached tokens" || bad "$case/$mode: turn 2 reused nothing"
        # turn 3 diverges 2 tokens before the end of turn 2's prompt: state rolled back to the snapshot
        T3=$(echo "$P,${A%|*}" | tr , '\n' | head -n -2 | paste -sd,)
        T3="$T3,7,11,13"
        C=$(compl "$PORT" "$T3" 6)
        kill -TERM "$SPID"; wait "$SPID" 2>/dev/null
        start_server "$case-$mode-noreuse" "${args[@]}" --no-kv-reuse || { bad "$case/$mode: no-reuse server did not start"; continue; }
        D=$(compl "$PORT" "$T3" 6)
        kill -TERM "$SPID"; wait "$SPID" 2>/dev/null
        expect "$case/$mode: turn 3 after roll-back == without prefix reuse" "${C%|*}" "${D%|*}"
    done
done
[ $n -gt 0 ] || echo "e2e_server_kimi: no kl_*/k3_* golden cases yet"
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
