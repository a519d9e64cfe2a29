#!/usr/bin/env bash
# e2e_run_draft.sh — `deltafin run --draft` end to end on models/kimi-mini: --draft off,
# ngram and models/kimi-mini-draft (also through --draft-retok on, and with --draft-gate off,
# --draft-max 3, --draft-adaptive off) print exactly the ids of plain decoding, greedy and
# seeded sampling, under --ram-budget too, and a draft model with another tokenizer (a 256-token byte-level
# one, drafting through re-tokenization); --stats prints the draft line (drafted, accepted,
# acceptance) and a decode figure of generated tokens (not verified positions); bad draft flags exit 2 naming the
# flag, a missing draft dir exits 1.
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
# the decode figure counts generated tokens (not verified positions, rejected drafts included) over the generation's
# wall time: the tokens after the first, at the generation line's rate
gen=$(sed -n 's/^stats: prompt [0-9]* tokens, generated \([0-9]*\);.*/\1/p' "$TMP/err")
dec=$(sed -n 's/^stats: prompt .*; decode \([0-9.]*\) tok\/s (\([0-9]*\) tokens in .*, drafting included; the target verified [0-9]* positions.*/\1 \2/p' "$TMP/err")
grate=$(sed -n 's/^stats: generation [0-9]* tokens, [0-9]* after the first in [0-9.]* s: \([0-9.]*\) tok\/s.*/\1/p' "$TMP/err")
[ -n "$gen" ] && [ "$dec" = "$grate $((gen - 1))" ] && ok "--stats decode with drafting: $dec (generated $gen, generation $grate tok/s)" \
    || bad "--stats decode figure with drafting: decode '$dec', generated '$gen', generation '$grate' ($(cat "$TMP/err"))"

# a draft model with a different tokenizer (--draft-retok auto): a tiny golden checkpoint (vocabulary 256) with a
# byte-level BPE tokenizer.json of its 256 byte tokens; drafts are re-tokenized with kimi-mini's tokenizer
if command -v python3 >/dev/null && [ -f "$SRC/tests/golden/bf16_kimi/model.safetensors" ]; then
    BD="$TMP/bytedraft"; mkdir -p "$BD"
    cp "$SRC/tests/golden/bf16_kimi/config.json" "$SRC/tests/golden/bf16_kimi/model.safetensors" "$BD/"
    python3 - "$BD/tokenizer.json" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl, "post_processor": None,
           "decoder": bl, "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}},
          open(sys.argv[1], "w"))
PY
    ids=$(run --draft "$BD" --draft-gate off --stats 2>"$TMP/err"); rc=$?
    "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt "x" --max-new 2 --threads 1 --draft "$BD" 2>&1 | grep -q "^draft: model-retok" \
        && [ $rc -eq 0 ] && [ "$ids" = "$ref" ] && grep -q "stats: draft model-retok: drafted [1-9]" "$TMP/err" \
        && ok "draft model with another tokenizer (vocabulary 256, re-tokenized): same ids" \
        || bad "retok draft: rc $rc '$ids' ($(cat "$TMP/err"))"
fi

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
