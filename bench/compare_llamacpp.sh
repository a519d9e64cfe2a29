#!/usr/bin/env bash
# bench/compare_llamacpp.sh — deltafin and llama.cpp side by side on the same Kimi-K2-shaped model (issue 10).
#
# Sets up everything itself (as root): Debian packages, llama.cpp from the node-llama-cpp npm package's bundled
# source (built once into a cache outside the repo, with bench/patches/ applied), deltafin built from this repo's
# HEAD commit (git archive, so others' uncommitted edits are not measured). Then writes a synthetic model with
# `deltafin synth`, a GGUF of the same shapes (bench/gguf_from_native.py), and runs, alternating llama.cpp and
# deltafin (A/B/A/B), with the same thread count:
#   1. in RAM (no cap): decode tok/s
#   2. under a cgroup-v1 memory cap, page cache dropped before each run: cold decode tok/s and bytes read per token
#      (/proc/diskstats of the model's disk, over the decode window only), and cold prefill tok/s
#   3. fio and `deltafin bench io` on the same expert pack files (1 MiB random reads, QD16, O_DIRECT, io_uring)
# and prints one table with the ratios issue 10's acceptance asks for. See bench/README.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NLC_VERSION=3.22.1
NLC_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f  # npm pack node-llama-cpp@3.22.1
PY=/usr/bin/python3   # Debian's python3 (python3-numpy); a pyenv python on PATH may lack numpy

usage() {
  cat <<EOF
usage: bench/compare_llamacpp.sh [options]
  --layers N          model layers (8; --quick: 3); layer 0 is dense, the rest MoE
  --experts N         routed experts per MoE layer (64)
  --top-k N           experts per token (8)
  --spine-encoding E  deltafin's spine: fp8_b128 (default: Kimi K2's own spine format) or bf16;
                      llama.cpp always gets a Q8_0 spine quantized from it
  --cap SIZE          memory cap of the capped runs, cgroup v1 memory.limit_in_bytes (4G)
  --headroom SIZE     deltafin --ram-budget = cap - headroom (512M)
  --threads N         compute threads of both engines (2)
  --repeat N          A/B pairs per measurement (2; --quick: 1)
  --tokens N          decoded tokens per run (32; --quick: 8)
  --prefill N         prompt tokens of the capped prefill run (64; --quick: 16)
  --io-seconds S      fio / bench io duration (15; --quick: 5); also deltafin's own bench io inside
                      bench decode/prefill (5; --quick: 2)
  --workdir DIR       where the models (~12-15 GB each at the defaults) and logs go (/tmp/df-compare)
  --keep              keep the model files (reused by the next run with the same shape options)
  --quick             smoke run: 3 layers, 1 pair, 8 tokens, short I/O runs
  --deltafin BIN      measure this deltafin binary instead of building HEAD (the table says so)
  --cache DIR         where llama.cpp and deltafin builds are cached (\$HOME/.cache/deltafin-bench)
  --skip PHASES       comma list of phases to skip: ram,cap,prefill,io
  --llama-args "..."  extra llama-bench arguments for every llama.cpp run (e.g. "-fa 1")
  --io-buffer SIZE    deltafin's capped decode also measures B with its reads landing in a pool of SIZE (as its
                      expert cache fills; `bench io --buffer`) and the table adds the bound for that B (128M; 0 = off)
Needs root (apt-get, cgroup, drop_caches), ~2.2x the model size free in --workdir, the npm registry.
EOF
}

die() { echo "compare_llamacpp: $*" >&2; exit 1; }
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

LAYERS= EXPERTS=64 TOPK=8 SPINE_ENC=fp8_b128 CAP=4G HEADROOM=512M THREADS=2 REPEAT= TOKENS= PREFILL= IO_S= \
WORK=/tmp/df-compare KEEP=0 QUICK=0 DELTAFIN= CACHE="${HOME:-/root}/.cache/deltafin-bench" SKIP= LLAMA_ARGS= IO_BUFFER=128M
CMDLINE="bench/compare_llamacpp.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift ;;
    --experts) EXPERTS=$2; shift ;;
    --top-k) TOPK=$2; shift ;;
    --spine-encoding) SPINE_ENC=$2; shift ;;
    --cap) CAP=$2; shift ;;
    --headroom) HEADROOM=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --tokens) TOKENS=$2; shift ;;
    --prefill) PREFILL=$2; shift ;;
    --io-seconds) IO_S=$2; shift ;;
    --workdir) WORK=$2; shift ;;
    --keep) KEEP=1 ;;
    --quick) QUICK=1 ;;
    --deltafin) DELTAFIN=$2; shift ;;
    --cache) CACHE=$2; shift ;;
    --skip) SKIP=$2; shift ;;
    --llama-args) LLAMA_ARGS=$2; shift ;;
    --io-buffer) IO_BUFFER=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
  shift
