#!/usr/bin/env bash
# e2e_cli_errors.sh — the CLI's handling of bad input and edge cases (fresh-user
# test items): strict number parsing in `run` (usage error, exit 2), --threads
# cap, --spine with a native model, `run` stopping at a full context and still
# printing what it generated, a broken tokenizer.json reported by run and doctor,
# tokenize option checks and id overflow, cache-corruption messages naming the
# cache directory, the KV reserve of a text prompt, --max-new 0 stats, bench and
# doctor option messages, dense-model description, progress lines ended before
# errors; a mistyped --model path, prompts from a file or stdin, prefill progress
# and the trained-positions warning (issue 11 items 11, 12); bench on a Hugging Face checkpoint and bench decode
# without --model, an unknown flag as the last argument, a directory that is no model, serve --help without
# --draft-sample, --backend cuda without a GPU and DF_BACKEND named in messages, the top-level help, doctor's
# model line (fresh-user items); DF_PREFETCH / DF_PREFAULT values and the prefault setting on the configuration
# line, `list` printing only its table (new-user trial); prompts that are not UTF-8, tokenize --decode parsing ids as
# run --prompt-ids, serve checking its options before anything else, negative seeds (the server's mapping, the same
# tokens from both), `deltafin version`, tools/gen-cli-doc.sh reproducing docs/cli.md, README's CUDA knobs, the *.tmp
# of a killed convert next to other files (second new-user trial); bench's did-you-mean, bench machine's "LLC
# unknown", no trailing space in doctor's output, an empty prompt (stdin, file, --prompt ""), --stats with no first
# token or no decode step (third); synth --size below one MoE layer refused, a config integer out of range, a dense
# model's --ram-budget error without an expert-cache term (fourth); a negative config size naming the field, value and
# lower bound, first_k_dense_replace past num_hidden_layers as a config error (fifth); run --quiet still showing the
# trained-positions note, a single-value option given twice refused in every command (sixth); every option of run's and
# serve's --help suggested for a slip, refused twice when it takes a value, accepted twice when not (their option
# tables). Uses tests/golden/bf16_dsv3_groups and models/kimi-mini(-draft).
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
# expect RC DESCRIPTION REGEX -- command...: exit status RC and stderr+stdout matching REGEX
expect() {
    local want=$1 what=$2 re=$3; shift 4
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    if [ "$rc" -eq "$want" ] && echo "$out" | grep -qE -- "$re"; then ok; else bad "$what: rc $rc (want $want), output: $out"; fi
}
TMP=$(mktemp -d /tmp/df_e2e_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# conversions without --cache-dir go to a cache in $TMP (removed at exit), never into the user's ~/.cache/deltafin
export XDG_CACHE_HOME="$TMP/xdg"
G="$SRC/tests/golden/bf16_dsv3_groups"
KM="$SRC/models/kimi-mini"
KD="$SRC/models/kimi-mini-draft"
R=("$BIN" run --model "$G" --cache-dir "$TMP/cache" --quiet)

# ---- run: strict numbers and lists (items 3, 4, 5): usage error, exit 2, naming the flag
for a in "--max-new abc" "--max-new 5x" "--max-new -1" "--threads -3" "--threads 100000" "--threads 2x" \
         "--temperature -1" "--temperature abc" "--temperature nan" "--temperature inf" "--top-p 0" "--top-p -1" \
         "--top-p 5" "--top-p nan" "--top-k -5" "--top-k 1.5" "--seed abc" "--seed -9223372036854775809" "--seed 99999999999999999999" \
         "--seed 1.5" "--seed -"; do
    set -- $a
    expect 2 "run $a" "^deltafin run: $1 \"" -- "${R[@]}" --prompt-ids 1,2,3 "$@"
done
for l in "1,,2" "1,2," ",1" "1,-2" "1 2" "abc" ""; do
    expect 2 "run --prompt-ids '$l'" "--prompt-ids" -- "${R[@]}" --prompt-ids "$l"
done
# valid values still run: sampling with a seed is reproducible; --threads 0 = all cores
a=$("${R[@]}" --prompt-ids 1,2,3 --max-new 4 --print-ids --temperature 0.8 --top-p 0.9 --top-k 20 --seed 7 --threads 0 2>&1)
b=$("${R[@]}" --prompt-ids 1,2,3 --max-new 4 --print-ids --temperature 0.8 --top-p 0.9 --top-k 20 --seed 7 2>&1)
[[ "$a" =~ ^[0-9]+(,[0-9]+){3}$ ]] && [ "$a" = "$b" ] && ok || bad "sampling run: '$a' vs '$b'"
expect 0 "run --help documents the default seed" "--seed S .*default 0" -- "$BIN" run --help

# ---- run: the context fills (item 2): stop, print the ids, note on stderr, exit 0
if command -v python3 >/dev/null; then
    mkdir -p "$TMP/small"; cp "$G"/*.safetensors "$TMP/small/"
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["max_position_embeddings"]=16; json.dump(c,open(sys.argv[2],"w"))' \
        "$G/config.json" "$TMP/small/config.json"
    greedy=$(python3 -c 'import json,sys; print(",".join(map(str,json.load(open(sys.argv[1]))["greedy_ids"])))' "$G/golden.json")
    ids=$("$BIN" run --model "$TMP/small" --cache-dir "$TMP/cache" --quiet --prompt-ids 0,1,2 --max-new 100 --print-ids --stats 2>"$TMP/err"); rc=$?
    n=$(echo "$ids" | tr , '\n' | grep -c .)
    [ $rc -eq 0 ] && [ "$n" -eq 13 ] && grep -q "stopped: context full (16 positions)" "$TMP/err" && grep -q "generated 13" "$TMP/err" \
        && ok || bad "context full (prompt + generated = 16): rc $rc, $n ids '$ids', stderr: $(cat "$TMP/err")"
    # the prompt alone longer than the context, or filling it: an error, not a crash
    expect 1 "prompt longer than the context" "16 positions" -- "$BIN" run --model "$TMP/small" --cache-dir "$TMP/cache" --quiet \
        --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 --max-new 1
    expect 1 "prompt filling the context" "no room to generate" -- "$BIN" run --model "$TMP/small" --cache-dir "$TMP/cache" \
        --quiet --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --max-new 1
    # --max-new INT_MAX is capped by the context (not "out of memory")
    expect 0 "--max-new 2147483647" "stopped: context full" -- "$BIN" run --model "$TMP/small" --cache-dir "$TMP/cache" --quiet \
        --prompt-ids 1,2,3 --max-new 2147483647 --print-ids
    # a prefix of the golden greedy continuation when it stops within the context
    prompt=$(python3 -c 'import json,sys; print(",".join(map(str,json.load(open(sys.argv[1]))["prompt_ids"])))' "$G/golden.json")
    got=$("${R[@]}" --prompt-ids "$prompt" --max-new 3 --print-ids 2>/dev/null)
    [ "$got" = "$(echo "$greedy" | cut -d, -f1-3)" ] && ok || bad "golden prefix: '$got' vs '$greedy'"
fi

# ---- config.json: an integer too large for its field is out of range (not "must be an integer"), naming the file,
# the field, the value and the allowed range (fresh-user trial)
if command -v python3 >/dev/null; then
    mkdir -p "$TMP/bigvocab"; cp "$G"/*.safetensors "$TMP/bigvocab/"
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["vocab_size"]=99999999999999; json.dump(c,open(sys.argv[2],"w"))' \
        "$G/config.json" "$TMP/bigvocab/config.json"
    expect 1 "config.json vocab_size 99999999999999" \
        "^deltafin run: $TMP/bigvocab/config\.json: field \"vocab_size\" = 99999999999999 is out of range: expected an integer from 1 to 2147483647" -- \
        "$BIN" run --model "$TMP/bigvocab" --cache-dir "$TMP/cache" --quiet --prompt-ids 1 --max-new 1
    # kimi-mini (6 layers, 64 experts) with one config field changed, its other files symlinked: a negative size
    # names the field, the value and its real lower bound (0, or 1 for sizes every model needs); a value past 2^53 is
    # echoed in full, not as 9.2233720368547758e+18; first_k_dense_replace past num_hidden_layers is a config error
    # naming both fields, not a routed-expert tensor error (fresh-user trial)
    kcfg() {  # kcfg NAME FIELD JSON-VALUE [DIR]: $TMP/NAME = DIR (kimi-mini) with config.json's FIELD set to JSON-VALUE
        local km; km=$(cd "${4:-$KM}" && pwd)
        mkdir -p "$TMP/$1"; for f in "$km"/*; do ln -sf "$f" "$TMP/$1/"; done
        rm -f "$TMP/$1/config.json"
        python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c[sys.argv[3]]=json.loads(sys.argv[4]); json.dump(c,open(sys.argv[2],"w"))' \
            "$km/config.json" "$TMP/$1/config.json" "$2" "$3"
    }
    KR=(run --cache-dir "$TMP/cache" --quiet --prompt-ids 1 --max-new 1 --model)
    for fv in "n_routed_experts -5 0" "first_k_dense_replace -1 0" "n_shared_experts -2147483649 0" "qk_nope_head_dim -1 0" \
              "num_hidden_layers 0 1" "hidden_size -3 1" "kv_lora_rank 0 1" "vocab_size 9223372036854775808 1" \
              "moe_intermediate_size -9223372036854775809 0"; do
        set -- $fv; shown=$2; [ "$2" = -9223372036854775809 ] && shown=-9223372036854775808   # the double cJSON keeps
        kcfg "km-$1" "$1" "$2"
        out=$("$BIN" "${KR[@]}" "$TMP/km-$1" 2>&1); rc=$?
        [ $rc -eq 1 ] && [ "$out" = "deltafin run: $TMP/km-$1/config.json: field \"$1\" = $shown is out of range: expected an integer from $3 to 2147483647; fix the value in the file" ] \
            && ok || bad "kimi-mini config.json $1 $2: rc $rc (want 1): $out"
    done
    kcfg km-x n_routed_experts 1.5
    out=$("$BIN" "${KR[@]}" "$TMP/km-x" 2>&1); rc=$?
    [ $rc -eq 1 ] && [ "$out" = "deltafin run: $TMP/km-x/config.json: field \"n_routed_experts\" must be an integer (got 1.5)" ] \
        && ok || bad "kimi-mini config.json n_routed_experts 1.5: rc $rc: $out"
    for k in 7 12; do
        kcfg "km-fk$k" first_k_dense_replace $k
        out=$("$BIN" "${KR[@]}" "$TMP/km-fk$k" 2>&1); rc=$?
        [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin run: $TMP/km-fk$k/config\.json: first_k_dense_replace $k > num_hidden_layers 6: .*at most num_hidden_layers" \
            && ! echo "$out" | grep -q "not a routed expert weight" && [ "$(echo "$out" | wc -l)" -eq 1 ] && ok || bad "kimi-mini first_k_dense_replace $k: rc $rc: $out"
    done
    # within the layers but over a layer that holds routed experts: the loader names the layer and the field
    kcfg km-fk6 first_k_dense_replace 6
    out=$("$BIN" "${KR[@]}" "$TMP/km-fk6" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "layer 1 holds routed expert tensors, but config.json makes it a dense layer (first_k_dense_replace 6, num_hidden_layers 6): fix config.json" \
        && ok || bad "kimi-mini first_k_dense_replace 6: rc $rc: $out"
    # kimi_linear: the field is named as the file spells it (num_experts, model_max_length), with the same bounds
    for fv in "num_experts -5 0" "num_shared_experts -1 0" "model_max_length 0 1"; do
        set -- $fv
        kcfg "kl-$1" "$1" "$2" "$SRC/tests/golden/kl_bf16"
        expect 1 "kl_bf16 config.json $1 $2" "^deltafin run: $TMP/kl-$1/config\.json: field \"$1\" = $2 is out of range: expected an integer from $3 to 2147483647; fix the value in the file$" -- \
            "$BIN" "${KR[@]}" "$TMP/kl-$1"
    done
    kcfg kl-fk first_k_dense_replace 5 "$SRC/tests/golden/kl_bf16"
    expect 1 "kl_bf16 first_k_dense_replace 5" "^deltafin run: $TMP/kl-fk/config\.json: first_k_dense_replace 5 > num_hidden_layers 4: " -- "$BIN" "${KR[@]}" "$TMP/kl-fk"
fi

# ---- --max-new 0 --stats (item 13): the prompt counts as prefill, no decode tokens
expect 0 "--max-new 0 stats" "generated 0; .*prefill (0\.0*[1-9]|[1-9])[0-9.]* tok/s; decode: no decode steps;" -- \
    "${R[@]}" --prompt-ids 5 --max-new 0 --stats
# --max-new 0 prints nothing on stdout (no empty line): ids (no tokenizer), --print-ids, text; a run that generates
# prints its ids on one line, ended by a newline
for a in "$G --prompt-ids 5" "$G --prompt-ids 5 --print-ids" "$KM --prompt hi"; do
    n=$("$BIN" run --model $a --cache-dir "$TMP/cache" --quiet --max-new 0 2>/dev/null | wc -c)
    [ "$n" -eq 0 ] && ok || bad "run --model $a --max-new 0: $n bytes on stdout, want none"
done
"${R[@]}" --prompt-ids 5 --max-new 2 >"$TMP/out2" 2>/dev/null
[ "$(wc -l <"$TMP/out2")" -eq 1 ] && [ "$(tail -c 1 "$TMP/out2" | od -An -c | tr -d ' ')" = '\n' ] && ok ||
    bad "run --max-new 2: want one line of ids ended by a newline, got: $(od -c "$TMP/out2" | head -3)"

# ---- native model: --spine (item 7), a broken tokenizer.json (item 9), dense description (item 18)
"$BIN" convert "$KD" "$TMP/draft" --quiet || bad "convert draft"
expect 2 "--spine with a native model" "--spine applies only when converting" -- \
    "$BIN" run --model "$TMP/draft" --spine int8 --prompt-ids 1,2 --max-new 1
expect 0 "dense model description" "no routed experts \(dense\)" -- "$BIN" run --model "$TMP/draft" --prompt-ids 1,2 --max-new 1
# a dense model's --ram-budget error sums spine, KV cache, other and store tables, with no expert-cache term (fresh-user trial)
out=$("$BIN" run --model "$TMP/draft" --prompt-ids 1,2 --max-new 1 --ram-budget 1K 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -Eq "^deltafin run: --ram-budget 1\.0 KiB is too small for .*: spine .* \+ store tables [0-9.]+ [KMG]iB = [0-9]+ bytes" \
    && ! echo "$out" | grep -q "expert cache" && ok || bad "dense model --ram-budget 1K: rc $rc $out"
cp -r "$TMP/draft" "$TMP/badtok"; echo '{}' > "$TMP/badtok/tokenizer.json"
expect 1 "run --prompt with tokenizer.json = {}" "tokenizer\.json: " -- "$BIN" run --model "$TMP/badtok" --prompt hi --quiet
expect 0 "run --prompt-ids with a broken tokenizer" "tokenizer ERROR \(" -- "$BIN" run --model "$TMP/badtok" --prompt-ids 1,2 --max-new 1 --print-ids
expect 1 "doctor with tokenizer.json = {}" "tokenizer FAILED: .*tokenizer\.json" -- "$BIN" doctor --model "$TMP/badtok"
expect 0 "doctor on a good native model" "tokenizer: OK" -- "$BIN" doctor --model "$TMP/draft"

# ---- text prompts: KV reserve from the token count (item 12): same minimum budget as the same ids
txt=$(printf 'hello world %.0s' $(seq 1 150))
tids=$(printf '%s' "$txt" | "$BIN" tokenize --model "$KM")
m1=$("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --quiet --prompt "$txt" --max-new 4 --ram-budget 1K 2>&1 | grep -oE '= [0-9]+ bytes' | head -1)
m2=$("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --quiet --prompt-ids "$tids" --max-new 4 --ram-budget 1K 2>&1 | grep -oE '= [0-9]+ bytes' | head -1)
[ -n "$m1" ] && [ "$m1" = "$m2" ] && ok || bad "text-prompt KV reserve: '$m1' vs ids '$m2'"

# ---- tokenize (items 8, 10)
expect 2 "tokenize --render without --chat" "--render applies only with --chat" -- "$BIN" tokenize --model "$KM" --render
expect 2 "tokenize --thinking without --chat" "--thinking applies only with --chat" -- "$BIN" tokenize --model "$KM" --thinking
out=$(echo 99999999999999999999 | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "id 99999999999999999999 at position 0 is out of range" && ok || bad "decode overflow: rc $rc $out"
out=$(echo 3,4294967297 | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "id 4294967297 at position 1 is out of range" && ok || bad "decode 2^32+1: rc $rc $out"

# ---- a corrupt conversion cache (item 11): the message names the cache dir to delete; doctor --cache-dir
"${R[@]}" --prompt-ids 1,2 --max-new 1 >/dev/null 2>&1
cdir=$(ls -d "$TMP"/cache/bf16_dsv3_groups-*-source 2>/dev/null | head -1)
if [ -n "$cdir" ]; then
    cp "$cdir/spine.bin" "$TMP/spine.bak"
    printf 'XXXX' | dd of="$cdir/spine.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
    expect 1 "run on a corrupt cache" "delete the conversion cache $cdir" -- "${R[@]}" --prompt-ids 1,2 --max-new 1
    expect 1 "doctor --cache-dir on a corrupt cache" "delete the conversion cache $cdir" -- \
        "$BIN" doctor --model "$G" --cache-dir "$TMP/cache"
    cp "$TMP/spine.bak" "$cdir/spine.bin"
    pack=$(ls "$cdir"/experts-L*.pack | tail -1)
    cp "$pack" "$TMP/pack.bak"
    printf 'XXXX' | dd of="$pack" bs=1 seek=10 conv=notrunc 2>/dev/null
    # item 15: the progress line is ended before the error
    out=$("$BIN" doctor --model "$G" --cache-dir "$TMP/cache" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: verification FAILED: .*delete the conversion cache" && ok \
        || bad "doctor corrupt pack: rc $rc $out"
    cp "$TMP/pack.bak" "$pack" # the later runs on this cache read every pack
else
    bad "no conversion cache dir under $TMP/cache"
fi
touch "$TMP/notadir"
expect 1 "--cache-dir that is a file" "not a directory \(the conversion cache root; choose another with --cache-dir" -- \
    "$BIN" run --model "$G" --cache-dir "$TMP/notadir" --prompt-ids 1 --max-new 1 --quiet

# ---- doctor and bench option messages (items 14, 22)
expect 2 "doctor --model without a value" "--model needs a value" -- "$BIN" doctor --model
expect 2 "bench io --bogus" "unknown option '--bogus'" -- "$BIN" bench io --bogus
expect 2 "bench decode --bogus" "unknown option '--bogus'" -- "$BIN" bench decode --bogus
expect 2 "bench foo" "io, decode, prefill, batch, machine, kernels, cache, store" -- "$BIN" bench foo
expect 2 "bench io --qd 100000" "--qd \"100000\": expected an integer in \[1, 1024\]" -- "$BIN" bench io --dir "$TMP" --qd 100000
expect 2 "bench io --seconds nan" "--seconds" -- "$BIN" bench io --dir "$TMP" --seconds nan
out=$("$BIN" bench io --dir "$TMP/nope" --seconds 0.1 --no-drop 2>&1); rc=$?
[ $rc -ne 0 ] && ! echo "$out" | grep -q "bench io: bench io" && echo "$out" | grep -q "$TMP/nope" && ok || bad "bench io error prefix: $out"
"$BIN" convert "$G" "$TMP/native" --quiet || bad "convert golden"
t0=$(date +%s)
out=$("$BIN" bench decode --model "$TMP/native" --ram-budget 1K --io-seconds 5 --no-drop 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "at least" && ! echo "$out" | grep -q "GB/s" && ok \
    || bad "bench decode small budget fails before the I/O benchmark: rc $rc $out"
expect 2 "bench decode --prompt-ids 1,,2" "--prompt-ids" -- "$BIN" bench decode --model "$TMP/native" --prompt-ids 1,,2
for c in io decode cache store prefill batch project machine kernels; do
    expect 0 "bench $c -h: its usage" "usage: deltafin bench" -- "$BIN" bench $c -h
done
expect 2 "bench project --hit-rate 1 without compute: no projection of 0 s (was inf)" "a decode step projects to 0 s" -- \
    "$BIN" bench project --drives 4 --gbps 5.4 --hit-rate 1
# an int8-spine model's benchmark results say NOT EXACT on stdout, where they print
"$BIN" convert "$KM" "$TMP/km8" --spine int8 --quiet 2>/dev/null
out=$("$BIN" bench prefill --model "$TMP/km8" --tokens 8 --io-seconds 0.2 --no-drop 2>/dev/null)
echo "$out" | grep -q "^  TTFT .*(NOT EXACT: int8 spine)$" && ok || bad "bench prefill int8: no NOT EXACT: $out"
out=$("$BIN" bench batch --model "$TMP/km8" --seqs 1 --tokens 2 --io-seconds 0.2 --no-drop 2>/dev/null)
echo "$out" | grep -q "^  S=1: .*(NOT EXACT: int8 spine)$" && ok || bad "bench batch int8: no NOT EXACT: $out"
out=$(env XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench batch --model "$KM" --seqs 1 --tokens 2 --io-seconds 0.2 --no-drop 2>/dev/null)
echo "$out" | grep -q "NOT EXACT" && bad "bench batch of an exact model says NOT EXACT: $out" || ok
rm -rf "$TMP/km8"
expect 0 "bench usage: --ram-budget optional" "bench decode \[--model DIR\] \[--ram-budget SIZE\]" -- "$BIN" bench --help

# ---- convert into a non-empty directory: refused unless --force; never into the checkpoint itself
"$BIN" convert "$G" "$TMP/conv" --expert-dirs "$TMP/conv,$TMP/conv2" --quiet || bad "striped convert"
expect 1 "convert into a non-empty dir" "MODEL_DIR .* is not empty" -- "$BIN" convert "$G" "$TMP/conv" --quiet
mkdir -p "$TMP/nohf"
expect 1 "convert HF_DIR without config.json" "^deltafin convert: HF_DIR $TMP/nohf has no config.json: expected a Hugging Face checkpoint directory" -- \
    "$BIN" convert "$TMP/nohf" "$TMP/conv-x"
expect 1 "convert HF_DIR missing" "^deltafin convert: HF_DIR $TMP/nohf2: No such file or directory; expected a Hugging Face" -- \
    "$BIN" convert "$TMP/nohf2" "$TMP/conv-x"
[ ! -e "$TMP/conv-x" ] && ok || bad "convert of a non-checkpoint created MODEL_DIR"
expect 0 "convert --force" "" -- "$BIN" convert "$G" "$TMP/conv" --quiet --force
# --force over a converted model with a card (README.md): the card goes with the old model; a user's README.md in a
# directory that holds no model stays
"$BIN" convert "$KM" "$TMP/card" --quiet && [ -f "$TMP/card/README.md" ] || bad "kimi-mini's convert copies its README.md"
"$BIN" convert "$G" "$TMP/card" --quiet --force && [ ! -e "$TMP/card/README.md" ] && ok || bad "convert --force kept the old model's README.md"
mkdir -p "$TMP/own" && echo mine >"$TMP/own/README.md"
expect 1 "convert into a dir with the user's README.md" "MODEL_DIR .* is not empty" -- "$BIN" convert "$G" "$TMP/own" --quiet
"$BIN" convert "$G" "$TMP/own" --quiet --force && grep -q mine "$TMP/own/README.md" && ok || bad "convert --force removed a user's README.md"
# ... and a checkpoint with a card does not replace the user's README.md: refused, the file as it was
rm -rf "$TMP/own" && mkdir -p "$TMP/own" && echo mine >"$TMP/own/README.md"
expect 1 "convert --force of a checkpoint with a card into a dir with the user's README.md" \
    "README.md is not a converted model's README.md \(--force keeps it\)" -- "$BIN" convert "$KM" "$TMP/own" --quiet --force
[ "$(cat "$TMP/own/README.md")" = mine ] && ok || bad "the user's README.md was replaced: $(head -2 "$TMP/own/README.md")"
rm -rf "$TMP/card" "$TMP/own"
ls "$TMP/conv" | grep -q '\.s0\.pack' && bad "convert --force left stale stripe packs" || ok
expect 2 "convert into the checkpoint dir" "checkpoint directory itself" -- "$BIN" convert "$G" "$G" --force
# convert --threads: what it controls and its range in --help; a bad value (not digits only, or out of range) names
# the flag, the value and the range, before anything is read or written
"$BIN" convert --help | grep -q -- "--threads N          threads that write the expert packs, each one MoE layer at a time: an integer" \
    && "$BIN" convert --help | grep -q "from 0 to 1024; 0 (the default) = one per core. At most 16 run" && ok || bad "convert --help: --threads"
for v in abc -1 1025 "" " 3" +3 1.5 99999999999999999999; do
    expect 2 "convert --threads [$v]" "^deltafin convert: --threads \"$(printf '%s' "$v" | sed 's/[.+]/\\&/g')\": expected the number of threads that write the expert packs, an integer from 0 to 1024 \(0 = one per core, the default\)$" -- \
        "$BIN" convert "$G" "$TMP/conv-t" --threads "$v"
done
[ ! -e "$TMP/conv-t" ] && ok || bad "convert with a bad --threads created MODEL_DIR"
expect 0 "convert --threads 1024 (at most 16 and one per MoE layer run)" "" -- "$BIN" convert "$G" "$TMP/conv-t" --threads 1024 --quiet
expect 2 "setup --threads 1025" "^deltafin setup: --threads \"1025\": expected an integer in \[0, 1024\]" -- "$BIN" setup a/b --threads 1025
expect 0 "run after convert --force" "" -- "$BIN" run --model "$TMP/conv" --prompt-ids 1,2 --max-new 2 --print-ids --quiet

# ---- issue 11 item 11: a mistyped --model path says the directory does not exist
expect 1 "run --model typo, text prompt" "^deltafin run: --model $TMP/kimi-mnii: no such directory" -- \
    "$BIN" run --model "$TMP/kimi-mnii" --prompt hi
expect 1 "run --model typo, ids" "^deltafin run: --model $TMP/kimi-mnii: no such directory" -- \
    "$BIN" run --model "$TMP/kimi-mnii" --prompt-ids 1
expect 1 "run --model a file" "^deltafin run: --model $TMP/notadir is not a directory" -- "$BIN" run --model "$TMP/notadir" --prompt hi
expect 1 "serve --model typo" "^deltafin serve: --model $TMP/kimi-mnii: no such directory" -- \
    "$BIN" serve --model "$TMP/kimi-mnii" --port 0
# serve: nothing silently changed (new-user trial item 1): --ctx 0 rejected, --ctx above the model maximum and
# --keepalive above --timeout / 2 noted, --prefetch / --prefault as in run, a bad --draft named as the problem
expect 2 "serve --ctx 0" "^deltafin serve: --ctx \"0\": expected an integer in \[1, " -- "$BIN" serve --model "$KM" --ctx 0 --port 0
expect 2 "serve --prefetch bogus" '^deltafin serve: --prefetch "bogus": expected auto, on, ungated or off' -- \
    "$BIN" serve --model "$KM" --prefetch bogus --port 0
expect 2 "serve --prefault ungated" '^deltafin serve: --prefault "ungated": expected auto, on or off' -- \
    "$BIN" serve --model "$KM" --prefault ungated --port 0
# a mistyped --draft path: said at once, before the model is opened (no configuration line)
out=$("$BIN" serve --model "$KM" --draft "$TMP/nope" --port 0 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "deltafin serve: --draft $TMP/nope: no such directory (expected a draft model directory, ngram or off)" ] \
    && ok || bad "serve --draft /nope: rc $rc $out"
expect 1 "run --draft /nope: before the model is opened" "^deltafin run: --draft $TMP/nope: no such directory" -- \
    "$BIN" run --model "$KM" --draft "$TMP/nope" --prompt-ids 5 --max-new 1
# a directory that is no draft model: the target opens (the --ctx note), then the draft model's error
mkdir -p "$TMP/nodraft"
out=$("$BIN" serve --model "$KM" --draft "$TMP/nodraft" --ctx 1000000 --prefetch ungated --prefault off --threads 1 --port 0 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin serve: cannot use the draft model: --draft $TMP/nodraft: " \
    && ! echo "$out" | grep -q "cannot open model" && ok || bad "serve --draft (not a model): rc $rc $out"
echo "$out" | grep -qE "^deltafin serve: note: --ctx 1000000 is more than the model's maximum of [0-9]+ positions; using [0-9]+$" \
    && ok || bad "serve --ctx 1000000: no note: $out"
# under a RAM budget, --ctx at the model's maximum is kept as asked, and above it lowered to that maximum
mx=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["max_position_embeddings"])' "$KM/config.json")
out=$(timeout 20 "$BIN" serve --model "$KM" --ram-budget 2G --ctx "$mx" --port 0 2>&1 | grep -m1 "listening on" ; true)
echo "$out" | grep -q ", context $mx, listening on" && ok || bad "serve --ram-budget 2G --ctx $mx: $out"
out=$(timeout 20 "$BIN" serve --model "$KM" --ram-budget 2G --ctx $((mx + 1)) --port 0 2>&1 | grep -m1 -E "note: --ctx|listening on" ; true)
echo "$out" | grep -q "^deltafin serve: note: --ctx $((mx + 1)) is more than the model's maximum of $mx positions; using $mx$" \
    && ok || bad "serve --ram-budget 2G --ctx $((mx + 1)): $out"
# settings with no effect are said once (new-user trial item 4): --gpu-budget with a CPU backend, --threads above
# the CPUs online
ncpu=$(getconf _NPROCESSORS_ONLN)
out=$("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --quiet --prompt-ids 1,2 --max-new 1 --backend cpu --gpu-budget 4G \
      --threads $((ncpu + 1)) 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c "^deltafin: warning: --gpu-budget has no effect with backend cpu")" = 1 ] \
    && [ "$(echo "$out" | grep -c "^deltafin: warning: --threads $((ncpu + 1)) is more than the $ncpu CPUs online; compute threads beyond the cores slow decoding$")" = 1 ] \
    && ok || bad "no-effect warnings: rc $rc: $out"
out=$("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --quiet --prompt-ids 1,2 --max-new 1 --backend cpu --threads 1 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && ! echo "$out" | grep -q "warning" && ok || bad "warning without cause: rc $rc: $out"
# convert on a directory that is already native: said so, with how to use it (new-user trial item 7)
"$BIN" convert "$G" "$TMP/native_g" --quiet >/dev/null 2>&1
expect 1 "convert <native dir>" "^deltafin convert: $TMP/native_g is already a native deltafin model directory \(manifest.json\): nothing to convert; use it directly with --model $TMP/native_g" -- \
    "$BIN" convert "$TMP/native_g" "$TMP/native_g2"
[ ! -e "$TMP/native_g2" ] && ok || bad "convert <native dir> created $TMP/native_g2"
expect 1 "serve --keepalive above timeout/2" "^deltafin serve: note: --keepalive 40 is more than --timeout 10 / 2; keep-alives are sent every 5 s" -- \
    "$BIN" serve --model "$TMP/kimi-mnii" --keepalive 40 --timeout 10 --port 0

# ---- issue 11 item 12: prompts from a file or stdin, prefill progress, trained-positions warning
printf 'The malloc() function\nallocates' >"$TMP/p.txt"
RK=("$BIN" run --model "$KM" --cache-dir "$TMP/cache" --quiet --max-new 6 --print-ids)
ref=$("${RK[@]}" --prompt "$(printf 'The malloc() function\nallocates')" 2>&1)
a=$("${RK[@]}" --prompt-file "$TMP/p.txt" 2>&1)
b=$("${RK[@]}" --prompt - <"$TMP/p.txt" 2>&1)
c=$("${RK[@]}" --prompt-file - <"$TMP/p.txt" 2>&1)
[[ "$ref" =~ ^[0-9]+(,[0-9]+){5}$ ]] && [ "$a" = "$ref" ] && [ "$b" = "$ref" ] && [ "$c" = "$ref" ] && ok \
    || bad "--prompt-file / --prompt - / --prompt-file - differ from --prompt: '$ref' '$a' '$b' '$c'"
expect 2 "--prompt with --prompt-file" "exactly one of --prompt TEXT, --prompt-file FILE or --prompt-ids" -- \
    "${RK[@]}" --prompt hi --prompt-file "$TMP/p.txt"
expect 1 "--prompt-file missing" "^deltafin run: --prompt-file $TMP/nope.txt: No such file" -- "${RK[@]}" --prompt-file "$TMP/nope.txt"
expect 0 "run --help documents --prompt-file" "--prompt-file FILE" -- "$BIN" run --help
# a model card that says the model was trained on 512 positions (as kimi-mini's, docs/model-card.md)
mkdir -p "$TMP/km-card"
for f in "$KM"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$TMP/km-card/"; done
rm -f "$TMP/km-card/README.md" # a link to the real card: replace, never write through it
printf -- '---\nlicense: mit\ntrained_positions: 512\n---\n# kimi-mini\n' >"$TMP/km-card/README.md"
printf 'The history of the city is long and varied. %.0s' $(seq 1 130) >"$TMP/long.txt"
n_long=$("$BIN" tokenize --model "$KM" <"$TMP/long.txt" | tr , '\n' | grep -c .)
"$BIN" run --model "$TMP/km-card" --cache-dir "$TMP/cache" --prompt-ids 1 --max-new 1 --quiet >/dev/null 2>&1 # convert first
t0=$(date +%s%N)
"$BIN" run --model "$TMP/km-card" --cache-dir "$TMP/cache" --prompt-file "$TMP/long.txt" --max-new 1 --threads 1 >/dev/null 2>"$TMP/long.err"; rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -eq 0 ] && [ "$n_long" -gt 512 ] && grep -q "^deltafin run: warning: the prompt has $n_long tokens but km-card was trained on 512 positions (model card $TMP/km-card/README.md" "$TMP/long.err" \
    && ok || bad "trained-positions warning ($n_long tokens): rc $rc, $(cat "$TMP/long.err")"
# the model card travels with a conversion: the native directory warns the same
"$BIN" convert "$TMP/km-card" "$TMP/km-card-native" >/dev/null 2>&1 && cmp -s "$TMP/km-card/README.md" "$TMP/km-card-native/README.md" \
    && "$BIN" run --model "$TMP/km-card-native" --prompt-file "$TMP/long.txt" --max-new 1 --quiet >/dev/null 2>"$TMP/long2.err" \
    && grep -q "^deltafin run: warning: the prompt has $n_long tokens but km-card was trained on 512 positions (model card $TMP/km-card-native/README.md" "$TMP/long2.err" \
    && ok || bad "trained-positions warning on the converted model: $(cat "$TMP/long2.err")"
# the prefill of ~1400 tokens on one thread takes seconds (2-3 s on the 2-core dev VM). To a file, progress lines
# come every 5 s, the first at 5 s: none under 5 s (then no total either), lines and the total from 6 s on
if [ "$ms" -ge 6000 ]; then
    grep -q "prefill: $n_long tokens, layers [0-9]* / [0-9]*, [0-9.]* s" "$TMP/long.err" &&
        grep -q "prefill: $n_long tokens in [0-9.]* s ([0-9.]* tok/s)$" "$TMP/long.err" && ok || bad "no prefill progress ($ms ms): $(cat "$TMP/long.err")"
elif [ "$ms" -lt 4500 ]; then
    ! grep -q "prefill:" "$TMP/long.err" && ok || bad "prefill progress before 5 s ($ms ms): $(cat "$TMP/long.err")"
else echo "note: the long prefill took $ms ms, near the first line's 5 s: progress not checked"; ok; fi
"$BIN" run --model "$TMP/km-card" --cache-dir "$TMP/cache" --prompt-file "$TMP/long.txt" --max-new 1 --threads 1 --quiet >/dev/null 2>"$TMP/long.err"
! grep -q "prefill:" "$TMP/long.err" && grep -q "warning: the prompt has" "$TMP/long.err" && ok || bad "--quiet: no progress, still the warning: $(cat "$TMP/long.err")"
"$BIN" run --model "$TMP/km-card" --cache-dir "$TMP/cache" --prompt "short prompt" --max-new 1 >/dev/null 2>"$TMP/short.err"
! grep -qE "warning|prefill:" "$TMP/short.err" && ok || bad "short prompt: no warning, no progress: $(cat "$TMP/short.err")"
# a copy without the card: the config's max_position_embeddings (131072) decides, so no warning
mkdir -p "$TMP/km-nocard"
for f in "$KM"/*; do [ "$(basename "$f")" = README.md ] || ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$TMP/km-nocard/"; done
"$BIN" run --model "$TMP/km-nocard" --cache-dir "$TMP/cache" --prompt-file "$TMP/long.txt" --max-new 1 --quiet >/dev/null 2>"$TMP/nocard.err"
! grep -q "warning" "$TMP/nocard.err" && ok || bad "without a card (max_position_embeddings 131072): no warning: $(cat "$TMP/nocard.err")"

# ---- fresh-user items: bench and a Hugging Face checkpoint, unknown flags last, a directory that is no model,
# serve's help, the CUDA backend without a GPU, DF_BACKEND, the top-level help, doctor's model line
expect 0 "bench batch --model <HF checkpoint> (converted once into the conversion cache)" "sequence 0's tokens identical at every S: yes" -- \
    env XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench batch --model "$KM" --seqs 1,2 --tokens 2 --io-seconds 0.1 --no-drop
# one sequence: every expert read serves one row (top-k picks, k distinct experts)
expect 0 "bench batch: rows per expert read at S=1" "S=1: .*, rows per expert read 1\.00$" -- \
    env XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench batch --model "$KM" --seqs 1 --tokens 2 --io-seconds 0.1 --no-drop
# bench decode / prefill take a Hugging Face checkpoint as run does (converted once into the conversion cache),
# and --prefetch / --prefault as run does
expect 0 "bench decode --model <HF checkpoint> --prefetch off --prefault off" "storage bound" -- \
    env XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench decode --model "$KM" --tokens 2 --io-seconds 0.1 --no-drop --prefetch off --prefault off
out=$(XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench decode --model "$KM" --tokens 2 --io-seconds 0.1 --no-drop --prefetch off --prefault off 2>&1)
echo "$out" | grep -q "prefetch off, prefault off, .*model: $KM converted into the conversion cache" && ok || bad "bench decode HF + flags: $out"
expect 0 "bench prefill --model <HF checkpoint> --prefetch ungated" "TTFT" -- \
    env XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench prefill --model "$KM" --tokens 4 --io-seconds 0.1 --no-drop --prefetch ungated --prefault on
for b in decode prefill; do
    expect 2 "bench $b --prefetch maybe" "^deltafin bench $b: --prefetch \"maybe\": expected auto, on, ungated or off" -- "$BIN" bench $b --prefetch maybe
    expect 2 "bench $b --prefault ungated" "^deltafin bench $b: --prefault \"ungated\": expected auto, on or off" -- "$BIN" bench $b --prefault ungated
done
# --heat FILE: a directory, or a file in a directory that does not exist, is refused at open naming the flag
expect 1 "run --heat <missing dir>/h.bin" "deltafin run: --heat $TMP/nodir/h.bin: the directory $TMP/nodir does not exist" -- \
    "${R[@]}" --prompt-ids 1 --max-new 1 --ram-budget 64M --heat "$TMP/nodir/h.bin"
expect 1 "run --heat <directory>" "deltafin run: --heat $TMP is a directory: expected a file" -- \
    "${R[@]}" --prompt-ids 1 --max-new 1 --ram-budget 64M --heat "$TMP"
expect 0 "run --heat <new file>" "" -- "${R[@]}" --prompt-ids 1 --max-new 1 --ram-budget 64M --heat "$TMP/h.bin"
[ -s "$TMP/h.bin" ] && ok || bad "run --heat $TMP/h.bin: not written"
mkdir -p "$TMP/nomodel"
expect 1 "bench prefill --model <not a model>" "^deltafin bench prefill: $TMP/nomodel: neither manifest.json \(native model\) nor config.json" -- \
    "$BIN" bench prefill --model "$TMP/nomodel"
# bench decode without --model: the embedded kimi-mini (a Hugging Face checkpoint) through the conversion cache, as run
expect 0 "bench decode without --model" "model \(no --model\): embedded kimi-mini.*converted into the conversion cache" -- \
    env DELTAFIN_REGISTRY="$TMP/no-registry.json" XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench decode --tokens 2 --io-seconds 0.1 --no-drop
for b in prefill batch project machine kernels decode cache store io; do
    expect 2 "bench $b --bogus (last)" "^deltafin bench $b: unknown option '--bogus' \(see deltafin bench $b --help\)$" -- "$BIN" bench $b --bogus
done
expect 2 "bench prefill --tokens without a value" "^deltafin bench prefill: --tokens needs a value" -- "$BIN" bench prefill --tokens
expect 2 "bench kernels --T without a value" "^deltafin bench kernels: --T needs a value" -- "$BIN" bench kernels --T
expect 1 "run --model <not a model> --prompt" "^deltafin run: $TMP/nomodel: neither manifest.json \(native model\) nor config.json \(Hugging Face checkpoint\) found" -- \
    "$BIN" run --model "$TMP/nomodel" --prompt hi
out=$("$BIN" serve --help 2>&1)
! echo "$out" | grep -q -- "--draft-sample" && echo "$out" | grep -q -- "--draft-max" && ok || bad "serve --help lists --draft-sample"
expect 0 "run --help lists --draft-sample" "--draft-sample on\|off" -- "$BIN" run --help
out=$("$BIN" run --model "$G" --cache-dir "$TMP/cache" --backend cuda --prompt-ids 1 --max-new 1 --quiet 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "note: --backend cuda runs here: the no-GPU message is not checked"; ok; ok
else
    [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin run: backend \"cuda\": .*; use --backend cpu (or auto, which picks the CPU here)$" \
        && ok || bad "run --backend cuda without a GPU: rc $rc $out"
    out=$("$BIN" serve --model "$G" --backend cuda --port 0 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "backend \"cuda\": .*; use --backend cpu (or auto, which picks the CPU here)$" \
        && ! echo "$out" | grep -q "(invalid argument)" && ok || bad "serve --backend cuda without a GPU: rc $rc $out"
fi
expect 2 "DF_BACKEND=bogus run" "^deltafin run: environment variable DF_BACKEND=\"bogus\" \(the alias of --backend\): expected auto, .*unset it" -- \
    env DF_BACKEND=bogus "${R[@]}" --prompt-ids 1 --max-new 1
expect 0 "DF_BACKEND=bogus, --backend cpu decides" "" -- env DF_BACKEND=bogus "${R[@]}" --prompt-ids 1 --max-new 1 --backend cpu
out=$(DF_BACKEND=bogus "$BIN" serve --model "$G" --port 0 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "environment variable DF_BACKEND=\"bogus\" (the alias of --backend)" && ! echo "$out" | grep -q "(invalid argument)" \
    && ok || bad "DF_BACKEND=bogus serve: rc $rc $out"
expect 2 "DF_PREFETCH=maybe" "environment variable DF_PREFETCH=\"maybe\": expected 1, on, 0, off or ungated \(the alias of --prefetch on\|off\|ungated\)" -- \
    env DF_PREFETCH=maybe "${R[@]}" --prompt-ids 1 --max-new 1
expect 2 "DF_PREFAULT=yes" "environment variable DF_PREFAULT=\"yes\": expected 1, on, 0 or off \(the alias of --prefault on\|off\)" -- \
    env DF_PREFAULT=yes "${R[@]}" --prompt-ids 1 --max-new 1 --ram-budget 64M
# the flag wins: with --prefetch / --prefault given, their environment aliases are not read
env DF_PREFETCH=maybe DF_PREFAULT=yes "${R[@]}" --prompt-ids 1 --max-new 1 --ram-budget 64M --prefetch on --prefault off \
    >/dev/null 2>"$TMP/flagwins.err" && ok || bad "the flags with bad env aliases: $(cat "$TMP/flagwins.err")"
expect 2 "run --prefault maybe" "--prefault \"maybe\": expected auto, on or off" -- "${R[@]}" --prompt-ids 1 --prefault maybe
# the configuration line shows the resolved prefault: on by default, off from --prefault off or DF_PREFAULT=0 / off,
# --prefault on over DF_PREFAULT=off; every documented DF_PREFAULT value is accepted
RC=("$BIN" run --model "$G" --cache-dir "$TMP/cache" --prompt-ids 1 --max-new 1 --ram-budget 64M)
expect 0 "config line: prefault on (default)" ", prefetch o[nf]*, prefault on, " -- "${RC[@]}"
expect 0 "config line: --prefault off" ", prefault off, " -- "${RC[@]}" --prefault off
for v in 0 off; do expect 0 "config line: DF_PREFAULT=$v" ", prefault off, " -- env DF_PREFAULT=$v "${RC[@]}"; done
for v in 1 on; do expect 0 "config line: DF_PREFAULT=$v" ", prefault on, " -- env DF_PREFAULT=$v "${RC[@]}"; done
expect 0 "config line: --prefault on over DF_PREFAULT=off" ", prefault on, " -- env DF_PREFAULT=off "${RC[@]}" --prefault on
expect 0 "deltafin --help lists bench batch" "bench .*decode, prefill, batch," -- "$BIN" --help
out=$("$BIN" doctor --model "$TMP/draft" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^model: kimi-mini-draft (" && ! echo "$out" | grep -q "model: model" && ok || bad "doctor model line: rc $rc $out"
# list prints its table only: nothing on stderr (no configuration line), with installed models (a full one, a
# streamed one) and the embedded model under its own heading
cp -r "$TMP/native" "$TMP/streamed"; echo '{}' >"$TMP/streamed/stream.json"
cat >"$TMP/reg.json" <<EOF
{"default": "test/full", "models": [
 {"repo": "test/full", "revision": "main", "mirror": "http://127.0.0.1:1", "dir": "$TMP", "model": "$TMP/native", "mode": "full", "bytes": 1, "installed": 1},
 {"repo": "test/streamed", "revision": "main", "mirror": "http://127.0.0.1:1", "dir": "$TMP", "model": "$TMP/streamed", "mode": "stream", "bytes": 1, "installed": 1}]}
EOF
out=$(DELTAFIN_REGISTRY="$TMP/reg.json" "$BIN" list 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/err" ] && echo "$out" | grep -q "^\* test/full  *full " && echo "$out" | grep -q "^  test/streamed  *streamed" \
    && echo "$out" | grep -q "embedded kimi-mini" && echo "$out" | grep -q "^built-in model (not in the registry):$" \
    && ! echo "$out" | grep -q "backend" \
    && ok || bad "list: rc $rc, stdout: $out; stderr: $(cat "$TMP/err")"

# ---- the registry's default model is missing (moved, deleted, unmounted): an error naming it, not the embedded model
GONE="$TMP/gone-install"
printf '{"default":"test/gone","models":[{"repo":"test/gone","revision":"main","mirror":"http://x","dir":"%s","model":"%s/native","mode":"full","bytes":1,"installed":1}]}' \
    "$GONE" "$GONE" > "$TMP/gone.json"
expect 1 "run: default model missing" "the default model test/gone .*is missing: $GONE/native has no manifest.json \(no such directory\).*deltafin setup test/gone" -- \
    env DELTAFIN_REGISTRY="$TMP/gone.json" "$BIN" run --prompt hi --max-new 1
expect 1 "doctor: default model missing" "deltafin doctor: the default model test/gone" -- env DELTAFIN_REGISTRY="$TMP/gone.json" "$BIN" doctor
expect 1 "bench decode: default model missing" "deltafin bench decode: the default model test/gone" -- env DELTAFIN_REGISTRY="$TMP/gone.json" "$BIN" bench decode
# ---- a dangling default: "default" names a repo the registry has no entry for (removed by editing the file): the
# commands that fall back to the default say so, naming the entry and the fixes (setup, --model), exit 1, and never
# run the embedded model instead; list shows it after the installed models and marks no other model as the default
printf '{"default":"test/removed","models":[{"repo":"test/other","revision":"main","mirror":"http://x","dir":"%s","model":"%s/native","mode":"full","bytes":1,"installed":1}]}' \
    "$GONE" "$GONE" > "$TMP/dangling.json"
DANG="the registry $TMP/dangling.json names test/removed as the default model, but has no entry for it \(the entry was removed, e.g. by editing the file\): install it again with .deltafin setup test/removed. \(it becomes the default\), make an installed model the default with .deltafin setup OTHER/REPO. \(.deltafin list. shows them\), pass --model DIR, or remove the \"default\" key from $TMP/dangling.json to use the embedded model$"
echo x >"$TMP/warm-prompts.txt"
for c in "run --prompt hi --max-new 1" "doctor" "bench decode" "bench prefill" "bench batch" "warm --prompts $TMP/warm-prompts.txt"; do
    expect 1 "$c: dangling default" "^deltafin ${c%% -*}: $DANG" -- env DELTAFIN_REGISTRY="$TMP/dangling.json" "$BIN" $c
done
expect 1 "tokenize: dangling default" "^deltafin tokenize: $DANG" -- sh -c 'echo hi | "$@"' sh env DELTAFIN_REGISTRY="$TMP/dangling.json" "$BIN" tokenize
expect 1 "serve: dangling default" "^deltafin serve: $DANG" -- env DELTAFIN_REGISTRY="$TMP/dangling.json" "$BIN" serve --port 0
out=$(DELTAFIN_REGISTRY="$TMP/dangling.json" "$BIN" list 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^\* test/removed: the default model, but the registry has no entry for it .*\`deltafin setup test/removed\` installs it again" \
    && echo "$out" | grep -q "^  test/other " && echo "$out" | grep -q "^  embedded kimi-mini " && [ "$(echo "$out" | grep -c '^\*')" = 1 ] \
    && ok || bad "list with a dangling default: rc $rc: $out"
# ---- a failed write to stdout is an error (exit 1, naming the cause), not a success
if [ -w /dev/full ]; then
    expect 1 "run --print-ids > /dev/full" "deltafin run: cannot write the output: No space left on device" -- \
        sh -c '"$@" > /dev/full' sh "${R[@]}" --prompt-ids 1,2 --max-new 2 --print-ids
    expect 1 "tokenize > /dev/full" "deltafin tokenize: cannot write the output: No space left on device" -- \
        sh -c 'echo hi | "$@" > /dev/full' sh "$BIN" tokenize --model "$KM"
    expect 1 "list > /dev/full" "deltafin list: cannot write the output: No space left on device" -- \
        sh -c '"$@" > /dev/full' sh env DELTAFIN_REGISTRY="$TMP/gone.json" "$BIN" list
fi

# ---- review of user-facing defects: --profile implies --stats (checked at parsing, nothing after generation);
# --opt=value in every command; an unknown option is one line (with a did-you-mean); --ram-budget 0 = no budget;
# notes for flags without effect; tokenize / bench prefill without --model; `help COMMAND`; help texts
out=$("${R[@]}" --prompt-ids 1,2 --max-new 2 --profile 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^stats: prompt 2 tokens, generated 2;" && echo "$out" | grep -q "^profile: total" \
    && ! echo "$out" | grep -q "with --stats only" && ok || bad "run --profile without --stats: rc $rc $out"
expect 0 "run --help: --profile implies --stats" "implies --stats" -- "$BIN" run --help
a=$("${R[@]}" --prompt-ids=1,2,3 --max-new=4 --print-ids --temperature=0.8 --top-k=20 --seed=7 2>&1)
b=$("${R[@]}" --prompt-ids 1,2,3 --max-new 4 --print-ids --temperature 0.8 --top-k 20 --seed 7 2>&1)
[[ "$a" =~ ^[0-9]+(,[0-9]+){3}$ ]] && [ "$a" = "$b" ] && ok || bad "run --opt=value: '$a' vs '$b'"
expect 2 "run --max-new=abc" '^deltafin run: --max-new "abc": expected an integer' -- "${R[@]}" --prompt-ids 1 --max-new=abc
expect 2 "run --max-new= (empty value)" '^deltafin run: --max-new "": expected an integer' -- "${R[@]}" --prompt-ids 1 --max-new=
# the value of --prompt is free text: "--x=1" stays whole (the same ids as its tokens given as ids)
xids=$(printf -- '--x=1' | "$BIN" tokenize --model "$KM")
a=$("${RK[@]}" --prompt "--x=1" 2>&1); b=$("${RK[@]}" --prompt-ids "$xids" 2>&1)
[ -n "$xids" ] && [[ "$a" =~ ^[0-9]+(,[0-9]+){5}$ ]] && [ "$a" = "$b" ] && ok || bad "--prompt '--x=1': '$a' vs ids $xids: '$b'"
expect 2 "bench io --dir=D --size=6000" "^deltafin bench io: --size 6000 bytes: O_DIRECT reads must be a multiple of 4096" -- \
    "$BIN" bench io --dir="$TMP" --size=6000
expect 2 "serve --ctx=0" "^deltafin serve: --ctx \"0\": expected an integer" -- "$BIN" serve --model="$KM" --ctx=0 --port=0
out=$("${R[@]}" --prompt-ids 1 --foo 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin run: unknown option '--foo' (see deltafin run --help)" ] && ok || bad "run --foo: rc $rc: $out"
out=$("${R[@]}" --prompt-ids 1 --tempreature 0.5 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin run: unknown option '--tempreature', did you mean '--temperature'? (see deltafin run --help)" ] \
    && ok || bad "run --tempreature: rc $rc: $out"
out=$("${R[@]}" --prompt-ids 1 --draft-mx 4 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin run: unknown option '--draft-mx', did you mean '--draft-max'? (see deltafin run --help)" ] \
    && ok || bad "run --draft-mx: rc $rc: $out"
out=$("${R[@]}" --prompt-ids 1 --temp 0.5 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin run: unknown option '--temp', did you mean '--temperature'? (see deltafin run --help)" ] \
    && ok || bad "run --temp (a prefix of one option): rc $rc: $out"
out=$("$BIN" runn --prompt-ids 1 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin: unknown command 'runn', did you mean 'run'? (see deltafin --help)" ] && ok || bad "deltafin runn: rc $rc: $out"
out=$("$BIN" serve --mock --prot 8000 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin serve: unknown option '--prot', did you mean '--port'? (see deltafin serve --help)" ] \
    && ok || bad "serve --prot: rc $rc: $out"
out=$("$BIN" tokenize --bogus </dev/null 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "deltafin tokenize: unknown option '--bogus' (see deltafin tokenize --help)" ] && ok || bad "tokenize --bogus: rc $rc: $out"
for c in convert doctor list setup warm synth; do
    out=$("$BIN" $c --bogus 2>&1); rc=$?
    [ $rc -eq 2 ] && [ "$out" = "deltafin $c: unknown option '--bogus' (see deltafin $c --help)" ] && ok || bad "$c --bogus: rc $rc: $out"
done
# --ram-budget 0: no budget (as leaving it out), said so on the configuration line; a bad size names the forms
expect 0 "run --ram-budget 0" ", budget unlimited," -- "$BIN" run --model "$G" --cache-dir "$TMP/cache" --prompt-ids 1 --max-new 1 --ram-budget 0
expect 2 "run --ram-budget 0x" '^deltafin run: --ram-budget "0x": expected a size such as 4G or 512M .*or 0 for no budget' -- \
    "${R[@]}" --prompt-ids 1 --ram-budget 0x
expect 0 "run --help: --ram-budget default 0" "--ram-budget SIZE .*default 0: unlimited" -- "$BIN" run --help
expect 0 "bench decode --ram-budget 0" "ram budget unlimited" -- \
    "$BIN" bench decode --model "$TMP/native" --ram-budget 0 --tokens 2 --io-seconds 0.1 --no-drop
# flags that change nothing: one note each on stderr, the run still succeeds; none when they apply
out=$("${R[@]}" --prompt-ids 1 --max-new 1 --top-k 5 --seed 3 --draft-max 4 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c "note")" = 2 ] \
    && echo "$out" | grep -q "^deltafin run: note: --top-k, --seed have no effect at --temperature 0 (greedy decoding" \
    && echo "$out" | grep -q "^deltafin run: note: --draft-max has no effect without --draft DIR|ngram (speculative decoding is off)$" \
    && ok || bad "no-effect notes: rc $rc: $out"
out=$("${R[@]}" --prompt-ids 1 --max-new 1 --top-p 0.9 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^deltafin run: note: --top-p has no effect at --temperature 0" && ok || bad "--top-p note: rc $rc: $out"
out=$("${R[@]}" --prompt-ids 1 --max-new 2 --top-k 5 --seed 3 --temperature 0.7 --draft ngram --draft-max 4 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && ! echo "$out" | grep -q "note" && ok || bad "notes where the flags apply: rc $rc: $out"
expect 1 "serve --draft-window without --draft: a note" "^deltafin serve: note: --draft-window has no effect without --draft" -- \
    "$BIN" serve --model "$TMP/kimi-mnii" --draft-window 64 --port 0
# tokenize without --model: the default model, as run (the embedded kimi-mini here); --help on stdout, exit 0
a=$(printf 'Hello, world' | env DELTAFIN_REGISTRY="$TMP/no-registry.json" "$BIN" tokenize 2>&1)
b=$(printf 'Hello, world' | "$BIN" tokenize --model "$KM" 2>&1)
[[ "$a" =~ ^[0-9]+(,[0-9]+)+$ ]] && [ "$a" = "$b" ] && ok || bad "tokenize without --model: '$a' vs --model kimi-mini '$b'"
expect 1 "tokenize: default model missing" "^deltafin tokenize: the default model test/gone" -- \
    env DELTAFIN_REGISTRY="$TMP/gone.json" "$BIN" tokenize
out=$("$BIN" tokenize --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^usage: deltafin tokenize" && ok || bad "tokenize --help on stdout: rc $rc: $out"
# bench prefill without --model: the default model, as bench decode / batch; bench --help says so
expect 0 "bench prefill without --model" "model \(no --model\): embedded kimi-mini.*converted into the conversion cache" -- \
    env DELTAFIN_REGISTRY="$TMP/no-registry.json" XDG_CACHE_HOME="$TMP/xdg" "$BIN" bench prefill --tokens 4 --io-seconds 0.1 --no-drop
out=$("$BIN" bench --help 2>&1)
echo "$out" | grep -q "bench prefill \[--model DIR\]" && echo "$out" | grep -q "bench batch \[--model DIR\]" \
    && echo "$out" | grep -q "bench io --dir DIR\[,DIR2...\]" && ok || bad "bench --help: $out"
# bench io: each problem named with its flag and value
expect 2 "bench io without --dir" "^deltafin bench io: --dir DIR is required" -- "$BIN" bench io
expect 2 "bench io --dir a,,b" "^deltafin bench io: --dir \"$TMP,,$TMP\": an empty directory name" -- "$BIN" bench io --dir "$TMP,,$TMP"
# a missing directory, a file, an empty directory, one with only subdirectories: usage errors (exit 2, as every option
# error of bench), each naming the flag and the directory and saying what --dir takes and how to write files there
SUGG="; give --dir a directory of files to read, such as a model directory written by .deltafin convert. or .deltafin synth."
expect 2 "bench io --dir <missing>" "^deltafin bench io: --dir $TMP/nope: no such directory$SUGG \(write one with .deltafin synth $TMP/nope \.\.\..\)$" -- \
    "$BIN" bench io --dir "$TMP/nope"
expect 2 "bench io --dir <missing> in a list" "^deltafin bench io: --dir $TMP/nope: no such directory$SUGG" -- "$BIN" bench io --dir "$KM,$TMP/nope"
: >"$TMP/afile"
expect 2 "bench io --dir <a file>" "^deltafin bench io: --dir $TMP/afile: not a directory$SUGG$" -- "$BIN" bench io --dir "$TMP/afile"
mkdir -p "$TMP/emptydir0" "$TMP/subonly/x"
expect 2 "bench io --dir <empty>" "^deltafin bench io: --dir $TMP/emptydir0: the directory is empty, nothing to read$SUGG \(write one with .deltafin synth $TMP/emptydir0 \.\.\..\)$" -- \
    "$BIN" bench io --dir "$TMP/emptydir0" --no-drop
expect 2 "bench io --dir <subdirectories only>" "^deltafin bench io: --dir $TMP/subonly: the directory holds no file to read \(only directories or other entries\)$SUGG \(write one with .deltafin synth $TMP/subonly/synth \.\.\.. and give --dir that directory\)$" -- \
    "$BIN" bench io --dir "$TMP/subonly" --no-drop
# an empty item in a comma-separated list is refused everywhere, as run --prompt-ids 1,,2 is
expect 2 "bench kernels --types f32,,bf16" '^deltafin bench kernels: --types "f32,,bf16": an empty item in the list' -- \
    "$BIN" bench kernels --types f32,,bf16
expect 2 "bench kernels --shapes 64x64," '^deltafin bench kernels: --shapes "64x64,": an empty item in the list' -- \
    "$BIN" bench kernels --shapes 64x64,
expect 2 "bench kernels --threads ,,1" '^deltafin bench kernels: --threads ",,1"' -- "$BIN" bench kernels --threads ,,1
mkdir -p "$TMP/smalldir" && echo small >"$TMP/smalldir/a.pack"
expect 2 "bench io --dir <no file large enough>" "^deltafin bench io: $TMP/smalldir has no file of at least 1052672 bytes of written data to read \(write one with .deltafin synth $TMP/smalldir/synth \.\.\.., a new directory: synth writes into no other, and give --dir that directory\)$" -- \
    "$BIN" bench io --dir "$TMP/smalldir" --seconds 0.1 --no-drop
mkdir -p "$TMP/sparsedir" && truncate -s 64M "$TMP/sparsedir/holes.bin"
expect 2 "bench io --dir <a sparse file only>" "has no file of at least .* bytes of written data to read; 1 skipped: sparse or preallocated" -- \
    "$BIN" bench io --dir "$TMP/sparsedir" --seconds 0.1 --no-drop
# help COMMAND = COMMAND --help; documented behaviours of serve --max-tokens 0 and run --events
[ "$("$BIN" help run 2>&1)" = "$("$BIN" run --help 2>&1)" ] && [ "$("$BIN" help bench io 2>&1)" = "$("$BIN" bench io --help 2>&1)" ] \
    && ok || bad "help run / help bench io differ from --help"
expect 0 "serve --help: --max-tokens default 0 = no cap" "default 0: no cap but the context's room" -- "$BIN" serve --help
expect 0 "run --help: --events appends" "--events FILE .*appended to FILE" -- "$BIN" run --help
rm -f "$TMP/ev.jsonl"
"${R[@]}" --prompt-ids 1 --max-new 1 --events "$TMP/ev.jsonl" >/dev/null 2>&1; n1=$(wc -l <"$TMP/ev.jsonl")
"${R[@]}" --prompt-ids 1 --max-new 1 --events "$TMP/ev.jsonl" >/dev/null 2>&1; n2=$(wc -l <"$TMP/ev.jsonl")
[ "$n1" -gt 0 ] && [ "$n2" -gt "$n1" ] && ok || bad "run --events appends: $n1 then $n2 lines"
# "1 prompt token" (singular) in the note about the trained positions
cp -r "$TMP/draft" "$TMP/draft-card"
printf -- '---\ntrained_positions: 2\n---\n' >"$TMP/draft-card/README.md"
expect 0 "1 prompt token (singular)" "note: 1 prompt token \+ --max-new 2 go past the 2 positions" -- \
    "$BIN" run --model "$TMP/draft-card" --prompt-ids 1 --max-new 2
# --quiet hides the configuration line and progress only: the note about the trained positions is still said
"$BIN" run --model "$TMP/draft-card" --prompt-ids 1 --max-new 2 --quiet >/dev/null 2>"$TMP/q.err"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$TMP/q.err")" -eq 1 ] && grep -q "^deltafin run: note: 1 prompt token + --max-new 2 go past the 2 positions" "$TMP/q.err" \
    && ok || bad "--quiet: the trained-positions note still shown, nothing else: rc $rc, $(cat "$TMP/q.err")"
expect 0 "run --help: --quiet keeps warnings and notes" "--quiet .*no configuration line or progress on stderr \(warnings and notes" -- "$BIN" run --help
# ---- new-user trial 2
# bench cache --slots: a usage error for anything but integers >= 1 (it hung on abc), an error naming the range
# for sizes the model cannot have (fewer than top-k, more than its routed experts)
for s in abc 1.5 8,abc -1 0 8,,16; do
    expect 2 "bench cache --slots $s" "^deltafin bench cache: --slots \"$s\": expected up to 64 comma-separated integers >= 1" -- \
        timeout 20 "$BIN" bench cache --model "$KM" --trace "$TMP/ev.jsonl" --slots "$s"
done
"$BIN" run --model "$KM" --prompt-ids 1,2 --max-new 2 --quiet --events "$TMP/km-ev.jsonl" >/dev/null 2>&1
for s in 4 400 8,321; do
    expect 2 "bench cache --slots $s (kimi-mini: top-8, 5 x 64 experts)" "^deltafin bench cache: --slots [0-9]+: expected a count in \[8, 320\]" -- \
        timeout 20 "$BIN" bench cache --model "$KM" --trace "$TMP/km-ev.jsonl" --slots "$s"
done
expect 0 "bench cache --slots 8,320" "^ +320 +100.0%" -- "$BIN" bench cache --model "$KM" --trace "$TMP/km-ev.jsonl" --slots 8,320
# a missing trace file: named, with strerror
for c in cache store; do
    expect 1 "bench $c --trace <missing>" "^deltafin bench $c: cannot open $TMP/nope.jsonl: No such file or directory" -- \
        "$BIN" bench $c --model "$KM" --trace "$TMP/nope.jsonl"
done
expect 1 "bench cache --train <missing>" "^deltafin bench cache: cannot open $TMP/nope.jsonl: No such file or directory" -- \
    "$BIN" bench cache --model "$KM" --trace "$TMP/km-ev.jsonl" --train "$TMP/nope.jsonl"
expect 1 "drive-idle.py <missing>" "^drive-idle.py: cannot open $TMP/nope.jsonl: No such file or directory$" -- \
    python3 "$SRC/tools/drive-idle.py" "$TMP/nope.jsonl"
head -c 4096 /dev/urandom >"$TMP/binary.jsonl"; printf '\xff\xfe\n' >>"$TMP/binary.jsonl"
expect 1 "drive-idle.py <binary>" "^drive-idle.py: $TMP/binary.jsonl: not a text file" -- python3 "$SRC/tools/drive-idle.py" "$TMP/binary.jsonl"
# --cache-dir "": a usage error in every command that takes it; doctor takes --cache-dir without --model (the default
# model is converted there, as run does); bench project converts a Hugging Face --model also with --from
for c in "run --prompt hi" doctor serve "bench decode" "bench prefill" "bench batch" "bench cache" "bench store" \
         "bench project --drives 1 --gbps 1"; do
    expect 2 "$c --cache-dir ''" "--cache-dir \"\": expected a directory" -- "$BIN" $c --cache-dir ""
done
expect 0 "doctor --cache-dir without --model" "checksums: all OK" -- env DELTAFIN_REGISTRY="$TMP/no-registry.json" \
    "$BIN" doctor --cache-dir "$TMP/dcache"
ls -d "$TMP/dcache"/kimi-mini-*-source >/dev/null 2>&1 && ok || bad "doctor --cache-dir: nothing converted into it: $(ls -R "$TMP/dcache" 2>&1 | head -3)"
expect 0 "bench project --from EV --model HF --cache-dir" "measured on $TMP/pcache/kimi-mini-[0-9a-f]+-source .*\[manifest\]" -- \
    "$BIN" bench project --drives 1 --gbps 1 --from "$TMP/km-ev.jsonl" --model "$KM" --cache-dir "$TMP/pcache"
expect 2 "bench project --cache-dir without --model" "^deltafin bench project: --cache-dir needs --model DIR" -- \
    "$BIN" bench project --drives 1 --gbps 1 --from "$TMP/km-ev.jsonl" --cache-dir "$TMP/pcache"
# small items: synth --encoding f32 in its --help as in its error; run --top-k -1 = off (as the server's top_k);
# --draft-sample on at temperature 0 says it has no effect; --max-new 1 --stats has no decode rate; tokenize
# --decode escapes a control character; convert without MODEL_DIR is one line; one conversion progress line (run's format)
# in run, bench and doctor; no degrade note when the context ends at the trained positions
expect 0 "synth --help lists f32" "--encoding E .*fp8_b128, f32" -- "$BIN" synth --help
expect 2 "synth --encoding int8 lists f32" "not supported \(mxfp4, bf16, int4_g32, fp8_b128, f32\)" -- "$BIN" synth "$TMP/s" --encoding int8
a=$("${R[@]}" --prompt-ids 1,2,3 --max-new 4 --print-ids --temperature 0.8 --top-k -1 --seed 7 2>&1); rc=$?
b=$("${R[@]}" --prompt-ids 1,2,3 --max-new 4 --print-ids --temperature 0.8 --top-k 0 --seed 7 2>&1)
[ $rc -eq 0 ] && [ "$a" = "$b" ] && ok || bad "run --top-k -1: rc $rc '$a' vs --top-k 0 '$b'"
expect 2 "run --top-k -2" '^deltafin run: --top-k "-2": expected an integer in \[-1,' -- "${R[@]}" --prompt-ids 1 --top-k -2
expect 0 "run --help: --top-k -1" "--top-k K .*-1: off too" -- "$BIN" run --help
expect 0 "--draft-sample on at temperature 0" "^deltafin run: note: --draft-sample on has no effect at --temperature 0" -- \
    "${R[@]}" --prompt-ids 1,2 --max-new 2 --draft ngram --draft-sample on
out=$("${R[@]}" --prompt-ids 1,2 --max-new 2 --draft ngram --draft-sample on --temperature 0.5 2>&1 >/dev/null)
echo "$out" | grep -q "draft-sample on has no effect" && bad "--draft-sample note at temperature 0.5: $out" || ok
expect 0 "--max-new 1 --stats" "generated 1; .*; decode: no decode steps; weight bytes" -- "${R[@]}" --prompt-ids 5 --max-new 1 --stats
expect 0 "--max-new 1 --stats: the generation line" "stats: generation 1 token, no decode steps \(draft off\)" -- "${R[@]}" --prompt-ids 5 --max-new 1 --stats
expect 2 "convert with an empty MODEL_DIR" "MODEL_DIR \"\": expected a directory" -- "$BIN" convert "$G" ""
expect 1 "tokenize --chat: not JSON" "the messages are not valid JSON" -- sh -c "printf '[{\"role\":\"user\",\"content\":\"hi\"}] trailing' | \"$BIN\" tokenize --chat --render"
out=$(printf '5,a\tb\n' | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "deltafin tokenize --decode: not a token id at position 1, near 'a\\tb' (expected comma-separated token ids, integers >= 0)" ] \
    && ok || bad "tokenize --decode escaping: rc $rc '$out'"
out=$("$BIN" convert "$G" 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "^deltafin convert: the output directory MODEL_DIR is missing" \
    && ok || bad "convert HF_DIR alone: rc $rc '$out'"
for c in "run --prompt-ids 1 --max-new 1" doctor "bench cache --trace $TMP/km-ev.jsonl --slots 8"; do
    rm -rf "$TMP/pc1"
    m=(--model "$G"); [ "$c" = doctor ] || [[ "$c" == bench* ]] && m=(--model "$G")
    [[ "$c" == bench* ]] && m=(--model "$KM")
    out=$("$BIN" $c "${m[@]}" --cache-dir "$TMP/pc1" 2>&1 >/dev/null)
    n=$(echo "$out" | grep -c "^converting: bytes 100.0% ([0-9]* / [0-9]*)$")
    [ "$n" = 1 ] && [ "$(echo "$out" | grep -c "^converting")" = 1 ] && ok || bad "$c: conversion progress lines: $out"
done
cp -r "$G" "$TMP/g4096"
python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c["max_position_embeddings"]=8; json.dump(c,open(p,"w"))' "$TMP/g4096/config.json"
printf -- '---\ntrained_positions: 8\n---\n' >"$TMP/g4096/README.md"
out=$("$BIN" run --model "$TMP/g4096" --cache-dir "$TMP/cache" --prompt-ids 1,2,3 --max-new 10 2>&1 >/dev/null)
echo "$out" | grep -q "stopped: context full" && ! echo "$out" | grep -q "may degrade" && ok || bad "context = trained positions: $out"
# ---- text that is not UTF-8 is refused (as the server's 400), naming the source and the first invalid byte's offset
u8() { # u8 WHAT WANT-STDERR -- command... (stdin from $TMP/u8.in): exit 2, that one line, nothing on stdout
    local what=$1 want=$2; shift 3
    local out rc; out=$("$@" <"$TMP/u8.in" 2>"$TMP/u8.err"); rc=$?
    [ $rc -eq 2 ] && [ -z "$out" ] && [ "$(cat "$TMP/u8.err")" = "$want" ] && ok || bad "$what: rc $rc, stdout '$out', stderr: $(cat "$TMP/u8.err")"
}
printf 'ab\xff\xfe' >"$TMP/u8.in"
u8 "run --prompt - (0xff)" "deltafin run: the prompt from stdin (--prompt -) is not valid UTF-8: invalid byte 0xff at byte offset 2" -- \
    "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt - --max-new 2
u8 "run --prompt TEXT (bad continuation)" "deltafin run: the prompt from --prompt is not valid UTF-8: invalid byte 0xc3 at byte offset 1" -- \
    "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt "$(printf 'x\xc3\x28y')" --max-new 2
printf 'hello \xe2\x82' >"$TMP/u8.txt"
u8 "run --prompt-file (cut short)" "deltafin run: the prompt from --prompt-file $TMP/u8.txt is not valid UTF-8: invalid byte 0xe2 at byte offset 6 (an incomplete character at the end)" -- \
    "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt-file "$TMP/u8.txt" --max-new 2
printf 'ok \xed\xa0\x80' >"$TMP/u8.in" # a UTF-16 surrogate
u8 "run --prompt-file - (surrogate)" "deltafin run: the prompt from stdin (--prompt-file -) is not valid UTF-8: invalid byte 0xed at byte offset 3" -- \
    "$BIN" run --model "$KM" --cache-dir "$TMP/cache" --prompt-file - --max-new 2 --chat
printf '\xc0\xaf' >"$TMP/u8.in" # an overlong form
out=$("$BIN" tokenize --model "$KM" <"$TMP/u8.in" 2>"$TMP/u8.err"); rc=$?
[ $rc -eq 1 ] && [ -z "$out" ] && [ "$(cat "$TMP/u8.err")" = "deltafin tokenize: the text on stdin is not valid UTF-8: invalid byte 0xc0 at byte offset 0" ] \
    && ok || bad "tokenize of invalid UTF-8: rc $rc '$out' $(cat "$TMP/u8.err")"
printf '[{"role":"user","content":"hi \xff"}]' | "$BIN" tokenize --model "$KM" --chat >/dev/null 2>"$TMP/u8.err"; rc=$?
[ $rc -eq 1 ] && grep -q "^deltafin tokenize: the --chat input on stdin is not valid UTF-8: invalid byte 0xff at byte offset 30$" "$TMP/u8.err" \
    && ok || bad "tokenize --chat of invalid UTF-8: rc $rc $(cat "$TMP/u8.err")"
# well-formed text of every length still goes through (2-, 3- and 4-byte characters)
ids=$(printf 'h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80' | "$BIN" tokenize --model "$KM"); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$ids" | "$BIN" tokenize --model "$KM" --decode)" = "$(printf 'h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80')" ] \
    && ok || bad "tokenize round trip of UTF-8: rc $rc '$ids'"

# ---- tokenize --decode: the ids of run --prompt-ids, one parser, the same messages
for l in "1,,2" "1,2," ",1" "1,-2" "1 2" "abc" "+3" "2147483648" "1,2,x9"; do
    r=$("${R[@]}" --prompt-ids "$l" 2>&1); rrc=$?
    t=$(printf '%s\n' "$l" | "$BIN" tokenize --model "$KM" --decode 2>&1); trc=$?
    [ $rrc -eq 2 ] && [ $trc -eq 1 ] && [ "${r#deltafin run: --prompt-ids: }" != "$r" ] && [ "${r#deltafin run: --prompt-ids: }" = "${t#deltafin tokenize --decode: }" ] \
        && ok || bad "--prompt-ids / --decode '$l': run rc $rrc '$r', tokenize rc $trc '$t'"
done
expect 2 "run --prompt-ids 1,,2" "^deltafin run: --prompt-ids: empty item at position 1 \(expected comma-separated token ids, integers >= 0\)$" -- \
    "${R[@]}" --prompt-ids 1,,2
out=$(echo 1,,2 | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "deltafin tokenize --decode: empty item at position 1 (expected comma-separated token ids, integers >= 0)" ] \
    && ok || bad "tokenize --decode 1,,2: rc $rc '$out'"
# no internal function name in what the user reads: a negative id is out of range, an unknown one is named with the vocabulary size
out=$(echo -1 | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "deltafin tokenize --decode: token id -1 at position 0 is out of range (expected an integer from 0 to 2147483647)" ] \
    && ok || bad "tokenize --decode -1: rc $rc '$out'"
out=$(echo 5,99999999 | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -qE "^deltafin tokenize --decode: token id 99999999 at position 1 is not in the vocabulary \(size [0-9]+\)$" \
    && ! echo "$out" | grep -q "df_" && ok || bad "tokenize --decode 99999999: rc $rc '$out'"
# blanks around the ids and a final newline are fine (the output of tokenize decodes); no ids at all is empty text
[ "$(printf ' 72 , 105\n' | "$BIN" tokenize --model "$KM" --decode)" = "$(printf 72,105 | "$BIN" tokenize --model "$KM" --decode)" ] && ok \
    || bad "tokenize --decode with blanks"
out=$(printf '\n' | "$BIN" tokenize --model "$KM" --decode 2>&1); rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] && ok || bad "tokenize --decode of no ids: rc $rc '$out'"

# ---- serve checks every option of its own before the default model or any note: a usage error is the only line
sv() { # sv WANT-STDERR -- serve args...: exit 2, exactly that line
    local want=$1; shift 2
    local out rc; out=$(env DELTAFIN_REGISTRY="$TMP/no-registry.json" timeout 20 "$BIN" serve --port 0 "$@" 2>&1 </dev/null); rc=$?
    [ $rc -eq 2 ] && [ "$out" = "$want" ] && ok || bad "serve $*: rc $rc, output: $out"
}
sv "deltafin serve: --mock-delay-ms applies to --mock only (the built-in test model)" -- --mock-delay-ms 5
sv "deltafin serve: --draft-sample is a run option (the server drafts greedily)" -- --draft-sample on
sv "deltafin serve: --draft-sample is a run option (the server drafts greedily)" -- --draft-max 4 --draft-sample on
sv "deltafin serve: --host foo is not a numeric IPv4 or IPv6 address or localhost (e.g. 127.0.0.1, ::1, 0.0.0.0)" -- --host foo
sv "deltafin serve: --api-key must not be empty" -- --keepalive 40 --timeout 10 --api-key ""
sv "deltafin serve: --draft needs a real model (not --mock)" -- --mock --draft ngram

# ---- seeds: negative ones as the server maps them, (uint64_t)(int64_t)S; the same seed, the same tokens from both
# (a cache of their own)
S=("$BIN" run --model "$G" --cache-dir "$TMP/seedcache" --quiet --prompt-ids 1,2,3 --max-new 6 --print-ids --temperature 0.9)
a=$("${S[@]}" --seed -1 2>&1); b=$("${S[@]}" --seed 18446744073709551615 2>&1)
[[ "$a" =~ ^[0-9]+(,[0-9]+){5}$ ]] && [ "$a" = "$b" ] && ok || bad "run --seed -1 vs 2^64-1: '$a' vs '$b'"
a=$("${S[@]}" --seed -9223372036854775808 2>&1); b=$("${S[@]}" --seed 9223372036854775808 2>&1)
[[ "$a" =~ ^[0-9]+(,[0-9]+){5}$ ]] && [ "$a" = "$b" ] && ok || bad "run --seed -2^63 vs 2^63: '$a' vs '$b'"
expect 0 "run --help: negative seeds" "--seed S +sampling seed, -2\^63\.\.2\^64-1" -- "$BIN" run --help
expect 2 "run --seed below -2^63" '^deltafin run: --seed "-9223372036854775809": expected an integer in \[-9223372036854775808, 18446744073709551615\]$' -- \
    "${S[@]}" --seed -9223372036854775809
expect 0 "synth --seed -1" "experts" -- "$BIN" synth "$TMP/syn-seed" --layers 2 --seed -1 --dry-run
# synth --size below one MoE layer's experts (1.50 GB with the default shapes): refused before anything is written
# (also with --dry-run), naming the value, the smallest model and the --size that writes it; a --size that small
# shapes reach still chooses the layers (fresh-user trial)
for sz in 200M 1K; do
    expect 2 "synth --size $sz" "^deltafin synth: --size $sz: the smallest model with these shapes is about 3\.70 GB: 1 dense \+ 1 MoE layer, .* pass --size 1\.40G or more" -- \
        "$BIN" synth "$TMP/syn-small" --size "$sz"
    [ ! -e "$TMP/syn-small" ] && ok || bad "synth --size $sz wrote $(ls -A "$TMP/syn-small")"
done
expect 2 "synth --size 200M --dry-run" "^deltafin synth: --size 200M: the smallest model" -- "$BIN" synth "$TMP/syn-small" --size 200M --dry-run
expect 0 "synth --size 1.40G --dry-run" "^synth: $TMP/syn-small: 2 layers \(1 dense\)" -- "$BIN" synth "$TMP/syn-small" --size 1.40G --dry-run
expect 0 "synth --size 8M, small shapes" "^synth: $TMP/syn-small: 6 layers \(1 dense\)" -- \
    "$BIN" synth "$TMP/syn-small" --hidden 512 --moe-inter 256 --experts 8 --size 8M --dry-run
expect 2 "bench prefill --seed x" '^deltafin bench prefill: --seed "x": expected an integer in \[-9223372036854775808, ' -- \
    "$BIN" bench prefill --model "$G" --seed x
expect 2 "bench batch --seed x" '^deltafin bench batch: --seed "x": expected an integer in \[-9223372036854775808, ' -- \
    "$BIN" bench batch --model "$G" --seed x
if command -v curl >/dev/null && command -v python3 >/dev/null; then
    "$BIN" serve --model "$G" --cache-dir "$TMP/seedcache" --port 0 --port-file "$TMP/seed.port" --threads 1 2>"$TMP/seed.log" &
    spid=$!
    for _ in $(seq 1 300); do [ -s "$TMP/seed.port" ] && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
    if [ -s "$TMP/seed.port" ]; then
        for sd in -1 -9007199254740991 12345; do
            got=$(curl -s -d "{\"prompt\":[1,2,3],\"max_tokens\":6,\"temperature\":0.9,\"seed\":$sd}" "http://127.0.0.1:$(cat "$TMP/seed.port")/v1/completions" |
                  python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["choices"][0]["token_ids"])))' 2>&1)
            want=$("${S[@]}" --seed "$sd" 2>&1)
            [[ "$want" =~ ^[0-9]+(,[0-9]+){5}$ ]] && [ "$got" = "$want" ] && ok || bad "seed $sd: server '$got', run '$want'"
        done
    else bad "serve for the seed comparison did not start: $(tail -2 "$TMP/seed.log")"; fi
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
fi

# ---- version: `deltafin version` is `deltafin --version`, and the top-level help says so
v=$("$BIN" --version); rc=$?
[ $rc -eq 0 ] && [[ "$v" =~ ^deltafin\ [0-9] ]] && [ "$("$BIN" version)" = "$v" ] && ok || bad "deltafin version: rc $rc '$v' vs '$("$BIN" version 2>&1)'"
expect 0 "deltafin --help mentions --version" "^  version +.*--version" -- "$BIN" --help
expect 2 "version with an unknown option" "deltafin version: unknown option '--modle'" -- "$BIN" version --modle x
expect 0 "help version: its usage" "^usage: deltafin version" -- "$BIN" help version

# ---- docs: tools/gen-cli-doc.sh reproduces docs/cli.md; README names every CUDA knob that docs/cli.md lists
if DF_BIN="$BIN" bash "$SRC/tools/gen-cli-doc.sh" "$TMP/cli.md" && diff -u "$SRC/docs/cli.md" "$TMP/cli.md" >"$TMP/cli.diff"; then ok
else bad "tools/gen-cli-doc.sh does not reproduce docs/cli.md: $(head -20 "$TMP/cli.diff")"; fi
knobs=$(grep -o 'DF_CUDA_[A-Z0-9_]*[A-Z0-9]' "$SRC/docs/cli.md" | sort -u)
[ -n "$knobs" ] && missing=$(for k in $knobs; do grep -q "\`$k\`" "$SRC/README.md" || echo "$k"; done) && [ -z "$missing" ] \
    && grep -q "docs/cli.md" "$SRC/README.md" && ok || bad "README.md lacks CUDA knobs of docs/cli.md: $missing"

# ---- the *.tmp of a killed conversion: removed by the next convert only when nothing else is in the directory
mkdir -p "$TMP/stale"; : >"$TMP/stale/spine.bin.tmp"; : >"$TMP/stale/experts-L001.pack.tmp"; : >"$TMP/stale/notes.txt"
out=$("$BIN" convert "$G" "$TMP/stale" --quiet 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "2 \*.tmp of an interrupted run, which are removed automatically only when the directory holds nothing else, but it also holds 'notes.txt'" \
    && echo "$out" | grep -q "pass --force" && [ -e "$TMP/stale/spine.bin.tmp" ] && ok || bad "convert into stale *.tmp + notes.txt: rc $rc $out"
rm "$TMP/stale/notes.txt"
out=$("$BIN" convert "$G" "$TMP/stale" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "removed 2 files (2 \*.tmp) left in .*stale by an interrupted convert" && [ -f "$TMP/stale/manifest.json" ] \
    && [ -z "$(ls "$TMP/stale" | grep '\.tmp$')" ] && ok || bad "convert into stale *.tmp alone: rc $rc $out"
# ---- third new-user trial: bench's did-you-mean, doctor's lines, an empty prompt, --stats without a first token or
# a decode step, bench machine's LLC line
expect 2 "bench iox: did you mean" "^deltafin bench: unknown benchmark 'iox', did you mean 'bench io'\? \(io, decode," -- "$BIN" bench iox
expect 2 "bench zzz: no suggestion" "^deltafin bench: unknown benchmark 'zzz' \(io, decode," -- "$BIN" bench zzz
# the LLC's size from sysfs, or "unknown" where sysfs has none (never "0.0 MiB")
out=$("$BIN" bench machine --threads 1 --dram-buffer 8M 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -Eq "^machine: .*; LLC (unknown|[0-9.]+ MiB); flags: " && ! echo "$out" | grep -q "LLC 0.0 MiB" && ok \
    || bad "bench machine's LLC: rc $rc $(echo "$out" | head -3)"
out=$("$BIN" doctor --model "$TMP/draft" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^SIMD: " && ! echo "$out" | grep -q ' $' && ok || bad "doctor: a line ends with a space: $(echo "$out" | grep -n ' $' | cat -A)"
expect 2 "run --prompt - with empty stdin" "^deltafin run: --prompt -: standard input was empty \(pipe the prompt text in, or give it with --prompt TEXT\)$" -- \
    "$BIN" run --model "$KM" --prompt -
expect 2 "run --prompt-file - with empty stdin" "^deltafin run: --prompt-file -: standard input was empty" -- "$BIN" run --model "$KM" --prompt-file -
: >"$TMP/empty.txt"
expect 2 "run --prompt-file with an empty file" "^deltafin run: --prompt-file $TMP/empty.txt: the file is empty$" -- \
    "$BIN" run --model "$KM" --prompt-file "$TMP/empty.txt"
expect 2 "run --prompt ''" '^deltafin run: --prompt "": the prompt is empty' -- "$BIN" run --model "$KM" --prompt ""
expect 0 "--max-new 0 stats: no TTFT" "generated 0; TTFT n/a \(no token generated\); prefill" -- "${R[@]}" --prompt-ids 5 --max-new 0 --stats
out=$("${R[@]}" --prompt-ids 5 --max-new 1 --stats --prefetch on 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "generated 1; TTFT [0-9.]* s;" && ! echo "$out" | grep -q "lookahead on for" && ok \
    || bad "--max-new 1 --stats: a lookahead count without a decode step: rc $rc $out"
out=$("${R[@]}" --prompt-ids 5 --max-new 2 --stats --prefetch on 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "lookahead on for [01] of 1 decode steps" && ok || bad "--max-new 2 --stats: want 1 decode step: rc $rc $out"

# ---- bench trial: did-you-mean only for a likely typo; bench cache / store against a trace of another model, a
# --cache too small for top-k (said before the I/O benchmarks, naming --cache), --slots defaults that fit the model;
# bench project's temporary events file removed on SIGINT / SIGTERM
expect 2 "bench foo: no suggestion" "^deltafin bench: unknown benchmark 'foo' \(io, decode," -- "$BIN" bench foo
expect 2 "bench decod: did you mean" "^deltafin bench: unknown benchmark 'decod', did you mean 'bench decode'\?" -- "$BIN" bench decod
expect 2 "bench prefil: did you mean" "^deltafin bench: unknown benchmark 'prefil', did you mean 'bench prefill'\?" -- "$BIN" bench prefil
SMALL=(--hidden 512 --moe-inter 256 --layers 3 --vocab 512 --heads 4 --inter 512 --q-lora 64 --kv-lora 64 --quiet)
"$BIN" synth "$TMP/bt8" --experts 8 "${SMALL[@]}" >/dev/null 2>&1
"$BIN" synth "$TMP/bt16" --experts 16 "${SMALL[@]}" >/dev/null 2>&1
"$BIN" run --model "$TMP/bt16" --prompt-ids 1,2,3,4 --max-new 8 --quiet --events "$TMP/bt16-ev.jsonl" >/dev/null 2>&1
"$BIN" run --model "$TMP/bt8" --prompt-ids 1,2,3,4 --max-new 4 --quiet --events "$TMP/bt8-ev.jsonl" >/dev/null 2>&1
for c in "cache --slots 8,16" "store --io-seconds 30"; do
    out=$("$BIN" bench $c --model "$TMP/bt8" --trace "$TMP/bt16-ev.jsonl" 2>&1 </dev/null); rc=$?; c=${c%% *}
    [ $rc -eq 1 ] && echo "$out" | grep -Eq "^deltafin bench $c: --trace $TMP/bt16-ev.jsonl was recorded on another model: \"synth-mxfp4-3x16\" \(.*its layer [0-9]+ expert [0-9]+ is not a routed expert of --model\), not on --model $TMP/bt8 \(\"synth-mxfp4-3x8\", .*the trace was recorded on$" \
        && [ "$(echo "$out" | wc -l)" -eq 1 ] && ! echo "$out" | grep -q store_acquire && ok || bad "bench $c: a trace of another model: rc $rc $out"
done
expect 1 "bench cache --train of another model" "^deltafin bench cache: --train $TMP/bt16-ev.jsonl was recorded on another model: \"synth-mxfp4-3x16\"" -- \
    "$BIN" bench cache --model "$TMP/bt8" --trace "$TMP/bt8-ev.jsonl" --train "$TMP/bt16-ev.jsonl" --slots 8
out=$("$BIN" bench store --model "$TMP/bt8" --trace "$TMP/bt8-ev.jsonl" --cache 1K --io-seconds 30 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -Eq "^deltafin bench store: --cache 1K holds 0 expert slots .*give at least [0-9]+ bytes \(--cache [0-9]+K\)$" \
    && ! echo "$out" | grep -q -- "--ram-budget" && ! echo "$out" | grep -q "bench io" && ok || bad "bench store --cache 1K: rc $rc $out"
expect 0 "bench cache without --slots on a 2 x 8-expert model" "^ +16 +100.0%" -- "$BIN" bench cache --model "$TMP/bt8" --trace "$TMP/bt8-ev.jsonl"
for sig in INT TERM; do
    out=$( (set -m; "$BIN" bench project --drives 2 --gbps 1 --model "$TMP/bt8" --tokens 2 --io-seconds 5 >/dev/null 2>&1 & pid=$!
            for _ in $(seq 100); do [ -e "/tmp/df_bench_project_$pid.jsonl" ] && break; sleep 0.1; done
            seen=$([ -e "/tmp/df_bench_project_$pid.jsonl" ] && echo yes || echo no)
            kill -$sig $pid; wait $pid; rc=$?; sleep 0.2
            left=$([ -e "/tmp/df_bench_project_$pid.jsonl" ] && echo yes || echo no); rm -f "/tmp/df_bench_project_$pid.jsonl"
            echo "rc=$rc seen=$seen left=$left") 2>/dev/null )
    want=$([ $sig = INT ] && echo 130 || echo 143)
    [ "$out" = "rc=$want seen=yes left=no" ] && ok || bad "bench project on SIG$sig: its temporary events file: $out (want rc=$want seen=yes left=no)"
done

# ---- a single-value option given twice: a usage error naming it and both values (the later one was taken silently),
# in every command; a value that looks like an option is a value, not a second option; flags may repeat
out=$("$BIN" run --model "$G" --cache-dir "$TMP/cache" --prompt a --prompt b 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = 'deltafin run: --prompt is given more than once ("a", then "b"); it takes one value: give it once' ] \
    && ok || bad "run --prompt a --prompt b: rc $rc: $out"
expect 2 "run --prompt=a --prompt=b" '^deltafin run: --prompt is given more than once \("a", then "b"\)' -- "$BIN" run --prompt=a --prompt=b
expect 2 "run --draft-max twice" '^deltafin run: --draft-max is given more than once \("2", then "3"\)' -- \
    "${R[@]}" --prompt-ids 1 --draft ngram --draft-max 2 --draft-max 3
a=$("${R[@]}" --prompt-ids 1,2,3 --max-new 2 --print-ids --quiet --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && [[ "$a" =~ ^[0-9]+(,[0-9]+)+$ ]] && ok || bad "run with a flag given twice: rc $rc $a"
"$BIN" run --model "$G" --cache-dir "$TMP/cache" --prompt-ids --max-new >/dev/null 2>"$TMP/rep.err"; rc=$?
! grep -q "more than once" "$TMP/rep.err" && ok || bad "--prompt-ids --max-new (a value that looks like an option): $(cat "$TMP/rep.err")"
for c in "serve --port 1 --port 2|serve: --port" "tokenize --model $KM --model $KM|tokenize: --model" \
         "convert $G $TMP/rep --spine bf16 --spine int8|convert: --spine" "doctor --model $G --model $G|doctor: --model" \
         "list --registry a --registry b|list: --registry" "setup a/b --dir x --dir y|setup: --dir" \
         "warm --trace a --trace b|warm: --trace" "synth $TMP/rep --layers 2 --layers 3|synth: --layers" \
         "bench decode --tokens 1 --tokens 2|bench decode: --tokens" "bench io --dir a --dir b|bench io: --dir" \
         "bench prefill --tokens 1 --tokens 2|bench prefill: --tokens" "bench batch --seqs 1 --seqs 2|bench batch: --seqs" \
         "bench project --drives 1 --drives 2|bench project: --drives" "bench kernels --threads 1 --threads 2|bench kernels: --threads" \
         "bench cache --slots 1 --slots 2|bench cache: --slots" "bench store --cache 1M --cache 2M|bench store: --cache"; do
    read -ra A <<<"${c%%|*}"
    expect 2 "${c%%|*}" "^deltafin ${c#*|} is given more than once" -- "$BIN" "${A[@]}"
done
[ ! -e "$TMP/rep" ] && ok || bad "convert / synth with a repeated option wrote $TMP/rep"
expect 0 "deltafin --help: an option with a value is given once" "given once \(twice is a usage error, exit 2\)" -- "$BIN" --help

# ---- run's and serve's option tables against their --help: every option listed there ("  --name METAVAR" takes a
# value, "  --name   text" or "  --name [...]" does not) is suggested for a one-letter slip ("--modell"), a value
# option given twice is refused, and a flag given twice is not (the unknown option after it is the only error)
for cmd in run serve; do
    n_val=0; n_flag=0
    while read -r opt kind; do
        [ "$opt" = --help ] && continue
        slip="$opt${opt: -1}"
        out=$("$BIN" $cmd "$slip" 2>&1 </dev/null); rc=$?
        [ $rc -eq 2 ] && [ "$out" = "deltafin $cmd: unknown option '$slip', did you mean '$opt'? (see deltafin $cmd --help)" ] \
            && ok || bad "$cmd $slip: rc $rc: $out"
        if [ "$kind" = value ]; then
            n_val=$((n_val+1))
            out=$("$BIN" $cmd "$opt" a "$opt" b 2>&1 </dev/null); rc=$?
            [ $rc -eq 2 ] && [ "$out" = "deltafin $cmd: $opt is given more than once (\"a\", then \"b\"); it takes one value: give it once" ] \
                && ok || bad "$cmd $opt a $opt b: rc $rc: $out"
        else
            n_flag=$((n_flag+1))
            out=$("$BIN" $cmd "$opt" "$opt" --zz-none 2>&1 </dev/null); rc=$?
            [ $rc -eq 2 ] && [ "$out" = "deltafin $cmd: unknown option '--zz-none' (see deltafin $cmd --help)" ] \
                && ok || bad "$cmd $opt $opt --zz-none: rc $rc: $out"
        fi
    done < <("$BIN" $cmd --help | sed -nE 's/^  (--[a-z0-9-]+) \[.*/\1 flag/p; s/^  (--[a-z0-9-]+) [^ [].*/\1 value/p; s/^  (--[a-z0-9-]+)(  .*|$)/\1 flag/p')
    # run: 22 value options + 9 --draft*, 6 flags; serve: 23 + 8 --draft* (no --draft-sample; --mock-delay-ms is on
    # --mock's line), 5 flags
    want=$([ $cmd = run ] && echo "31 6" || echo "31 5")
    [ "$n_val $n_flag" = "$want" ] && ok || bad "$cmd --help: $n_val value options, $n_flag flags (want $want)"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
