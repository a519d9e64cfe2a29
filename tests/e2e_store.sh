#!/usr/bin/env bash
# e2e_store.sh — streaming experts end to end on a small synthetic model
# (deltafin synth, 2 pack directories): greedy ids are identical with no
# budget, with a budget of about 1/4 of the expert bytes, with the pread
# engine's store and with --expert-dirs; a corrupted pack is a clear error
# naming layer, expert and file; bench io and bench decode run (the configuration line on
# stderr, as bench prefill's); the events file has the drives' busy / idle transitions and the requests,
# which tools/drive-idle.py reads; bench io's suggested synth command quotes a directory with a space or a
# single quote. synth refuses a non-empty OUT_DIR unless --force (which
# deletes the old model files).
set -u
BIN=${DF_BIN:?DF_BIN not set}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d /tmp/df_e2e_store.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

"$BIN" synth "$T/m" --quiet --hidden 256 --moe-inter 128 --experts 32 --layers 4 --vocab 512 --heads 4 \
  --q-lora 64 --kv-lora 32 --inter 512 --nope 16 --rope 8 --v-dim 16 --top-k 4 \
  --expert-dirs "$T/m/d0,$T/m/d1" && ok || bad "synth"
[ -f "$T/m/manifest.json" ] && [ ! -e "$T/m/manifest.json.tmp" ] && ok || bad "manifest written atomically"

# synth refuses a non-empty OUT_DIR (and pack directories holding packs); --force deletes the old model files first
S=(--quiet --hidden 256 --moe-inter 128 --experts 8 --vocab 512 --heads 4 --q-lora 64 --kv-lora 32 --inter 512
   --nope 16 --rope 8 --v-dim 16 --top-k 2)