done
IO_BUFFER_ARG=()
case "$IO_BUFFER" in 0|"") ;; *) IO_BUFFER_ARG=(--io-buffer "$IO_BUFFER") ;; esac
if [ $QUICK = 1 ]; then
  : "${LAYERS:=3}" "${REPEAT:=1}" "${TOKENS:=8}" "${PREFILL:=16}" "${IO_S:=5}"; INNER_IO_S=2
else
  : "${LAYERS:=8}" "${REPEAT:=2}" "${TOKENS:=32}" "${PREFILL:=64}" "${IO_S:=15}"; INNER_IO_S=5
fi
case "$SPINE_ENC" in fp8_b128|bf16) ;; *) die "--spine-encoding: fp8_b128 or bf16" ;; esac
for v in LAYERS EXPERTS TOPK THREADS REPEAT TOKENS PREFILL IO_S; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 ] || die "--$(echo $v | tr A-Z_ a-z-) must be a positive integer"
done
skipped() { [[ ",$SKIP," == *",$1,"* ]]; }

to_bytes() {  # 4G, 512M, 1.5G, 123 -> bytes
  awk -v s="$1" 'BEGIN { n = s + 0; u = toupper(substr(s, length(s)));
    m = (u == "K") ? 1024 : (u == "M") ? 1048576 : (u == "G") ? 1073741824 : (u == "T") ? 1099511627776 : 1;
    if (n <= 0) exit 1; printf "%.0f\n", n * m }' || die "bad size '$1'"
}
CAP_B=$(to_bytes "$CAP"); HEAD_B=$(to_bytes "$HEADROOM")
[ "$CAP_B" -gt "$HEAD_B" ] || die "--cap must exceed --headroom"
BUDGET_M=$(( (CAP_B - HEAD_B) / 1048576 ))M

[ "$(id -u)" = 0 ] || die "run as root (apt-get, the cgroup-v1 memory group, /proc/sys/vm/drop_caches)"

# ------------------------------------------------------------------ packages
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v git >/dev/null || need+=(git)
command -v fio >/dev/null || need+=(fio)
command -v npm >/dev/null || need+=(npm)
[ -x $PY ] && $PY -c 'import numpy' 2>/dev/null || need+=(python3 python3-numpy)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || die "apt-get install failed"
fi
"$REPO/tools/deps.sh" >&2 || die "tools/deps.sh (deltafin's build packages) failed"

mkdir -p "$CACHE" "$WORK" "$WORK/logs"
CACHE=$(cd "$CACHE" && pwd); WORK=$(cd "$WORK" && pwd)
case "$WORK/" in "$REPO/"*) die "--workdir must be outside the repository" ;; esac

