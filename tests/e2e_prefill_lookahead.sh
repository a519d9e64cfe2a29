#!/usr/bin/env bash
# e2e_prefill_lookahead.sh — a prompt under a RAM budget reads each touched expert about once while the
# next layer's experts are read during the current layer's compute (lookahead guesses queued behind the
# demand reads): `bench prefill` on a synthetic model (8 MoE layers x 128 MXFP4 experts, expert cache
# ~1/5 of the experts) must print amplification <= 1.08 with some bytes read by prefetch, and a
# 64-token prompt must give the same greedy ids under the budget as without one; with a cache smaller
# than a layer's set, amplification <= 1.01 (only the surest guesses read). (This random model's
# prompt touches only ~87% of the bank, so wrong guesses cost up to ~5% here, timing-dependent; prompts
# that touch nearly the whole bank, as on the K2-shaped models of bench/RESULTS.md, waste less.) Then
# amplification <= 1.05 over budgets 60M-240M and prompts of 16-256 tokens (issue 10).
set -u
BIN=${DF_BIN:?DF_BIN not set}
T=$(mktemp -d /tmp/df_e2e_la.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

"$BIN" synth "$T/m" --quiet --hidden 1024 --moe-inter 512 --experts 128 --layers 9 --vocab 4096 --heads 8 \
  --q-lora 256 --kv-lora 128 --inter 2048 --nope 64 --rope 32 --v-dim 64 --top-k 8 && ok || bad "synth"
"$BIN" bench prefill --model "$T/m" --tokens 64 --ram-budget 256M --io-seconds 0.5 --no-drop --threads 2 >"$T/bp" 2>&1 \
  && ok || bad "bench prefill: $(cat "$T/bp")"
cat "$T/bp"
amp=$(sed -n 's/.*amplification \([0-9.]*\).*/\1/p' "$T/bp")
pf=$(sed -n 's/.*prefetch \([0-9.]*\)).*/\1/p' "$T/bp")
[ -n "$amp" ] && awk -v a="$amp" 'BEGIN { exit !(a <= 1.08) }' && ok || bad "amplification '$amp' > 1.08"
[ -n "$pf" ] && awk -v p="$pf" 'BEGIN { exit !(p > 0) }' && ok || bad "no expert bytes read by the lookahead ('$pf' MB)"
# a cache smaller than one layer's set (~60 of ~112 experts a layer touches): only the surest guesses, as many as
# may be pinned, taking the slots the layer releases; the next layer computes its members with a slot first, so a
# right guess is not evicted before its use (with every guess read and no such order: amplification 1.56 here)
"$BIN" bench prefill --model "$T/m" --tokens 64 --ram-budget 120M --io-seconds 0.5 --no-drop --threads 2 >"$T/bp2" 2>&1 \
  && ok || bad "bench prefill (120M): $(cat "$T/bp2")"
amp2=$(sed -n 's/.*amplification \([0-9.]*\).*/\1/p' "$T/bp2")
[ -n "$amp2" ] && awk -v a="$amp2" 'BEGIN { exit !(a <= 1.01) }' && ok || bad "amplification under a cache smaller than a layer '$amp2' > 1.01"
# issue 10: amplification <= 1.05 at every budget, from a cache smaller than one layer's set (60M-150M: the set is
# computed in groups that fit, no member read twice) to one that holds several layers, and for short prompts,
# whose lookahead guesses are the least sure (16 tokens: 1.12-1.21 before only the guesses worth reading were
# read; a demand request evicting its own present members: 1.009 at 256 tokens / 90M)
for tb in 16:90M 16:150M 16:180M 16:240M 32:180M 64:60M 64:120M 64:200M 256:90M; do
  t=${tb%%:*}; b=${tb#*:}
  "$BIN" bench prefill --model "$T/m" --tokens "$t" --ram-budget "$b" --io-seconds 0.2 --no-drop --threads 2 \
    >"$T/bp3" 2>&1 || { bad "bench prefill ($t tokens, $b): $(cat "$T/bp3")"; continue; }
  a=$(sed -n 's/.*amplification \([0-9.]*\).*/\1/p' "$T/bp3")
  echo "$t tokens, budget $b: amplification $a"
  [ -n "$a" ] && awk -v a="$a" 'BEGIN { exit !(a <= 1.05) }' && ok || bad "$t tokens, budget $b: amplification '$a' > 1.05"
done
ids=$(seq -s, 3 66)
args="run --model $T/m --prompt-ids $ids --max-new 4 --print-ids --quiet --threads 2"
ref=$("$BIN" $args 2>"$T/err" | tail -1)
[ -n "$ref" ] && ok || bad "unbudgeted run: $(cat "$T/err")"
got=$("$BIN" $args --ram-budget 256M 2>"$T/err" | tail -1)
[ "$got" = "$ref" ] && ok || bad "budgeted ids '$got' vs '$ref' ($(cat "$T/err"))"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
