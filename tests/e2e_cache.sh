#!/usr/bin/env bash
# e2e_cache.sh — the conversion cache (README "The conversion cache"; src/model/convert_cache.c) on the golden
# checkpoint tests/golden/bf16_kimi, copied so its files can be touched:
#  - the first run converts into --cache-dir, the second reuses it without writing (the directory's files unchanged)
#    and works from a cache that is read only for it;
#  - after `touch` of a checkpoint file the next run converts anew and removes the older conversion, saying so,
#    unless a process still holds it (a shared flock on its directory), which keeps it;
#  - an unfinished conversion left by a killed run (no manifest, lock file free) is removed by the next new
#    conversion of that checkpoint; no lock file is left in the cache;
#  - another spine mode's conversion of the same checkpoint made from the current files is never removed (a stale
#    one is: tests/e2e_cache_modes.sh);
#  - the model card (README.md, which convert copies and `run` reads trained_positions from) keys the conversion:
#    an edited card gives a fresh conversion, and run warns with the new value;
#  - a relative XDG_CACHE_HOME is ignored with a one-line note (once per process), the conversion going to ~/.cache;
#  - every bench command that opens a model (decode, prefill, batch, cache, store, and project's bench decode run)
#    converts into its --cache-dir DIR, not into the default cache; their --help and docs/cli.md list the flag.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
command -v python3 >/dev/null || { echo "no python3: skipped"; echo "0 passed, 0 failed"; exit 77; }
TMP=$(mktemp -d /tmp/df_e2e_cache.XXXXXX)
HOLD=""
trap '[ -n "$HOLD" ] && kill "$HOLD" 2>/dev/null; rm -rf "$TMP"' EXIT
cp -r "$SRC/tests/golden/bf16_kimi" "$TMP/ck"
C=$TMP/cache
ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$TMP/ck/golden.json")
run() { "$BIN" run --model "$TMP/ck" --cache-dir "$C" --prompt-ids "$ids" --max-new 2 --print-ids --quiet "$@" 2>"$TMP/err"; }
convs() { ls -d "$C"/ck-*-source 2>/dev/null; }

out1=$(run); rc=$?
[ $rc -eq 0 ] && [ "$(convs | wc -l)" -eq 1 ] && ok || bad "first run: rc $rc, $(cat "$TMP/err")"
first=$(convs)
sum() { find "$1" -type f -printf '%P %s %T@\n' | sort | md5sum; }
before=$(sum "$first")
out2=$(run); rc=$?
[ $rc -eq 0 ] && [ "$out2" = "$out1" ] && [ "$(sum "$first")" = "$before" ] && [ ! -s "$TMP/err" ] && ok \
    || bad "reuse: rc $rc, output '$out2' vs '$out1', $(cat "$TMP/err")"
chmod -R a-w "$C"
out3=$(run); rc=$?
chmod -R u+w "$C"
[ $rc -eq 0 ] && [ "$out3" = "$out1" ] && ok || bad "read-only cache: rc $rc, $(cat "$TMP/err")"

# the files change: a new conversion, the old one removed and said so
touch "$TMP/ck/config.json"
out4=$(run); rc=$?
[ $rc -eq 0 ] && [ "$out4" = "$out1" ] && [ ! -e "$first" ] && [ "$(convs | wc -l)" -eq 1 ] \
    && grep -q "^deltafin: removed $first (.* GB), a conversion made before the checkpoint's files changed" "$TMP/err" && ok \
    || bad "after touch: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"

# a conversion a process holds is kept
second=$(convs)
python3 -c 'import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); open(sys.argv[2], "w").close(); time.sleep(60)' \
    "$second" "$TMP/held" &
HOLD=$!
for _ in $(seq 1 500); do [ -e "$TMP/held" ] && break; sleep 0.01; done
touch "$TMP/ck/config.json"
run >/dev/null; rc=$?
[ $rc -eq 0 ] && [ -d "$second" ] && [ "$(convs | wc -l)" -eq 2 ] && ! grep -q "removed $second" "$TMP/err" \
    && grep -q "^deltafin: kept $second (.* GB), a conversion made before the checkpoint's files changed: a process is still using it" "$TMP/err" && ok \
    || bad "held conversion: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"
kill "$HOLD"; wait "$HOLD" 2>/dev/null; HOLD=""
# once unused, the next run of the model (its conversion found complete) removes it
out5=$(run); rc=$?
[ $rc -eq 0 ] && [ "$out5" = "$out1" ] && [ ! -e "$second" ] && [ "$(convs | wc -l)" -eq 1 ] \
    && grep -q "^deltafin: removed $second (.* GB), a conversion made before the checkpoint's files changed" "$TMP/err" && ok \
    || bad "held conversion, then unused: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"

