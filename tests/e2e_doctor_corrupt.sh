#!/usr/bin/env bash
# e2e_doctor_corrupt.sh — `deltafin doctor` names EVERY corrupt expert (layer, expert, file, offset), not only the
# first, prints the spine's state, and exits 1 (issue 11 item 14): two experts in different layers of a converted
# golden (tests/golden/bf16_kimi: 3 MoE layers x 8 experts), the same with a corrupt spine.bin too (which stops
# the model from opening: the experts are still checked), a striped model (both stripe files and offsets named),
# a missing pack (its layer reported, the other layers still checked), packs damaged differently in one run (a
# flipped byte, truncated, missing; spine.bin truncated too; a cached conversion's: every damaged file named once,
# though a truncated one stops the model from opening; the spine's state gives its real size or "missing", the experts'
# state counts the unreadable apart from the corrupt), a lost tokenizer.json (named in the closing summary, with damaged
# packs and alone; the repair names where a tokenizer can come from: the checkpoint's copy, or, when the checkpoint has
# none either, the model's repository), a pack larger than its experts (damaged, as a shorter one), manifest.json
# missing or cut short beside spine.bin and the packs (named with its repair, then the FAILED line), and a clean model
# ("checksums: all OK").
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_doctor.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
G="$SRC/tests/golden/bf16_kimi"
M="$TMP/m"

# flip one byte at OFFSET of FILE (dd: no Python needed)
flip() {
    local f=$1 off=$2 b
    b=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
    printf "\\$(printf %03o $(( (b ^ 16) & 255 )))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
}
# the manifest's experts.stride
stride_of() { grep -o '"stride":[[:space:]]*[0-9]*' "$1/manifest.json" | head -1 | grep -o '[0-9]*$'; }

"$BIN" convert "$G" "$M" --quiet || { bad "convert $G"; echo "$pass passed, $fail failed"; exit 1; }
S=$(stride_of "$M")
[ -n "$S" ] && [ "$S" -gt 0 ] && ok || bad "stride from manifest: '$S'"

