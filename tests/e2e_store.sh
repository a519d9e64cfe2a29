#!/usr/bin/env bash
# e2e_store.sh — streaming experts end to end on a small synthetic model
# (deltafin synth, 2 pack directories): greedy ids are identical with no
# budget, with a budget of about 1/4 of the expert bytes, with the pread
# engine's store and with --expert-dirs; a corrupted pack is a clear error
# naming layer, expert and file; bench io and bench decode run (the configuration line on
# stderr, as bench prefill's); the events file has the drives' busy / idle transitions and the requests,
# which tools/drive-idle.py reads; bench io's suggested synth command quotes a directory with a space or a
# single quote. synth refuses a non-empty OUT_DIR unless --force (which
# deletes the old model files). bench cache / store / project refuse a trace recorded on another model (exit 1,
# naming both and what to do), warn once about a trace without an open event; bench project's result line of an
# int8-spine model says NOT EXACT, and it counts the waits for streamed spine layers (bench decode --events records
# them) as I/O, not compute.
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
"$BIN" run --model "$T/m" --prompt-ids 5,17,42,99 --max-new 24 --print-ids --quiet --events "$T/tr.jsonl" >/dev/null 2>"$T/err" \
  || bad "run recording the trace: $(cat "$T/err")"
"$BIN" bench cache --model "$T/m" --trace "$T/tr.jsonl" --slots 8,16,32 >"$T/bc" 2>&1 && grep -q "LRFU+heat" "$T/bc" \
  && [ "$(grep -cE '^ +[0-9]+ +[0-9.]+%' "$T/bc")" = 3 ] && ok || bad "bench cache: $(cat "$T/bc")"
"$BIN" bench store --model "$T/m" --trace "$T/tr.jsonl" --io-seconds 0.3 --no-drop >"$T/bs" 2>&1 \
  && grep -q "of bench io" "$T/bs" && ok || bad "bench store: $(cat "$T/bs")"


# a trace recorded on a model of other expert shapes is refused (exit 1) by bench cache / store / project before
# anything is measured, in one plain line naming both models and what to do: expert slots of another size (a model of
# smaller experts), or experts the model lacks (a larger model's trace on a smaller one); the same model in another
# stripe layout is not another model; the same checkpoint under another name (a Hugging Face folder of another name)
# is replayed with one note line naming both names; a trace without an open event (an older events file) is replayed
# with a one-line warning, or refused with the old question when its experts are not the model's
"$BIN" synth "$T/m8" --quiet --hidden 256 --moe-inter 128 --experts 8 --layers 4 --vocab 512 --heads 4 \
  --q-lora 64 --kv-lora 32 --inter 512 --nope 16 --rope 8 --v-dim 16 --top-k 4 && ok || bad "synth m8"
"$BIN" synth "$T/m1" --quiet --hidden 256 --moe-inter 128 --experts 32 --layers 4 --vocab 512 --heads 4 \
  --q-lora 64 --kv-lora 32 --inter 512 --nope 16 --rope 8 --v-dim 16 --top-k 4 && ok || bad "synth m1 (one pack directory)"
"$BIN" synth "$T/ms" --quiet --hidden 256 --moe-inter 64 --experts 8 --layers 4 --vocab 512 --heads 4 \
  --q-lora 64 --kv-lora 32 --inter 512 --nope 16 --rope 8 --v-dim 16 --top-k 4 && ok || bad "synth ms (smaller experts)"
