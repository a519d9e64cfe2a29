#!/usr/bin/env bash
# e2e_run_draft.sh — `deltafin run --draft` end to end on models/kimi-mini: --draft off,
# ngram and models/kimi-mini-draft (also through --draft-retok on, and with --draft-gate off,
# --draft-max 3, --draft-adaptive off) print exactly the ids of plain decoding, greedy and
# seeded sampling, under --ram-budget too; --stats prints the draft line (drafted, accepted,
# acceptance); bad draft flags exit 2 naming the flag, a missing draft dir exits 1.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
fail=0; pass=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_draft.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
KM="$SRC/models/kimi-mini"; KD="$SRC/models/kimi-mini-draft"
P="int main(int argc, char **argv)
{
	int i;

	for (i = 0; i < argc; i++)
		printf(\"%s\\n\", argv[i]);
	for (i = 0; i < argc; i++)
"
run() { "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt "$P" --max-new 48 --print-ids --quiet --threads 1 "$@"; }

ref=$(run 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && [ -n "$ref" ] && ok "plain: $ref" || bad "plain run rc $rc ($(cat "$TMP/err"))"
for args in "--draft off" "--draft ngram" "--draft ngram --draft-gate off --draft-max 3 --draft-adaptive off" \
            "--draft ngram --draft-ngram 1,2" "--draft $KD" "--draft $KD --draft-gate off" "--draft $KD --draft-retok on --draft-gate off" \
            "--draft $KD --ram-budget 16M --draft-gate off"; do
    # shellcheck disable=SC2086
    ids=$(run $args 2>"$TMP/err"); rc=$?
    [ $rc -eq 0 ] && [ "$ids" = "$ref" ] && ok "greedy $args == plain" || bad "greedy $args: rc $rc '$ids' ($(cat "$TMP/err"))"
done
sref=$(run --temperature 0.8 --top-k 50 --seed 7 2>"$TMP/err")
for args in "--draft ngram --draft-gate off" "--draft $KD --draft-gate off"; do
    # shellcheck disable=SC2086
    ids=$(run --temperature 0.8 --top-k 50 --seed 7 $args 2>"$TMP/err"); rc=$?
    [ $rc -eq 0 ] && [ "$ids" = "$sref" ] && ok "seed 7 $args == plain seed 7" || bad "seed 7 $args: rc $rc '$ids' vs '$sref' ($(cat "$TMP/err"))"
done
ids=$("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt "$P" --max-new 48 --print-ids --threads 1 --draft ngram --draft-gate off --stats 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && grep -q "^draft: ngram (n 2..4), k max 8 adaptive, gate off" "$TMP/err" && grep -q "stats: draft ngram: drafted [1-9][0-9]*, accepted [1-9][0-9]* (acceptance" "$TMP/err" \
    && ok "--stats prints the configuration and the draft line" || bad "--stats draft line: rc $rc ($(cat "$TMP/err"))"

# errors
out=$(run --draft-max 0 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--draft-max" && ok "--draft-max 0 -> usage error" || bad "--draft-max 0 (rc $rc): $out"
out=$(run --draft ngram --draft-ngram 3,2 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--draft-ngram" && ok "--draft-ngram 3,2 -> usage error" || bad "--draft-ngram 3,2 (rc $rc): $out"
out=$(run --draft-gate maybe 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "on or off" && ok "--draft-gate maybe -> usage error" || bad "--draft-gate (rc $rc): $out"
out=$(run --draft "$TMP/nope" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q -- "--draft .*nope: no such directory" && ok "missing draft dir -> rc 1: $out" || bad "missing draft dir (rc $rc): $out"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