# ------------------------------------------------------------------ llama.cpp from the npm package
PATCHES=("$REPO"/bench/patches/*.patch)
TGZ="$CACHE/node-llama-cpp-$NLC_VERSION.tgz"
if [ ! -f "$TGZ" ]; then
  log "npm pack node-llama-cpp@$NLC_VERSION"
  (cd "$CACHE" && npm pack "node-llama-cpp@$NLC_VERSION" --silent >/dev/null) || die "npm pack failed"
fi
SHA=$(sha256sum "$TGZ" | cut -d' ' -f1)
echo "node-llama-cpp-$NLC_VERSION.tgz sha256 $SHA" >&2
[ "$SHA" = "$NLC_SHA256" ] || die "sha256 of $TGZ is $SHA, expected $NLC_SHA256 (delete it to fetch again)"
LSRC="$CACHE/llama.cpp"
PATCH_SUM=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-16)
if [ ! -f "$LSRC/.deltafin-patched-$PATCH_SUM" ]; then
  log "cloning llama.cpp from the package's llama/gitRelease.bundle"
  rm -rf "$LSRC" "$CACHE/pkg"
  mkdir -p "$CACHE/pkg"
  tar -xzf "$TGZ" -C "$CACHE/pkg" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  git clone -q "$CACHE/pkg/package/llama/gitRelease.bundle" "$LSRC" 2>/dev/null || die "git clone of the bundle failed"
  cp "$CACHE/pkg/package/llama/llama.cpp.info.json" "$LSRC/.nlc-info.json"
  for p in "${PATCHES[@]}"; do git -C "$LSRC" apply "$p" || die "patch $p does not apply"; done
  touch "$LSRC/.deltafin-patched-$PATCH_SUM"
fi
LLAMA_TAG=$($PY -c "import json; print(json.load(open('$LSRC/.nlc-info.json'))['tag'])" 2>/dev/null || echo '?')
LLAMA_COMMIT=$(git -C "$LSRC" rev-parse --short HEAD)
LBUILD="$LSRC/build"
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ ! -x "$LBUILD/bin/llama-bench" ]; then
  log "building llama-bench (CPU, Release, GGML_NATIVE on, AMX off): a few minutes on 2 cores"
  cmake -S "$LSRC" -B "$LBUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF >"$CACHE/llama-cmake.log" 2>&1 || die "llama.cpp cmake failed: $CACHE/llama-cmake.log"
  cmake --build "$LBUILD" --target llama-bench -j "$(nproc)" >"$CACHE/llama-build.log" 2>&1 \
    || die "llama.cpp build failed: $CACHE/llama-build.log"
fi
LLAMA_BENCH="$LBUILD/bin/llama-bench"

# ------------------------------------------------------------------ deltafin at HEAD
DF_COMMIT=$(git -C "$REPO" rev-parse HEAD)
DF_NOTE="built from HEAD $DF_COMMIT (git archive)"
if [ -n "$DELTAFIN" ]; then
  [ -x "$DELTAFIN" ] || die "--deltafin $DELTAFIN is not executable"
  DELTAFIN=$(cd "$(dirname "$DELTAFIN")" && pwd)/$(basename "$DELTAFIN")
  DF_NOTE="given binary $DELTAFIN (HEAD is $DF_COMMIT; the binary may differ)"
else
  # keyed by the trees deltafin is built from: a commit that changes only bench/ or docs/ reuses the build
  SRC_KEY=$(git -C "$REPO" rev-parse "$DF_COMMIT:src" "$DF_COMMIT:include" "$DF_COMMIT:CMakeLists.txt" \
    "$DF_COMMIT:cmake" 2>/dev/null | sha256sum | cut -c1-12)
  DSRC="$CACHE/deltafin-src-$SRC_KEY"
  if [ ! -x "$DSRC/build/deltafin" ]; then
    log "building deltafin at ${DF_COMMIT:0:12} (RelWithDebInfo, as make does)"
    rm -rf "$DSRC"; mkdir -p "$DSRC"
    git -C "$REPO" archive "$DF_COMMIT" | tar -x -C "$DSRC"
    cmake -S "$DSRC" -B "$DSRC/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$DSRC/cmake.log" 2>&1 \
      || die "deltafin cmake failed: $DSRC/cmake.log"
    cmake --build "$DSRC/build" --target deltafin -j "$(nproc)" >"$DSRC/build.log" 2>&1 \
      || die "deltafin build failed: $DSRC/build.log"
  fi
  DELTAFIN="$DSRC/build/deltafin"
fi
DIRTY=$(git -C "$REPO" status --porcelain -- src include cmake CMakeLists.txt 2>/dev/null | wc -l)

# ------------------------------------------------------------------ the models
NAT="$WORK/native"; GGUF="$WORK/model.gguf"; PACKS="$WORK/packs"
STAMP="layers=$LAYERS experts=$EXPERTS topk=$TOPK spine=$SPINE_ENC synth=$(sha256sum < "$DELTAFIN" | cut -c1-12)"
cleanup() {
  local rc=$?
  [ -d "$CG" ] && { rmdir "$CG" 2>/dev/null || true; }
  if [ $KEEP = 0 ]; then rm -rf "$NAT" "$PACKS" "$GGUF" "$GGUF.tmp" "$WORK/stamp"; fi
  exit $rc
}
CG=/sys/fs/cgroup/memory/deltafin-compare-$$
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -f "$WORK/stamp" ] && [ "$(cat "$WORK/stamp")" = "$STAMP" ] && [ -f "$NAT/manifest.json" ] && [ -f "$GGUF" ]; then
  log "reusing the models in $WORK ($STAMP)"
else
  rm -rf "$NAT" "$PACKS" "$GGUF" "$WORK/stamp"
  SYNTH=(synth "$NAT" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" --spine-encoding "$SPINE_ENC")
  est=$("$DELTAFIN" "${SYNTH[@]}" --dry-run 2>&1 | sed -n 's/.*about \([0-9.]*\) GB.*/\1/p' | head -1)
  [ -n "$est" ] || die "deltafin synth --dry-run printed no size"
  avail=$(df -B1 --output=avail "$WORK" | tail -1)
  $PY -c "import sys; sys.exit(0 if $avail/1e9 > 2.2*$est + 2 else 1)" \
    || die "$WORK has $((avail / 1000000000)) GB free: the native model (~$est GB) and its GGUF need ~2.2x that"
  log "deltafin ${SYNTH[*]} (~$est GB)"
  "$DELTAFIN" "${SYNTH[@]}" --quiet >&2 || die "deltafin synth failed"
  log "gguf_from_native.py -> $GGUF"
  $PY "$REPO/bench/gguf_from_native.py" "$NAT" "$GGUF" --quiet >&2 || die "gguf_from_native.py failed"
  echo "$STAMP" > "$WORK/stamp"
fi
mkdir -p "$PACKS"
for f in "$NAT"/experts-L*.pack; do ln -f "$f" "$PACKS/"; done  # hard links: bench io / fio see the packs only
PACK_LIST=$(ls "$PACKS"/experts-L*.pack | paste -sd:)
DEV=$(stat -c '%Hd:%Ld' "$GGUF")
grep -q "^ *${DEV%:*} *${DEV#*:} " /proc/diskstats || die "device $DEV of $GGUF not in /proc/diskstats"
DEVNAME=$(awk -v a="${DEV%:*}" -v b="${DEV#*:}" '$1 == a && $2 == b { print $3 }' /proc/diskstats)
# the disk's read-ahead: mmap page faults (llama.cpp) read around the faulting page by up to this much
READAHEAD_KB=$(cat "/sys/class/block/$DEVNAME/queue/read_ahead_kb" 2>/dev/null \
  || cat "/sys/class/block/$DEVNAME/../queue/read_ahead_kb" 2>/dev/null || echo '?')

# ------------------------------------------------------------------ measurement helpers
[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ] || die "no cgroup-v1 memory controller at /sys/fs/cgroup/memory"
mkdir -p "$CG"
echo "$CAP_B" > "$CG/memory.limit_in_bytes"
[ -f "$CG/memory.memsw.limit_in_bytes" ] && { echo "$CAP_B" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true; }

RUNNER="$WORK/runner.py"
cat > "$RUNNER" <<'PYEOF'
# One measured command: joins a cgroup (optional) and marks a window between output markers. Over the window and
# over the whole process it counts the bytes read from the model's disk (/proc/diskstats sectors x 512: every
# process on the machine) and the bytes this process made the block layer read (/proc/PID/io read_bytes: its
# threads' page faults, buffered and O_DIRECT reads), and its CPU time (all threads).
import os, select, signal, subprocess, sys, time
log, summ, cg, dev, start_m, end_m, limit = sys.argv[1:8]
cmd = sys.argv[8:]
maj, mn = dev.split(":")
TCK = os.sysconf("SC_CLK_TCK")
def disk():
    with open("/proc/diskstats") as f:
        for l in f:
            p = l.split()
            if p[0] == maj and p[1] == mn:
                return int(p[5]) * 512
    return 0
def pio(pid):
    try:
        with open("/proc/%s/io" % pid) as f:
            for l in f:
                if l.startswith("read_bytes:"):
                    return int(l.split()[1])
    except OSError:
        pass
    return None
def pcpu(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
        x = st[st.rindex(")") + 2:].split()
        return (int(x[11]) + int(x[12])) / TCK
    except (OSError, ValueError, IndexError):
        return None
def cgv(name):
    try:
        with open(os.path.join(cg, name)) as f:
            return f.read()
    except OSError:
        return ""
def ooms():
    for l in cgv("memory.oom_control").splitlines():
        if l.startswith("oom_kill "):
            return int(l.split()[1])
    return 0
if cg:
    for n, v in (("memory.max_usage_in_bytes", "0"), ("memory.failcnt", "0")):
        try:
            with open(os.path.join(cg, n), "w") as f: f.write(v)
        except OSError: pass
oom0 = ooms()
def pre():
    if cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f: f.write(str(os.getpid()))
load0 = open("/proc/loadavg").read().split()[0]
self0 = pio("self")
t0 = time.monotonic(); d0 = disk()
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=pre, start_new_session=True)
out = bytearray(); ws = we = None; timed_out = False; sm = start_m.encode(); pos = 0
def snap():
    return (time.monotonic(), disk(), pio(p.pid), pcpu(p.pid))
with open(log, "wb") as lf:
    while True:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if time.monotonic() - t0 > float(limit) and not timed_out:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
        if not r:
            if p.poll() is not None: break
            continue
        chunk = os.read(p.stdout.fileno(), 65536)
        if not chunk: break
        now = snap() if ws is None or we is None else None
        lf.write(chunk); lf.flush()
        out += chunk
        if ws is None and sm and out.find(sm) >= 0:
            ws = now; pos = out.find(sm) + len(sm)
        if ws is not None and we is None:
            if end_m == "EOL" and out.find(b"\n", pos) >= 0:
                we = now
            elif end_m.startswith("COUNT:") and len(out[pos:].split()) >= int(end_m[6:]):
                we = now  # N whitespace-separated items printed after the marker (one flushed write each)
_, status, ru = os.wait4(p.pid, 0)
rc = os.waitstatus_to_exitcode(status)
t1 = time.monotonic(); d1 = disk()
proc_bytes = pio("self") - self0          # the reaped child's read_bytes are added to its parent's
cpu_total = ru.ru_utime + ru.ru_stime
if ws is not None and we is None:
    we = (t1, d1, proc_bytes, cpu_total)
load1 = open("/proc/loadavg").read().split()[0]
res = dict(rc=rc, timed_out=int(timed_out), wall_s="%.2f" % (t1 - t0), disk_bytes=d1 - d0, proc_bytes=proc_bytes,
           cpu_s="%.2f" % cpu_total, load_start=load0, load_end=load1)
if ws is not None:
    res.update(win_s="%.3f" % (we[0] - ws[0]), win_bytes=we[1] - ws[1],
               win_proc_bytes=(we[2] - ws[2]) if None not in (we[2], ws[2]) else "",
               win_cpu_s=("%.2f" % (we[3] - ws[3])) if None not in (we[3], ws[3]) else "")
if cg:
    res.update(cg_max_usage=cgv("memory.max_usage_in_bytes").strip(), cg_failcnt=cgv("memory.failcnt").strip(),
               oom_kills=ooms() - oom0)
with open(summ, "w") as f:
    for k, v in res.items(): f.write("%s=%s\n" % (k, v))
sys.exit(0)
PYEOF

# deltafin learns expert heat into MODEL/heat.bin under a budget: removed before each run so that every run is
# cold and independent (the same prompt would otherwise be routed from an in-sample heat file)
drop_cache() { rm -f "$NAT/heat.bin"; sync; echo 3 > /proc/sys/vm/drop_caches; [ -f "$CG/memory.force_empty" ] && echo 0 > "$CG/memory.force_empty" 2>/dev/null || true; }
# run NAME CAPPED(0/1) START_MARKER END -- cmd...: the timed window runs from the first START_MARKER in the output
# to END: EXIT (the process exits), EOL (the end of that line) or COUNT:N (N more whitespace-separated items: the
# decoded token ids that `deltafin bench decode` prints and flushes one by one)
run() {
  local name=$1 capped=$2 sm=$3 em=$4; shift 5
  local cg=""; [ "$capped" = 1 ] && cg=$CG
  echo "$*" > "$WORK/logs/$name.cmd"
  log "$name: $*"
  $PY "$RUNNER" "$WORK/logs/$name.log" "$WORK/logs/$name.sum" "$cg" "$DEV" "$sm" "$em" 3600 "$@"
  grep -q '^rc=0$' "$WORK/logs/$name.sum" || log "$name: FAILED ($(tr '\n' ' ' < "$WORK/logs/$name.sum")); see $WORK/logs/$name.log"
}
LB=("$LLAMA_BENCH" -t "$THREADS" -r 1 -o jsonl --progress)
# shellcheck disable=SC2206
[ -n "$LLAMA_ARGS" ] && LB+=($LLAMA_ARGS)
ids() { seq -s, 1 "$1"; }
read -r LOAD1 _ < /proc/loadavg
awk -v l="$LOAD1" -v n="$(nproc)" 'BEGIN { exit !(l > n) }' && \
  log "warning: load average $LOAD1 on $(nproc) cores: other work shares the CPU (recorded with the results)"
rm -f "$WORK"/logs/*.log "$WORK"/logs/*.sum "$WORK"/logs/*.cmd
echo "$CMDLINE" > "$WORK/logs/cmdline"

# ------------------------------------------------------------------ 1. in RAM
if ! skipped ram; then
  for r in $(seq 1 "$REPEAT"); do
    cat "$GGUF" > /dev/null   # page cache warm: the load is not disk-bound (llama.cpp repacks into RAM anyway)
    run "ram-llama-$r" 0 ": generation run 1/" EXIT -- "${LB[@]}" -m "$GGUF" -p 0 -n "$TOKENS"
    # deltafin: no budget = every expert cached once read; the 64-token prompt is the warm-up that reads them
    rm -f "$NAT/heat.bin"
    run "ram-deltafin-$r" 0 "  decoded token ids:" "COUNT:$TOKENS" -- "$DELTAFIN" bench decode --model "$NAT" --tokens "$TOKENS" \
      --threads "$THREADS" --prompt-ids "$(ids 64)" --no-drop --io-seconds 1
  done
fi
# ------------------------------------------------------------------ 2. under the cap, cold
if ! skipped cap; then
  for r in $(seq 1 "$REPEAT"); do
    drop_cache
    run "cap-decode-llama-$r" 1 ": generation run 1/" EXIT -- env LLAMA_BENCH_NO_REPACK=1 "${LB[@]}" -m "$GGUF" \
      -p 0 -n "$TOKENS"
    drop_cache
    run "cap-decode-deltafin-$r" 1 "  decoded token ids:" "COUNT:$TOKENS" -- "$DELTAFIN" bench decode --model "$NAT" --tokens "$TOKENS" \
      --threads "$THREADS" --ram-budget "$BUDGET_M" --io-seconds "$INNER_IO_S" ${IO_BUFFER_ARG[@]+"${IO_BUFFER_ARG[@]}"}
  done
fi
if ! skipped prefill; then
  for r in $(seq 1 "$REPEAT"); do
    drop_cache   # --no-warmup: llama-bench's warm-up would run the whole prompt once before the timed run
    run "cap-prefill-llama-$r" 1 ": prompt run 1/" EXIT -- env LLAMA_BENCH_NO_REPACK=1 "${LB[@]}" -m "$GGUF" \
      -p "$PREFILL" -n 0 --no-warmup
    drop_cache
    run "cap-prefill-deltafin-$r" 1 "" EXIT -- "$DELTAFIN" bench prefill --model "$NAT" --tokens "$PREFILL" \
      --threads "$THREADS" --ram-budget "$BUDGET_M" --io-seconds "$INNER_IO_S"
  done
fi
# ------------------------------------------------------------------ 3. I/O on the same pack files
if ! skipped io; then
  for r in $(seq 1 "$REPEAT"); do
    drop_cache
    run "io-fio-$r" 0 "" EXIT -- fio --name=packs --filename="$PACK_LIST" --rw=randread --bs=1M --iodepth=16 \
      --direct=1 --ioengine=io_uring --runtime="$IO_S" --time_based --numjobs=1 --output-format=json
    run "io-deltafin-$r" 0 "" EXIT -- "$DELTAFIN" bench io --dir "$PACKS" --size 1M --qd 16 --seconds "$IO_S"
  done
fi

# ------------------------------------------------------------------ the table
SPINE_BYTES=$($PY -c "import json; print(json.load(open('$NAT/manifest.json'))['spine']['bytes'])")
NAT_BYTES=$(du -sb --apparent-size "$NAT" | cut -f1); GGUF_BYTES=$(stat -c %s "$GGUF")
export WORK REPEAT TOKENS PREFILL CAP BUDGET_M THREADS LAYERS EXPERTS TOPK SPINE_ENC DF_NOTE DF_COMMIT DIRTY \
  LLAMA_TAG LLAMA_COMMIT NLC_VERSION SHA SPINE_BYTES NAT_BYTES GGUF_BYTES DEVNAME READAHEAD_KB CMDLINE IO_S IO_BUFFER
$PY - <<'PYEOF' | tee "$WORK/results.md"
import json, os, re, statistics, subprocess, datetime
E = os.environ
W = E["WORK"] + "/logs/"
R, TOK, THR = int(E["REPEAT"]), int(E["TOKENS"]), int(E["THREADS"])
rows = {}
def add(k, v):
    rows.setdefault(k, []).append(v)
def rd(name):
    try:
        txt = open(W + name + ".log", errors="replace").read()
        s = dict(l.strip().partition("=")[::2] for l in open(W + name + ".sum"))
        return txt, s
    except OSError:
        return None, {}
def num(rx, txt):
    m = re.search(rx, txt or "")
    return float(m.group(1)) if m else None
def fl(s, k, div=1.0):
    return float(s[k]) / div if s.get(k) not in (None, "") else None
def llama_ts(txt):
    for l in (txt or "").splitlines():
        if l.startswith("{"):
            try:
                return float(json.loads(l)["avg_ts"])
            except (ValueError, KeyError):
                pass
    return None
def window(k, s):  # per-token bytes (process, whole disk) and CPU busy of the timed window
    add(k + "_pb", fl(s, "win_proc_bytes", TOK)); add(k + "_db", fl(s, "win_bytes", TOK))
    w, c = fl(s, "win_s"), fl(s, "win_cpu_s")
    add(k + "_cpu", 100 * c / (w * THR) if w and c is not None else None)
def cap(k, s):
    add(k + "_mem", fl(s, "cg_max_usage")); add(k + "_oom", fl(s, "oom_kills"))
for r in range(1, R + 1):
    t, s = rd("ram-llama-%d" % r)
    if t is not None:
        add("ram_l", llama_ts(t)); window("ram_l", s)
    t, s = rd("ram-deltafin-%d" % r)
    if t is not None:
        add("ram_d", num(r"decode: ([\d.]+) tok/s over", t)); add("ram_d_hit", num(r"hit rate ([\d.]+)", t)); window("ram_d", s)
    t, s = rd("cap-decode-llama-%d" % r)
    if t is not None:
        add("cap_l", llama_ts(t)); window("cap_l", s); cap("cap_l", s)
    t, s = rd("cap-decode-deltafin-%d" % r)
    if t is not None:
        add("cap_d", num(r"decode: ([\d.]+) tok/s over", t)); window("cap_d", s); cap("cap_d", s)
        add("cap_d_own", num(r"MB needed/token, ([\d.]+) MB read/token", t))
        add("cap_d_need", num(r"experts: ([\d.]+) MB needed/token", t))
        add("cap_d_bound", num(r"storage bound [^=]*= ([\d.]+) tok/s", t))
        add("cap_d_pct", num(r"achieved ([\d.]+)% of the bound", t))
        add("cap_d_B", num(r"\(B = ([\d.]+) GB/s, mean", t))
        add("cap_d_open", num(r"open ([\d.]+) s", t)); add("cap_d_hit", num(r"hit rate ([\d.]+)", t))
        add("cap_d_pct_p", num(r"storage bound with B into [\d]+ MiB of buffers = [\d.]+ tok/s \(B = [\d.]+ GB/s, mean of before/after\): achieved ([\d.]+)%", t))
        add("cap_d_Bp", num(r"storage bound with B into [\d]+ MiB of buffers = [\d.]+ tok/s \(B = ([\d.]+) GB/s", t))
    t, s = rd("cap-prefill-llama-%d" % r)
    if t is not None:
        add("pf_l", llama_ts(t)); cap("pf_l", s); add("pf_l_pb", fl(s, "win_proc_bytes"))
    t, s = rd("cap-prefill-deltafin-%d" % r)
    if t is not None:
        add("pf_d", num(r"TTFT [\d.]+ s \(([\d.]+) tok/s\)", t)); cap("pf_d", s)
        add("pf_d_amp", num(r"amplification ([\d.]+)", t)); add("pf_d_read", num(r"; read ([\d.]+) MB", t))
        add("pf_d_ratio", num(r"TTFT / max\(union read, compute\) = ([\d.]+)", t))
    t, s = rd("io-fio-%d" % r)
    if t is not None:
        try:
            add("fio", json.loads(t[t.index("{"):])["jobs"][0]["read"]["bw_bytes"] / 1e9)
        except (ValueError, KeyError, IndexError):
            add("fio", None)
    t, s = rd("io-deltafin-%d" % r)
    if t is not None:
        add("bio", num(r"bench io: .*?: ([\d.]+) GB/s", t))
loads = []
for f in sorted(os.listdir(W)):
    if f.endswith(".sum"):
        loads += [float(l.split("=")[1]) for l in open(W + f) if l.startswith("load_")]
def vals(k):
    return [v for v in rows.get(k, []) if v is not None]
def fmt(k, f="%.3f", scale=1.0):
    v = rows.get(k)
    return ", ".join("-" if x is None else f % (x * scale) for x in v) if v else "-"
def ratio(a, b):  # per A/B pair: the same rep, one run of each engine back to back
    return [x / y for x, y in zip(rows.get(a, []), rows.get(b, [])) if x is not None and y]
def rfmt(x, f="%.2f"):
    return ", ".join(f % v for v in x) if x else "-"
def ok(x, target, ge=True):
    if not x:
        return ""
    m = statistics.median(x)
    return " (met)" if (m >= target if ge else m <= target) else " (**not met**)"
cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = re.search(r"Model name:\s*(.*)", cpu); model = model.group(1).strip() if model else "?"
flags = re.search(r"Flags:\s*(.*)", cpu); flags = flags.group(1).split() if flags else []
isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
mem = int(open("/proc/meminfo").readline().split()[1]) / 1048576
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
GB = 1e-9
print()
print("### deltafin vs llama.cpp, %s" % now)
print("Command: `%s`  " % E["CMDLINE"])
print("Machine: %s, %d cores (%s), %.1f GiB RAM, model disk %s (read_ahead_kb %s); load average (1 min) at the runs' "
      "starts and ends %s-%s  " % (model, os.cpu_count(), isa, mem, E["DEVNAME"], E["READAHEAD_KB"],
                                   "%.1f" % min(loads) if loads else "?", "%.1f" % max(loads) if loads else "?"))
dirty = ("; the working tree had %s uncommitted change(s) under src/ include/ cmake/, not measured" % E["DIRTY"]
         if E["DIRTY"] != "0" and "given binary" not in E["DF_NOTE"] else "")
print("deltafin: %s%s  " % (E["DF_NOTE"], dirty))
print("llama.cpp: %s (commit %s) from node-llama-cpp@%s's llama/gitRelease.bundle (tgz sha256 %s...), CPU Release, "
      "GGML_NATIVE, AMX off, bench/patches applied; `llama-bench -r 1`, capped runs with LLAMA_BENCH_NO_REPACK=1  "
      % (E["LLAMA_TAG"], E["LLAMA_COMMIT"], E["NLC_VERSION"], E["SHA"][:16]))
print("Model: `deltafin synth` %s layers (1 dense), %s MXFP4 experts x [2048 x 7168] top-%s, %s spine: native %.2f GB "
      "(spine %.2f GB); GGUF (deepseek2, same MXFP4 expert bytes, Q8_0 spine) %.2f GB. Threads %s; cap %s (cgroup v1), "
      "deltafin --ram-budget %s; %s A/B pair(s); decode %s tokens, prefill %s tokens."
      % (E["LAYERS"], E["EXPERTS"], E["TOPK"], E["SPINE_ENC"], int(E["NAT_BYTES"]) * GB, int(E["SPINE_BYTES"]) * GB,
         int(E["GGUF_BYTES"]) * GB, E["THREADS"], E["CAP"], E["BUDGET_M"], E["REPEAT"], E["TOKENS"], E["PREFILL"]))
print()
print("| measurement (one value per run, in A/B order) | llama.cpp | deltafin | deltafin / llama.cpp (per pair) | issue 10 target |")
print("|---|---|---|---|---|")
x = ratio("ram_d", "ram_l")
print("| decode in RAM, tok/s | %s | %s (hit rate %s) | %s | >= 1%s |" % (fmt("ram_l"), fmt("ram_d"), fmt("ram_d_hit"), rfmt(x), ok(x, 1)))
x = ratio("cap_d", "cap_l")
print("| decode under the cap, cold, tok/s | %s | %s | %s | >= 3%s |" % (fmt("cap_l"), fmt("cap_d"), rfmt(x), ok(x, 3)))
print("| read per decoded token under the cap, GB: the process (/proc/PID/io) [whole disk, /proc/diskstats] | %s [%s] | "
      "%s [%s] (own count %s; experts needed %s) | | |" % (
      fmt("cap_l_pb", "%.2f", GB), fmt("cap_l_db", "%.2f", GB), fmt("cap_d_pb", "%.2f", GB), fmt("cap_d_db", "%.2f", GB),
      fmt("cap_d_own", "%.2f", 1e-3), fmt("cap_d_need", "%.2f", 1e-3)))
x = vals("cap_d_pct")
print("| deltafin cold decode, %% of its storage bound (bound tok/s; B GB/s; hit rate) | | %s%% (%s; %s; %s) | | >= 80%%%s |"
      % (fmt("cap_d_pct", "%.1f"), fmt("cap_d_bound"), fmt("cap_d_B"), fmt("cap_d_hit"), ok(x, 80)))
if vals("cap_d_pct_p"):
    x = vals("cap_d_pct_p")
    print("| deltafin cold decode, %% of its storage bound with B into %s of buffers (B GB/s) | | %s%% (%s) | | >= 80%%%s |"
          % (E["IO_BUFFER"], fmt("cap_d_pct_p", "%.1f"), fmt("cap_d_Bp"), ok(x, 80)))
x = ratio("pf_d", "pf_l")
print("| prefill %s tokens under the cap, cold, tok/s | %s (read %s GB) | %s (read %s GB, amplification %s; TTFT / max(read, "
      "compute) %s) | %s | >= 1.5%s |" % (E["PREFILL"], fmt("pf_l", "%.2f"), fmt("pf_l_pb", "%.2f", GB), fmt("pf_d", "%.2f"),
      fmt("pf_d_read", "%.2f", 1e-3), fmt("pf_d_amp"), fmt("pf_d_ratio", "%.2f"), rfmt(x), ok(x, 1.5)))
x = ratio("bio", "fio")
print("| I/O on the pack files, GB/s (1 MiB random, QD16, O_DIRECT, io_uring, %s s) | fio %s | bench io %s | %s (bench io / fio) | "
      ">= 0.9%s |" % (E["IO_S"], fmt("fio"), fmt("bio"), rfmt(x), ok(x, 0.9)))
opens, fios = vals("cap_d_open"), vals("fio")
if opens and fios:
    ideal = int(E["SPINE_BYTES"]) / (statistics.median(fios) * 1e9)
    x = [o / ideal for o in opens]
    print("| open the model cold, s (ideal: spine bytes / fio GB/s = %.1f s) | | %s | %s (x ideal) | <= 1.3%s |"
          % (ideal, fmt("cap_d_open", "%.1f"), rfmt(x), ok(x, 1.3, ge=False)))
    bps = vals("cap_d_Bp")
    if bps: # the spine lands in one buffer of its size: the drive's B into a large destination is its ideal speed
        ideal_p = int(E["SPINE_BYTES"]) / (statistics.median(bps) * 1e9)
        x = [o / ideal_p for o in opens]
        print("| open the model cold, s (ideal: spine bytes / B into %s of buffers = %.1f s) | | %s | %s (x ideal) | <= 1.3%s |"
              % (E["IO_BUFFER"], ideal_p, fmt("cap_d_open", "%.1f"), rfmt(x), ok(x, 1.3, ge=False)))
print("| CPU busy in the timed decode window, %% of %s threads: in RAM; capped | %s; %s | %s; %s | | |" % (
    E["THREADS"], fmt("ram_l_cpu", "%.0f"), fmt("cap_l_cpu", "%.0f"), fmt("ram_d_cpu", "%.0f"), fmt("cap_d_cpu", "%.0f")))
print("| peak memory of the capped decode (cgroup max_usage, GiB) | %s | %s | | |"
      % (fmt("cap_l_mem", "%.2f", 1 / 1073741824), fmt("cap_d_mem", "%.2f", 1 / 1073741824)))
oom = sum(vals("cap_l_oom") + vals("cap_d_oom") + vals("pf_l_oom") + vals("pf_d_oom"))
if oom:
    print("\n**%d process(es) were OOM-killed under the cap**: their rows lack values." % oom)
rb = vals("ram_l_pb") + vals("ram_d_pb")
if rb and max(rb) > 20e6:
    print("\nNote: an in-RAM decode read %.0f MB per token from disk: it was not fully in RAM." % (max(rb) / 1e6))
print("\nCPU busy = CPU seconds of the process / (window seconds x threads): below 100%% the engine waited (I/O, or "
      "other work on the machine). Logs: %s (a .log, .sum and .cmd per run)." % W)
PYEOF
