#!/usr/bin/env bash
# e2e_run.sh — `deltafin run` end to end on a golden case (tests/golden/<case>/):
# --prompt-ids/--print-ids must print exactly the golden greedy ids; error cases
# (missing dir, truncated safetensors, corrupt native spine, --prompt without a
# tokenizer, bad options) must exit non-zero with a message.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
fail=0; pass=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_run.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# error: missing directory
out=$("$BIN" run --model "$TMP/nope" --prompt-ids 1,2 --max-new 2 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "nope" && ok "missing dir -> rc $rc: $out" || bad "missing dir (rc $rc): $out"
# no --model and nothing installed (an empty registry): the embedded models/kimi-mini, said on the configuration line
out=$(DELTAFIN_REGISTRY="$TMP/no-registry.json" "$BIN" run --prompt-ids 1 --max-new 1 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "model (no --model): .*models/kimi-mini, embedded kimi-mini" && ok "no --model -> the embedded kimi-mini" \
    || bad "no --model (rc $rc): $out"

case_dir=""
for d in "$SRC"/tests/golden/*/; do
    if [ -f "$d/golden.json" ] && [ -f "$d/model.safetensors" ]; then case_dir=${d%/}; break; fi
done
if [ -z "$case_dir" ] || ! command -v python3 >/dev/null; then
    echo "no golden case with a single model.safetensors (or no python3): golden checks skipped"
    echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; exit
fi
name=$(basename "$case_dir")
read -r prompt greedy < <(python3 -c '
import json,sys; g=json.load(open(sys.argv[1]))
print(",".join(map(str,g["prompt_ids"])), ",".join(map(str,g["greedy_ids"])))' "$case_dir/golden.json")
n=$(echo "$greedy" | tr , '\n' | wc -l)

ids=$("$BIN" run --model "$case_dir" --cache-dir "$TMP/cache" --prompt-ids "$prompt" --max-new "$n" --print-ids --quiet 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && [ "$ids" = "$greedy" ] && ok "$name: greedy ids equal the golden" || bad "$name: rc $rc, got '$ids' want '$greedy' ($(cat "$TMP/err"))"
# the same from the cache, single thread, scalar backend, with stats
ids=$("$BIN" run --model "$case_dir" --cache-dir "$TMP/cache" --prompt-ids "$prompt" --max-new "$n" --print-ids --threads 1 --backend cpu-scalar --stats 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && [ "$ids" = "$greedy" ] && grep -q "TTFT" "$TMP/err" && grep -q "backend cpu-scalar" "$TMP/err" \
    && ok "$name: cpu-scalar, 1 thread, --stats" || bad "$name: scalar run rc $rc '$ids' ($(cat "$TMP/err"))"
# under a RAM budget smaller than spine + all experts (eviction + router prefetch): same ids
ids=$("$BIN" run --model "$case_dir" --cache-dir "$TMP/cache" --prompt-ids "$prompt" --max-new "$n" --print-ids --ram-budget 1M --stats 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && [ "$ids" = "$greedy" ] && grep -q "prefetch on" "$TMP/err" \
    && ok "$name: --ram-budget 1M (prefetch on) gives the same ids" || bad "$name: budget run rc $rc '$ids' ($(cat "$TMP/err"))"
# a budget below the minimum: clear error naming the minimum
out=$("$BIN" run --model "$case_dir" --cache-dir "$TMP/cache" --prompt-ids "$prompt" --max-new 2 --ram-budget 100K --quiet 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "at least" && ok "budget too small -> states the minimum" || bad "small budget (rc $rc): $out"
# --prompt without a tokenizer
if [ ! -f "$case_dir/tokenizer.json" ]; then
    out=$("$BIN" run --model "$case_dir" --cache-dir "$TMP/cache" --prompt "hello" --max-new 2 --quiet 2>&1); rc=$?
    [ $rc -ne 0 ] && echo "$out" | grep -q -- "--prompt-ids" && ok "--prompt without tokenizer -> suggests --prompt-ids" || bad "--prompt without tokenizer (rc $rc): $out"
fi
# truncated safetensors
mkdir -p "$TMP/trunc"; cp "$case_dir"/config.json "$TMP/trunc/"
size=$(stat -c %s "$case_dir/model.safetensors")
head -c $((size / 2)) "$case_dir/model.safetensors" > "$TMP/trunc/model.safetensors"
out=$("$BIN" run --model "$TMP/trunc" --cache-dir "$TMP/cache2" --prompt-ids "$prompt" --max-new 2 --quiet 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "safetensors" && ok "truncated safetensors -> rc $rc: $out" || bad "truncated safetensors (rc $rc): $out"
# corrupt native spine
native=$(ls -d "$TMP"/cache/*/ | head -1)
cp -r "$native" "$TMP/corrupt"
printf '\x55' | dd of="$TMP/corrupt/spine.bin" bs=1 seek=100 conv=notrunc status=none
out=$("$BIN" run --model "$TMP/corrupt" --prompt-ids "$prompt" --max-new 2 --quiet 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "spine.bin" && ok "corrupt spine.bin -> rc $rc: $out" || bad "corrupt spine (rc $rc): $out"
# out-of-vocabulary prompt id
out=$("$BIN" run --model "$native" --prompt-ids 99999999 --max-new 2 --quiet 2>&1); rc=$?
[ $rc -ne 0 ] && ok "out-of-vocabulary id -> rc $rc" || bad "out-of-vocabulary id accepted"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
