#!/usr/bin/env bash
# e2e_interrupt.sh — `deltafin convert` / `deltafin synth` stopped by real signals (issue 11 items 13, 15):
#  - SIGINT / SIGTERM in the middle of writing (models large enough to be mid-write: a 1.3 GB synth, a 1.2 GB
#    checkpoint generated here as a sparse file): exit 128 + signal, a message, no file left (no *.tmp, no partial
#    pack, the directory removed when the run created it, kept empty when it existed), also with --expert-dirs;
#  - kill -9 mid-write, then a re-run into the same directory: the killed run's *.tmp files (no manifest.json) are
#    recognised and removed, the re-run succeeds (also in --expert-dirs); a directory holding other files as well
#    is still refused unless --force; a directory another run is writing into right now is refused (its lock);
#  - `run` on a Hugging Face checkpoint: SIGINT during its first-use conversion into the cache leaves nothing there
#    (exit 130, one line), also when it comes right after the lock file is created (before the conversion starts),
#    and a second run of the same conversion meanwhile says it waits for the first; `bench
#    decode` the same; `serve` the same, ending by the signal too (SIGINT 130, SIGTERM 143, SIGHUP 129), with no port
#    file left;
#  - `synth OUT_DIR` alone writes the documented default model (the figures of --help = --dry-run's; started and
#    interrupted when the disk has room, else refused for lack of space before writing), OUT_DIR may come last;
#    every synth usage error names its flag and value; docs/cli.md shows the --help of convert, synth and doctor.
set -u
set -m   # background jobs keep SIGINT (without job control a script's `cmd &` ignores it)
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_interrupt.XXXXXX)
# conversions without --cache-dir go to a cache in $TMP (removed at exit), never into the user's ~/.cache/deltafin
export XDG_CACHE_HOME="$TMP/xdg-cache"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
SYN=(--layers 4 --experts 16 --hidden 2048)                   # 1.27 GB, seconds to write
SMALL=(--hidden 256 --moe-inter 128 --experts 8 --layers 3 --vocab 512 --heads 4 --q-lora 64 --kv-lora 64 --inter 256)

# start CMD... in the background (stderr to $TMP/bg.err); PID in $bg
start() { "$@" 2>"$TMP/bg.err" & bg=$!; PIDS+=("$bg"); }
# wait until a non-empty file matching GLOB exists (the writer is mid-write); 1 if the writer ended first
wait_tmp() {
    local glob=$1 f
    for _ in $(seq 1 3000); do
        for f in $glob; do [ -s "$f" ] && return 0; done
        kill -0 "$bg" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}
# files left under DIR... (none expected)
left() { find "$@" -type f 2>/dev/null | head -5; }

# ---- synth: SIGINT mid-write into a new directory: exit 130, message, nothing left, the directory removed
start "$BIN" synth "$TMP/s1" "${SYN[@]}"
if wait_tmp "$TMP/s1/*.tmp"; then
    kill -INT "$bg"; wait "$bg"; rc=$?
    [ $rc -eq 130 ] && grep -q "^deltafin synth: interrupted by SIGINT: removed the [0-9]* files\? written so far" "$TMP/bg.err" \
        && [ ! -e "$TMP/s1" ] && ok || bad "synth SIGINT: rc $rc, left: $(left "$TMP/s1"), $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
else
    wait "$bg"; bad "synth ended before it was mid-write: $(tail -2 "$TMP/bg.err")"
fi

# ---- synth: SIGTERM with the packs in --expert-dirs (an existing empty OUT_DIR is kept, empty)
mkdir "$TMP/s2"
start "$BIN" synth "$TMP/s2" "${SYN[@]}" --expert-dirs "$TMP/e1,$TMP/e2"
if wait_tmp "$TMP/e[12]/*.tmp"; then
    kill -TERM "$bg"; wait "$bg"; rc=$?
    [ $rc -eq 143 ] && grep -q "interrupted by SIGTERM" "$TMP/bg.err" && [ -d "$TMP/s2" ] && [ -z "$(left "$TMP/s2" "$TMP/e1" "$TMP/e2")" ] \
        && [ ! -e "$TMP/e1" ] && ok || bad "synth SIGTERM: rc $rc, left: $(left "$TMP/s2" "$TMP/e1" "$TMP/e2"), $(tail -1 "$TMP/bg.err")"
