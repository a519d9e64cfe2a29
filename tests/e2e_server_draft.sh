#!/usr/bin/env bash
# e2e_server_draft.sh — `deltafin serve --draft` (speculative decoding) gives the tokens of a server
# without drafting: models/kimi-mini with models/kimi-mini-draft and with ngram (gate off, so every
# step drafts), text prompts greedy and seeded, streaming, a second turn that extends the first
# (prefix reuse after speculative steps), a request with logprobs (served without drafting) and 3
# concurrent requests (serve --parallel: one drafter per session);
# a KDA model (tests/golden/kl_bf16) with ngram drafting keeps the golden greedy ids; --cache-dir holds the
# draft model's conversion as the target's.
# Env: DF_BIN, DF_SRC.
set -u
SRC=${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${DF_BIN:-$SRC/build/deltafin}
TMP=$(mktemp -d /tmp/df-e2e-draft.XXXXXX)
PASS=0
FAIL=0
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; sleep 0.2; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
command -v curl >/dev/null || { echo "e2e_server_draft: curl is required"; exit 1; }
command -v node >/dev/null || { echo "e2e_server_draft: node is required"; exit 1; }
export XDG_CACHE_HOME=$TMP/cache

start_server() { # start_server NAME ARGS... -> PORT (global)
    local name=$1; shift
    "$BIN" serve --port 0 --port-file "$TMP/$name.port" --threads 2 "$@" >"$TMP/$name.out" 2>"$TMP/$name.log" &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 600); do
        [ -s "$TMP/$name.port" ] && { PORT=$(cat "$TMP/$name.port"); return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# req PORT JSON -> token ids of the completion (or ERROR ...)
req() {
    curl -s -d "$2" "http://127.0.0.1:$1/v1/completions" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{let j;try{j=JSON.parse(s)}catch(e){console.log("ERROR "+s);return}
          if(!j.choices){console.log("ERROR "+s);return;}
          const c=((j.usage||{}).prompt_tokens_details||{}).cached_tokens||0;
          console.log((j.choices[0].token_ids||[]).join(",")+"|"+j.choices[0].text.length+"|"+c)})'
}
# stream PORT JSON -> the streamed text
stream() {
    curl -s -N -d "$2" "http://127.0.0.1:$1/v1/completions" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{let t="";for(const l of s.split("\n")){
          if(!l.startsWith("data: ")||l==="data: [DONE]")continue;const j=JSON.parse(l.slice(6));t+=j.choices[0].text}
          console.log(JSON.stringify(t))})'
}

KM=$SRC/models/kimi-mini
start_server plain --model "$KM" && P0=$PORT || { bad "plain server did not start: $(cat "$TMP/plain.log")"; echo "$PASS passed, $FAIL failed"; exit 1; }
start_server draft --model "$KM" --draft "$SRC/models/kimi-mini-draft" --draft-gate off --cache-dir "$TMP/cd" && P1=$PORT || bad "draft server did not start: $(cat "$TMP/draft.log")"
# --cache-dir holds the draft model's conversion too (not the default cache)
ls -d "$TMP/cd"/kimi-mini-draft-*-source >/dev/null 2>&1 && ! ls -d "$XDG_CACHE_HOME"/deltafin/kimi-mini-draft-* >/dev/null 2>&1 \
    && ok "serve --draft DIR converts the draft into --cache-dir" \
    || bad "draft conversion not in --cache-dir: $(ls "$TMP/cd" 2>&1) / default: $(ls "$XDG_CACHE_HOME"/deltafin 2>&1)"
start_server ngram --model "$KM" --draft ngram --draft-gate off --draft-ngram 1,3 && P2=$PORT || bad "ngram server did not start: $(cat "$TMP/ngram.log")"
grep -q "^draft: model .*kimi-mini-draft, k max 8 adaptive, gate off" "$TMP/draft.log" && ok "draft server echoes its drafting configuration" \
    || bad "no draft line: $(cat "$TMP/draft.log")"

prompts=("In the beginning God created the heaven and the earth. And the earth was"
         "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n"
         "The malloc() function allocates size bytes and returns a pointer to")