# an unfinished conversion of a killed run: removed by the next new conversion (with the one no longer held)
touch "$TMP/ck/config.json"
dead="$C/ck-0123456789abcdef-source"
mkdir "$dead" && echo partial >"$dead/spine.bin.tmp"
run >/dev/null; rc=$?
[ $rc -eq 0 ] && [ ! -e "$dead" ] && [ "$(convs | wc -l)" -eq 1 ] \
    && grep -q "^deltafin: removed $dead (.* GB), a conversion that a killed run left unfinished" "$TMP/err" && ok \
    || bad "unfinished conversion: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"
[ -z "$(ls "$C" | grep '\.lock$')" ] && ok || bad "lock files left: $(ls "$C")"

# another spine mode's conversion of the current files stays
touch "$TMP/ck/config.json"
run --spine bf16 >/dev/null; rc=$?
run >/dev/null
[ $rc -eq 0 ] && [ "$(ls -d "$C"/ck-*-bf16 2>/dev/null | wc -l)" -eq 1 ] && ok || bad "bf16 conversion: rc $rc, $(ls "$C")"

# the model card (README.md, copied beside the conversion; `run` reads its trained_positions) keys the conversion as
# the other files convert copies: a changed card gives a fresh conversion with the new card (the stale one removed),
# and run warns with the new value, given the checkpoint or its conversion; a card removed leaves none behind
cp -r "$SRC/tests/golden/bf16_kimi" "$TMP/card"
CC=$TMP/card-cache
card() { printf -- '---\nlicense: mit\ntrained_positions: %s\n---\n# card\n' "$1" >"$TMP/card/README.md"; }
crun() { "$BIN" run --model "$1" --cache-dir "$CC" --prompt-ids "$ids" --max-new 1 --print-ids --quiet 2>"$TMP/card.err"; }
cconv() { ls -d "$CC"/card-*-source 2>/dev/null; }
n_ids=$(echo "$ids" | tr , '\n' | grep -c .)
card 4
crun "$TMP/card" >/dev/null; rc=$?
c1=$(cconv)
[ $rc -eq 0 ] && [ "$n_ids" -gt 6 ] && [ "$(echo "$c1" | wc -w)" -eq 1 ] && cmp -s "$TMP/card/README.md" "$c1/README.md" \
    && grep -q "^deltafin run: warning: the prompt has $n_ids tokens but .* was trained on 4 positions (model card $TMP/card/README.md: trained_positions)" "$TMP/card.err" \
    && ok || bad "card 4: rc $rc, conversions '$c1', $(cat "$TMP/card.err")"
crun "$c1" >/dev/null; rc=$?
[ $rc -eq 0 ] && grep -q "was trained on 4 positions (model card $c1/README.md: trained_positions)" "$TMP/card.err" \
    && ok || bad "card 4, the conversion: rc $rc, $(cat "$TMP/card.err")"
card 6 # the card edited (same size: its mtime changes)
crun "$TMP/card" >/dev/null; rc=$?
c2=$(cconv)
[ $rc -eq 0 ] && [ "$(echo "$c2" | wc -w)" -eq 1 ] && [ "$c2" != "$c1" ] && [ ! -e "$c1" ] && cmp -s "$TMP/card/README.md" "$c2/README.md" \
    && grep -q "^deltafin: removed $c1 (.* GB), a conversion made before the checkpoint's files changed" "$TMP/card.err" \
    && grep -q "^deltafin run: warning: the prompt has $n_ids tokens but .* was trained on 6 positions (model card $TMP/card/README.md: trained_positions)" "$TMP/card.err" \
    && ok || bad "card 6: rc $rc, conversions '$c2' (was '$c1'), $(cat "$TMP/card.err")"
crun "$c2" >/dev/null; rc=$?
[ $rc -eq 0 ] && grep -q "was trained on 6 positions (model card $c2/README.md: trained_positions)" "$TMP/card.err" \
    && ! grep -q "trained on 4 positions" "$TMP/card.err" && ok || bad "card 6, the conversion: rc $rc, $(cat "$TMP/card.err")"
crun "$TMP/card" >/dev/null; rc=$?
[ $rc -eq 0 ] && [ "$(cconv)" = "$c2" ] && ! grep -q "converting\|removed" "$TMP/card.err" && ok || bad "card 6 again: not reused: $(cconv), $(cat "$TMP/card.err")"
rm "$TMP/card/README.md"
crun "$TMP/card" >/dev/null; rc=$?
c3=$(cconv)
[ $rc -eq 0 ] && [ "$(echo "$c3" | wc -w)" -eq 1 ] && [ "$c3" != "$c2" ] && [ ! -e "$c3/README.md" ] && ! grep -q "trained on" "$TMP/card.err" \
    && ok || bad "card removed: rc $rc, conversions '$c3' (was '$c2'), $(ls "$c3" 2>&1), $(cat "$TMP/card.err")"