"$BIN" run --model "$T/ms" --prompt-ids 5,17,42,99 --max-new 8 --quiet --events "$T/trs.jsonl" >/dev/null 2>&1
# bench CMD ARGS...: rc, stdout and stderr into $T/rc, $T/out, $T/err
bn() { "$BIN" bench "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
foreign() { # foreign WHAT TRACE NAME MODEL SHAPE [WHY]: exit 1, one line naming both models and what to do, nothing on stdout
  [ "$(cat "$T/rc")" = 1 ] && [ ! -s "$T/out" ] && [ "$(wc -l <"$T/err")" = 1 ] \
    && grep -Eq "$2 was recorded on another model: \"$3\" \(expert slots of [0-9]+ bytes${6:-}\), not on --model $4 \($5, " "$T/err" \
    && grep -q "record a trace with this model (\`deltafin [a-z ]* --model $4 --events FILE\`) or pass --model the model the trace was recorded on$" "$T/err" \
    && ! grep -q "?" "$T/err" && ok || bad "$1: a trace of another model: rc $(cat "$T/rc") $(cat "$T/out" "$T/err")"
}
# a model of smaller experts (expert slots of another size): its trace is refused on $T/m
S32='"synth-mxfp4-4x32", 4 layers, 3 MoE x 32 experts'
bn cache --model "$T/m" --trace "$T/trs.jsonl" --slots 8
foreign "bench cache" "$T/trs.jsonl" synth-mxfp4-4x8 "$T/m" "$S32"; grep -q "^deltafin bench cache: --trace " "$T/err" || bad "bench cache: the flag: $(cat "$T/err")"
bn cache --model "$T/m" --trace "$T/tr.jsonl" --train "$T/trs.jsonl" --slots 8
foreign "bench cache --train" "$T/trs.jsonl" synth-mxfp4-4x8 "$T/m" "$S32"; grep -q "^deltafin bench cache: --train " "$T/err" || bad "bench cache --train: the flag: $(cat "$T/err")"
bn store --model "$T/m" --trace "$T/trs.jsonl" --io-seconds 5
foreign "bench store" "$T/trs.jsonl" synth-mxfp4-4x8 "$T/m" "$S32"
bn project --drives 1 --gbps 1 --from "$T/trs.jsonl" --model "$T/m"
foreign "bench project --from" "$T/trs.jsonl" synth-mxfp4-4x8 "$T/m" "$S32"; grep -q "(\`deltafin bench decode --model $T/m --events FILE\`)" "$T/err" \
  && ok || bad "bench project: the command that records a trace: $(cat "$T/err")"
# a larger model's trace on a smaller model of the same expert size: its experts are not the smaller model's, said
# plainly (the open event names the model), not as a question
S8='"synth-mxfp4-4x8", 4 layers, 3 MoE x 8 experts'
for c in "cache --slots 8" "store --io-seconds 5"; do
  bn $c --model "$T/m8" --trace "$T/tr.jsonl"
  foreign "bench ${c%% *} (a larger model's trace)" "$T/tr.jsonl" synth-mxfp4-4x32 "$T/m8" "$S8" "; its layer [0-9]+ expert [0-9]+ is not a routed expert of --model"
done
bn project --drives 1 --gbps 1 --from "$T/tr.jsonl" --model "$T/m8"
foreign "bench project (a larger model's trace)" "$T/tr.jsonl" synth-mxfp4-4x32 "$T/m8" "$S8" "; its experts reach layer [0-9]+ and expert [0-9]+, beyond --model's"
# the same model with its experts in one directory (expert slots of another size): replayed, no word
"$BIN" bench cache --model "$T/m1" --trace "$T/tr.jsonl" --slots 8 >"$T/out" 2>"$T/err" && [ ! -s "$T/err" ] && grep -q "LRFU+heat" "$T/out" \
  && ok || bad "bench cache: the same model in one pack directory: $(cat "$T/out" "$T/err")"
"$BIN" bench project --drives 1 --gbps 1 --from "$T/tr.jsonl" --model "$T/m1" >"$T/out" 2>"$T/err" && ! grep -q "warning" "$T/err" \
  && grep -q "^result: " "$T/out" && ok || bad "bench project: the same model in one pack directory: $(cat "$T/out" "$T/err")"
# the same checkpoint under another name: a trace of its conversion (named by the checkpoint's folder) with --model a
# copy of the checkpoint in a folder of another name (named so): replayed, one note line naming both names
cp -r "$ROOT/tests/golden/bf16_kimi" "$T/kh"
"$BIN" convert "$ROOT/tests/golden/bf16_kimi" "$T/kn" --quiet 2>/dev/null && ok || bad "convert (the trace's model)"
KN=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("name") or "kn")' "$T/kn/manifest.json")
"$BIN" run --model "$T/kn" --prompt-ids 1,2,3,4 --max-new 6 --quiet --events "$T/trk.jsonl" >/dev/null 2>&1
"$BIN" bench cache --model "$T/kh" --cache-dir "$T/cc" --trace "$T/trk.jsonl" --slots 8 >/dev/null 2>&1 # converted once, quietly
for c in "cache --slots 8" "store --io-seconds 0.2 --no-drop" "project --drives 1 --gbps 1 --from"; do
  case $c in project*) args=(bench $c "$T/trk.jsonl" --model "$T/kh"); flag=--from ;; *) args=(bench $c --model "$T/kh" --trace "$T/trk.jsonl"); flag=--trace ;; esac
  "$BIN" "${args[@]}" --cache-dir "$T/cc" >"$T/out" 2>"$T/err"; rc=$?
  [ $rc -eq 0 ] && [ -n "$KN" ] && [ "$KN" != kh ] && [ "$(wc -l <"$T/err")" = 1 ] \
    && grep -qF "deltafin bench ${c%% *}: note: $flag $T/trk.jsonl was recorded on \"$KN\", --model is \"kh\": the same expert shapes, taken as the same model" "$T/err" \
    && [ -s "$T/out" ] && ok || bad "bench ${c%% *}: the same model under another name: rc $rc (names \"$KN\", \"kh\") $(cat "$T/out" "$T/err")"
