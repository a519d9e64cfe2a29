#!/usr/bin/env bash
# e2e_setup.sh — `deltafin setup` against a loopback Hugging Face mirror (nginx serving models/kimi-mini
# in the hub's URL layout, tests/hub/mirror.py) and a fault proxy in front of it:
#   - run / serve without --model use the embedded kimi-mini before setup and the installed model after;
#   - a full install equals a local `deltafin convert` (bytes of every native file, greedy ids); `list`;
#   - a damaged full install (a pack gone, a corrupt spine.bin, tokenizer.json gone): list says DAMAGED naming the file
#     and the setup command that repairs it; run / serve / bench decode, prefill, batch without --model and doctor name
#     that command (doctor never says convert for a setup install);
#   - a truncated pack: list names setup's repair only (never "convert again"); setup's repair says what was damaged
#     and what it did in one sentence; a pack larger than its experts is DAMAGED too (list, doctor);
#   - the download's summary is a readable line on stderr (no machine-format line on stdout); progress to a pipe or
#     file has no \r or padding (a plain line every 5 s), on a terminal it is rewritten in place;
#   - setup --no-default of the default repo into another --dir leaves the registry (and what run loads) unchanged
#     and says the new install is not recorded; without --no-default the entry is repointed, with a note;
#   - warm on a streamed install with a disk budget says how many experts the budget evicted;
#   - setup run again over a damaged full install verifies it and repairs it: a pack gone, a corrupt spine.bin (downloaded
#     and converted again), a corrupt expert of a --keep-download install (from the kept shards, nothing fetched), a
#     tokenizer.json gone (copied again); an intact one is verified and "already installed"; setup --stream over a
#     streamed install with a corrupt fetched expert fetches it again;
#   - the commands messages suggest (list's doctor, setup's rm -rf / setup --dir) quote a path with a space and a ';
#   - a streamed install gives the full install's ids under a RAM budget, fetching each expert once; warm fetches
#     what a trace ranks first; setup --full completes a streamed install in place;
#   - kill -9 during a throttled download, then resume: the second run fetches exactly the bytes the
#     first did not write (nginx's log), nothing twice; the listing-less mirror (index as listing) works;
#   - verified files renamed into place unsynced: --download-only / --keep-download sync at the end and leave
#     byte-identical files; shards left verified-but-unsynced (a failed conversion) are re-hashed on the next run:
#     one corrupted on the disk is fetched again (its bytes alone, nginx's log), the intact ones are kept;
#   - dropped connections are retried; every fault gives its message and exit 1: no network, 401,
#     404 (repo, revision, file), 500, no Range support, corrupt byte (sha256), disk full, unsupported
#     architecture (before any weight is requested).
# Skips (0 failed) only when nginx is not installed and cannot be.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DF_BIN:-$ROOT/build/deltafin}
PASS=0; FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
finish() { echo "$PASS passed, $FAIL failed"; [ $FAIL -eq 0 ]; exit $?; }
[ -x "$BIN" ] || { echo "e2e_setup: no deltafin binary at $BIN (set DF_BIN)"; exit 1; }
. "$ROOT/tests/hub/nginx.sh"
find_nginx e2e_setup
command -v python3 >/dev/null || { echo "e2e_setup: python3 is required"; exit 1; }

