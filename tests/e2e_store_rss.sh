#!/usr/bin/env bash
# e2e_store_rss.sh — peak RSS of a budgeted run stays within the budget + 5%.
# A synthetic model (deltafin synth) with 856 MB of MXFP4 experts (8 MoE layers
# x 128) and a ~70 MiB spine runs greedy under --ram-budget 256M (expert cache
# ~180 MiB, 1/5 of the experts): max RSS (/usr/bin/time) <= 1.05 x budget (the
# budget counts weights, staging and KV; code, libraries and stacks, ~9 MiB,
# must fit in the 5%), and the ids equal the unbudgeted run's.
set -u
BIN=${DF_BIN:?DF_BIN not set}
# AddressSanitizer's shadow memory and quarantine add to the peak RSS: the budget bound does not apply to such a build
if ldd "$BIN" 2>/dev/null | grep -q libasan; then echo "skipped: $BIN is built with AddressSanitizer (its RSS is not the engine's)"; echo "0 passed, 0 failed"; exit 77; fi
TIME=/usr/bin/time
T=$(mktemp -d /tmp/df_e2e_rss.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
if [ ! -x $TIME ]; then echo "no $TIME: skipped"; echo "0 passed, 0 failed"; exit 0; fi

"$BIN" synth "$T/m" --quiet --hidden 1024 --moe-inter 512 --experts 128 --layers 9 --vocab 4096 --heads 8 \
  --q-lora 256 --kv-lora 128 --inter 2048 --nope 64 --rope 32 --v-dim 64 --top-k 8 && ok || bad "synth"
args="run --model $T/m --prompt-ids 5,6,7,8,9,10 --max-new 10 --print-ids --quiet --threads 2"
ref=$("$BIN" $args 2>"$T/err" | tail -1)
[ -n "$ref" ] && ok || bad "unbudgeted run: $(cat "$T/err")"
budget_mib=256
$TIME -f "maxrss_kb %M" -o "$T/time" "$BIN" $args --ram-budget ${budget_mib}M --stats >"$T/out" 2>"$T/err"
ids=$(grep -v '^stats' "$T/out" | tail -1)
[ "$ids" = "$ref" ] && ok || bad "budgeted ids '$ids' vs '$ref' ($(cat "$T/err"))"
rss=$(awk '/maxrss_kb/ {print $2}' "$T/time")
limit=$(( budget_mib * 1024 * 105 / 100 ))
echo "peak RSS ${rss} KiB, budget $((budget_mib * 1024)) KiB, limit (budget + 5%) ${limit} KiB"
[ -n "$rss" ] && [ "$rss" -le "$limit" ] && ok || bad "peak RSS ${rss} KiB > ${limit} KiB"
grep -q "misses" "$T/err" "$T/out" && ok || bad "no stats line"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