done
# a trace without an open event: one warning line, then the replay; with experts the model lacks, the old question
grep -v '"ev":"open"' "$T/tr.jsonl" >"$T/old.jsonl"
for c in "cache --slots 8" "store --io-seconds 0.2 --no-drop" "project --drives 1 --gbps 1 --from"; do
  case $c in project*) args=(bench $c "$T/old.jsonl" --model "$T/m"); flag=--from ;; *) args=(bench $c --model "$T/m" --trace "$T/old.jsonl"); flag=--trace ;; esac
  "$BIN" "${args[@]}" >"$T/out" 2>"$T/err"; rc=$?
  [ $rc -eq 0 ] && [ "$(wc -l <"$T/err")" = 1 ] \
    && grep -q "^deltafin bench ${c%% *}: warning: $flag $T/old.jsonl has no \"open\" event (an events file of an older deltafin): cannot check that it was recorded on this model (\"synth-mxfp4-4x32\")$" "$T/err" \
    && [ -s "$T/out" ] && ok || bad "bench ${c%% *}: a trace without an open event: rc $rc $(cat "$T/out" "$T/err")"
done
for c in "cache --slots 8" "store --io-seconds 5"; do
  bn $c --model "$T/m8" --trace "$T/old.jsonl"
  [ "$(cat "$T/rc")" = 1 ] && [ "$(wc -l <"$T/err")" = 1 ] \
    && grep -Eq "^deltafin bench ${c%% *}: --trace $T/old.jsonl: layer [0-9]+ expert [0-9]+ is not a routed expert of synth-mxfp4-4x8 \(3 MoE layers x 8 experts; the trace was recorded on another model\?\)$" "$T/err" \
    && ok || bad "bench ${c%% *}: a larger model's trace without an open event: rc $(cat "$T/rc") $(cat "$T/err")"
done

# bench project's result line of a lossy model (int8 spine) says NOT EXACT as run --stats, bench prefill and bench
# batch do: measured by its own bench decode run, from the events of bench decode (alone) and of run (with --model)
"$BIN" convert "$ROOT/tests/golden/bf16_kimi" "$T/k8" --spine int8 --quiet 2>/dev/null && ok || bad "convert --spine int8"
"$BIN" convert "$ROOT/tests/golden/bf16_kimi" "$T/kx" --quiet 2>/dev/null && ok || bad "convert"
NE='^result: decode_tok_s=.* t_compute_s=[0-9.]* (NOT EXACT: int8 spine)$'
"$BIN" bench project --drives 1 --gbps 1 --model "$T/k8" --tokens 2 --io-seconds 0.1 --no-drop >"$T/out" 2>&1 && grep -q "$NE" "$T/out" \
  && ok || bad "bench project --model (int8 spine): no NOT EXACT on the result line: $(cat "$T/out")"
"$BIN" bench decode --model "$T/k8" --tokens 2 --io-seconds 0.1 --no-drop --events "$T/k8bd.jsonl" >/dev/null 2>&1
"$BIN" bench project --drives 1 --gbps 1 --from "$T/k8bd.jsonl" >"$T/out" 2>&1 && grep -q "$NE" "$T/out" \
  && ok || bad "bench project --from (bench decode, int8 spine): $(cat "$T/out")"
"$BIN" run --model "$T/k8" --prompt-ids 1,2,3 --max-new 4 --quiet --events "$T/k8run.jsonl" >/dev/null 2>&1
"$BIN" bench project --drives 1 --gbps 1 --from "$T/k8run.jsonl" --model "$T/k8" >"$T/out" 2>&1 && grep -q "$NE" "$T/out" \
  && ok || bad "bench project --from (run) --model (int8 spine): $(cat "$T/out")"
"$BIN" bench project --drives 1 --gbps 1 --from "$T/k8run.jsonl" >"$T/out" 2>&1 && ! grep -q "^result: .*NOT EXACT" "$T/out" \
  && grep -q "note: these events do not say whether the model is exact" "$T/out" \
  && ok || bad "bench project --from (run) alone: exactness unknown, said: $(cat "$T/out")"