# bench: --cache-dir DIR for each command that opens a model (the default cache, $XDG_CACHE_HOME, stays untouched)
XC=$TMP/xdg
bench() { # NAME ARGS...: bench NAME on the checkpoint with --cache-dir $TMP/b-NAME; output in $TMP/bench.out
    local n=$1; shift
    XDG_CACHE_HOME=$XC "$BIN" bench "$n" --model "$TMP/ck" --cache-dir "$TMP/b-$n" "$@" >"$TMP/bench.out" 2>&1
}
IO=(--io-seconds 0.05)
for c in "decode --tokens 2 --events $TMP/ev.jsonl" "prefill --tokens 4" "batch --seqs 1,2 --tokens 2 --prompt 2" \
         "cache --trace $TMP/ev.jsonl --slots 4" "store --trace $TMP/ev.jsonl" "project --drives 1 --gbps 1 --tokens 2"; do
    read -ra A <<<"$c"
    n=${A[0]}
    io=("${IO[@]}"); [ "$n" = cache ] && io=()
    bench "${A[@]}" "${io[@]}"; rc=$?
    conv=$(ls -d "$TMP/b-$n"/ck-*-source 2>/dev/null)
    [ $rc -eq 0 ] && [ -n "$conv" ] && [ -f "$conv/manifest.json" ] && [ ! -e "$XC" ] && grep -qF "$conv" "$TMP/bench.out" && ok \
        || bad "bench $n --cache-dir: rc $rc, cache: $(ls "$TMP/b-$n" 2>&1), default cache: $(ls -R "$XC" 2>&1 | head -3), $(tr '\r' '\n' <"$TMP/bench.out" | tail -3)"
    "$BIN" bench "$n" --help | grep -q -- "--cache-dir DIR" && ok || bad "bench $n --help does not list --cache-dir"
    doc=$(awk -v h="### deltafin bench $n" '$0==h{f=1;next} f&&/^```$/{if(++k==2)exit;next} f&&k==1' "$SRC/docs/cli.md")
    [ -n "$doc" ] && [ "$doc" = "$("$BIN" bench "$n" --help 2>&1)" ] && ok || bad "docs/cli.md '### deltafin bench $n' differs from its --help"
done
# a second decode reuses its conversion (nothing converted again), and --cache-dir without a value is a usage error
bench decode --tokens 1 "${IO[@]}"; rc=$?
[ $rc -eq 0 ] && ! grep -q "converting" "$TMP/bench.out" && ok || bad "bench decode reuse: rc $rc, $(tail -2 "$TMP/bench.out")"
for n in decode prefill batch cache store project; do
    out=$("$BIN" bench $n --cache-dir 2>&1); rc=$?
    [ $rc -eq 2 ] && echo "$out" | grep -q -- "--cache-dir needs a value" && ok || bad "bench $n --cache-dir (no value): rc $rc $out"
done

# a relative XDG_CACHE_HOME is ignored (the XDG base directory specification), said once per process on stderr:
# the conversion goes to $HOME/.cache/deltafin, never to the relative directory; --cache-dir silences it
mkdir -p "$TMP/home" "$TMP/cwd"
out=$(cd "$TMP/cwd" && HOME=$TMP/home XDG_CACHE_HOME=relcache "$BIN" doctor --model "$TMP/ck" 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c 'XDG_CACHE_HOME')" -eq 1 ] \
    && echo "$out" | grep -qx "deltafin: note: XDG_CACHE_HOME=\"relcache\" is not an absolute path, so it is ignored (the XDG base directory specification); the conversion cache is $TMP/home/.cache/deltafin (set XDG_CACHE_HOME to an absolute path, or pass --cache-dir DIR)" \
    && [ ! -e "$TMP/cwd/relcache" ] && ls -d "$TMP"/home/.cache/deltafin/ck-*-source >/dev/null 2>&1 && ok \
    || bad "relative XDG_CACHE_HOME: rc $rc, $out; cwd: $(ls "$TMP/cwd"); home cache: $(ls "$TMP/home/.cache/deltafin" 2>&1)"
out=$(cd "$TMP/cwd" && HOME=$TMP/home XDG_CACHE_HOME=relcache "$BIN" run --model "$TMP/ck" --cache-dir "$TMP/c-rel" --prompt-ids "$ids" --max-new 1 --quiet 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && ! echo "$out" | grep -q XDG_CACHE_HOME && ok || bad "relative XDG_CACHE_HOME with --cache-dir: rc $rc, $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