"$BIN" synth "$T/f" "${S[@]}" --layers 4 && ok || bad "synth small"
sum0=$(cat "$T/f"/* | md5sum)
"$BIN" synth "$T/f" "${S[@]}" --layers 3 --seed 2 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "is not empty" "$T/err" && grep -q -- "--force" "$T/err" && [ "$(cat "$T/f"/* | md5sum)" = "$sum0" ] \
  && ok || bad "synth into a non-empty dir: rc $rc $(cat "$T/err")"
echo '{}' >"$T/f/tokenizer.json"; echo keep >"$T/f/notes.txt"
"$BIN" synth "$T/f" "${S[@]}" --layers 3 --seed 2 --force 2>"$T/err" && [ ! -e "$T/f/experts-L003.pack" ] \
  && [ ! -e "$T/f/tokenizer.json" ] && [ -f "$T/f/notes.txt" ] && [ -f "$T/f/experts-L002.pack" ] \
  && ok || bad "synth --force: $(ls "$T/f") $(cat "$T/err")"
"$BIN" run --model "$T/f" --prompt-ids 1,2 --max-new 2 --quiet >/dev/null 2>"$T/err" && ok || bad "run after --force: $(cat "$T/err")"
mkdir -p "$T/e1"; cp "$T/f/experts-L001.pack" "$T/e1/"
"$BIN" synth "$T/g" "${S[@]}" --layers 3 --expert-dirs "$T/e1,$T/e2" 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "already holds model files" "$T/err" && [ ! -e "$T/g/manifest.json" ] && ok \
  || bad "synth into a pack dir with packs: rc $rc $(cat "$T/err")"
: >"$T/x"; "$BIN" synth "$T/x" "${S[@]}" 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "not a directory" "$T/err" && ok || bad "synth onto a file: rc $rc $(cat "$T/err")"
rm -rf "$T/f" "$T/g" "$T/e1" "$T/e2" "$T/x"

run() { "$BIN" run --model "$T/m" --prompt-ids 5,17,42,99 --max-new 12 --print-ids --quiet "$@" 2>"$T/err" | tail -1; }
ref=$(run)
[ -n "$ref" ] && ok || bad "run without budget: $(cat "$T/err")"
# experts: 3 layers x 32 x 57344 B = 5.25 MiB; fixed part (spine 2.28 MiB, KV, other, store tables) 2.42 MiB;
# + 1/4 of the experts (1.31 MiB, 23 slots) -> 3.75 MiB budget; 3.2 MiB -> 13 slots
b=$(run --ram-budget 3.75M)
[ "$b" = "$ref" ] && ok || bad "budget 3.75M ids '$b' vs '$ref' ($(cat "$T/err"))"
# --preload: every routed expert (3 layers x 32) read before the prompt; then no decode step misses; the same ids
"$BIN" run --model "$T/m" --prompt-ids 5,17,42,99 --max-new 12 --print-ids --preload --stats >"$T/out" 2>"$T/err"
[ "$(tail -1 "$T/out")" = "$ref" ] && grep -q "^preload: 96 of 96 routed experts in memory (0 in GPU memory, 96 in the host cache), " "$T/err" \
  && grep -q "misses 0," "$T/err" && ok || bad "run --preload: $(cat "$T/out" "$T/err")"
# under a budget of 13 slots: it stops when the cache is full (nothing evicted), and says so; the same ids
"$BIN" run --model "$T/m" --prompt-ids 5,17,42,99 --max-new 12 --print-ids --preload --ram-budget 3.2M >"$T/out" 2>"$T/err"
[ "$(tail -1 "$T/out")" = "$ref" ] && grep -Eq "^preload: [0-9]+ of 96 routed experts in memory \(0 in GPU memory, [0-9]+ in the host cache\): the budgets hold no more" "$T/err" \
  && ok || bad "run --preload --ram-budget 3.2M: $(cat "$T/out" "$T/err")"
ev=$(run --ram-budget 3.2M --events "$T/ev.jsonl")
[ "$ev" = "$ref" ] && ok || bad "budget 3.2M ids '$ev' vs '$ref' ($(cat "$T/err"))"
grep -q '"ev":"token"' "$T/ev.jsonl" && grep -q '"ev":"read"' "$T/ev.jsonl" && ok || bad "events file"
# the drive's busy / idle transitions pair up, every request names its priority, and tools/drive-idle.py splits
# the decode steps' idle drive time
nb=$(grep -c '"ev":"drive_busy","drive":0' "$T/ev.jsonl"); ni=$(grep -c '"ev":"drive_idle","drive":0' "$T/ev.jsonl")
[ "$nb" -gt 0 ] && [ "$nb" = "$ni" ] && grep -Eq '"ev":"request","layer":[0-9]+,"n":[0-9]+,"prio":"(demand|prefetch)","started":[0-9]+' "$T/ev.jsonl" \
  && ok || bad "drive / request events: busy $nb idle $ni"
# --io-depth / --io-size: the store's reads in flight and read size; the same ids, echoed on the configuration line
"$BIN" run --model "$T/m" --prompt-ids 5,17,42,99 --max-new 12 --print-ids --ram-budget 3.2M --io-depth 3 --io-size=12K >"$T/out" 2>"$T/err"
[ "$(tail -1 "$T/out")" = "$ref" ] && grep -Eq ", I/O (io_uring|pread) 3 x 12 KiB, " "$T/err" && ok || bad "run --io-depth 3 --io-size 12K: $(cat "$T/out" "$T/err")"
for bad_io in "--io-depth 0" "--io-depth 2000" "--io-size 1000" "--io-size 128M"; do
  "$BIN" run --model "$T/m" --prompt-ids 5 --max-new 1 $bad_io >/dev/null 2>"$T/err"
  [ $? -eq 2 ] && grep -q "expected" "$T/err" && ok || bad "run $bad_io: $(cat "$T/err")"
done
"$ROOT/tools/drive-idle.py" "$T/ev.jsonl" >"$T/idle" 2>&1 && grep -q "decode steps" "$T/idle" \
  && grep -Eq "^  drive 0: idle [0-9.]+% of the decode time .* boundary [0-9.]+% .* in-layer [0-9.]+%" "$T/idle" \
  && ok || bad "drive-idle.py: $(cat "$T/idle")"
"$BIN" run --model "$T/m" --prompt-ids 1,2 --max-new 1 --ram-budget 1M --quiet >/dev/null 2>"$T/err"
[ $? -ne 0 ] && grep -q "too small" "$T/err" && grep -q "at least" "$T/err" && ok || bad "tiny budget error: $(cat "$T/err")"

cp -r "$T/m/d0" "$T/d0x"; cp -r "$T/m/d1" "$T/d1x"

"$BIN" bench io --dir "$T/m/d0,$T/m/d1" --size 64K --seconds 0.3 --no-drop >"$T/io" 2>&1 && grep -q "GB/s" "$T/io" && ok || bad "bench io: $(cat "$T/io")"
# reads landing in turn in a pool of --buffer per directory (as the expert cache fills)
"$BIN" bench io --dir "$T/m/d0,$T/m/d1" --size 64K --seconds 0.3 --buffer 40M --no-drop >"$T/io" 2>&1 \
  && grep -q "into 40 MiB of buffers" "$T/io" && ok || bad "bench io --buffer: $(cat "$T/io")"
# the drive's speed with threads computing beside the reads
"$BIN" bench io --dir "$T/m/d0" --size 64K --seconds 0.3 --cpu-load 2 --no-drop >"$T/io" 2>&1 \
  && grep -q "GB/s with 2 threads computing" "$T/io" && ok || bad "bench io --cpu-load: $(cat "$T/io")"
# a directory with nothing to read: the suggested `deltafin synth DIR ...` quotes DIR (a space, a single quote), so that
# pasted into a shell it writes into that directory, not into its first word
for d in "$T/syn small" "$T/it's here"; do
  mkdir -p "$d"
  "$BIN" bench io --dir "$d" --seconds 0.1 --no-drop >"$T/io" 2>&1; rc=$?
  sugg=$(sed -n 's/.*(write one with `\(deltafin synth .*\) \.\.\.`)$/\1/p' "$T/io")
  words=$(eval "set -- $sugg"'; echo "$#|$3"' 2>/dev/null)
  [ $rc -ne 0 ] && [ "$words" = "3|$d" ] && ok || bad "bench io in [$d]: the suggested command is not one word per argument ($words): rc $rc $(cat "$T/io")"
done
# a pool no larger than the qd reused buffers would measure nothing new: refused, the minimum named
"$BIN" bench io --dir "$T/m/d0" --buffer 4K --no-drop >"$T/io" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "a pool must be larger than --qd x --size (16384 KiB here)" "$T/io" && ok || bad "bench io --buffer 4K: rc $rc $(cat "$T/io")"
"$BIN" bench decode --model "$T/m" --io-buffer 16M --no-drop >"$T/io" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "a pool must be larger than --qd x 1 MiB reads (16 MiB here)" "$T/io" && ok || bad "bench decode --io-buffer 16M: rc $rc $(cat "$T/io")"
"$BIN" bench decode --model "$T/m" --ram-budget 6.25M --tokens 2 --io-seconds 0.2 --io-buffer 33M --no-drop >"$T/bd" 2>"$T/bd.err" \
  && [ "$(grep -c "GB/s into 33 MiB of buffers" "$T/bd")" = 2 ] && grep -q "storage bound with B into 33 MiB of buffers" "$T/bd" && ok \
  || bad "bench decode --io-buffer: $(cat "$T/bd" "$T/bd.err")"
"$BIN" bench decode --model "$T/m" --ram-budget 6.25M --tokens 2 --io-seconds 0.2 --io-cpu-load 1 --no-drop >"$T/bd" 2>"$T/bd.err" \
  && grep -q "GB/s with 1 thread computing" "$T/bd" && grep -q "storage bound with B read beside 1 computing thread = " "$T/bd" && ok \
  || bad "bench decode --io-cpu-load: $(cat "$T/bd" "$T/bd.err")"
"$BIN" bench decode --model "$T/m" --ram-budget 6.25M --tokens 4 --io-seconds 0.3 --no-drop >"$T/bd" 2>"$T/bd.err" \
  && grep -q "tok/s" "$T/bd" && grep -q "hit rate" "$T/bd" && grep -q "storage bound" "$T/bd" && ok \
  || bad "bench decode: $(cat "$T/bd" "$T/bd.err")"
# its resolved configuration: one line on stderr (as run and serve), none on stdout; bench prefill the same
[ "$(grep -c "^model .*, backend .*, prefetch o[nf]*, prefault o[nf]*, " "$T/bd.err")" = 1 ] && ! grep -q "prefault" "$T/bd" \
  && ok || bad "bench decode configuration line: stdout $(cat "$T/bd"); stderr $(cat "$T/bd.err")"
"$BIN" bench prefill --model "$T/m" --ram-budget 6.25M --tokens 8 --io-seconds 0.2 --no-drop >"$T/bp" 2>"$T/bp.err" \
  && [ "$(grep -c "^model .*, backend .*, prefault o[nf]*, " "$T/bp.err")" = 1 ] && ! grep -q "prefault" "$T/bp" \
  && ok || bad "bench prefill configuration line: stdout $(cat "$T/bp"); stderr $(cat "$T/bp.err")"

# trace replays: eviction policies (LRU / frequency / heat tier) and the store's I/O path without compute
run --max-new 24 --events "$T/tr.jsonl" >/dev/null
"$BIN" bench cache --model "$T/m" --trace "$T/tr.jsonl" --slots 8,16,32 >"$T/bc" 2>&1 && grep -q "LRFU+heat" "$T/bc" \
  && [ "$(grep -cE '^ +[0-9]+ +[0-9.]+%' "$T/bc")" = 3 ] && ok || bad "bench cache: $(cat "$T/bc")"
"$BIN" bench store --model "$T/m" --trace "$T/tr.jsonl" --io-seconds 0.3 --no-drop >"$T/bs" 2>&1 \
  && grep -q "of bench io" "$T/bs" && ok || bad "bench store: $(cat "$T/bs")"

# corrupt every expert of layer 2 in stripe 1 (byte 100 of each stripe): checksum error, never a wrong token
python3 - "$T/m/d1/experts-L002.pack" <<'PY'
import sys, os
p = sys.argv[1]; n = os.path.getsize(p); stripe = n // 32
with open(p, "r+b") as f:
    for e in range(32):
        f.seek(e * stripe + 100); b = f.read(1); f.seek(e * stripe + 100); f.write(bytes([b[0] ^ 0x55]))
PY
out=$(run)
rc=$?
grep -q "checksum mismatch in layer 2 expert" "$T/err" && grep -q "experts-L002.pack" "$T/err" && ok \
  || bad "corrupt pack: rc $rc out '$out' err: $(cat "$T/err")"
# clean copies through --expert-dirs (the manifest's packs are the corrupt ones now)
mv2=$(run --expert-dirs "$T/d0x,$T/d1x" --ram-budget 3.75M)
[ "$mv2" = "$ref" ] && ok || bad "--expert-dirs ids '$mv2' vs '$ref' ($(cat "$T/err"))"
# truncated pack
truncate -s 100000 "$T/m/d0/experts-L003.pack"
out=$(run)
grep -q "experts-L003.pack" "$T/err" && grep -qi "truncated" "$T/err" && ok || bad "truncated pack: $(cat "$T/err")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