"$BIN" bench project --drives 1 --gbps 1 --model "$T/kx" --tokens 2 --io-seconds 0.1 --no-drop >"$T/out" 2>&1 \
  && grep -q "^result: " "$T/out" && ! grep -q "NOT EXACT" "$T/out" && ok || bad "bench project of an exact model: $(cat "$T/out")"

# bench project counts the waits for streamed spine layers (the spine larger than --ram-budget) as I/O, not compute:
# bench decode --events records them (spine_stream); the compute per layer is (decode - stall - spine wait) / tokens / layers
ev() { printf '{"t":%s,%s}\n' "$1" "$2"; }
{ ev 0 '"ev":"open","model":"synth-mxfp4-4x32","slots":96,"slot_bytes":57344,"drives":2,"io":"pread","qd":16,"io_bytes":1048576,"hot_limit":0'
  ev 1.0 '"drives":[],"ev":"token","pos":3,"bytes_demand":0,"bytes_prefetch":0,"hits":0,"misses":0,"stall_ms":0'
  for p in 4 5 6 7; do ev "1.$((p - 3))" "\"drives\":[],\"ev\":\"token\",\"pos\":$p,\"bytes_demand\":0,\"bytes_prefetch\":0,\"hits\":0,\"misses\":0,\"stall_ms\":10"; done
} >"$T/sp0.jsonl"
{ cat "$T/sp0.jsonl"; echo '{"ev":"spine_stream","decode_steps":4,"bytes":4000000,"wait_s":0.24,"io_wait_s":0.28,"expert_stall_s":0.04}'; } >"$T/sp.jsonl"
# 4 decode steps of 100 ms: stall 10 ms, spine wait 60 ms each -> compute 30 ms per token, 7.5 ms per layer (4 layers)
"$BIN" bench project --drives 1 --gbps 1 --from "$T/sp.jsonl" --model "$T/m" >"$T/out" 2>&1 \
  && grep -Eq "compute_ms_per_layer +7\.500 +measured +\(decode time - stall - spine-streaming wait\) / tokens / 4 layers" "$T/out" \
  && grep -q "100.00 ms per token (compute 30.00, stall 10.00, spine-streaming wait 60.00)" "$T/out" \
  && grep -q "spine streaming (the spine did not fit the budget): 1.0 MB of spine layers read per token, 60.00 ms per token waiting for them (0.240 s in all): I/O, not counted as compute" "$T/out" \
  && ok || bad "bench project: spine-streaming waits: $(cat "$T/out")"
# without the spine_stream event (run --events): compute as before (22.5 ms per layer), and said
"$BIN" bench project --drives 1 --gbps 1 --from "$T/sp0.jsonl" --model "$T/m" >"$T/out" 2>&1 \
  && grep -Eq "compute_ms_per_layer +22\.500 +measured +\(decode time - stall\) / tokens" "$T/out" \
  && grep -q "note: these events do not record waits for streamed spine layers" "$T/out" \
  && ok || bad "bench project: events without spine_stream: $(cat "$T/out")"
# a real decode with 3 of 4 spine layers streamed (2.8M): bench decode records the spine bytes; bench project says so
"$BIN" bench decode --model "$T/m" --ram-budget 2.8M --tokens 4 --io-seconds 0.1 --no-drop --events "$T/sbd.jsonl" >"$T/out" 2>&1 \
  && grep -Eq '^\{"ev":"spine_stream","decode_steps":4,"bytes":[1-9][0-9]*,"wait_s":[0-9.]+,' "$T/sbd.jsonl" \
  && ok || bad "bench decode (streamed spine): no spine_stream event: $(cat "$T/out"; tail -2 "$T/sbd.jsonl")"
"$BIN" bench project --drives 1 --gbps 1 --from "$T/sbd.jsonl" --model "$T/m" >"$T/out" 2>&1 \
  && grep -Eq "^  spine streaming \(the spine did not fit the budget\): [0-9.]+ MB of spine layers read per token" "$T/out" \
  && ok || bad "bench project --from (streamed spine): $(cat "$T/out")"
"$BIN" bench decode --model "$T/m" --tokens 2 --io-seconds 0.1 --no-drop --events "$T/rbd.jsonl" >/dev/null 2>&1 \
  && grep -q '^{"ev":"spine_stream","decode_steps":2,"bytes":0,"wait_s":0.000000,' "$T/rbd.jsonl" \
  && "$BIN" bench project --drives 1 --gbps 1 --from "$T/rbd.jsonl" >"$T/out" 2>&1 && ! grep -q "spine" "$T/out" \
  && ok || bad "bench project (resident spine): no spine line: $(cat "$T/out"; tail -2 "$T/rbd.jsonl")"

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