else
    wait "$bg"; bad "synth --expert-dirs ended before it was mid-write: $(tail -2 "$TMP/bg.err")"
fi

# ---- synth: kill -9 mid-write, then a re-run into the same directories removes the stale *.tmp and succeeds
start "$BIN" synth "$TMP/s3" "${SYN[@]}" --expert-dirs "$TMP/s3,$TMP/e3"
if wait_tmp "$TMP/e3/*.tmp"; then
    kill -KILL "$bg"; wait "$bg" 2>/dev/null
    ls "$TMP/s3" | grep -q '\.tmp$' && ok || bad "kill -9 left no *.tmp to test with: $(ls "$TMP/s3")"
    # another file next to the stale ones: refused (naming both), and --force is the way out
    : >"$TMP/s3/notes.txt"
    out=$("$BIN" synth "$TMP/s3" "${SMALL[@]}" --quiet --expert-dirs "$TMP/s3,$TMP/e3" 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "is not empty" && echo "$out" | grep -q "\*.tmp of an interrupted run" \
        && echo "$out" | grep -q "notes.txt" && ok || bad "stale + other file not refused: rc $rc $out"
    rm "$TMP/s3/notes.txt"
    out=$("$BIN" synth "$TMP/s3" "${SMALL[@]}" --expert-dirs "$TMP/s3,$TMP/e3" 2>&1); rc=$?
    [ $rc -eq 0 ] && echo "$out" | grep -q "synth: removed [0-9]* files\? ([0-9]* \*.tmp) left in .*s3 by an interrupted" \
        && [ -f "$TMP/s3/manifest.json" ] && [ -z "$(ls "$TMP/s3" "$TMP/e3" | grep '\.tmp$')" ] && ok \
        || bad "re-run after kill -9: rc $rc $out; $(ls "$TMP/s3" "$TMP/e3")"
    "$BIN" doctor --model "$TMP/s3" >/dev/null 2>&1 && ok || bad "doctor after the re-run"
else
    wait "$bg"; bad "synth (kill -9) ended before it was mid-write"
fi

# ---- a run still writing holds its directory: a second run there is refused, its files are not touched
start "$BIN" synth "$TMP/s4" "${SYN[@]}"
if wait_tmp "$TMP/s4/*.tmp"; then
    out=$("$BIN" synth "$TMP/s4" "${SMALL[@]}" --quiet 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "another deltafin process is writing a model into OUT_DIR .*s4" && ls "$TMP/s4" | grep -q '\.tmp$' \
        && ok || bad "second writer: rc $rc $out"
    kill -INT "$bg"; wait "$bg"
    [ ! -e "$TMP/s4" ] && ok || bad "s4 left after SIGINT: $(ls "$TMP/s4")"
else
    wait "$bg"; bad "synth (lock) ended before it was mid-write"
fi

# ---- convert: a 1.2 GB checkpoint (the golden's shapes with 256 experts of [2048, 128], zeros in a sparse file)
if command -v python3 >/dev/null; then
    python3 - "$SRC/tests/golden/bf16_kimi" "$TMP/hf" 256 2048 <<'EOF'
import json, os, struct, sys
src, dst, E, I = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(dst)
cfg = json.load(open(os.path.join(src, "config.json")))
E0, I0, H = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
cfg["n_routed_experts"], cfg["moe_intermediate_size"] = E, I
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
f = open(os.path.join(src, "model.safetensors"), "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
keep, zero = [], []
for k, v in h.items():
    if k == "__metadata__" or ".mlp.experts." in k:
        continue
    if ".mlp.gate." in k or ".shared_experts." in k:   # shapes follow n_routed_experts / moe_intermediate_size
        zero.append((k, v["dtype"], [E if d == E0 else I if d == I0 else d for d in v["shape"]]))
    else:
        keep.append((k, v))
for l in sorted({int(k.split(".")[2]) for k in h if ".mlp.experts." in k}):
    for e in range(E):
        for p, shp in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
            zero.append(("model.layers.%d.mlp.experts.%d.%s.weight" % (l, e, p), "BF16", shp))
hdr, off, blobs = {}, 0, []
for k, v in keep:
    a, b = v["data_offsets"]
    f.seek(8 + n + a)
    blobs.append(f.read(b - a))
    hdr[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + b - a]}
    off += b - a
for k, dt, shp in zero:
    nb = 4 if dt == "F32" else 2
    for d in shp:
        nb *= d
    hdr[k] = {"dtype": dt, "shape": shp, "data_offsets": [off, off + nb]}
    off += nb
js = json.dumps(hdr).encode()
js += b" " * ((8 - len(js) % 8) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as o:
    o.write(struct.pack("<Q", len(js)) + js)
    for b in blobs:
        o.write(b)
    o.truncate(8 + len(js) + off)
EOF
    for sig in INT TERM; do
        want=$(case $sig in INT) echo 130 ;; TERM) echo 143 ;; HUP) echo 129 ;; esac)
        start "$BIN" convert "$TMP/hf" "$TMP/c-$sig" --threads 1
        if wait_tmp "$TMP/c-$sig/experts-*.tmp"; then
            kill -$sig "$bg"; wait "$bg"; rc=$?
            [ $rc -eq "$want" ] && grep -q "^deltafin convert: interrupted by SIG$sig: removed every file it had written" "$TMP/bg.err" \
                && [ ! -e "$TMP/c-$sig" ] && ok || bad "convert SIG$sig: rc $rc, left: $(left "$TMP/c-$sig"), $(tr '\r' '\n' <"$TMP/bg.err" | tail -1)"
        else
            wait "$bg"; bad "convert ended before it was mid-write: $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
        fi
    done
    # run's first-use conversion into the cache, SIGINT mid-write: exit 130, one line, nothing left in the cache
    # (no *.tmp, no directory, no lock file); a second process converting the same key while the first holds the
    # lock says it waits
    start "$BIN" run --model "$TMP/hf" --cache-dir "$TMP/cache" --prompt-ids 1 --max-new 1 --threads 1
    if wait_tmp "$TMP/cache/*/experts-*.tmp"; then
        "$BIN" run --model "$TMP/hf" --cache-dir "$TMP/cache" --prompt-ids 1 --max-new 1 >"$TMP/w.out" 2>&1 &
        w=$!; PIDS+=("$w")
        for _ in $(seq 1 200); do grep -q "waiting for another process converting" "$TMP/w.out" && break; sleep 0.01; done
        grep -q "^deltafin: waiting for another process converting $TMP/hf into $TMP/cache/" "$TMP/w.out" && ok \
            || bad "run while another converts: $(head -2 "$TMP/w.out")"
        kill -KILL "$w" 2>/dev/null; wait "$w" 2>/dev/null
        kill -INT "$bg"; wait "$bg"; rc=$?
        [ $rc -eq 130 ] && grep -q "^deltafin: interrupted by SIGINT: the conversion into $TMP/cache/hf-.* stopped and removed every file it had written (and the cache directory, which it had created)" "$TMP/bg.err" \
            && [ ! -e "$TMP/cache" ] && ok || bad "run's conversion SIGINT: rc $rc, left: $(ls -A "$TMP/cache" 2>/dev/null), $(tr '\r' '\n' <"$TMP/bg.err" | tail -1)"
    else
        wait "$bg"; bad "run's conversion ended before it was mid-write: $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
    fi
    # serve's first-use conversion, SIGINT / SIGTERM / SIGHUP mid-write: the same cleanup and message, serve's line, no
    # port file, and serve ends by the signal as run does (exit 130 / 143 / 129)
    for sig in INT TERM HUP; do
        want=$(case $sig in INT) echo 130 ;; TERM) echo 143 ;; HUP) echo 129 ;; esac)
        start "$BIN" serve --model "$TMP/hf" --cache-dir "$TMP/scache" --threads 1 --port 0 --port-file "$TMP/s.port"
        if wait_tmp "$TMP/scache/*/experts-*.tmp"; then
            kill -$sig "$bg"; wait "$bg"; rc=$?
            [ $rc -eq "$want" ] \
                && grep -q "^deltafin: interrupted by SIG$sig: the conversion into $TMP/scache/hf-.* stopped and removed every file it had written" "$TMP/bg.err" \
                && grep -q "^deltafin serve: cannot open model $TMP/hf: interrupted by SIG$sig" "$TMP/bg.err" \
                && [ ! -e "$TMP/scache" ] && [ ! -e "$TMP/s.port" ] && [ ! -e "$TMP/s.port.tmp" ] && ok \
                || bad "serve's conversion SIG$sig: rc $rc (want $want), left: $(ls -A "$TMP/scache" 2>/dev/null) $(ls "$TMP" | grep s.port), $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
        else
            wait "$bg"; bad "serve's conversion ended before it was mid-write: $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
        fi
    done
    # bench decode's first-use conversion, SIGINT mid-write: the same cleanup and message, ended by the signal (130)
    start "$BIN" bench decode --model "$TMP/hf" --cache-dir "$TMP/bcache" --threads 1 --tokens 1
    if wait_tmp "$TMP/bcache/*/experts-*.tmp"; then
        kill -INT "$bg"; wait "$bg"; rc=$?
        [ $rc -eq 130 ] \
            && grep -q "^deltafin: interrupted by SIGINT: the conversion into $TMP/bcache/hf-.* stopped and removed every file it had written" "$TMP/bg.err" \
            && [ ! -e "$TMP/bcache" ] && ok || bad "bench decode's conversion SIGINT: rc $rc, left: $(ls -A "$TMP/bcache" 2>/dev/null), $(tr '\r' '\n' <"$TMP/bg.err" | tail -1)"
    else
        wait "$bg"; bad "bench decode's conversion ended before it was mid-write: $(tr '\r' '\n' <"$TMP/bg.err" | tail -2)"
    fi
    # SIGINT into an existing directory with --force: the directory stays, emptied of what this run wrote
    mkdir -p "$TMP/c-f"; : >"$TMP/c-f/keep.txt"
    start "$BIN" convert "$TMP/hf" "$TMP/c-f" --threads 1 --quiet --force
    if wait_tmp "$TMP/c-f/experts-*.tmp"; then
        kill -INT "$bg"; wait "$bg"; rc=$?
        [ $rc -eq 130 ] && [ "$(ls "$TMP/c-f")" = "keep.txt" ] && ok || bad "convert --force SIGINT: rc $rc, $(ls "$TMP/c-f")"
    else
        wait "$bg"; bad "convert --force ended before it was mid-write"
    fi
    # kill -9, then a re-run (the small golden) into the same directory
    start "$BIN" convert "$TMP/hf" "$TMP/c9" --threads 1 --quiet
    if wait_tmp "$TMP/c9/experts-*.tmp"; then
        kill -KILL "$bg"; wait "$bg" 2>/dev/null
        out=$("$BIN" convert "$SRC/tests/golden/bf16_kimi" "$TMP/c9" 2>&1); rc=$?
        [ $rc -eq 0 ] && echo "$out" | grep -q "convert: removed [0-9]* files\? ([0-9]* \*.tmp) left in .*c9 by an interrupted" \
            && [ -f "$TMP/c9/manifest.json" ] && [ -z "$(ls "$TMP/c9" | grep '\.tmp$')" ] && ok || bad "convert re-run after kill -9: rc $rc $out"
        "$BIN" doctor --model "$TMP/c9" >/dev/null 2>&1 && ok || bad "doctor after the convert re-run"
    else
        wait "$bg"; bad "convert (kill -9) ended before it was mid-write"
    fi
    # a complete model is never taken for an interrupted one: still refused without --force
    out=$("$BIN" convert "$SRC/tests/golden/bf16_kimi" "$TMP/c9" --quiet 2>&1); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q "is not empty" && ok || bad "complete model dir not refused: rc $rc $out"
    rm -rf "$TMP/hf"