TMP=$(mktemp -d /tmp/df_e2e_setup.XXXXXX)
chmod 755 "$TMP"
# the embedded model's first-use conversion goes to a cache in $TMP (removed at exit), never into ~/.cache/deltafin
export XDG_CACHE_HOME="$TMP/xdg-cache"
PIDS=()
MOUNTED=""
cleanup() {
    [ -f "$TMP/nginx.pid" ] && kill "$(cat "$TMP/nginx.pid")" 2>/dev/null
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    [ -n "$MOUNTED" ] && umount "$MOUNTED" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
read -r P1 P2 P3 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]; print(*[x.getsockname()[1] for x in s])')
python3 "$ROOT/tests/hub/mirror.py" build "$TMP" "$P1" "$P2" || { bad "build the mirror tree"; finish; }
"$NGINX" -c "$TMP/nginx.conf" -p "$TMP" 2>"$TMP/nginx.start" || { bad "start nginx: $(cat "$TMP/nginx.start")"; finish; }
python3 "$ROOT/tests/hub/mirror.py" proxy "$P3" "$P1" 2>"$TMP/proxy.log" & PIDS+=($!)
M=http://127.0.0.1:$P1; SLOW=http://127.0.0.1:$P2; PX=http://127.0.0.1:$P3
for _ in $(seq 1 50); do curl -s -o /dev/null "$PX/ok/api/models/test/kimi-mini" && break; sleep 0.1; done
export DELTAFIN_REGISTRY=$TMP/registry.json HF_ENDPOINT=$M
unset HF_TOKEN
IDS=1,2,3,4,5,6
shards_bytes() { awk -v port="$1" '$1 == port && $3 ~ /kimi-mini\/resolve\/main\/.*safetensors$/ && $2 == "GET" { s += $5 } END { print s + 0 }' "$TMP/access.log"; }
TOTAL=$(cat "$ROOT"/models/kimi-mini/*.safetensors | wc -c)

# ---- before setup: the embedded model
out=$("$BIN" run --prompt-ids $IDS --max-new 8 --print-ids 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "model (no --model): .*models/kimi-mini, embedded kimi-mini" && ok "run without --model before setup: embedded kimi-mini" \
    || bad "run without --model before setup: rc $rc $out"
EMB_IDS=$(echo "$out" | tail -1)
serve_check() { # serve_check WHAT PATTERN: serve without --model answers /v1/models and names its model
    rm -f "$TMP/port"
    "$BIN" serve --port 0 --port-file "$TMP/port" 2>"$TMP/serve.log" & local sp=$!
    for _ in $(seq 1 300); do [ -s "$TMP/port" ] && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
    local models; models=$(curl -s "http://127.0.0.1:$(cat "$TMP/port" 2>/dev/null)/v1/models")
    kill -TERM $sp; wait $sp
    echo "$models" | grep -q '"kimi-mini"' && grep -q "$2" "$TMP/serve.log" && ok "$1" || bad "$1: $models $(cat "$TMP/serve.log")"
}
serve_check "serve without --model before setup" "model (no --model): .*embedded kimi-mini"

# ---- full install == local convert
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "installed (full" && ok "setup --full" || bad "setup --full: rc $rc $out"
"$BIN" convert "$ROOT/models/kimi-mini" "$TMP/local" --quiet || bad "local convert"
same=1
for f in $(cd "$TMP/local" && ls | grep -v '^manifest.json$'); do cmp -s "$TMP/local/$f" "$TMP/inst/native/$f" || { same=0; bad "native file $f differs from a local convert"; }; done
# manifest.json: equal but for the source directory it names
python3 - "$TMP/local/manifest.json" "$TMP/inst/native/manifest.json" <<'PY' || { same=0; bad "manifest.json differs beyond source.dir"; }
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
a["source"].pop("dir"); b["source"].pop("dir")
sys.exit(a != b)
PY
[ $same = 1 ] && ok "full install == local convert: every native file byte-identical ($(ls "$TMP/local" | wc -l) files)"
ls "$TMP/inst/kimi-mini/"*.safetensors >/dev/null 2>&1 && bad "downloaded shards kept without --keep-download" || ok "shards removed after the conversion"
# several hashing threads (one shard each at a time): the same install
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst3" --hash-threads 3 --no-default --registry "$TMP/reg3.json" 2>&1); rc=$?
same3=1
for f in $(cd "$TMP/local" && ls | grep -v '^manifest.json$'); do cmp -s "$TMP/local/$f" "$TMP/inst3/native/$f" || same3=0; done
[ $rc -eq 0 ] && [ $same3 = 1 ] && echo "$out" | grep -q "hash threads 3" && ok "--hash-threads 3: every native file byte-identical" \
    || bad "--hash-threads 3: rc $rc same $same3: $(echo "$out" | tail -3)"
rm -rf "$TMP/inst3"
L=$("$BIN" run --model "$TMP/local" --prompt-ids $IDS --max-new 8 --print-ids --quiet 2>/dev/null | tail -1)
out=$("$BIN" run --prompt-ids $IDS --max-new 8 --print-ids 2>&1)
I=$(echo "$out" | tail -1)
[ -n "$L" ] && [ "$I" = "$L" ] && [ "$I" = "$EMB_IDS" ] && echo "$out" | grep -q "installed test/kimi-mini (full)" \
    && ok "run without --model after setup: the installed model, greedy ids = local convert ($I)" || bad "ids: installed '$I' local '$L' embedded '$EMB_IDS': $out"
serve_check "serve without --model after setup" "installed test/kimi-mini"
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini  *full .*$TMP/inst/native" && ok "list: installed, full, default" || bad "list: $out"
# a pack gone from the full install: list says DAMAGED and names it (put back afterwards)
pk=$(ls "$TMP/inst/native"/experts-L*.pack | head -1)
mv "$pk" "$TMP/pack.away"
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini  *DAMAGED " && echo "$out" | grep -q "expert pack $pk .*No such file" \
    && ok "list: a full install missing a pack is DAMAGED, the pack named" || bad "list with a pack missing: $out"
mv "$TMP/pack.away" "$pk"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "already installed" && ok "setup again: already installed" || bad "setup again: $out"
# another revision of an installed repo is not "already installed": exit 1 naming both revisions, nothing changed
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" --revision v2 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'installed in .* at revision "main", not the requested "v2"' && ! echo "$out" | grep -q "already installed" \
    && ok "setup --revision v2 over main: a different revision is installed (exit 1)" || bad "setup other revision: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" --revision main 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "(revision main) is already installed" && ok "setup --revision main: already installed" || bad "setup --revision main: rc $rc $out"

# ---- setup over a damaged full install re-verifies it and repairs it (as a pull would), never "already installed"
# a pack gone: run fails; setup (as first run) names the pack, downloads the checkpoint again, converts, says "repaired"
rm "$TMP/inst/native/experts-L003.pack"
INSTR=$(realpath "$TMP/inst")
FIX="deltafin setup test/kimi-mini --dir $INSTR" # the repair command each message names (HF_ENDPOINT is the install's mirror)
out=$("$BIN" run --prompt-ids $IDS --max-new 2 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "the default model test/kimi-mini is an install of .deltafin setup. (in $INSTR): .$FIX. verifies and repairs it" \
    && ok "run with a pack gone: exit 1, names the setup command that repairs it" || bad "run with a pack gone: rc $rc $out"
# serve and bench without --model name the same command (one shared message); list and doctor too
rm -f "$TMP/port"
out=$(timeout 60 "$BIN" serve --port 0 --port-file "$TMP/port" 2>&1); rc=$?
[ $rc -eq 1 ] && [ ! -s "$TMP/port" ] && echo "$out" | grep -q "^deltafin serve: the default model test/kimi-mini (installed by .deltafin setup. in $INSTR) is DAMAGED: expert pack .*experts-L003.pack (layer 3): No such file.*; .$FIX. verifies and repairs it" \
    && ok "serve with a pack gone: exit 1, names the pack and the setup command that repairs it" || bad "serve with a pack gone: rc $rc $out"
for b in decode prefill batch; do
    out=$("$BIN" bench $b --tokens 2 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin bench $b: the default model test/kimi-mini (installed by .deltafin setup. in $INSTR) is DAMAGED: expert pack .*experts-L003.pack .*; .$FIX. verifies and repairs it" \
        && ok "bench $b with a pack gone: exit 1, names the setup command that repairs it" || bad "bench $b with a pack gone: rc $rc $out"
done
out=$("$BIN" doctor 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "verification FAILED: .*(layer 3): the model files are damaged; repair the install with .$FIX.$" \
    && ! echo "$out" | grep -q "deltafin convert" && ok "doctor on the setup install: names setup's repair, not convert" || bad "doctor with a pack gone: rc $rc $out"
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" 2>&1); rc=$?
GOT=$(( $(shards_bytes "$P1") - BEFORE ))
[ $rc -eq 0 ] && ! echo "$out" | grep -q "already installed" && echo "$out" | grep -q "install in $TMP/inst is DAMAGED: experts-L003.pack (layer 3, unreadable); repairing it" \
    && echo "$out" | grep -q "^setup: test/kimi-mini repaired (full, .*) in .*/inst/native: rebuilt experts-L003.pack (layer 3, unreadable) by .*; it is the default model$" \
    && ok "setup over a full install missing a pack: DAMAGED named, repaired (exit 0)" || bad "repair a missing pack: rc $rc $out"
[ "$GOT" -eq "$TOTAL" ] && echo "$out" | grep -q "MB downloaded, 0.[0-9] MB reused from the disk" && ok "repair: the shards fetched again ($GOT bytes), the small files reused" \
    || bad "repair fetched $GOT shard bytes, want $TOTAL: $out"
same=1
for f in $(cd "$TMP/local" && ls | grep -v '^manifest.json$'); do cmp -s "$TMP/local/$f" "$TMP/inst/native/$f" || same=0; done
I=$("$BIN" run --prompt-ids $IDS --max-new 8 --print-ids --quiet 2>/dev/null | tail -1)
[ $same = 1 ] && [ "$I" = "$L" ] && "$BIN" list | grep -q "^\* test/kimi-mini  *full " && ! ls "$TMP/inst/kimi-mini/" | grep -q "safetensors$" \
    && ok "after the repair: native files = local convert, list says full, run gives the same ids, shards removed again" \
    || bad "after the repair: same $same ids '$I' want '$L': $("$BIN" list) $(ls "$TMP/inst/kimi-mini/")"
# a corrupt byte in spine.bin (found by its checksum only), with --full: repaired
python3 - "$TMP/inst/native/spine.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1000); c = f.read(1); f.seek(1000); f.write(bytes([c[0] ^ 4]))
PY
# list checks spine.bin's checksum (a small spine): DAMAGED, the file and the repair named; run / serve / bench / doctor
# without --model name the same repair command
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini  *DAMAGED " && echo "$out" | grep -q "test/kimi-mini: checksum mismatch: $INSTR/native/spine.bin .*the spine is corrupt (.deltafin doctor --model $INSTR/native. checks every file; .$FIX. repairs the install)$" \
    && ok "list: a corrupt spine.bin is DAMAGED, with its checksum and the repair command" || bad "list with a corrupt spine.bin: $out"
out=$("$BIN" run --prompt-ids $IDS --max-new 2 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "spine.bin: checksum mismatch" && echo "$out" | grep -q ": .$FIX. verifies and repairs it" \
    && echo "$out" | grep -q "the file is corrupt; repair the install with .$FIX." && ! echo "$out" | grep -q "deltafin convert" \
    && ok "run with a corrupt spine.bin: names the setup command that repairs it (not convert)" || bad "run with a corrupt spine.bin: rc $rc $out"
out=$(timeout 60 "$BIN" serve --port 0 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "cannot open model .*spine.bin: checksum mismatch" \
    && echo "$out" | grep -q "^deltafin serve: the default model test/kimi-mini .* is DAMAGED: checksum mismatch: .*spine.bin.*; .$FIX. verifies and repairs it" \
    && echo "$out" | grep -q "the file is corrupt; repair the install with .$FIX." && ! echo "$out" | grep -q "deltafin convert" \
    && ok "serve with a corrupt spine.bin: exit 1, names the setup command that repairs it (not convert)" || bad "serve with a corrupt spine.bin: rc $rc $out"
out=$("$BIN" bench decode --tokens 2 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin bench decode: the default model test/kimi-mini .* is DAMAGED: checksum mismatch: .*spine.bin.*; .$FIX. verifies and repairs it" \
    && ok "bench decode with a corrupt spine.bin: names the setup command that repairs it" || bad "bench decode with a corrupt spine.bin: rc $rc $out"
out=$("$BIN" doctor --model "$TMP/inst/native" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: spine CORRUPT: checksum mismatch: $INSTR/native/spine.bin .*the spine is corrupt; repair the install with .$FIX.$" \
    && [ "$(echo "$out" | grep -c 'spine.bin')" -eq 2 ] \
    && echo "$out" | grep -q "verification FAILED: spine.bin CORRUPT, .*repair the install with .$FIX.$" && ! echo "$out" | grep -q "deltafin convert" \
    && ok "doctor --model on a setup install with a corrupt spine.bin: one line for it, setup's repair, never convert" || bad "doctor corrupt spine: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --full --dir "$TMP/inst" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^setup: damaged: checksum mismatch: .*spine.bin" && echo "$out" | grep -q "repaired (full, .*: rebuilt spine.bin by" \
    && cmp -s "$TMP/local/spine.bin" "$TMP/inst/native/spine.bin" && ok "setup --full over a corrupt spine.bin: repaired" || bad "repair spine: rc $rc $out"
# spine.bin gone: doctor names setup's repair (not convert)
mv "$TMP/inst/native/spine.bin" "$TMP/spine.bin.away"
out=$("$BIN" doctor --model "$TMP/inst/native" 2>&1 >/dev/null); rc=$?
mv "$TMP/spine.bin.away" "$TMP/inst/native/spine.bin"
[ $rc -eq 1 ] && echo "$out" | grep -q "spine.bin: No such file or directory (the converted model is incomplete; repair the install with .$FIX.)$" \
    && ! echo "$out" | grep -q "convert again" && ok "doctor on a setup install without spine.bin: setup's repair" || bad "doctor, spine.bin gone: rc $rc $out"
# a side file gone (tokenizer.json): list says DAMAGED (against the checkpoint's copy), doctor names it; setup copies
# it again from the checkpoint's copy, nothing downloaded or converted
rm "$TMP/inst/native/tokenizer.json"
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini  *DAMAGED " && echo "$out" | grep -q "test/kimi-mini: $INSTR/native/tokenizer.json is missing; the checkpoint's copy is $INSTR/kimi-mini/tokenizer.json (.*; .$FIX. repairs the install)$" \
    && ok "list: a full install missing tokenizer.json is DAMAGED, the file and the repair named" || bad "list with tokenizer.json gone: $out"
out=$("$BIN" doctor 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin doctor: $INSTR/native/tokenizer.json is missing; the checkpoint's copy is .*: repair the install with .$FIX.$" \
    && ok "doctor: the setup install's missing tokenizer.json named, with setup's repair (exit 1)" || bad "doctor with tokenizer.json gone: rc $rc $out"
echo "$out" | grep -q "^deltafin doctor: FAILED: tokenizer.json is missing (the checksums are OK); .$FIX. repairs the install$" \
    && [ "$(echo "$out" | grep -c 'tokenizer')" -eq 2 ] \
    && ok "doctor: its last line says it FAILED for the missing tokenizer.json though the checksums are OK; the file named once" \
    || bad "doctor's last line with tokenizer.json gone: $out"
out=$("$BIN" run --prompt hi --max-new 1 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "is an install of .deltafin setup. and its tokenizer .* is missing: the install is damaged; .$FIX. repairs it$" \
    && ok "run: a setup install's missing tokenizer is damage, with setup's repair" || bad "run with tokenizer.json gone: rc $rc $out"
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(shards_bytes "$P1")" = "$BEFORE" ] && cmp -s "$TMP/local/tokenizer.json" "$TMP/inst/native/tokenizer.json" \
    && echo "$out" | grep -q "was damaged and is repaired: tokenizer.json copied again from" && ! echo "$out" | grep -q "converted into" \
    && ok "setup over a full install missing tokenizer.json: copied again, nothing downloaded" || bad "repair tokenizer.json: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "already installed in .* (verified: every checksum matches); it is the default model" \
    && ok "setup over the repaired install: verified, already installed" || bad "setup after repairs: rc $rc $out"
out=$("$BIN" list 2>&1); d=$("$BIN" doctor 2>&1); drc=$?
echo "$out" | grep -q "^\* test/kimi-mini  *full " && ! echo "$out" | grep -q "DAMAGED" && [ $drc -eq 0 ] && echo "$d" | grep -q "^side files: as in the checkpoint $INSTR/kimi-mini$" \
    && ok "after the repairs: list says full, doctor checks the side files (exit 0)" || bad "after the repairs: list $out; doctor rc $drc $d"
# a truncated pack (it stops the model from opening): list names it with setup's repair only (no "convert again"); setup
# says in one clean clause what was damaged and what it did; a pack made larger is damaged as well (list and doctor)
pk2="$TMP/inst/native/experts-L002.pack"
PS=$(stat -c %s "$pk2")
cp "$pk2" "$TMP/pack2.orig"
truncate -s 1000 "$pk2"
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini  *DAMAGED " \
    && echo "$out" | grep -q "test/kimi-mini: expert pack $INSTR/native/experts-L002.pack (layer 2) is 1000 bytes, needs $PS (truncated) (.deltafin doctor --model $INSTR/native. checks every file; .$FIX. repairs the install)$" \
    && ! echo "$out" | grep -q "convert" && ok "list: a truncated pack of a setup install names setup's repair only" || bad "list with a truncated pack: $out"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "install in $TMP/inst is DAMAGED: experts-L002.pack (layer 2, truncated: 1000 of $PS bytes); repairing it" \
    && echo "$out" | grep -q "^setup: test/kimi-mini repaired (full, .*) in .*/inst/native: rebuilt experts-L002.pack (layer 2, truncated: 1000 of $PS bytes) by converting the checkpoint again (.* MB downloaded, .* MB reused from the disk); it is the default model$" \
    && ! echo "$out" | grep -q "convert again" && cmp -s "$TMP/pack2.orig" "$pk2" \
    && ok "setup over a truncated pack: what was damaged and what was done, one clean sentence; repaired" || bad "repair a truncated pack: rc $rc $out"
cat "$TMP/pack2.orig" /dev/zero 2>/dev/null | head -c $((PS + 4096)) >"$pk2"
out=$("$BIN" list 2>&1); d=$("$BIN" doctor 2>&1); drc=$?
echo "$out" | grep -q "^\* test/kimi-mini  *DAMAGED " && echo "$out" | grep -q "experts-L002.pack (layer 2) is $((PS + 4096)) bytes, needs $PS (too large: not the pack this manifest describes) (" \
    && [ $drc -eq 1 ] && echo "$d" | grep -q "^deltafin doctor: layer 2 UNREADABLE: expert pack .*experts-L002.pack (layer 2) is $((PS + 4096)) bytes, needs $PS (too large: not the pack this manifest describes; repair the install with .$FIX.)" \
    && ok "a pack larger than its experts: DAMAGED in list, doctor fails (exit 1)" || bad "oversized pack: list $out; doctor rc $drc $d"
cp "$TMP/pack2.orig" "$pk2"

# ---- suggested commands quote their paths: an install whose directory has a space and a single quote (a copy of
# the full install, recorded in a registry of its own); each command a message suggests, pasted into a shell, gets
# the path as one argument (eval), and the doctor command it suggests runs as is
QD="$TMP/inst dir's"
cp -r "$TMP/inst" "$QD"
words() { eval "set -- $1"'; echo "$#|${'"$2"'}"' 2>/dev/null; } # words CMDLINE N: "argument count|argument N"
out=$("$BIN" setup test/kimi-mini --dir "$QD" --registry "$TMP/regq.json" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "already installed in $QD/native" && ok "setup --dir with a space and a quote: recorded" || bad "setup into [$QD]: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --dir "$QD" --registry "$TMP/regq.json" --revision v2 2>&1)
sugg=$(echo "$out" | sed -n 's/.*delete that install (`\(rm -rf .*\)`) and run.*/\1/p')
sugg2=$(echo "$out" | sed -n 's/.* and run `\(deltafin setup .*\)` again;.*/\1/p')
[ "$(words "$sugg" 3)" = "3|$QD" ] && [ "$(words "$sugg2" 7)" = "9|$QD" ] && [ "$(words "$sugg2" 9)" = "9|$TMP/regq.json" ] \
    && ok "setup --revision v2: the suggested rm -rf and setup --dir (and --registry) quote their paths" \
    || bad "revision suggestions [$sugg] [$sugg2]: $out"
mv "$QD/native/experts-L003.pack" "$TMP/packq.away"
out=$("$BIN" list --registry "$TMP/regq.json" 2>&1)
sugg=$(echo "$out" | sed -n 's/.*(`\(deltafin doctor --model .*\)` checks every file; .*/\1/p')
fix=$(echo "$out" | sed -n 's/.* checks every file; `\(deltafin setup .*\)` repairs the install)$/\1/p')
[ "$(words "$sugg" 4)" = "4|$QD/native" ] && ok "list: the suggested doctor command quotes the path ($sugg)" || bad "list's doctor command [$sugg]: $out"
out=$(eval "\"\$BIN\" ${sugg#deltafin }" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "$QD/native/experts-L003.pack" && ok "the suggested doctor command, pasted, checks that install" || bad "pasted doctor: rc $rc $out"
[ "$(words "$fix" 5)" = "8|$QD" ] && [ "$(words "$fix" 7)" = "8|$TMP/regq.json" ] && [ "$(words "$fix" 8)" = "8|--no-default" ] \
    && ok "list: the suggested repair (setup --dir DIR --registry FILE --no-default) quotes its paths ($fix)" || bad "list's repair command [$fix]: $out"
out=$(eval "\"\$BIN\" ${fix#deltafin }" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "repaired (full, " && cmp -s "$TMP/packq.away" "$QD/native/experts-L003.pack" \
    && "$BIN" list --registry "$TMP/regq.json" | grep -q "^  test/kimi-mini  *full .*$QD/native" \
    && ok "the suggested repair, pasted, restores the pack (the model still not the default)" || bad "pasted repair: rc $rc $out $("$BIN" list --registry "$TMP/regq.json")"
rm -f "$TMP/packq.away"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/inst" --registry "$TMP/regq.json" --no-default 2>&1)
sugg=$(echo "$out" | sed -n 's/.*delete them with `\(rm -rf .*\)` if you no longer need them$/\1/p')
[ "$(words "$sugg" 3)" = "3|$QD" ] && ok "setup's note: the suggested rm -rf quotes the old directory ($sugg)" || bad "rm -rf suggestion [$sugg]: $out"
"$BIN" setup test/kimi-mini --dir "$QD" --registry "$TMP/regq.json" >/dev/null 2>&1 || bad "setup --dir [$QD] as the default"
mv "$QD/native/manifest.json" "$TMP/manq.away"
out=$(DELTAFIN_REGISTRY="$TMP/regq.json" "$BIN" run --prompt-ids $IDS --max-new 1 2>&1); rc=$?
sugg=$(echo "$out" | sed -n 's/.*install it again with `\(deltafin setup .*\)`, pass --model DIR.*/\1/p')
[ $rc -eq 1 ] && [ "$(words "$sugg" 5)" = "5|$QD" ] && ok "run with the default install missing: the suggested setup --dir quotes the directory ($sugg)" \
    || bad "missing default's setup suggestion [$sugg]: rc $rc $out"
rm -rf "$QD"

# ---- kill -9 during the download, then resume: no byte twice
"$BIN" setup test/kimi-mini --mirror "$SLOW" --dir "$TMP/kill" --connections 4 --chunk 8M --no-default --quiet >/dev/null 2>&1 & KP=$!
sleep 2.5
kill -9 $KP; wait $KP 2>/dev/null
[ -d "$TMP/kill/native" ] && bad "kill -9: conversion started (download too fast to interrupt)"
DONE=$(python3 - "$TMP/kill/kimi-mini" <<'PY'
import os, struct, sys
d = sys.argv[1]; s = 0
for n in os.listdir(d):
    p = os.path.join(d, n)
    if n.endswith(".safetensors"): s += os.path.getsize(p)
    elif n.endswith(".safetensors.partial.state") and os.path.exists(p[:-6]):  # a verified file's sidecar: counted above
        b = open(p, "rb").read(); s += sum(struct.unpack("<%dQ" % ((len(b) - 88) // 8), b[88:]))
print(s)
PY
)
ls "$TMP/kill/kimi-mini/"*.partial >/dev/null 2>&1 && ok "kill -9 left .partial files ($DONE of $TOTAL shard bytes written)" || bad "kill -9: no partial file"
[ "$DONE" -gt 0 ] && [ "$DONE" -lt "$TOTAL" ] || bad "kill -9 landed outside the download ($DONE of $TOTAL)"
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --dir "$TMP/kill" --no-default 2>&1); rc=$?
GOT=$(( $(shards_bytes "$P1") - BEFORE ))
[ $rc -eq 0 ] && ok "resume after kill -9" || bad "resume: rc $rc $out"
[ "$GOT" -eq $((TOTAL - DONE)) ] && ok "resume fetched exactly the missing $GOT bytes (nginx log; $DONE were kept): no byte twice" \
    || bad "resume fetched $GOT bytes, want $((TOTAL - DONE))"
for f in spine.bin experts-L001.pack experts-L005.pack; do cmp -s "$TMP/local/$f" "$TMP/kill/native/$f" || bad "resumed install: $f differs"; done
ls "$TMP/kill/kimi-mini/" | grep -q "partial" && bad "resumed install left partial files or sidecars: $(ls "$TMP/kill/kimi-mini/")" \
    || ok "resumed install: no .partial file or sidecar left"
# stderr not a terminal ($(...) is a pipe): no carriage return, no padding, no progress line under 5 s; the summary line
! printf '%s' "$out" | grep -q $'\r' && ! printf '%s' "$out" | grep -q '      $' && ! echo "$out" | grep -q "^download: " \
    && echo "$out" | grep -q "^setup: downloaded [0-9.]* MB in [0-9.]* s" \
    && ok "progress to a pipe: no \\r, no padding, no progress line for a download under 5 s, the summary line" || bad "progress to a pipe: $(printf '%s' "$out" | cat -A)"
# a throttled download (1 connection, 1 MB/s) logged to a file: a plain progress line every 5 s (one by 7 s), no \r
"$BIN" setup test/kimi-mini --mirror "$SLOW" --dir "$TMP/plain" --connections 1 --no-default --registry "$TMP/regp.json" 2>"$TMP/plain.err" & PP=$!
sleep 7; kill -TERM $PP; wait $PP; rc=$? # (SIGINT is ignored by a background job of a script)
n=$(grep -c "^download: [0-9.]*/[0-9.]* MB  *[0-9.]*%  [0-9.]* MB/s  ETA [0-9:-]* | model-0000[123]-of-00003.safetensors [0-9.]*/[0-9.]* MB  *[0-9]*%" "$TMP/plain.err")
[ $rc -eq 130 ] && [ "$n" = 1 ] && ! grep -q $'\r' "$TMP/plain.err" && ! grep -q ' $' "$TMP/plain.err" \
    && ok "progress to a file: one plain line per 5 s ($n by 7 s), no \\r, no padding" || bad "progress to a file: rc $rc, $n lines: $(cat -A "$TMP/plain.err")"
rm -rf "$TMP/plain"
# stderr a terminal (script's pty): the progress line rewritten in place, as before
script -qec "$(printf '%q ' "$BIN" setup test/kimi-mini --dir "$TMP/ttyd" --no-default --registry "$TMP/regt.json")" /dev/null </dev/null >"$TMP/tty.out" 2>&1
grep -q $'\rdownload: [0-9.]*/[0-9.]* MB .*MB/s  ETA' "$TMP/tty.out" && grep -q $'\r  model-00001-of-00003.safetensors  *[0-9.]* MB  sha256 OK  *\r' "$TMP/tty.out" \
    && ok "progress to a terminal: rewritten in place (\\r), bytes, rate, ETA" || bad "progress to a terminal: $(cat -A "$TMP/tty.out" | head -20)"
rm -rf "$TMP/ttyd"
# the repo recorded again from another directory: a note names the old one, whose files stay
"$BIN" setup test/kimi-mini --dir "$TMP/inst" --registry "$TMP/reg7.json" --no-default >/dev/null 2>&1
out=$("$BIN" setup test/kimi-mini --dir "$TMP/kill" --registry "$TMP/reg7.json" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "note: test/kimi-mini was installed in $(realpath "$TMP/inst"); the registry now points at $(realpath "$TMP/kill").*left in place.*rm -rf" \
    && [ -e "$TMP/inst/native/manifest.json" ] && ok "reinstall into another --dir: note naming the old directory" || bad "reinstall note: rc $rc $out"
# --no-default over the default repo into another --dir: the registry (one entry per repo) is left as it is, so the
# default keeps loading its own files; the new install is said to be unrecorded (use it with --model)
"$BIN" setup test/kimi-mini --dir "$TMP/inst" --registry "$TMP/reg8.json" >/dev/null 2>&1 || bad "setup (default) into reg8"
cp "$TMP/reg8.json" "$TMP/reg8.before"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/nd" --registry "$TMP/reg8.json" --no-default 2>&1); rc=$?
RI=$(realpath "$TMP/inst"); RN=$(realpath "$TMP/nd")
[ $rc -eq 0 ] && echo "$out" | grep -q "registry $TMP/reg8.json (not made default)$" \
    && echo "$out" | grep -qxF "setup: note: test/kimi-mini is the default model, installed in $RI; the registry holds one entry per model and --no-default leaves that entry (and so the default) unchanged, so this install in $RN will not be recorded in the registry: use it with --model $RN/native" \
    && echo "$out" | tail -1 | grep -q "^setup: test/kimi-mini installed (full, [0-9.]* MB on disk) in $RN/native; NOT recorded in the registry (--no-default): test/kimi-mini is the default model and its entry still points at $RI/native, left unchanged; use this install with --model $RN/native$" \
    && ! echo "$out" | grep -q "now points at" && cmp -s "$TMP/reg8.json" "$TMP/reg8.before" && [ -e "$TMP/nd/native/manifest.json" ] \
    && ok "setup --no-default of the default repo into another --dir: registry unchanged, the install said to be unrecorded" \
    || bad "--no-default over the default: rc $rc $out $(cat "$TMP/reg8.json")"
out=$(DELTAFIN_REGISTRY=$TMP/reg8.json "$BIN" run --prompt-ids $IDS --max-new 2 2>&1)
echo "$out" | grep -q "model (no --model): .*$RI/native" && ! echo "$out" | grep -q "$RN" \
    && ok "run without --model after setup --no-default elsewhere: still the default's files ($RI/native)" || bad "run after --no-default: $out"
# run again (already installed there): the same, nothing recorded
out=$("$BIN" setup test/kimi-mini --dir "$TMP/nd" --registry "$TMP/reg8.json" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | tail -1 | grep -q "^setup: test/kimi-mini (revision main) is already installed in $RN/native (verified: every checksum matches); NOT recorded in the registry (--no-default)" \
    && cmp -s "$TMP/reg8.json" "$TMP/reg8.before" && ok "setup --no-default again over that install: registry unchanged" || bad "--no-default again: rc $rc $out"
# without --no-default the other directory becomes the default's entry, as before
out=$("$BIN" setup test/kimi-mini --dir "$TMP/nd" --registry "$TMP/reg8.json" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "note: test/kimi-mini was installed in $RI; the registry now points at $RN" \
    && DELTAFIN_REGISTRY=$TMP/reg8.json "$BIN" run --prompt-ids $IDS --max-new 2 2>&1 | grep -q "model (no --model): .*$RN/native" \
    && ok "setup (default) into that --dir: the registry points at it, run loads it" || bad "setup default into nd: rc $rc $out"
rm -rf "$TMP/nd"

# ---- verified files are renamed into place before they are synced; the sync comes once, at the end
# --download-only: the shards byte-identical to the mirror's, synced at the end (its own status line), no sidecar left
out=$("$BIN" setup test/kimi-mini --dir "$TMP/dlo" --download-only --quiet 2>&1); rc=$?
same=1
for f in "$ROOT"/models/kimi-mini/*; do cmp -s "$f" "$TMP/dlo/kimi-mini/$(basename "$f")" || same=0; done
[ $rc -eq 0 ] && [ $same = 1 ] && echo "$out" | grep -q "^setup: synced [0-9.]* MB of the download to the disk in [0-9.]* s$" \
    && ! ls "$TMP/dlo/kimi-mini/" | grep -q partial && ok "--download-only: every file byte-identical to the mirror's, synced at the end, no sidecar left" \
    || bad "--download-only: rc $rc same $same $(ls "$TMP/dlo/kimi-mini/") $out"
out=$(DF_SETUP_WRITEBACK=maybe "$BIN" setup test/kimi-mini --dir "$TMP/dlo2" --download-only 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q 'DF_SETUP_WRITEBACK="maybe": expected 1, on, 0 or off' && [ ! -e "$TMP/dlo2" ] \
    && ok "DF_SETUP_WRITEBACK=maybe: usage error (exit 2), nothing downloaded" || bad "DF_SETUP_WRITEBACK=maybe: rc $rc $out"
# --keep-download: the shards kept and synced after the conversion
# a streamed install's shards are sparse: never handed over (--download-only) or kept (--keep-download) as a checkpoint
for extra in --download-only --keep-download; do
    out=$("$BIN" setup test/kimi-mini --dir "$TMP/sx" --stream $extra 2>&1); rc=$?
    [ $rc -eq 2 ] && echo "$out" | grep -q -- "--stream and $extra cannot be combined" && [ ! -e "$TMP/sx" ] \
        && ok "--stream $extra refused" || bad "--stream $extra: rc $rc $out"
done
out=$("$BIN" setup test/kimi-mini --dir "$TMP/sx" --stream --full 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--full and --stream cannot be combined" && [ ! -e "$TMP/sx" ] \
    && ok "--stream --full refused" || bad "--stream --full: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/sx" --disk-budget 3M 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--disk-budget applies to --stream installs only" && ok "--disk-budget without --stream refused" \
    || bad "--disk-budget without --stream: rc $rc $out"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/keep" --keep-download --no-default --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && cmp -s "$ROOT/models/kimi-mini/model-00002-of-00003.safetensors" "$TMP/keep/kimi-mini/model-00002-of-00003.safetensors" \
    && cmp -s "$TMP/local/spine.bin" "$TMP/keep/native/spine.bin" && echo "$out" | grep -q "^setup: synced [0-9.]* MB of the download to the disk" \
    && ! ls "$TMP/keep/kimi-mini/" | grep -q partial && ok "--keep-download: shards kept, synced after the conversion, no sidecar left" \
    || bad "--keep-download: rc $rc $(ls "$TMP/keep/kimi-mini/") $out"
python3 - "$TMP/keep/native/experts-L002.pack" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(70000); c = f.read(1); f.seek(70000); f.write(bytes([c[0] ^ 1]))
PY
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --dir "$TMP/keep" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(shards_bytes "$P1")" = "$BEFORE" ] && cmp -s "$TMP/local/experts-L002.pack" "$TMP/keep/native/experts-L002.pack" \
    && echo "$out" | grep -q "repaired (full, .*: rebuilt experts-L002.pack (layer 2 expert 1) by .*(0.0 MB downloaded" \
    && cmp -s "$ROOT/models/kimi-mini/model-00002-of-00003.safetensors" "$TMP/keep/kimi-mini/model-00002-of-00003.safetensors" \
    && ok "repair of a --keep-download install: a corrupt expert rebuilt from the kept shards (nothing fetched), shards still kept" \
    || bad "repair with kept shards: rc $rc $(ls "$TMP/keep/kimi-mini/") $out"
# A conversion that fails (an expert dir under a regular file) leaves the shards verified at their final names, not
# yet synced, each sidecar marked so. Then: one shard corrupted on the disk (as a power loss would leave it), one
# put back to FILE.partial (a stop between the sidecar's mark and the rename): the next setup re-hashes all three,
# fetches the corrupted one again (exactly its bytes in nginx's log) and nothing else, and installs the same model.
: > "$TMP/notadir"
out=$("$BIN" setup test/kimi-mini --dir "$TMP/uns" --expert-dirs "$TMP/notadir/x" --no-default --quiet 2>&1); rc=$?
SH1=model-00001-of-00003.safetensors; SH2=model-00002-of-00003.safetensors; SH3=model-00003-of-00003.safetensors
marks=$(python3 - "$TMP/uns/kimi-mini" $SH1 $SH2 $SH3 <<'PY'
import os, sys
d = sys.argv[1]
print(sum(os.path.exists(os.path.join(d, n)) and not os.path.exists(os.path.join(d, n + ".partial"))
          and open(os.path.join(d, n + ".partial.state"), "rb").read(8) == b"DFDL1vu\0" for n in sys.argv[2:]))
PY
)
[ $rc -eq 1 ] && [ "$marks" = 3 ] && ok "conversion failed: the 3 shards at their final names, sidecars marked verified, not yet synced" \
    || bad "unsynced state: rc $rc marks '$marks' $(ls "$TMP/uns/kimi-mini/") $out"
python3 - "$TMP/uns/kimi-mini/$SH2" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(5000000); c = f.read(1); f.seek(5000000); f.write(bytes([c[0] ^ 0x40]))
PY
mv "$TMP/uns/kimi-mini/$SH3" "$TMP/uns/kimi-mini/$SH3.partial"
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --dir "$TMP/uns" --no-default 2>&1); rc=$?
GOT=$(( $(shards_bytes "$P1") - BEFORE ))
[ $rc -eq 0 ] && echo "$out" | grep -q "$SH2 .*sha256 on the disk does not match .*downloading it again" \
    && echo "$out" | grep -q "$SH1 .*sha256 OK on the disk (kept)" && echo "$out" | grep -q "$SH3 .*sha256 OK on the disk (kept)" \
    && echo "$out" | grep -q "re-checked 3 files an earlier run verified but did not sync: 2 kept, 1 downloaded again" \
    && ok "resume re-hashes the unsynced shards: the corrupted one detected, the two intact ones kept" || bad "re-check: rc $rc $out"
[ "$GOT" -eq "$(stat -c %s "$ROOT/models/kimi-mini/$SH2")" ] && ok "only the corrupted shard fetched again ($GOT bytes, nginx log); the intact ones not downloaded twice" \
    || bad "re-check fetched $GOT shard bytes, want $(stat -c %s "$ROOT/models/kimi-mini/$SH2")"
same=1
for f in $(cd "$TMP/local" && ls | grep -v '^manifest.json$'); do cmp -s "$TMP/local/$f" "$TMP/uns/native/$f" || same=0; done
[ $same = 1 ] && ! ls "$TMP/uns/kimi-mini/" | grep -q "safetensors$\|partial" \
    && ok "after the re-check: native files = local convert; shards removed unsynced with their sidecars" || bad "after re-check: same $same $(ls "$TMP/uns/kimi-mini/")"

# ---- a mirror without the listing API: the index is the listing
out=$("$BIN" setup test/kimi-mini-noapi --dir "$TMP/noapi" --no-default --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && cmp -s "$TMP/local/spine.bin" "$TMP/noapi/native/spine.bin" && ok "mirror without listing API (index + HEAD)" || bad "noapi: rc $rc $out"

# ---- the hub's redirect of LFS files (302 + X-Linked-Size / X-Linked-Etag): listing-less mirror (HEADs) and streaming
out=$("$BIN" setup test/kimi-mini-noapi --mirror "$PX/redirect" --dir "$TMP/redir" --no-default --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && cmp -s "$TMP/local/spine.bin" "$TMP/redir/native/spine.bin" && ok "LFS files behind a 302 (sizes and sha256 from X-Linked-*)" \
    || bad "redirect: rc $rc $out"
"$BIN" setup test/kimi-mini --stream --mirror "$PX/redirect" --dir "$TMP/redir-st" --no-default --quiet >/dev/null 2>&1 || bad "setup --stream behind a 302"
R=$("$BIN" run --model "$TMP/redir-st/native" --prompt-ids $IDS --max-new 8 --print-ids --quiet 2>&1 | tail -1)
[ "$R" = "$L" ] && ok "streaming behind a 302: same ids ($R)" || bad "stream redirect: '$R' want '$L'"

# ---- dropped connections are retried
out=$("$BIN" setup test/kimi-mini --mirror "$PX/drop" --dir "$TMP/drop" --no-default --chunk 4M 2>&1); rc=$?
r=$(echo "$out" | sed -n 's/^setup: downloaded [0-9.]* MB in .* MB were already on disk, \([0-9]*\) retries$/\1/p' | tail -1)
# the download's summary is that readable line on stderr; stdout carries no machine-format line
echo "$out" | grep -q "fetched_bytes\|present_bytes" && bad "setup printed a fetched_bytes line: $out" || ok "setup: no fetched_bytes line"
[ $rc -eq 0 ] && [ "${r:-0}" -ge 3 ] && cmp -s "$TMP/local/spine.bin" "$TMP/drop/native/spine.bin" && ok "connections dropped mid-range: $r retries, install intact" \
    || bad "drop: rc $rc retries '$r' $out"

# ---- streamed install: the spine only, experts fetched on first use; identical ids to the full install
# (its own registry, where it is the default: list and doctor see it as the registered install of test/kimi-mini; in
# the main registry test/kimi-mini is the default in $TMP/inst, which setup --no-default elsewhere leaves unchanged)
export DELTAFIN_REGISTRY=$TMP/regs.json
out=$("$BIN" setup test/kimi-mini --stream --dir "$TMP/stream" --quiet 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "installed (stream" && ok "setup --stream" || bad "setup --stream: rc $rc $out"
full_kb=$(du -sk "$TMP/local" | cut -f1); st_kb=$(du -sk "$TMP/stream/native" | cut -f1)
[ "$st_kb" -lt $((full_kb / 2)) ] && ok "streamed native dir holds no experts yet (${st_kb} KB vs ${full_kb} KB full)" || bad "stream size ${st_kb} KB vs ${full_kb} KB"
ck_kb=$(du -sk "$TMP/stream/kimi-mini" | cut -f1)
[ "$ck_kb" -lt 4000 ] && ok "the sparse checkpoint keeps no spine once converted (${ck_kb} KB)" || bad "sparse checkpoint ${ck_kb} KB"
out=$("$BIN" run --model "$TMP/stream/native" --prompt-ids $IDS --max-new 8 --print-ids --stats --ram-budget 20M 2>&1); rc=$?
S1=$(echo "$out" | grep "^[0-9,]*$" | tail -1)
[ $rc -eq 0 ] && [ "$S1" = "$L" ] && ok "streamed run under --ram-budget 20M: greedy ids = full install ($S1)" || bad "stream ids '$S1' want '$L': $out"
net=$(echo "$out" | sed -n 's/^stream: network \([0-9.]*\) MB in \([0-9]*\) expert fetches.*/\1 \2/p')
[ -n "$net" ] && [ "${net#* }" -gt 0 ] && ok "--stats: stream network MB / fetches: $net" || bad "no stream stats: $out"
# --preload on a streamed install would fetch the whole model over the network: refused, with what to do instead
out=$("$BIN" run --model "$TMP/stream/native" --prompt-ids $IDS --max-new 2 --preload 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "this is a streamed install: preloading would fetch every routed expert" \
    && ok "--preload on a streamed install refused" || bad "--preload on a streamed install: rc $rc $out"
out=$("$BIN" run --model "$TMP/stream/native" --prompt-ids $IDS --max-new 8 --print-ids --stats --ram-budget 20M 2>&1)
S2=$(echo "$out" | grep "^[0-9,]*$" | tail -1)
echo "$out" | grep -q "^stream: network 0.00 MB in 0 expert fetches.*local hits [1-9]" && [ "$S2" = "$L" ] \
    && ok "second streamed run: every expert local (0 fetches), same ids" || bad "second stream run: $out"
"$BIN" list | grep -q "test/kimi-mini  *streamed [0-9.]*%" && ok "list: streamed x%" || bad "list streamed: $("$BIN" list)"
out=$("$BIN" doctor --model "$TMP/stream/native" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^experts: streamed install: [1-9][0-9]* fetched experts OK, 0 corrupt" && ok "doctor on a streamed install checks the fetched experts" \
    || bad "doctor stream: rc $rc $out"
rm -f "$TMP/port"
"$BIN" serve --model "$TMP/stream/native" --port 0 --port-file "$TMP/port" 2>"$TMP/serve.log" & sp=$!
for _ in $(seq 1 300); do [ -s "$TMP/port" ] && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
code=$(curl -s -o "$TMP/compl.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"model":"kimi-mini","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0}' \
    "http://127.0.0.1:$(cat "$TMP/port" 2>/dev/null)/v1/chat/completions")
kill -TERM $sp; wait $sp
[ "$code" = 200 ] && grep -q "^stream: network" "$TMP/serve.log" && ok "serve a streamed install (chat completion 200, stream stats at exit)" \
    || bad "serve stream: $code $(cat "$TMP/compl.json") $(cat "$TMP/serve.log")"
le=$(python3 - "$TMP/stream/native" <<'PY'
import json, struct, sys
d = sys.argv[1]; b = open(d + "/stream-state.bin", "rb").read(); L, E = struct.unpack("<II", b[8:16])
l, e = next((l, e) for l in range(L) for e in range(E) if b[16 + l * E + e])
stride = json.load(open(d + "/manifest.json"))["experts"]["stride"]
with open("%s/experts-L%03d.pack" % (d, l), "r+b") as f:
    f.seek(e * stride + 100); c = f.read(1); f.seek(e * stride + 100); f.write(bytes([c[0] ^ 1]))
print(l, e)
PY
)
out=$("$BIN" doctor --model "$TMP/stream/native" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "streamed expert layer ${le% *} expert ${le#* } in .*experts-L00${le% *}.pack: XXH64" \
    && echo "$out" | grep -q "verification FAILED: 1 streamed experts corrupt; .deltafin setup test/kimi-mini --stream --dir $(realpath "$TMP/stream"). fetches them again$" \
    && ok "doctor names a corrupt fetched expert (layer ${le% *} expert ${le#* }) and the setup --stream that fetches it again" || bad "doctor corrupt stream: rc $rc $out"
out=$("$BIN" run --model "$TMP/stream/native" --prompt-ids $IDS --max-new 8 --print-ids 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "checksum mismatch in layer ${le% *} expert ${le#* }" && ok "run refuses the corrupt fetched expert (XXH64 recorded at fetch)" \
    || bad "run on corrupt stream: rc $rc $out"
# setup --stream run again over it: every fetched expert checked, the corrupt one fetched again (not "already installed")
out=$("$BIN" setup test/kimi-mini --stream --dir "$TMP/stream" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && ! echo "$out" | grep -q "already installed" && echo "$out" | grep -q "^setup: damaged: streamed expert layer ${le% *} expert ${le#* } in .*: XXH64" \
    && echo "$out" | grep -q "was damaged and is repaired: 1 corrupt fetched expert (layer ${le% *} expert ${le#* }) fetched again; [1-9][0-9]* intact ones kept" \
    && ok "setup --stream over the corrupt fetched expert: fetched again (exit 0)" || bad "repair streamed: rc $rc $out"
out=$("$BIN" run --model "$TMP/stream/native" --prompt-ids $IDS --max-new 8 --print-ids --ram-budget 20M 2>&1); rc=$?
d=$("$BIN" doctor --model "$TMP/stream/native" 2>&1); drc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | tail -1)" = "$L" ] && [ $drc -eq 0 ] && ok "after the streamed repair: doctor OK, run gives the full install's ids" \
    || bad "after the streamed repair: run rc $rc $(echo "$out" | tail -1) want $L; doctor rc $drc $d"
out=$("$BIN" setup test/kimi-mini --stream --dir "$TMP/stream" --no-default 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "already installed in .* (verified: every fetched expert matches its checksum)" \
    && ok "setup --stream over the intact streamed install: verified, already installed" || bad "setup --stream again: rc $rc $out"
BEFORE=$(shards_bytes "$P1")
out=$("$BIN" setup test/kimi-mini --full --dir "$TMP/stream" --no-default --quiet 2>&1); rc=$?
GOT=$(( $(shards_bytes "$P1") - BEFORE ))
KEPT=$(echo "$out" | sed -n 's/.*: \([0-9.]*\) MB already here are kept$/\1/p')
[ $rc -eq 0 ] && [ ! -e "$TMP/stream/native/stream.json" ] && cmp -s "$TMP/local/experts-L003.pack" "$TMP/stream/native/experts-L003.pack" \
    && cmp -s "$TMP/local/spine.bin" "$TMP/stream/native/spine.bin" \
    && ok "setup --full completes a streamed install in place (native files = local convert)" || bad "complete in place: rc $rc $out"
python3 -c "import sys; k=float(sys.argv[1]); got=int(sys.argv[2]); tot=int(sys.argv[3]); sys.exit(not (k > 5 and abs(got - (tot - k * 1e6)) < 1e5))" \
    "${KEPT:-0}" "$GOT" "$TOTAL" && ok "completing keeps what was streamed: $KEPT MB kept, $GOT shard bytes fetched of $TOTAL" \
    || bad "completing: kept '$KEPT' MB, fetched $GOT of $TOTAL: $out"
export DELTAFIN_REGISTRY=$TMP/registry.json

# ---- a bounded disk cache (--disk-budget): coldest experts evicted, same ids
"$BIN" setup test/kimi-mini --stream --disk-budget 3M --dir "$TMP/bounded" --no-default --quiet >/dev/null 2>&1 || bad "setup --stream --disk-budget"
out=$("$BIN" run --model "$TMP/bounded/native" --prompt-ids $IDS --max-new 8 --print-ids --stats --ram-budget 20M 2>&1)
B1=$(echo "$out" | grep "^[0-9,]*$" | tail -1)
[ "$B1" = "$L" ] && echo "$out" | grep -q "^stream: .*disk cache 3.15 MB (59 extents), [1-9][0-9]* evicted" \
    && ok "--disk-budget 3M: experts evicted by heat, ids unchanged ($(echo "$out" | grep -o 'present [0-9]* / [0-9]*'))" || bad "disk budget: $out"

# ---- warm: a streamed install fetches ahead what a recorded trace ranks first (acquisition counts)
"$BIN" run --model "$TMP/local" --prompt-ids $IDS --max-new 4 --quiet --ram-budget 20M --events "$TMP/ev.jsonl" >/dev/null 2>&1
"$BIN" setup test/kimi-mini --stream --dir "$TMP/warm" --no-default --quiet >/dev/null 2>&1 || bad "setup --stream for warm"
out=$("$BIN" warm --model "$TMP/warm/native" --trace "$TMP/ev.jsonl" --budget 1M 2>&1); rc=$?
python3 - "$TMP/ev.jsonl" "$TMP/warm/native/stream-state.bin" <<'PY' && [ $rc -eq 0 ] && ok "warm --trace --budget 1M: $(echo "$out" | tail -1 | cut -c1-60)..., exactly the trace's top-ranked experts" || bad "warm: rc $rc $out"
import json, struct, sys
cnt = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("ev") == "acquire":
        for i in e["ids"]: cnt[(e["layer"], i)] = cnt.get((e["layer"], i), 0) + 1
rank = sorted(cnt, key=lambda k: (-cnt[k], k[0], k[1]))
b = open(sys.argv[2], "rb").read(); L, E = struct.unpack("<II", b[8:16])
have = {(l, x) for l in range(L) for x in range(E) if b[16 + l * E + x]}
k = len(have)
sys.exit(not (0 < k < len(rank) and have == set(rank[:k])))
PY
echo "$out" | grep -q "evicted" && bad "warm without a disk budget speaks of evictions: $out"
out=$("$BIN" run --model "$TMP/warm/native" --prompt-ids $IDS --max-new 4 --print-ids --stats 2>&1)
echo "$out" | grep -q "^stream: .*local hits [1-9]" && ok "a run after warm finds the warmed experts local" || bad "after warm: $out"
# warm on an install with a disk budget: the closing line says how many experts the budget evicted (fetched - evicted = present)
"$BIN" setup test/kimi-mini --stream --dir "$TMP/warmb" --disk-budget 1M --no-default --quiet >/dev/null 2>&1 || bad "setup --stream --disk-budget 1M for warm"
printf 'Hello, how are you today?\nThe quick brown fox jumps over the lazy dog.\nWrite a poem about the sea and the sky.\n' >"$TMP/prompts.txt"
out=$("$BIN" warm --model "$TMP/warmb/native" --prompts "$TMP/prompts.txt" 2>&1); rc=$?
re='^warm: fetched \([0-9]*\) experts (.*) in [0-9.]* s; 0 already local; \([0-9]*\) evicted by the disk budget; present \([0-9]*\) / 320 ([0-9.]*%)$'
f_e_p=$(echo "$out" | tail -1 | sed -n "s|$re|\1 \2 \3|p")
read -r wf we wp <<<"$f_e_p"
[ $rc -eq 0 ] && [ -n "$f_e_p" ] && [ "$we" -gt 0 ] && [ $((wf - we)) -eq "$wp" ] \
    && ok "warm --prompts under --disk-budget 1M: $wf fetched, $we evicted by the disk budget, $wp present" || bad "warm with a disk budget: rc $rc $out"

# ---- faults: message + exit 1, nothing installed
expect_fail() { # expect_fail WHAT PATTERN ARGS...
    local what=$1 pat=$2; shift 2
    local out rc; out=$("$@" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q -- "$pat" && ok "$what" || bad "$what: rc $rc, want 1 and /$pat/: $out"
}
S="$BIN setup --quiet --no-default --retries 1"
expect_fail "no network" "cannot reach the mirror http://127.0.0.1:1 .*no network" $S test/kimi-mini --mirror http://127.0.0.1:1 --dir "$TMP/f1"
expect_fail "401 without a token" "401 Unauthorized: the repo needs a token: set HF_TOKEN" $S test/kimi-mini --mirror "$PX/auth" --dir "$TMP/f2"
expect_fail "401 with a wrong token" "the token in HF_TOKEN was refused" env HF_TOKEN=nope $S test/kimi-mini --mirror "$PX/auth" --dir "$TMP/f2"
out=$(HF_TOKEN=good $S test/kimi-mini --mirror "$PX/auth" --dir "$TMP/f2b" 2>&1) && ok "the right token (HF_TOKEN) is sent" || bad "token: $out"
expect_fail "404 repo" "repo test/nope not found on $M" $S test/nope --dir "$TMP/f3"
expect_fail "404 revision" "revision \"v9\" not found in test/kimi-mini" $S test/kimi-mini --revision v9 --dir "$TMP/f3"
expect_fail "404 file" "404 Not Found: model-0000[123]-of-00003.safetensors is not in test/kimi-mini" $S test/kimi-mini --mirror "$PX/e404" --dir "$TMP/f4"
expect_fail "500" "answered HTTP 500 after 2 tries" $S test/kimi-mini --mirror "$PX/e500" --dir "$TMP/f5"
expect_fail "no Range support" "does not support HTTP Range requests" $S test/kimi-mini --mirror "$PX/norange" --dir "$TMP/f6" --chunk 4M
expect_fail "corrupt byte" "sha256 mismatch for model-00001-of-00003.safetensors .*expected e83929f5" $S test/kimi-mini --mirror "$PX/corrupt" --dir "$TMP/f7"
[ ! -e "$TMP/f7/kimi-mini/model-00001-of-00003.safetensors" ] && [ ! -e "$TMP/f7/kimi-mini/model-00001-of-00003.safetensors.partial" ] && [ ! -d "$TMP/f7/native" ] \
    && ok "corrupt file removed, nothing converted" || bad "corrupt: files left: $(ls -R "$TMP/f7")"
expect_fail "corrupt small file" "git blob id mismatch for tokenizer_config.json: expected $(python3 -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())' "$ROOT/models/kimi-mini/tokenizer_config.json")" \
    $S test/kimi-mini --mirror "$PX/corruptsmall" --dir "$TMP/f7s"
before=$(grep -c "test/llama/resolve/main/.*safetensors" "$TMP/access.log")
expect_fail "unsupported architecture" "test/llama cannot be run by deltafin: .*llama.*nothing was downloaded" $S test/llama --dir "$TMP/f8"
[ "$(grep -c "test/llama/resolve/main/.*safetensors" "$TMP/access.log")" = "$before" ] && ok "unsupported architecture: no weight requested" || bad "llama weights requested"
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=8m tmpfs "$TMP/small" 2>/dev/null; then
    MOUNTED=$TMP/small
    expect_fail "disk full" "not enough disk space in $TMP/small/i: the download needs 30.8[0-9] GB\|not enough disk space in $TMP/small/i" $S test/kimi-mini --dir "$TMP/small/i"
else echo "skip disk full: cannot mount a small tmpfs (not root)"; fi
out=$("$BIN" list 2>&1)
echo "$out" | grep -q "^\* test/kimi-mini " && ! echo "$out" | grep -q "test/nope\|test/llama" && ok "registry: failures recorded nothing, default unchanged" || bad "list after faults: $out"
expect_fail "registry unreadable" "is not a deltafin models.json" env DELTAFIN_REGISTRY="$ROOT/models/kimi-mini/config.json" "$BIN" list
finish