# ---- a clean model: every checksum OK, exit 0
out=$("$BIN" doctor --model "$M" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^checksums: all OK" && echo "$out" | grep -q "^spine: OK" \
    && echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 24 OK, 0 corrupt" && ok || bad "clean model: rc $rc $out"

# ---- two corrupt experts in different layers: both named with file and offset; spine OK; exit 1
flip "$M/experts-L001.pack" $((2 * S + 100))
flip "$M/experts-L003.pack" $((5 * S + 7))
out=$("$BIN" doctor --model "$M" 2>&1); rc=$?
[ $rc -eq 1 ] && ok || bad "two corrupt experts: rc $rc (want 1)"
echo "$out" | grep -q "^deltafin doctor: corrupt expert: .*layer 1 expert 2 in .*/experts-L001.pack at offset $((2 * S)) ($S bytes)" \
    && ok || bad "layer 1 expert 2 not named with file and offset: $out"
echo "$out" | grep -q "^deltafin doctor: corrupt expert: .*layer 3 expert 5 in .*/experts-L003.pack at offset $((5 * S)) ($S bytes)" \
    && ok || bad "layer 3 expert 5 not named with file and offset: $out"
[ "$(echo "$out" | grep -c '^deltafin doctor: corrupt expert:')" -eq 2 ] && ok || bad "exactly two corrupt experts: $out"
echo "$out" | grep -q "^spine: OK (.*spine.bin, [0-9]* bytes)" && ok || bad "spine state: $out"
echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 22 OK, 2 corrupt" && ok || bad "expert count: $out"
echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin OK, 2 of 24 routed experts corrupt or unreadable (layer 1 expert 2, layer 3 expert 5)" \
    && ok || bad "summary: $out"
echo "$out" | grep -q "checksums: all OK" && bad "all OK printed for a corrupt model: $out" || ok

# ---- the spine corrupt as well: the model does not open, yet the spine's state and both experts are reported
flip "$M/spine.bin" 100
out=$("$BIN" doctor --model "$M" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: spine CORRUPT: checksum mismatch: .*spine.bin" \
    && echo "$out" | grep -q "^spine: CORRUPT" && echo "$out" | grep -q "layer 1 expert 2 in .*experts-L001.pack at offset" \
    && echo "$out" | grep -q "layer 3 expert 5 in .*experts-L003.pack at offset" \
    && echo "$out" | grep -q "verification FAILED: spine.bin CORRUPT, 2 of 24" && ok || bad "corrupt spine + experts: rc $rc $out"

# ---- a pack that is missing: its layer is reported, the other layers are still checked
flip "$M/spine.bin" 100   # restored
mv "$M/experts-L002.pack" "$TMP/L002.bak"
out=$("$BIN" doctor --model "$M" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: layer 2 UNREADABLE: cannot open expert pack .*experts-L002.pack" \
    && echo "$out" | grep -q "layer 1 expert 2 in" && echo "$out" | grep -q "layer 3 expert 5 in" && echo "$out" | grep -q "^spine: OK" \
    && echo "$out" | grep -q "experts: 24 routed experts in 3 MoE layers: 14 OK, 2 corrupt, 8 unreadable$" && ok || bad "missing pack: rc $rc $out"
mv "$TMP/L002.bak" "$M/experts-L002.pack"

# ---- several packs damaged differently, in one run: a flipped byte (L001), a truncated pack (L002: it stops the model
# from opening, and used to hide every other problem) and a missing one (L003): each named on its own line with its
# repair, then the states and the same FAILED line; the same with spine.bin truncated too
F="$TMP/f"
"$BIN" convert "$G" "$F" --quiet || bad "convert $F"
flip "$F/experts-L001.pack" $((4 * S + 9))
truncate -s $((3 * S + 100)) "$F/experts-L002.pack"
rm -f "$F/experts-L003.pack"
mkdir -p "$TMP/tv"
out=$(TMPDIR="$TMP/tv" "$BIN" doctor --model "$F" 2>&1); rc=$?
[ $rc -eq 1 ] && ok || bad "three damaged packs: rc $rc (want 1): $out"
echo "$out" | grep -q "^deltafin doctor: corrupt expert: .*layer 1 expert 4 in .*/experts-L001.pack at offset $((4 * S)) ($S bytes).*convert again" \
    && ok || bad "flipped byte in L001 not named: $out"
echo "$out" | grep -q "^deltafin doctor: layer 2 UNREADABLE: expert pack .*/experts-L002.pack (layer 2) is $((3 * S + 100)) bytes, needs $((8 * S)) (truncated; convert again: \`deltafin convert [^\`]* --force\`); none of its 8 experts checked" \
    && ok || bad "truncated L002 not named: $out"
echo "$out" | grep -q "^deltafin doctor: layer 3 UNREADABLE: cannot open expert pack .*/experts-L003.pack (layer 3): No such file or directory; none of its 8 experts checked" \
    && ok || bad "missing L003 not named: $out"
[ "$(echo "$out" | grep -c 'UNREADABLE')" -eq 2 ] && [ "$(echo "$out" | grep -c '^deltafin doctor: corrupt expert:')" -eq 1 ] \
    && ok || bad "each damaged pack once: $out"
# one line per damaged file: the truncated pack, which stops the model from opening, is not named a second time by
# the open's own error (the line before the checks)
[ "$(echo "$out" | grep -c '^deltafin doctor: .*experts-L002.pack')" -eq 1 ] && [ "$(echo "$out" | grep -c '^deltafin doctor: .*experts-L003.pack')" -eq 1 ] \
    && ok || bad "the truncated pack named on more than one line: $out"
echo "$out" | grep -q "^spine: OK (.*/f/spine.bin, [0-9]* bytes)" && echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 7 OK, 1 corrupt, 16 unreadable$" \
    && ok || bad "states with three damaged packs: $out"
echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin OK, 17 of 24 routed experts corrupt or unreadable (layer 1 expert 4, layer 2, layer 3): the model files are damaged; convert again: \`deltafin convert [^\`]* --force\`" \
    && ok || bad "FAILED line with three damaged packs: $out"
[ -z "$(ls -A "$TMP/tv")" ] && ok || bad "doctor left files in TMPDIR: $(ls -A "$TMP/tv")"
SB=$(stat -c %s "$F/spine.bin")
truncate -s 1000 "$F/spine.bin"
out=$(TMPDIR="$TMP/tv" "$BIN" doctor --model "$F" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: spine CORRUPT: .*/f/spine.bin is 1000 bytes but the manifest says $SB (truncated or replaced; convert again: \`deltafin convert [^\`]* --force\`)" \
    && echo "$out" | grep -q "^deltafin doctor: corrupt expert: .*layer 1 expert 4 in .*/experts-L001.pack" \
    && echo "$out" | grep -q "^deltafin doctor: layer 2 UNREADABLE: expert pack .*/experts-L002.pack (layer 2) is $((3 * S + 100)) bytes" \
    && echo "$out" | grep -q "^deltafin doctor: layer 3 UNREADABLE: cannot open expert pack .*/experts-L003.pack" \
    && echo "$out" | grep -q "^spine: CORRUPT (.*/f/spine.bin, 1000 bytes)$" && echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 7 OK, 1 corrupt, 16 unreadable$" \
    && echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin CORRUPT, 17 of 24 routed experts corrupt or unreadable (spine.bin, layer 1 expert 4, layer 2, ...)" \
    && [ -z "$(ls -A "$TMP/tv")" ] && ok || bad "truncated spine + three damaged packs: rc $rc $out"
[ "$(echo "$out" | grep -c '^deltafin doctor: .*/f/spine.bin')" -eq 1 ] && [ "$(echo "$out" | grep -c '^deltafin doctor: .*experts-L002.pack')" -eq 1 ] \
    && ok || bad "truncated spine + packs: a damaged file named on more than one line: $out"
# spine.bin missing: its state says so (not the manifest's size)
mv "$F/spine.bin" "$TMP/spine.away"
out=$(TMPDIR="$TMP/tv" "$BIN" doctor --model "$F" 2>&1); rc=$?
mv "$TMP/spine.away" "$F/spine.bin"
[ $rc -eq 1 ] && echo "$out" | grep -q "^spine: CORRUPT (.*/f/spine.bin, missing)$" && ! echo "$out" | grep -q "^spine: .*$SB bytes" \
    && echo "$out" | grep -q "^deltafin doctor: spine CORRUPT: .*/f/spine.bin: No such file or directory" && ok || bad "spine.bin missing: rc $rc $out"
# the tokenizer lost as well (tokenizer_config.json without tokenizer.json): its line, and the closing summary says so;
# the checkpoint it was converted from (the golden) has no tokenizer either, so converting again is not the advice
GA=$(realpath "$G")
cp "$SRC/models/kimi-mini/tokenizer_config.json" "$F/"
out=$(TMPDIR="$TMP/tv" "$BIN" doctor --model "$F" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: tokenizer FAILED: .*/f has tokenizer_config.json but neither tokenizer.json nor tiktoken.model: the checkpoint it was converted from ($GA) has no tokenizer.json or tiktoken.model either, so converting again does not help: put the model's tokenizer.json (from its repository) into .*/f$" \
    && echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin CORRUPT, 17 of 24 routed experts corrupt or unreadable (spine.bin, layer 1 expert 4, layer 2, ...), tokenizer.json is missing: the model files are damaged; convert again: \`deltafin convert [^\`]* --force\`$" \
    && [ "$(echo "$out" | grep -c 'tokenizer')" -eq 2 ] && ok || bad "damaged packs + tokenizer.json missing: rc $rc $out"
# only the tokenizer lost: every checksum OK, and the summary names the missing tokenizer.json (exit 1)
T="$TMP/tok"
"$BIN" convert "$G" "$T" --quiet && cp "$SRC/models/kimi-mini/tokenizer_config.json" "$T/" || bad "convert $T"
out=$("$BIN" doctor --model "$T" 2>"$TMP/err"); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^checksums: all OK$" \
    && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: FAILED: tokenizer.json is missing (the checksums are OK); the checkpoint it was converted from ($GA) has no tokenizer.json or tiktoken.model either, so converting again does not help: put the model's tokenizer.json (from its repository) into $T" ] \
    && ok || bad "tokenizer.json missing alone: rc $rc $out $(cat "$TMP/err")"
# a checkpoint that has its tokenizer: the tokenizer lost from the converted model is copied from it, or converted again
mkdir -p "$TMP/ckt" && cp "$G"/* "$TMP/ckt/" && cp "$SRC/models/kimi-mini/tokenizer.json" "$SRC/models/kimi-mini/tokenizer_config.json" "$TMP/ckt/"
"$BIN" convert "$TMP/ckt" "$TMP/tk" --quiet && rm "$TMP/tk/tokenizer.json" || bad "convert $TMP/ckt"
"$BIN" doctor --model "$TMP/tk" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "^deltafin doctor: tokenizer FAILED: .*tiktoken.model: copy $TMP/ckt/tokenizer.json into $TMP/tk, or convert again$" "$TMP/err" \
    && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: FAILED: tokenizer.json is missing (the checksums are OK); copy $TMP/ckt/tokenizer.json into $TMP/tk, or convert again" ] \
    && ok || bad "tokenizer.json missing, the checkpoint has one: rc $rc $(cat "$TMP/err")"
echo '{' >"$T/tokenizer.json"
out=$("$BIN" doctor --model "$T" 2>"$TMP/err"); rc=$?
[ $rc -eq 1 ] && grep -q "^deltafin doctor: tokenizer FAILED: .*tokenizer.json: not valid JSON" "$TMP/err" \
    && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: FAILED: tokenizer.json does not open (the checksums are OK); the checkpoint it was converted from ($GA) has no tokenizer.json or tiktoken.model either, so converting again does not help: put the model's tokenizer.json (from its repository) into $T" ] \
    && ok || bad "tokenizer.json that does not open: rc $rc $out $(cat "$TMP/err")"
# the same where the checkpoint has its tokenizer: copied from it
echo '{' >"$TMP/tk/tokenizer.json"
"$BIN" doctor --model "$TMP/tk" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: FAILED: tokenizer.json does not open (the checksums are OK); copy $TMP/ckt/tokenizer.json into $TMP/tk, or convert again" ] \
    && ok || bad "tokenizer.json that does not open, the checkpoint has one: rc $rc $(cat "$TMP/err")"
# a Hugging Face checkpoint whose own tokenizer.json does not open
mkdir -p "$TMP/hfbad" && cp "$G"/* "$TMP/hfbad/" && echo '{' >"$TMP/hfbad/tokenizer.json"
"$BIN" doctor --model "$TMP/hfbad" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "; replace $TMP/hfbad/tokenizer.json with the model's own (from its repository)$" "$TMP/err" \
    && ok || bad "a checkpoint's tokenizer.json that does not open: rc $rc $(cat "$TMP/err")"

# ---- a Hugging Face checkpoint's conversion in the cache, a pack truncated and another corrupt: both named, each
# with the cache's repair (delete the conversion)
"$BIN" doctor --model "$G" --cache-dir "$TMP/cache" >/dev/null 2>&1 || bad "doctor converting $G into the cache"
CV=$(ls -d "$TMP"/cache/bf16_kimi-*-source 2>/dev/null | head -1)
if [ -n "$CV" ]; then
    truncate -s 100 "$CV/experts-L001.pack"
    flip "$CV/experts-L003.pack" $((6 * S + 3))
    out=$("$BIN" doctor --model "$G" --cache-dir "$TMP/cache" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: layer 1 UNREADABLE: expert pack $CV/experts-L001.pack (layer 1) is 100 bytes, needs $((8 * S)) (truncated; delete the conversion cache $CV and run again to re-convert)" \
        && echo "$out" | grep -q "^deltafin doctor: corrupt expert: .*layer 3 expert 6 in $CV/experts-L003.pack at offset $((6 * S)) .*delete the conversion cache $CV and run again" \
        && echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 15 OK, 1 corrupt, 8 unreadable$" \
        && echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin OK, 9 of 24 routed experts corrupt or unreadable (layer 1, layer 3 expert 6): .*delete the conversion cache $CV" \
        && ok || bad "cached conversion with damaged packs: rc $rc $out"
else
    bad "no conversion of $G in $TMP/cache: $(ls "$TMP/cache" 2>&1)"
fi

# ---- a pack larger than its experts is damaged as a shorter one is (and as a spine.bin of another size): named, not
# checked, exit 1
O="$TMP/o"
"$BIN" convert "$G" "$O" --quiet || bad "convert $O"
truncate -s $((8 * S + 4096)) "$O/experts-L002.pack"
out=$("$BIN" doctor --model "$O" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: layer 2 UNREADABLE: expert pack .*/o/experts-L002.pack (layer 2) is $((8 * S + 4096)) bytes, needs $((8 * S)) (too large: not the pack this manifest describes; convert again: \`deltafin convert [^\`]* --force\`); none of its 8 experts checked$" \
    && echo "$out" | grep -q "^experts: 24 routed experts in 3 MoE layers: 16 OK, 0 corrupt, 8 unreadable$" \
    && echo "$out" | grep -q "^deltafin doctor: verification FAILED: spine.bin OK, 8 of 24 routed experts corrupt or unreadable (layer 2)" \
    && ok || bad "oversized pack: rc $rc $out"
truncate -s $((8 * S)) "$O/experts-L002.pack"

# ---- a native model whose manifest.json is missing, or damaged: recognised by its spine.bin and packs; manifest.json
# named as the damaged file with the repair, then the FAILED summary (exit 1)
mv "$O/manifest.json" "$TMP/manifest.away"
OA=$(realpath "$O")
out=$("$BIN" doctor --model "$O" 2>"$TMP/err"); rc=$?
[ $rc -eq 1 ] && grep -qx "deltafin doctor: manifest.json DAMAGED: $OA/manifest.json is missing; spine.bin and 3 expert packs are here, but without the manifest they cannot be read or checked; convert again" "$TMP/err" \
    && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: verification FAILED: manifest.json missing (spine.bin and 3 expert packs not checked): the model files are damaged; re-run \`deltafin convert\`" ] \
    && ! grep -q "neither manifest.json" "$TMP/err" && echo "$out" | grep -q "^tokenizer: none" && ok || bad "manifest.json missing: rc $rc $out $(cat "$TMP/err")"
head -c 500 "$TMP/manifest.away" >"$O/manifest.json"
out=$("$BIN" doctor --model "$O" 2>"$TMP/err"); rc=$?
[ $rc -eq 1 ] && grep -qx "deltafin doctor: manifest.json DAMAGED: $OA/manifest.json is not valid JSON (500 bytes: cut short or overwritten); spine.bin and 3 expert packs are here, but without the manifest they cannot be read or checked; convert again" "$TMP/err" \
    && [ "$(tail -1 "$TMP/err")" = "deltafin doctor: verification FAILED: manifest.json damaged (spine.bin and 3 expert packs not checked): the model files are damaged; re-run \`deltafin convert\`" ] \
    && ok || bad "manifest.json cut short: rc $rc $out $(cat "$TMP/err")"
# a directory with none of convert's files is still "no model" (not a damaged one)
mkdir -p "$TMP/empty"
out=$("$BIN" doctor --model "$TMP/empty" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "neither manifest.json (native model) nor config.json" && ! echo "$out" | grep -q "DAMAGED" \
    && ok || bad "empty directory: rc $rc $out"
mv "$TMP/manifest.away" "$O/manifest.json"

# ---- a striped model: an expert corrupt in its second stripe; both stripe files and offsets are named
P="$TMP/p"
"$BIN" convert "$G" "$P" --expert-dirs "$TMP/d0,$TMP/d1" --quiet || bad "striped convert"
SB=$(grep -o '"stripe_bytes":[[:space:]]*[0-9]*' "$P/manifest.json" | head -1 | grep -o '[0-9]*$')
f1=$(ls "$TMP"/d1/experts-L002*.pack 2>/dev/null | head -1)
if [ -n "$SB" ] && [ -n "$f1" ]; then
    flip "$f1" $((6 * SB + 5))
    flip "$(ls "$TMP"/d0/experts-L001*.pack | head -1)" $((0 * SB + 1))
    out=$("$BIN" doctor --model "$P" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "layer 2 expert 6 in .*/d0/experts-L002[^ ]*pack at offset $((6 * SB)) ($SB bytes) + .*/d1/experts-L002[^ ]*pack at offset $((6 * SB)) ($SB bytes)" \
        && echo "$out" | grep -q "layer 1 expert 0 in .*/d0/experts-L001" && echo "$out" | grep -q "22 OK, 2 corrupt" \
        && ok || bad "striped: rc $rc $out"
else
    bad "striped layout: stripe_bytes '$SB', file '$f1'"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