else
    echo "python3 not found: the convert signal cases are skipped"
fi

# ---- run's first-use conversion, SIGINT right after its lock file is created (strace holds the process 1 s in that
# flock): the handlers are in place before the first file is, so exit 130, one line, nothing left in the cache
if command -v strace >/dev/null && strace -o /dev/null -e inject=flock:delay_enter=1 true 2>/dev/null; then
    strace -f -o /dev/null -e trace=flock -e inject=flock:delay_enter=1000000:when=1 \
        "$BIN" run --model "$SRC/tests/golden/bf16_kimi" --cache-dir "$TMP/lcache" --prompt-ids 1 --max-new 1 --threads 1 \
        >/dev/null 2>"$TMP/l.err" &
    st=$!; PIDS+=("$st")
    for _ in $(seq 1 500); do ls "$TMP"/lcache/*.lock >/dev/null 2>&1 && break; sleep 0.01; done
    kill -INT "$(pgrep -P "$st" -x deltafin)"; wait "$st"; rc=$?
    [ $rc -eq 130 ] && [ "$(grep -c . "$TMP/l.err")" -eq 1 ] \
        && grep -q "^deltafin: interrupted by SIGINT before the conversion into $TMP/lcache/bf16_kimi-.* started: nothing was written$" "$TMP/l.err" \
        && [ ! -e "$TMP/lcache" ] && ok || bad "run's conversion, SIGINT at its lock file: rc $rc, left: $(ls -A "$TMP/lcache" 2>/dev/null), $(cat "$TMP/l.err")"
else
    echo "strace cannot delay a system call here: the SIGINT-at-the-lock-file case is skipped"
fi

# ---- synth OUT_DIR alone: the documented default model (issue 11 item 15)
help=$("$BIN" synth --help)
fig=$(echo "$help" | grep -o "about [0-9.]* GB" | head -1)
figx=$(echo "$help" | tr '\n' ' ' | grep -o "(experts [0-9.]* GB, spine [0-9.]* GB)" | head -1)
out=$("$BIN" synth --dry-run "$TMP/def" 2>&1); rc=$?   # OUT_DIR last: it used to be taken for a missing value
[ $rc -eq 0 ] && [ -n "$fig" ] && echo "$out" | grep -qF "8 layers (1 dense), 64 experts x mxfp4 [2048 x 7168], top-8, $fig $figx" \
    && [ ! -e "$TMP/def" ] && ok || bad "default dry run vs --help ('$fig' '$figx'): rc $rc $out"
echo "$help" | grep -q "With OUT_DIR alone it writes the default model" && echo "$help" | grep -q -- "--layers N        total layers (8)" \
    && echo "$help" | grep -q -- "--experts N       routed experts per layer (64)" && ok || bad "--help documents the default"
avail=$(df -Pk "$TMP" | awk 'NR==2 {print $4}')
start "$BIN" synth "$TMP/def"
if [ "${avail:-0}" -gt $((16 * 1024 * 1024)) ]; then
    if wait_tmp "$TMP/def/*.tmp"; then
        kill -INT "$bg"; wait "$bg"; rc=$?
        [ $rc -eq 130 ] && grep -qF "8 layers (1 dense), 64 experts x mxfp4 [2048 x 7168], top-8, $fig" "$TMP/bg.err" && [ ! -e "$TMP/def" ] \
            && ok || bad "synth OUT_DIR alone: rc $rc $(tr '\r' '\n' <"$TMP/bg.err" | head -3)"
    else
        wait "$bg"; bad "synth OUT_DIR alone did not start writing: $(tail -2 "$TMP/bg.err")"
    fi
else
    wait "$bg"; rc=$?
    [ $rc -eq 1 ] && grep -q "needs about 14.4[0-9] GB on the filesystem of .*which has" "$TMP/bg.err" && [ ! -e "$TMP/def" ] \
        && ok || bad "synth OUT_DIR alone, little space: rc $rc $(cat "$TMP/bg.err")"
fi

# ---- run: SIGINT during generation stops after the current token, prints what was generated, the message and the
# stats, and exits 130; SIGTERM the same with 143, SIGHUP with 129
KM=$SRC/models/kimi-mini
if [ -d "$KM" ]; then
    "$BIN" run --model "$KM" --prompt-ids 1,2,3 --max-new 4 --quiet >/dev/null 2>&1   # converted once, outside the timing
    for sig in INT TERM HUP; do
        "$BIN" run --model "$KM" --prompt-ids 1,2,3 --max-new 1000000 --print-ids --stats >"$TMP/gen.out" 2>"$TMP/gen.err" &
        bg=$!; PIDS+=("$bg")
        for _ in $(seq 100); do [ -s "$TMP/gen.err" ] && grep -q "kimi-mini" "$TMP/gen.err" && break; sleep 0.1; done
        sleep 1
        kill -$sig "$bg"; wait "$bg"; rc=$?
        want=$(case $sig in INT) echo 130 ;; TERM) echo 143 ;; HUP) echo 129 ;; esac)
        n=$(grep -o "after [0-9]* generated tokens" "$TMP/gen.err" | grep -o "[0-9]*")
        ids=$(tr ',' '\n' <"$TMP/gen.out" | grep -c .)
        [ "$rc" = "$want" ] && grep -q "^deltafin run: interrupted (SIG$sig) after [0-9]* generated tokens" "$TMP/gen.err" \
            && grep -q "^stats: prompt 3 tokens, generated" "$TMP/gen.err" && [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$ids" = "$n" ] \
            && ok || bad "run SIG$sig during generation: rc $rc (want $want), $n tokens, $ids ids: $(tail -3 "$TMP/gen.err")"
    done
fi

# ---- every synth usage error names the flag and the value (exit 2, nothing written)
while IFS='|' read -r args re; do
    read -ra A <<<"$args"
    out=$("$BIN" synth "$TMP/u" "${A[@]}" 2>&1); rc=$?
    [ $rc -eq 2 ] && echo "$out" | grep -q -- "$re" && [ ! -e "$TMP/u" ] && ok || bad "synth $args: rc $rc (want 2, /$re/): $out"
done <<'EOF'
--hidden abc|--hidden "abc": expected an integer
--hidden 0|--hidden "0": expected an integer in \[1,
--experts -3|--experts "-3"
--layers 999|--layers "999"
--top-k 1.5|--top-k "1.5"
--seed x|--seed "x"
--skew nan|--skew "nan"
--rope 63|--rope "63": expected an even number
--top-k 65 --experts 64|--top-k 65 is more than --experts 64
--experts 10 --n-group 3|--experts 10 is not a multiple of --n-group 3
--topk-group 2|--topk-group 2 is more than --n-group 1
--hidden 100|--hidden 100 (the experts' input width) must be a multiple of 32 for --encoding mxfp4
--moe-inter 100|--moe-inter 100 must be a multiple of 32
--dense 8|--dense 8 leaves no MoE layer with --layers 8
--size 12x|--size "12x"
--size 1T|--size 1T needs [0-9]* layers
--size 40G --layers 3|--size 40G and --layers 3
--encoding int8|--encoding "int8" is not supported
--spine-encoding mxfp4|--spine-encoding "mxfp4" is not supported
--arch kimi_k9|--arch "kimi_k9" is not supported
--latent 512|--latent 512: the kimi_k3 options
--stripe-weights 1,2|--stripe-weights "1,2" needs --expert-dirs
--expert-dirs a,,b|--expert-dirs "a,,b"
--expert-dirs a,b/,a|--expert-dirs "a,b/,a": the directory a is named twice
--hidden --dry-run|--hidden needs a value (found the option --dry-run
--bogus 1|unknown option '--bogus' (see deltafin synth --help)
extra|unexpected argument "extra"
EOF
out=$("$BIN" synth "$TMP/u" --layers 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "^deltafin synth: --layers needs a value" && ok || bad "missing value: rc $rc $out"
out=$("$BIN" synth 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "OUT_DIR missing" && ok || bad "no OUT_DIR: rc $rc $out"
out=$("$BIN" synth "$TMP/u" --expert-dirs "" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q '^deltafin synth: --expert-dirs "": expected' && [ ! -e "$TMP/u" ] && ok || bad "empty --expert-dirs: rc $rc $out"
out=$("$BIN" convert "$SRC/models/kimi-mini" "$TMP/u" --expert-dirs "$TMP/d1,$TMP/d1/" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "^deltafin convert: --expert-dirs .*: the directory $TMP/d1 is named twice" && [ ! -e "$TMP/u" ] && [ ! -e "$TMP/d1" ] \
    && ok || bad "convert with a directory twice in --expert-dirs: rc $rc $out"
out=$("$BIN" synth "" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q '^deltafin synth: OUT_DIR "": expected a directory' && ok || bad "empty OUT_DIR: rc $rc $out"

# ---- docs/cli.md shows each of these commands' --help as it is
for c in convert synth doctor; do
    doc=$(awk -v h="## deltafin $c" '$0==h{f=1;next} f&&/^```$/{if(++n==2)exit;next} f&&n==1' "$SRC/docs/cli.md")
    [ -n "$doc" ] && [ "$doc" = "$("$BIN" $c --help 2>&1)" ] && ok || bad "docs/cli.md '## deltafin $c' differs from $c --help"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