for i in 0 1 2; do
    p=${prompts[$i]}
    for samp in '"temperature":0' '"temperature":0.8,"top_k":40,"seed":11'; do
        body="{\"prompt\":\"$p\",\"max_tokens\":40,$samp}"
        want=$(req "$P0" "$body")
        for port in "$P1" "$P2"; do
            got=$(req "$port" "$body")
            [ "${got%|*}" = "${want%|*}" ] && [ "${want#ERROR}" = "$want" ] && ok "prompt $i {$samp} port $port: same tokens" \
                || bad "prompt $i {$samp} port $port: got '$got' want '$want'"
        done
    done
done
# streaming: the same text
body="{\"prompt\":\"${prompts[0]}\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}"
want=$(stream "$P0" "$body"); got=$(stream "$P1" "$body")
[ "$got" = "$want" ] && [ ${#want} -gt 10 ] && ok "streamed text equal ($want)" || bad "stream: got $got want $want"
# a second turn extending the first (prefix reuse after speculative steps), token-id prompts
body="{\"prompt\":\"${prompts[1]}\",\"max_tokens\":24,\"temperature\":0}"
req "$P1" "$body" >/dev/null
body2="{\"prompt\":\"${prompts[1]}\",\"max_tokens\":48,\"temperature\":0}"
want=$(req "$P0" "$body2"); got=$(req "$P1" "$body2")
[ "${got%%|*}" = "${want%%|*}" ] && [ "${got##*|}" -gt 0 ] && ok "second turn reuses the cache (${got##*|} cached) and matches" \
    || bad "second turn: got '$got' want '$want'"
# logprobs: served without drafting, same tokens
body="{\"prompt\":\"${prompts[2]}\",\"max_tokens\":16,\"temperature\":0,\"logprobs\":2}"
want=$(req "$P0" "$body"); got=$(req "$P1" "$body")
[ "${got%|*}" = "${want%|*}" ] && ok "logprobs request: same tokens" || bad "logprobs: got '$got' want '$want'"

# concurrent requests (--parallel: one drafter per session): each gets the tokens it gets alone
CP=()
for i in 0 1 2; do
    req "$P1" "{\"prompt\":\"${prompts[$i]}\",\"max_tokens\":32,\"temperature\":0}" >"$TMP/conc.$i" &
    CP+=($!)
done
wait "${CP[@]}"
allsame=1
for i in 0 1 2; do
    want=$(req "$P0" "{\"prompt\":\"${prompts[$i]}\",\"max_tokens\":32,\"temperature\":0}")
    [ "$(cut -d'|' -f1 "$TMP/conc.$i")" = "${want%%|*}" ] || { allsame=0; echo "concurrent $i: $(cat "$TMP/conc.$i") vs $want"; }
done
[ $allsame = 1 ] && ok "3 concurrent requests with drafting: the tokens of each alone" || bad "concurrent requests differ"

# KDA model: golden greedy ids with ngram drafting
KL=$SRC/tests/golden/kl_bf16
if [ -f "$KL/golden.json" ]; then
    start_server kl --model "$KL" --draft ngram --draft-gate off --draft-ngram 1,2 && P3=$PORT || bad "kl server did not start: $(cat "$TMP/kl.log")"
    PR=$(node -e 'console.log(require(process.argv[1]).prompt_ids.join(","))' "$KL/golden.json")
    G=$(node -e 'console.log(require(process.argv[1]).greedy_ids.join(","))' "$KL/golden.json")
    got=$(req "$P3" "{\"prompt\":[$PR],\"max_tokens\":20,\"temperature\":0}")
    [ "${got%%|*}" = "$G" ] && ok "kl_bf16 with ngram drafting: golden greedy ids" || bad "kl_bf16: got '$got' want '$G'"
    got=$(req "$P3" "{\"prompt\":[$PR,$(echo "$G" | cut -d, -f1-6)],\"max_tokens\":14,\"temperature\":0}")
    [ "${got%%|*}" = "$(echo "$G" | cut -d, -f7-20)" ] && ok "kl_bf16 second turn (KDA rollback + reuse): golden ids" || bad "kl_bf16 turn 2: got '$got'"
fi
echo "$PASS passed, $FAIL failed"
[ $FAIL -eq 0 ]
