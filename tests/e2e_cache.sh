#!/usr/bin/env bash
# e2e_cache.sh — the conversion cache (README "The conversion cache"; src/model/convert_cache.c) on the golden
# checkpoint tests/golden/bf16_kimi, copied so its files can be touched:
#  - the first run converts into --cache-dir, the second reuses it without writing (the directory's files unchanged)
#    and works from a cache that is read only for it;
#  - after `touch` of a checkpoint file the next run converts anew and removes the older conversion, saying so,
#    unless a process still holds it (a shared flock on its directory), which keeps it;
#  - an unfinished conversion left by a killed run (no manifest, lock file free) is removed by the next new
#    conversion of that checkpoint; no lock file is left in the cache;
#  - another spine mode's conversion of the same checkpoint is never removed.
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
[ $rc -eq 0 ] && [ -d "$second" ] && [ "$(convs | wc -l)" -eq 2 ] && ! grep -q "removed $second" "$TMP/err" && ok \
    || bad "held conversion: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"
kill "$HOLD"; wait "$HOLD" 2>/dev/null; HOLD=""

# an unfinished conversion of a killed run: removed by the next new conversion (with the one no longer held)
touch "$TMP/ck/config.json"
dead="$C/ck-0123456789abcdef-source"
mkdir "$dead" && echo partial >"$dead/spine.bin.tmp"
run >/dev/null; rc=$?
[ $rc -eq 0 ] && [ ! -e "$dead" ] && [ "$(convs | wc -l)" -eq 1 ] \
    && grep -q "^deltafin: removed $dead (.* GB), a conversion that a killed run left unfinished" "$TMP/err" && ok \
    || bad "unfinished conversion: rc $rc, left: $(convs | tr '\n' ' '), $(cat "$TMP/err")"
[ -z "$(ls "$C" | grep '\.lock$')" ] && ok || bad "lock files left: $(ls "$C")"

# another spine mode's conversion stays
run --spine bf16 >/dev/null; rc=$?
touch "$TMP/ck/config.json"
run >/dev/null
[ $rc -eq 0 ] && [ "$(ls -d "$C"/ck-*-bf16 2>/dev/null | wc -l)" -eq 1 ] && ok || bad "bf16 conversion: rc $rc, $(ls "$C")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
