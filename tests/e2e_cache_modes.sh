#!/usr/bin/env bash
# e2e_cache_modes.sh — the conversion cache (README "The conversion cache"; src/model/convert_cache.c) across spine
# modes, on the golden checkpoint tests/golden/bf16_kimi copied so its files can be touched:
#  - after `touch` of a checkpoint file, the next new conversion (any mode) removes the stale conversions of that
#    directory in every spine mode (source, bf16, int8), each said on stderr;
#  - a conversion whose key still matches the current files stays, whatever its mode;
#  - a stale conversion of another mode that a process holds (a shared flock on its directory) is kept and said so,
#    and the first run of the model after that process ends (its own conversion found complete) removes it;
#  - an unfinished conversion of another mode left by a killed run (no manifest, lock file free) is removed;
#  - a moved checkpoint's old conversions (another source directory) stay, in every mode; no lock file is left.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
command -v python3 >/dev/null || { echo "no python3: skipped"; echo "0 passed, 0 failed"; exit 77; }
TMP=$(mktemp -d /tmp/df_e2e_cache_modes.XXXXXX)
HOLD=""
trap '[ -n "$HOLD" ] && kill "$HOLD" 2>/dev/null; rm -rf "$TMP"' EXIT
cp -r "$SRC/tests/golden/bf16_kimi" "$TMP/ck"
C=$TMP/cache
ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$TMP/ck/golden.json")
# run MODE [MODEL]: one run in spine mode MODE, stderr in $TMP/err
run() { "$BIN" run --model "${2:-$TMP/ck}" --cache-dir "$C" --spine "$1" --prompt-ids "$ids" --max-new 1 --quiet \
        >/dev/null 2>"$TMP/err"; }
conv() { ls -d "$C"/ck-*-"$1" 2>/dev/null; }        # the conversions of mode $1
count() { ls -d "$C"/ck-* 2>/dev/null | grep -vc '\.lock$'; }
removed() { grep -q "^deltafin: removed $1 (.* GB), a conversion made before the checkpoint's files changed" "$TMP/err"; }
left() { echo "left: $(ls "$C" | tr '\n' ' '), stderr: $(cat "$TMP/err")"; }

# one conversion in each mode
rcs=""
for m in source bf16 int8; do run $m; rcs="$rcs$?"; done
s1=$(conv source); b1=$(conv bf16); i1=$(conv int8)
[ "$rcs" = 000 ] && [ -n "$s1" ] && [ -n "$b1" ] && [ -n "$i1" ] && [ "$(count)" -eq 3 ] && ok \
    || bad "three modes: rcs $rcs, $(left)"

# the files change: the next new conversion (source) removes the stale ones of every mode, each said so
touch "$TMP/ck/config.json"
run source; rc=$?
s2=$(conv source)
[ $rc -eq 0 ] && [ "$(count)" -eq 1 ] && [ -n "$s2" ] && [ "$s2" != "$s1" ] && [ ! -e "$b1" ] && [ ! -e "$i1" ] \
    && removed "$s1" && removed "$b1" && removed "$i1" && ok || bad "after touch, source: rc $rc, $(left)"

# conversions whose key matches the current files stay, whatever their mode
run bf16; rc=$?
b2=$(conv bf16)
[ $rc -eq 0 ] && [ -n "$b2" ] && [ -d "$s2" ] && [ "$(count)" -eq 2 ] && ! grep -q "removed" "$TMP/err" && ok \
    || bad "bf16 next to a current source conversion: rc $rc, $(left)"
run int8; rc=$?
i2=$(conv int8)
[ $rc -eq 0 ] && [ -n "$i2" ] && [ -d "$s2" ] && [ -d "$b2" ] && [ "$(count)" -eq 3 ] && ! grep -q "removed" "$TMP/err" \
    && ok || bad "int8 next to current source and bf16 conversions: rc $rc, $(left)"

# the files change again, a stale bf16 conversion is held by a process: kept and said so, the others removed
python3 -c 'import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); open(sys.argv[2], "w").close(); time.sleep(60)' \
    "$b2" "$TMP/held" &
HOLD=$!
for _ in $(seq 1 500); do [ -e "$TMP/held" ] && break; sleep 0.01; done
touch "$TMP/ck/config.json"
run int8; rc=$?
i3=$(conv int8)
[ $rc -eq 0 ] && [ -n "$i3" ] && [ "$i3" != "$i2" ] && [ -d "$b2" ] && [ ! -e "$s2" ] && [ ! -e "$i2" ] \
    && [ "$(count)" -eq 2 ] && removed "$s2" && removed "$i2" && ! grep -q "removed $b2" "$TMP/err" \
    && grep -q "^deltafin: kept $b2 (.* GB), a conversion made before the checkpoint's files changed: a process is still using it" "$TMP/err" \
    && ok || bad "held bf16 conversion: rc $rc, $(left)"
kill "$HOLD"; wait "$HOLD" 2>/dev/null; HOLD=""
# once unused, the next run of the model (its int8 conversion found complete) removes it
run int8; rc=$?
[ $rc -eq 0 ] && [ ! -e "$b2" ] && [ -d "$i3" ] && [ "$(count)" -eq 1 ] && removed "$b2" && ok \
    || bad "held bf16 conversion, then unused: rc $rc, $(left)"

# an unfinished conversion of another mode left by a killed run: removed by the next new conversion
dead="$C/ck-0123456789abcdef-bf16"
mkdir "$dead" && echo partial >"$dead/spine.bin.tmp"
touch "$TMP/ck/config.json"
run source; rc=$?
[ $rc -eq 0 ] && [ ! -e "$dead" ] && [ ! -e "$i3" ] && [ "$(count)" -eq 1 ] && removed "$i3" \
    && grep -q "^deltafin: removed $dead (.* GB), a conversion that a killed run left unfinished" "$TMP/err" && ok \
    || bad "unfinished bf16 conversion: rc $rc, $(left)"

# a moved checkpoint: converted anew, its old conversions (another source directory) stay in every mode
run int8; rc=$?
s4=$(conv source); i4=$(conv int8)
mkdir "$TMP/moved" && mv "$TMP/ck" "$TMP/moved/ck"
run source "$TMP/moved/ck"; rc2=$?
run bf16 "$TMP/moved/ck"; rc3=$?
[ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ -d "$s4" ] && [ -d "$i4" ] && [ "$(count)" -eq 4 ] \
    && ! grep -q "removed" "$TMP/err" && ok || bad "moved checkpoint: rc $rc/$rc2/$rc3, $(left)"
[ -z "$(ls "$C" | grep '\.lock$')" ] && ok || bad "lock files left: $(ls "$C")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
