#!/usr/bin/env bash
# acceptance.sh — the open issues' measurements on the accelerator machine, in two `device` calls of under
# ten minutes each, from the checkout with .devcarry.tar.xz (tools/device/pack.sh: deltafin built with the
# CUDA backend, its shared libraries, and fio when FIO=path was given to pack.sh).
#   part 1 (16 host cores, one NVMe drive): speculative decoding on kimi-mini (bench_spec.sh, issue 14),
#          then bench_host.sh (issue 10: kernels vs the machine's limits, bench io vs fio, cold decode vs the
#          storage bound, prefill amplification and TTFT / max(read, compute) for 64/256/1024 tokens; BACKEND,
#          default cpu, picks the backend of decode and prefill).
#   part 2: on a K2-shaped model 4x larger than the budgets, cold CPU decode and prefill (issue 10), the same
#          model streamed with the GPU backend under GPU and host budgets 4x+ smaller together (issue 12: decode
#          vs the storage bound, 512-token TTFT), batched decode of S = 1, 2, 4, 8 sequences on the CPU under a
#          budget 4x smaller than the experts (issue 14), and a model resident in GPU memory (issue 12: decode
#          vs the HBM bound).
#   part 3: setup's download vs curl on 1 and 8 shards (issue 13) and the GPU backend's phases (issue 12).
#   part 4: streamed decode with the lookahead gated / ungated / off (GPU and CPU) and a streamed GPU prefill.
#   part 5: the GPU's single and grouped kernel launches, resident decode (grouped MLP on / off), long-context
#          resident decode (the KV mirror on / off), then test_cuda_kernels and test_golden on the GPU if carried.
#   part 6: the streamed model of part 4: 512-token GPU prefill twice (TTFT / union read), one streamed GPU decode.
#   part 8: DF_CUDA_TRACE of a preloaded resident decode (issue 12), the drafting gate in RAM (issue 14).
#   part 10: the store's read depth (--qd 8 / 16): bench io, streamed GPU and 16-thread CPU decode.
#   part 9: where the drive waits in a streamed decode (GPU gated / ungated, 16-thread CPU): tools/drive-idle.py.
#   part 11: host CPU kernels and decode (in RAM, capped), this binary vs a carried deltafin.base; GPU tests.
#   part 12: where a streamed 512-token GPU prefill's time goes (--stats --profile, DF_CUDA_TRACE=1), bench prefill;
#          then FP8 / MXFP4 host CPU kernels of this binary against a carried deltafin.base, and the CPU kernel tests.
#   part 13: the streamed 512-token GPU prefill with `run --events` (OUT/ev-*.jsonl) at the host budget and at 8G,
#          between bench io runs into reused buffers and into a pool of the host budget.
#   part 14: a layer's whole MLA block in one GPU call vs separate calls (DF_CUDA_MLA_BLOCK): GPU tests, preloaded
#          resident decode A/B, traced, and after a 3072-token prompt.
#   part 15: host vs device time of a preloaded resident decode (DF_CUDA_TRACE=2, MLA block on / off), GPU tests
#          first; ncu kernel durations with NCU_RUN=1.
#   part 16: a decode step's MoE into the device residual (DF_CUDA_MOE_RESID on / off): GPU tests, resident decode.
#   part 17: every kernel of a preloaded resident decode (ncu durations).
#   part 19: this binary against a carried deltafin.b: GPU tests, resident decode alternated, ncu of each.
#   part 20: the block starts the shared expert (DF_CUDA_SHARED_EARLY on / off): GPU tests, resident decode.
#   part 21: this binary against the carried builds named in ALT (default "deltafin.b"): GPU tests, the kernels (KTYPES, default mxfp4; KSHAPES)
#          (bench kernels --backend cuda) and the resident decode of each, alternated twice; SASS instruction counts
#          of the one-token MXFP4 tile in the objects named in OBJS (paths in the checkout) when cuobjdump is there.
#   part 22: one token's MoE routed and run on the device by the MLA block (DF_CUDA_MOE_ROUTE on / off): GPU tests,
#          resident decode alternated, traced (host clocks), and after a 3072-token prompt.
#   part 24: GPU tests and the resident decode three times.
#   part 25: programmatic dependent launch (DF_CUDA_PDL on / off): GPU tests (test_golden also with DF_CUDA_MOE_ROUTE=1),
#          resident decode alternated, traced, after a 3072-token prompt, and alternated with DF_CUDA_MOE_ROUTE=1.
#   part 27: the resident decode's GPU timeline (CUPTI preload library; EXTRA_BINS="libgpu_timeline.so libcupti.so.13").
#   part 28: small host <-> device copies as kernels (DF_CUDA_COPY_KERNEL on / off), as 25, then the timeline (27).
#   part 29: GPU tests (+ DF_CUDA_MOE_ROUTE=1), resident decode x3 with host and with device routing, the timeline.
#   part 30: GPU tests (+ test_golden, test_batch with DF_CUDA_MOE_ROUTE=0), resident decode x3 with and without --profile.
#   part 32: reads into buffers registered with io_uring: bench io --fixed / plain, reused / pool, then part 6.
#   part 37: this binary against a carried deltafin.b (ALT): GPU tests, bench kernels (KTYPES, KSHAPES) of both, then
#          the resident decode alternated twice: this binary, the same with DF_CUDA_GREEDY=0, deltafin.b.
#   part 38: this binary against a carried deltafin.b (ALT): GPU tests, then 384-token resident runs alternated
#          three times (the ids hashed); unless SKIP_BENCH=1, bench kernels bf16 T=1 (every variant) and mxfp4 T=1
#          with DF_CUDA_MMA_KS=2, 1, 4; then (NCU_RUN=1) ncu durations of this one. BIN_NAME=deltafin.b (any part):
#          that carried binary instead of deltafin.
#   part 41: the one-token MXFP4 tile's prefetch depth: carried deltafin.pf2 / deltafin.pf3 (16x2 tile, 2 / 3 rounds
#          ahead: built with -DDF_T1_PF=2 / 3 in the CUDA flags) against this binary (1 round) and DF_CUDA_MV_ROWS=4 (16x8, 3 rounds): resident runs alternated
#          twice (ids hashed), bench kernels mxfp4 T=1 of each.
#   part 42: this binary (also with the variable XENV="V=x" when set) against the carried builds named in ALTS
#          (default "deltafin.b"): GPU tests of this one, then 384-token resident runs alternated twice (ids hashed)
#          and bench kernels mxfp4 T=1 (KSHAPES) of each; (NCU_RUN=1) ncu durations of this one.
#   part 39: as 38, then the one-token MXFP4 launches by tile variant (DF_CUDA_MV_ROWS 0 / 8 / 4 / 2), ncu (NCU_RUN=1).
#   part 36: the greedy token kept on the device (DF_CUDA_GREEDY on / off): GPU tests (test_golden also with it off),
#          resident decode alternated (knob_ab), then the timeline (libgpu_timeline.so carried) with it on.
#   part 35: the resident decode once, its GPU timeline (device routing) and every kernel's duration (ncu).
#   part 34: greedy and sampled resident decode with a 163840-token vocabulary.
#   part 26: a started shared expert on its own stream beside the routed experts (DF_CUDA_SIDE_STREAM on / off), as 25.
#   part 23: the resident decode's GPU timeline gaps (nsys, tools/device/gpu_gaps.py) and kernel durations (ncu),
#          DF_CUDA_MOE_ROUTE on / off.
#   part 18: small matrices split over K (DF_CUDA_SPLIT on / off): GPU tests, resident decode, ncu durations.
#   part 7: the drive into a cache-sized pool (bench io --buffer) and parts 6's runs plus a 16-thread CPU decode
#          against that B too (--io-buffer).
# Usage (device tool): tools/device/acceptance.sh 1|2|3 "$OUT"     Env: SIZE (24G), BUDGET (6G), GPU_BUDGET (2G),
#        HOST_BUDGET (3G), SPEC_REPS (3), CPU_PREFILL ("64 256").
set -u
PART=${1:?usage: acceptance.sh 1..11 OUTDIR}
OUT=${2:?usage: acceptance.sh 1..11 OUTDIR}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
D=$(mktemp -d)
tar xJf "$HERE/.devcarry.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -x "$D/fio" ] && export PATH="$D:$PATH"
[ -x "$D/nginx" ] && export PATH="$D:$PATH"
BIN=$D/${BIN_NAME:-deltafin}
mkdir -p "$OUT"
S=$OUT/summary.txt
log() { echo "== $(date -u +%T) $*" | tee -a "$S"; }
{ date -u; nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -1
  ldd "$BIN" | grep "not found"; } >>"$S"
if ldd "$BIN" | grep -q "not found"; then echo "deltafin lacks libraries here: $(ldd "$BIN" | grep "not found" | awk '{print $1}' | tr '\n' ' ')" | tee -a "$S"; exit 1; fi
# the streamed model of parts 4, 6 and 7 in $W/m: 8 layers, fp8 spine, 12.9 GB (4x the budgets 2816M + 256M)
streamed_model() {
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, fp8 spine, 12.9 GB; budgets ${HOST_BUDGET:-2816M} + ${GPU_BUDGET:-256M}"
    "$BIN" synth "$W/m" --layers 8 --spine-encoding fp8_b128 --quiet --force 2>&1 | tail -1 >>"$S"
    sync; sleep 3
}
# the GPU tests of the carried binaries (test_cuda_kernels, test_golden, test_batch) with DF_BACKEND=cuda
gpu_tests() {
    for t in test_cuda_kernels test_golden test_batch; do
        [ -x "$D/$t" ] || continue
        log "DF_BACKEND=cuda $t"
        (cd "$HERE" && DF_SRC="$HERE" DF_BACKEND=cuda timeout 150 "$D/$t" 2>&1 | grep -E "FAIL|passed|diff" | tail -12) >>"$S"
    done
}
# gpu_tests_env "VAR=V ..." TEST...: the named carried tests with DF_BACKEND=cuda and those variables set
gpu_tests_env() {
    local envs=$1
    shift
    log "DF_BACKEND=cuda $envs $*"
    for t in "$@"; do
        (cd "$HERE" && env DF_SRC="$HERE" DF_BACKEND=cuda $envs timeout 150 "$D/$t" 2>&1 \
            | grep -E "FAIL|passed|diff" | tail -4) >>"$S"
    done
}
# the resident model's GPU timeline (tools/device/gpu_timeline.c carried as libgpu_timeline.so; the model in $W/r),
# with host and with device routing, the last GT_LAST_MS (150) ms of each run
timeline_runs() {
    for v in 0 1; do
        log "timeline: cuda run --preload, DF_CUDA_MOE_ROUTE=$v, the last ${GT_LAST_MS:-150} ms"
        rp DF_CUDA_MOE_ROUTE=$v LD_PRELOAD="$D/libgpu_timeline.so" GT_LAST_MS="${GT_LAST_MS:-150}" \
            | grep -E "^gpu_timeline|^stats: generation|rror" >>"$S"
    done
}
# the resident model of parts 14-16 in $W/r: 8 layers, bf16 spine, 14.4 GB
resident_model() {
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, bf16 spine"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --quiet --force 2>&1 | tail -1 >>"$S"
}
# rp KNOBS...: the preloaded resident run (64-token prompt + 96 tokens, stats, profile, ids) with those settings
rp() {
    env "$@" timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
        --prompt-ids "$(seq -s, 1 64)" --max-new 96 --stats --profile --print-ids 2>&1
}
# cfg_runs CFG...: each CFG = "BINARY:VAR=x" (VAR=x optional), the 384-token resident run alternated twice (stats, the
# ids hashed); cfg_kernels CFG...: bench kernels mxfp4 T=1 (KSHAPES) of each
cfg_runs() {
    local i cfg b e
    for i in 1 2; do
        for cfg in "$@"; do
            b=${cfg%%:*} e=${cfg#*:}
            log "cuda run --preload, 384 tokens, $(basename "$b") $e"
            env ${e:-DF_NONE=1} timeout 100 "$b" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
                --prompt-ids "$(seq -s, 1 64)" --max-new 384 --stats --print-ids >"$OUT/run.txt" 2>&1
            grep -E "^stats: (generation|decode)|rror" "$OUT/run.txt" | cut -c1-300 >>"$S"
            grep -E "^[0-9]+(,[0-9]+)+$" "$OUT/run.txt" | md5sum >>"$S"
        done
    done
}
cfg_kernels() {
    local cfg b e
    for cfg in "$@"; do
        b=${cfg%%:*} e=${cfg#*:}
        log "bench kernels mxfp4 T=1, $(basename "$b") $e"
        env ${e:-DF_NONE=1} timeout 120 "$b" bench kernels --backend cuda --types mxfp4 --T 1 \
            --shapes ${KSHAPES:-2048x7168,7168x2048} 2>&1 | grep -E "^(mxfp4|limits)" | cut -c1-200 >>"$S"
    done
}
# knob_ab KNOB: the resident run with KNOB=1 / 0 alternated twice, one DF_CUDA_TRACE=2 run of each (host clocks:
# queueing vs waiting per call), then each after a ${CTX:-3072}-token prompt (48 tokens)
knob_ab() {
    for v in 1 0 1 0; do
        log "cuda run --preload, $1=$v"
        rp "$1=$v" | grep -E "^(profile|stats):|^[0-9]+(,[0-9]+)+$|rror|fault|Abort" | cut -c1-300 >>"$S"
    done
    for v in 1 0; do
        log "cuda run --preload, DF_CUDA_TRACE=2, $1=$v"
        rp "$1=$v" DF_CUDA_TRACE=2 | grep -E "^(stats: prompt|cuda trace: [a-z_]+ +[0-9]|cuda trace: op)" >>"$S"
    done
    for v in 1 0; do
        log "cuda run --preload, ${CTX:-3072}-token prompt, 48 tokens, $1=$v"
        env "$1=$v" timeout 150 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
            --prompt-ids "$(seq -s, 1 "${CTX:-3072}")" --max-new 48 --stats --profile 2>&1 | grep -E "^(profile|stats):" >>"$S"
    done
}
# on it, the budgets above, cold: the 512-token GPU prefill twice (TTFT / union read), then a streamed GPU decode
# (17 warm-up + 24 tokens, the lookahead's gate); arguments (e.g. --io-buffer SIZE) go to both benchmarks
knob_ab_route() {
    gpu_tests
    gpu_tests_env DF_CUDA_MOE_ROUTE=1 test_golden test_cuda_kernels
    gpu_tests_env "$1=0" test_cuda_kernels
    resident_model
    knob_ab "$1"
    for v in 1 0 1 0; do
        log "cuda run --preload, DF_CUDA_MOE_ROUTE=1 $1=$v"
        rp DF_CUDA_MOE_ROUTE=1 "$1=$v" | grep -E "^(profile|stats):|^[0-9]+(,[0-9]+)+$|rror|fault|Abort" \
            | cut -c1-300 >>"$S"
    done
    rm -rf "$W"
}
streamed_gpu_runs() {
    for i in 1 2; do
        log "cuda prefill 512, cold, --ram-budget ${HOST_BUDGET:-2816M} --gpu-budget ${GPU_BUDGET:-256M} $* (run $i)"
        timeout 100 "$BIN" bench prefill --model "$W/m" --backend cuda --tokens 512 --gpu-budget "${GPU_BUDGET:-256M}" \
            --ram-budget "${HOST_BUDGET:-2816M}" --io-seconds 2 "$@" 2>&1 | grep -vE "^(model |bench prefill:)" >>"$S"
    done
    log "cuda decode, cold, same budgets, 17 warm-up + 24 tokens $*"
    timeout 120 "$BIN" bench decode --model "$W/m" --backend cuda --ram-budget "${HOST_BUDGET:-2816M}" \
        --gpu-budget "${GPU_BUDGET:-256M}" --warmup 17 --tokens 24 --io-seconds 2 "$@" 2>&1 \
        | grep -E "bench io|decode: [0-9.]+ tok|experts:|storage bound" | cut -c1-400 >>"$S"
}
# ncu_decode: Nsight Compute's durations (no cache flush, no clock lock) of 600 kernel launches of the resident
# run's decode (after NCU_SKIP, default 10000, launches: past the prompt), as OUT/ncu-kernels.txt (id|kernel|grid|
# block|ns|registers), and the sum per kernel name into the summary.
ncu_decode() {
    local NCU
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    [ -n "$NCU" ] || { log "ncu: not installed"; return; }
    log "ncu: kernel durations of 600 decode launches (after ${NCU_SKIP:-10000})"
    timeout 300 "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none \
        --launch-skip "${NCU_SKIP:-10000}" --launch-count 600 --csv --page raw "$BIN" run --model "$W/r" --backend cuda \
        --gpu-budget 100G --preload --prompt-ids "$(seq -s, 1 64)" --max-new 96 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    tail -2 "$OUT/ncu.err" >>"$S"
    awk 'f{print} /^"ID"/{f=1; print}' "$OUT/ncu.csv" | python3 -c '
import csv, re, sys, collections
rows = [r for r in csv.DictReader(sys.stdin) if r["ID"].isdigit()]
tot = collections.defaultdict(float); cnt = collections.Counter()
with open(sys.argv[1], "w") as f:
    for r in rows:
        n = re.sub(r"\(.*", "", r["Kernel Name"]).replace("<unnamed>::", "")
        ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        print(r["ID"], n, r["Grid Size"], r["Block Size"], int(ns), r["launch__registers_per_thread"], sep="|", file=f)
        k = n + " " + r["Grid Size"]; tot[k] += ns; cnt[k] += 1
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print("ncu: %-60s x%-4d %8.1f us each" % (k[:60], cnt[k], v / cnt[k] / 1e3))
print("ncu: %d launches, %.1f us in all" % (len(rows), sum(tot.values()) / 1e3))
' "$OUT/ncu-kernels.txt" >>"$S" 2>&1
    rm -f "$OUT/ncu.csv"
}
case $PART in
1)
    log "bench_spec.sh (kimi-mini, REPS=${SPEC_REPS:-3}, 4 threads)"
    REPS=${SPEC_REPS:-3} TOKENS=256 THREADS=4 timeout 150 "$HERE/tools/device/bench_spec.sh" "$OUT/spec" >/dev/null 2>&1
    cat "$OUT/spec/spec.txt" >>"$S" 2>/dev/null
    log "bench_host.sh (issue 10)"
    KERNELS=1 SPINE=fp8_b128 PREFILL="64 256 1024" TOKENS=16 IO_PAIRS=2 IO_S=5 SETTLE=5 \
        timeout 400 "$HERE/tools/device/bench_host.sh" "$OUT/host" "${SIZE:-24G}" "${BUDGET:-6G}" >/dev/null 2>&1
    cat "$OUT/host/bench.txt" >>"$S" 2>/dev/null
    ;;
2)
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth ${SIZE:-24G} (fp8 spine)"
    "$BIN" synth "$W/m" --size "${SIZE:-24G}" --spine-encoding fp8_b128 --quiet --force 2>&1 | tail -2 >>"$S"
    sync; sleep 5
    log "cpu decode, cold, budget ${BUDGET:-6G} (issue 10: >= 90% of the storage bound on 16 cores)"
    timeout 120 "$BIN" bench decode --model "$W/m" --backend cpu --ram-budget "${BUDGET:-6G}" --tokens 32 \
        --io-seconds 3 2>&1 | grep -v "^  decoded token ids:" | tail -12 >>"$S"
    for n in ${CPU_PREFILL:-64 256}; do
        log "cpu prefill $n tokens, cold, budget ${BUDGET:-6G}"
        timeout 120 "$BIN" bench prefill --model "$W/m" --backend cpu --tokens "$n" --ram-budget "${BUDGET:-6G}" \
            --io-seconds 3 2>&1 | tail -8 >>"$S"
    done
    log "cuda decode, streamed: --gpu-budget ${GPU_BUDGET:-2G} --ram-budget ${HOST_BUDGET:-3G}"
    timeout 150 "$BIN" bench decode --model "$W/m" --backend cuda --gpu-budget "${GPU_BUDGET:-2G}" \
        --ram-budget "${HOST_BUDGET:-3G}" --tokens 32 --io-seconds 3 2>&1 | tail -25 >>"$S"
    log "cuda prefill 512 tokens, streamed"
    timeout 150 "$BIN" bench prefill --model "$W/m" --backend cuda --tokens 512 --gpu-budget "${GPU_BUDGET:-2G}" \
        --ram-budget "${HOST_BUDGET:-3G}" --io-seconds 3 2>&1 | tail -25 >>"$S"
    log "bench batch (cpu, budget ${BUDGET:-6G})"
    timeout 170 "$BIN" bench batch --model "$W/m" --backend cpu --ram-budget "${BUDGET:-6G}" --seqs 1,2,4,8 --tokens 6 \
        --io-seconds 3 2>&1 | tail -25 >>"$S"
    rm -rf "$W"
    if [ -x "$D/nginx" ] && command -v curl >/dev/null; then
        for r in 1 2; do
            log "setup download vs curl, 1024 MB, run $r (issue 13)"
            DF_BIN=$BIN timeout 60 "$HERE/bench/setup_download.sh" 1024 2>&1 | tail -2 >>"$S"
        done
    fi
    log "cuda decode, resident (8-layer synth, --gpu-budget 100G, page cache warm)"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --quiet --force 2>&1 | tail -1 >>"$S"
    timeout 100 "$BIN" bench decode --model "$W/r" --backend cuda --gpu-budget 100G --warmup 64 --tokens 32 --no-drop \
        --io-seconds 1 2>&1 | tail -25 >>"$S"
    rm -rf "$W"
    ;;
3)
    # issue 13: setup's download vs curl on one shard and on a multi-shard checkpoint (one hashing thread per
    # shard in flight); the SHA-256 rate of this CPU for reference. Issue 12: where the GPU backend's time goes
    # (phases of a 512-token prefill warm and streamed, and of a resident decode).
    openssl speed -evp sha256 -bytes 1048576 -seconds 2 2>/dev/null | tail -1 | sed 's/^/openssl sha256, 1 MiB blocks, k bytes\/s: /' >>"$S"
    if [ -x "$D/nginx" ] && command -v curl >/dev/null; then
        for sh in 1 8 8; do
            log "setup download vs curl, 2048 MiB in $sh shard(s) (issue 13)"
            SHARDS=$sh DF_BIN=$BIN timeout 90 "$HERE/bench/setup_download.sh" 2048 2>&1 | tail -1 >>"$S"
        done
    fi
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, bf16 spine"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --quiet --force 2>&1 | tail -1 >>"$S"
    log "cuda prefill 512, warm page cache, no budget"
    timeout 100 "$BIN" bench prefill --model "$W/r" --backend cuda --tokens 512 --no-drop --io-seconds 1 2>&1 | tail -8 >>"$S"
    log "cuda prefill 512, cold, --gpu-budget 1G --ram-budget 3G"
    timeout 100 "$BIN" bench prefill --model "$W/r" --backend cuda --tokens 512 --gpu-budget 1G --ram-budget 3G \
        --io-seconds 2 2>&1 | tail -8 >>"$S"
    log "cpu prefill 512, warm page cache, no budget"
    timeout 100 "$BIN" bench prefill --model "$W/r" --backend cpu --tokens 512 --no-drop --io-seconds 1 2>&1 | tail -8 >>"$S"
    log "cuda decode, resident, --stats phases"
    timeout 100 "$BIN" bench decode --model "$W/r" --backend cuda --gpu-budget 100G --warmup 64 --tokens 32 --no-drop \
        --io-seconds 1 2>&1 | tail -25 >>"$S"
    for knobs in "" "DF_CUDA_ATTN=0 DF_CUDA_MLP_GROUP=0"; do
        log "cuda run, resident, --stats --profile (96 tokens after a 64-token prompt) ${knobs:-(attention core and grouped MLPs on the GPU)}"
        env $knobs timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --prompt-ids "$(seq -s, 1 64)" \
            --max-new 96 --stats --profile 2>&1 | grep -E "^(profile|stats):" >>"$S"
    done
    log "cuda prefill 512, warm page cache, no budget, DF_CUDA_ATTN=0 DF_CUDA_MLP_GROUP=0"
    DF_CUDA_ATTN=0 DF_CUDA_MLP_GROUP=0 timeout 100 "$BIN" bench prefill --model "$W/r" --backend cuda --tokens 512 --no-drop \
        --io-seconds 1 2>&1 | tail -8 >>"$S"
    rm -rf "$W"
    ;;
4)
    # streamed decode under budgets 4x smaller than the model, with the lookahead's A/B gate (default), always
    # on (ungated) and off: GPU (issue 12: >= 90% of the storage bound) and 16 CPU threads (issue 10); then a
    # streamed 512-token prefill on the GPU with the spine resident (issue 12: TTFT <= 1.2 x union read).
    streamed_model
    for be in cuda cpu; do
        for pf in "" ungated 0; do
            [ $be = cpu ] && [ "$pf" = 0 ] && continue
            log "$be decode, cold, --ram-budget ${HOST_BUDGET:-2816M} --gpu-budget ${GPU_BUDGET:-256M}, DF_PREFETCH=$pf, 17 warm-up + 24 tokens"
            DF_PREFETCH=$pf timeout 100 "$BIN" bench decode --model "$W/m" --backend $be --ram-budget "${HOST_BUDGET:-2816M}" \
                --gpu-budget "${GPU_BUDGET:-256M}" --warmup 17 --tokens 24 --io-seconds 2 2>&1 | grep -E "decode: [0-9.]+ tok|experts:|storage bound|spine" | cut -c1-400 >>"$S"
        done
    done
    log "cuda prefill 512, cold, same budgets"
    timeout 100 "$BIN" bench prefill --model "$W/m" --backend cuda --tokens 512 --gpu-budget "${GPU_BUDGET:-256M}" \
        --ram-budget "${HOST_BUDGET:-2816M}" --io-seconds 2 2>&1 | tail -8 >>"$S"
    rm -rf "$W"
    if [ -x "$D/nginx" ] && command -v curl >/dev/null; then
        for sh in 8 1; do
            log "setup download vs curl, 2048 MiB in $sh shard(s) (issue 13)"
            SHARDS=$sh DF_BIN=$BIN timeout 90 "$HERE/bench/setup_download.sh" 2048 2>&1 | tail -1 >>"$S"
        done
    fi
    ;;
5)
    # issue 12: the grouped tensor-core launches of a MoE layer's experts and the device mirror of the latent KV
    # cache: kernel tables (single and grouped launches), resident decode with its phases (grouped MLP on / off),
    # and a long-context resident decode with the KV mirror on / off. Then the tests on the GPU when carried.
    log "bench kernels --backend cuda (MXFP4, BF16; single and grouped launches)"
    timeout 120 "$BIN" bench kernels --backend cuda --types mxfp4,bf16 --T 1,8,512 2>&1 | tail -30 >>"$S"
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, bf16 spine"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --quiet --force 2>&1 | tail -1 >>"$S"
    for knobs in "" "DF_CUDA_MLA_PROJECT=0" "DF_CUDA_MLP_GROUP=0"; do
        log "cuda run, resident, --stats --profile (96 tokens after a 64-token prompt) ${knobs:-(defaults)}"
        env $knobs timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --prompt-ids "$(seq -s, 1 64)" \
            --max-new 96 --stats --profile 2>&1 | grep -E "^(profile|stats):" >>"$S"
    done
    log "cuda run --preload, resident, --stats --profile (96 tokens after a 64-token prompt)"
    timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload --prompt-ids "$(seq -s, 1 64)" \
        --max-new 96 --stats --profile 2>&1 | grep -E "^(preload|profile|stats):" >>"$S"
    log "cuda decode --preload, resident (bench decode --tokens 64)"
    timeout 100 "$BIN" bench decode --model "$W/r" --backend cuda --gpu-budget 100G --preload --tokens 64 --no-drop \
        --io-seconds 1 2>&1 | grep -E "preload|decode: [0-9.]+ tok|storage" >>"$S"
    log "cuda decode, resident (bench decode --warmup 64 --tokens 32)"
    timeout 100 "$BIN" bench decode --model "$W/r" --backend cuda --gpu-budget 100G --warmup 64 --tokens 32 --no-drop \
        --io-seconds 1 2>&1 | tail -25 >>"$S"
    for knobs in "" "DF_CUDA_KV_MIRROR=0"; do
        log "cuda run, resident, ${CTX:-3072}-token prompt, 48 tokens, --stats --profile ${knobs:-(KV mirror on)}"
        env $knobs timeout 150 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G \
            --prompt-ids "$(seq -s, 1 "${CTX:-3072}")" --max-new 48 --stats --profile 2>&1 | grep -E "^(profile|stats):" >>"$S"
    done
    rm -rf "$W"
    if [ -x "$D/test_cuda_kernels" ]; then
        log "test_cuda_kernels"
        (cd "$HERE" && timeout 150 "$D/test_cuda_kernels" 2>&1 | grep -E "FAIL|passed" | tail -15) >>"$S"
    fi
    if [ -x "$D/test_golden" ]; then
        log "DF_BACKEND=cuda test_golden"
        (cd "$HERE" && DF_SRC="$HERE" DF_BACKEND=cuda timeout 150 "$D/test_golden" 2>&1 | grep -E "FAIL|passed|diff" | tail -15) >>"$S"
    fi
    ;;
6)
    # issue 12 on the streamed model (as part 4): the 512-token prefill's TTFT against the union read, twice, and a
    # streamed GPU decode with the lookahead's gate.
    streamed_model
    streamed_gpu_runs
    rm -rf "$W"
    ;;
7)
    # the drive into a cache-sized pool (bench io --buffer): the streamed model of part 6, bench io with qd reused
    # buffers and into pools of 64M / the host budget, alternating; then the 512-token GPU prefill, the streamed
    # GPU decode and a 16-thread CPU decode, each also against B into a pool of the host budget (--io-buffer).
    streamed_model
    for i in 1 2; do
        for b in "" "--buffer 64M" "--buffer ${HOST_BUDGET:-2816M}"; do
            log "bench io $b (run $i)"
            timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 $b 2>&1 | tail -1 >>"$S"
        done
    done
    streamed_gpu_runs --io-buffer "${HOST_BUDGET:-2816M}"
    log "cpu decode, 16 threads, cold, --ram-budget 3G, 24 tokens, --io-buffer 3G"
    timeout 120 "$BIN" bench decode --model "$W/m" --backend cpu --ram-budget 3G --tokens 24 --io-seconds 2 --io-buffer 3G \
        2>&1 | grep -E "open|bench io|decode: [0-9.]+ tok|experts:|storage bound" | cut -c1-400 >>"$S"
    rm -rf "$W"
    ;;
8)
    # issue 12: where a resident decode step's GPU time goes (DF_CUDA_TRACE=1: each GPU call's wall time) with every
    # expert preloaded; issue 14: the drafting gate on kimi-mini in RAM (bench_spec.sh, SPEC_PROMPTS, REPS 3).
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, bf16 spine"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --quiet --force 2>&1 | tail -1 >>"$S"
    log "cuda run --preload, DF_CUDA_TRACE=1 (prompt 64, 96 tokens)"
    DF_CUDA_TRACE=1 timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
        --prompt-ids "$(seq -s, 1 64)" --max-new 96 --stats --profile 2>&1 | grep -E "^(preload|profile|stats|cuda trace):" >>"$S"
    log "cuda run --preload, DF_CUDA_TRACE=1 (prompt 64, 1 token: the prompt's calls alone)"
    DF_CUDA_TRACE=1 timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
        --prompt-ids "$(seq -s, 1 64)" --max-new 1 2>&1 | grep -E "^cuda trace:" >>"$S"
    rm -rf "$W"
    [ "${SPEC:-1}" = 0 ] && { log "done"; exit 0; }
    log "bench_spec.sh (MEMS=ram, PROMPTS=${SPEC_PROMPTS:-text rep}, REPS=${SPEC_REPS:-3})"
    MEMS=ram PROMPTS="${SPEC_PROMPTS:-text rep}" REPS=${SPEC_REPS:-3} timeout 400 "$HERE/tools/device/bench_spec.sh" "$OUT/spec" >/dev/null 2>&1
    cat "$OUT/spec/spec.txt" >>"$S" 2>/dev/null
    ;;
14)
    # issue 12: a layer's whole MLA block in one GPU call (df_backend.mla_block) against the separate calls
    # (DF_CUDA_MLA_BLOCK=0): knob_ab, then one DF_CUDA_TRACE=1 run of each (device time per stage).
    gpu_tests
    resident_model
    knob_ab DF_CUDA_MLA_BLOCK
    for knobs in DF_CUDA_MLA_BLOCK=1 DF_CUDA_MLA_BLOCK=0; do
        log "cuda run --preload, DF_CUDA_TRACE=1, $knobs"
        rp $knobs DF_CUDA_TRACE=1 | grep -E "^cuda trace:" >>"$S"
    done
    rm -rf "$W"
    ;;
15)
    # issue 12: where a preloaded resident decode step's time goes between host and device: knob_ab of the MLA block
    # (its DF_CUDA_TRACE=2 runs: queueing vs waiting in each call's synchronisation); with NCU_RUN=1 and Nsight Compute
    # installed, the kernels' own durations (no cache flush, no clock lock) over 600 decode launches.
    { command -v nsys; command -v ncu; ls /usr/local/cuda*/bin 2>/dev/null | grep -E "^(nsys|ncu)$"; } >>"$S" 2>&1
    gpu_tests
    resident_model
    knob_ab DF_CUDA_MLA_BLOCK
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [ "${NCU_RUN:-0}" = 1 ] && [ -n "$NCU" ]; then
        log "ncu: kernel durations of 600 decode launches (after 3000)"
        timeout 300 "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-skip ${NCU_SKIP:-3000} \
            --launch-count 600 --csv --page raw "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
            --prompt-ids "$(seq -s, 1 64)" --max-new 40 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
        tail -3 "$OUT/ncu.err" >>"$S"
    fi
    rm -rf "$W"
    ;;
16)
    # issue 12: a decode step's MoE added into the device residual without a round trip (df_backend.moe_resid)
    # against the round trip (DF_CUDA_MOE_RESID=0): knob_ab.
    gpu_tests
    resident_model
    knob_ab DF_CUDA_MOE_RESID
    rm -rf "$W"
    ;;
42)
    gpu_tests
    resident_model
    cfgs="$BIN: ${XENV:+$BIN:$XENV} $(for a in ${ALTS:-deltafin.b}; do echo "$D/$a:"; done)"
    cfg_runs $cfgs
    cfg_kernels $cfgs
    [ -z "${NCU_RUN:-}" ] || ncu_decode
    rm -rf "$W"
    ;;
41)
    # resident decode and the grouped one-token MXFP4 kernels by prefetch depth (every variant: the same bits)
    resident_model
    cfgs="$BIN: $D/deltafin.pf2: $D/deltafin.pf3: $BIN:DF_CUDA_MV_ROWS=4"
    cfg_runs $cfgs
    KSHAPES=2048x7168,7168x2048 cfg_kernels $cfgs
    rm -rf "$W"
    ;;
39)
    # this binary against a carried deltafin.b (ALT): GPU tests, 384-token resident runs alternated three times (ids
    # hashed), the one-token MXFP4 launches by tile variant (DF_CUDA_MV_ROWS: 0 automatic, 8 = 32x2, 4 = 16x8, 2 =
    # 32x8), then (NCU_RUN=1) ncu durations of this binary's decode launches
    gpu_tests
    resident_model
    for i in 1 2 3; do
        for b in "$BIN" "$D/${ALT:-deltafin.b}"; do
            log "cuda run --preload, 384 tokens, $(basename "$b")"
            timeout 100 "$b" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
                --prompt-ids "$(seq -s, 1 64)" --max-new 384 --stats --print-ids >"$OUT/run.txt" 2>&1
            grep -E "^stats: (generation|decode)|rror" "$OUT/run.txt" | cut -c1-300 >>"$S"
            grep -E "^[0-9]+(,[0-9]+)+$" "$OUT/run.txt" | md5sum >>"$S"
        done
    done
    for v in 0 8 4 2; do
        log "bench kernels mxfp4 T=1, DF_CUDA_MV_ROWS=$v"
        DF_CUDA_MV_ROWS=$v timeout 120 "$BIN" bench kernels --backend cuda --types mxfp4 --T 1 \
            --shapes 2048x7168,7168x2048 2>&1 | grep -E "^(mxfp4|limits)" | cut -c1-200 >>"$S"
    done
    [ -z "${NCU_RUN:-}" ] || ncu_decode
    rm -rf "$W"
    ;;
38)
    gpu_tests
    resident_model
    for i in 1 2 3; do
        for b in "$BIN" "$D/${ALT:-deltafin.b}"; do
            log "cuda run --preload, 384 tokens, $(basename "$b")"
            timeout 100 "$b" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
                --prompt-ids "$(seq -s, 1 64)" --max-new 384 --stats --print-ids >"$OUT/run.txt" 2>&1
            grep -E "^stats: (generation|decode)|rror" "$OUT/run.txt" | cut -c1-300 >>"$S"
            grep -E "^[0-9]+(,[0-9]+)+$" "$OUT/run.txt" | md5sum >>"$S"
        done
    done
    if [ -z "${SKIP_BENCH:-}" ]; then
        log "bench kernels bf16 T=1, every variant"
        DF_CUDA_BENCH_VARIANTS=1 timeout 120 "$BIN" bench kernels --backend cuda --types bf16 --T 1 \
            --shapes 7168x8192,7168x2048,12288x1536,2112x7168 2>&1 | grep -E "^(bf16|limits)" | cut -c1-200 >>"$S"
        for k in 2 1 4; do
            log "bench kernels mxfp4 T=1, DF_CUDA_MMA_KS=$k"
            DF_CUDA_MMA_KS=$k timeout 120 "$BIN" bench kernels --backend cuda --types mxfp4 --T 1 \
                --shapes 2048x7168,7168x2048 2>&1 | grep -E "^(mxfp4|limits)" | cut -c1-200 >>"$S"
        done
    fi
    [ -z "${NCU_RUN:-}" ] || ncu_decode
    rm -rf "$W"
    ;;
37)
    gpu_tests
    resident_model
    for b in "$BIN" "$D/${ALT:-deltafin.b}"; do
        log "bench kernels ${KTYPES:-mxfp4}, $(basename "$b")"
        timeout 120 "$b" bench kernels --backend cuda --types ${KTYPES:-mxfp4} --T 1 --shapes ${KSHAPES:-2048x7168,7168x2048} 2>&1 | grep -E "^(mxfp4|bf16|fp8|limits)" | cut -c1-200 >>"$S"
    done
    for i in 1 2; do
        for c in "$BIN" "$BIN DF_CUDA_GREEDY=0" "$D/${ALT:-deltafin.b}"; do
            log "cuda run --preload, $(basename "$c")"
            k=""
            case "$c" in *" "*) k=${c#* } ;; esac
            BIN=${c%% *} rp $k | grep -E "^(profile: (mla|lm-head|total)|stats:)|^[0-9]+(,[0-9]+)+$" | cut -c1-300 >>"$S"
        done
    done
    rm -rf "$W"
    ;;
36)
    # issue 12: greedy decoding with the token on the device, the next step queued before it is read back
    gpu_tests
    gpu_tests_env DF_CUDA_GREEDY=0 test_golden
    resident_model
    knob_ab DF_CUDA_GREEDY
    if [ -f "$D/libgpu_timeline.so" ]; then
        log "timeline: cuda run --preload, the last ${GT_LAST_MS:-150} ms"
        rp LD_PRELOAD="$D/libgpu_timeline.so" GT_LAST_MS="${GT_LAST_MS:-150}" | grep -E "^gpu_timeline|^stats: generation|rror" >>"$S"
    fi
    rm -rf "$W"
    ;;
35)
    # issue 12: where a resident decode step's time goes on this GPU: the run, the CUPTI timeline, ncu durations
    resident_model
    log "cuda run --preload"
    rp | grep -E "^(profile|stats):" >>"$S"
    log "timeline: cuda run --preload, the last ${GT_LAST_MS:-150} ms"
    rp LD_PRELOAD="$D/libgpu_timeline.so" GT_LAST_MS="${GT_LAST_MS:-150}" | grep -E "^gpu_timeline|^stats: generation|rror" >>"$S"
    ncu_decode
    rm -rf "$W"
    ;;
17)
    # issue 12: every kernel of a preloaded resident decode with its device duration (ncu_decode); the run's own
    # tok/s first.
    resident_model
    log "cuda run --preload"
    rp | grep -E "^(profile|stats):" >>"$S"
    ncu_decode
    rm -rf "$W"
    ;;
18)
    # issue 12: matrices of at most 2048 rows split over K (DF_CUDA_SPLIT on / off: knob_ab), with the row kernels'
    # batched loads and the attention's short segments in both; GPU tests first, every decode kernel's duration last.
    gpu_tests
    resident_model
    knob_ab DF_CUDA_SPLIT
    ncu_decode
    rm -rf "$W"
    ;;
25)
    # programmatic dependent launch (DF_CUDA_PDL on / off: knob_ab, with host routing and with DF_CUDA_MOE_ROUTE=1);
    # GPU tests with it on first, the golden test also with the device routing
    knob_ab_route DF_CUDA_PDL
    ;;
26)
    # a started shared expert on the side stream (DF_CUDA_SIDE_STREAM on / off), as part 25
    knob_ab_route DF_CUDA_SIDE_STREAM
    ;;
28)
    # small host <-> device copies as kernels (DF_CUDA_COPY_KERNEL on / off), as part 25; then the timeline (part 27)
    knob_ab_route DF_CUDA_COPY_KERNEL
    resident_model
    timeline_runs
    rm -rf "$W"
    ;;
30)
    # GPU tests with the defaults, test_golden and test_batch with host routing, the resident decode (with and
    # without --profile)
    gpu_tests
    gpu_tests_env DF_CUDA_MOE_ROUTE=0 test_golden test_batch
    resident_model
    for i in 1 2 3; do
        log "cuda run --preload"
        rp | grep -E "^(profile: (mla|experts|dense|lm-head|total)|stats:)|^[0-9]+(,[0-9]+)+$|rror|fault" | cut -c1-300 >>"$S"
        log "cuda run --preload, no --profile"
        timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
            --prompt-ids "$(seq -s, 1 64)" --max-new 96 --stats 2>&1 | grep -E "^stats: generation|rror" >>"$S"
    done
    rm -rf "$W"
    ;;
32)
    # reads into registered buffers: the streamed model of part 6, bench io into reused buffers and into a pool of the
    # host budget, each registered with the ring (--fixed) and not, alternated; then part 6's prefill and decode
    # runs, and a decode that also measures B into the pool
    streamed_model
    for i in 1 2; do
        for b in "--fixed" "" "--buffer ${HOST_BUDGET:-2816M} --fixed" "--buffer ${HOST_BUDGET:-2816M}"; do
            log "bench io $b"
            timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 $b 2>&1 | tail -1 >>"$S"
        done
    done
    streamed_gpu_runs
    log "cuda decode, cold, same budgets, 17 warm-up + 24 tokens, --io-buffer ${HOST_BUDGET:-2816M}"
    timeout 120 "$BIN" bench decode --model "$W/m" --backend cuda --ram-budget "${HOST_BUDGET:-2816M}" \
        --gpu-budget "${GPU_BUDGET:-256M}" --warmup 17 --tokens 24 --io-seconds 2 --io-buffer "${HOST_BUDGET:-2816M}" 2>&1 \
        | grep -E "bench io|decode: [0-9.]+ tok|experts:|storage bound" | cut -c1-400 >>"$S"
    rm -rf "$W"
    ;;
34)
    # greedy and sampled resident decode with Kimi K2's 163840-token vocabulary (the host picks every token from
    # the logits): the 8-layer bf16-spine synth of part 24 with --vocab 163840
    W=/tmp/df-acc
    mkdir -p "$W"
    log "synth 8 layers, bf16 spine, vocab 163840"
    "$BIN" synth "$W/r" --layers 8 --spine-encoding bf16 --vocab 163840 --quiet --force 2>&1 | tail -1 >>"$S"
    for a in "" "--temperature 1 --seed 1" "" "--temperature 1 --seed 1" "--temperature 0.8 --top-p 0.95 --seed 1" \
        "--temperature 0.7 --top-k 40 --seed 1"; do
        log "cuda run --preload $a"
        timeout 100 "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload --prompt-ids "$(seq -s, 1 64)" \
            --max-new 96 --stats $a 2>&1 | grep -E "^stats: (prompt|generation)|rror|fault" | cut -c1-300 >>"$S"
    done
    rm -rf "$W"
    ;;
29)
    # GPU tests (also with DF_CUDA_MOE_ROUTE=1), the resident decode three times with each routing, then the timeline
    gpu_tests
    gpu_tests_env DF_CUDA_MOE_ROUTE=1 test_golden test_cuda_kernels
    resident_model
    for i in 1 2 3; do
        for v in 0 1; do
            log "cuda run --preload, DF_CUDA_MOE_ROUTE=$v"
            rp DF_CUDA_MOE_ROUTE=$v | grep -E "^(profile: (mla|experts|dense|lm-head|total)|stats:)|^[0-9]+(,[0-9]+)+$|rror|fault" \
                | cut -c1-300 >>"$S"
        done
    done
    timeline_runs
    rm -rf "$W"
    ;;
27)
    # the resident decode's GPU timeline (CUPTI, tools/device/gpu_timeline.c carried as libgpu_timeline.so): busy,
    # idle gaps and what they lie between, with host and with device routing
    resident_model
    timeline_runs
    rm -rf "$W"
    ;;
24)
    # GPU tests, then the resident decode three times (this build alone)
    gpu_tests
    resident_model
    for i in 1 2 3; do
        log "cuda run --preload"
        rp | grep -E "^(profile: (mla|experts|dense|lm-head|total)|stats:)|^[0-9]+(,[0-9]+)+$|rror|fault" | cut -c1-300 >>"$S"
    done
    rm -rf "$W"
    ;;
23)
    # where the resident decode's GPU idles (nsys timeline, gpu_gaps.py) and each kernel's duration (ncu), with
    # DF_CUDA_MOE_ROUTE on and off
    resident_model
    NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
    for v in 1 0; do
        if [ -n "$NSYS" ]; then
            log "nsys: resident decode, DF_CUDA_MOE_ROUTE=$v"
            DF_CUDA_MOE_ROUTE=$v timeout 150 "$NSYS" profile --trace=cuda --sample=none --cpuctxsw=none -o "/tmp/nsys$v" \
                --force-overwrite true "$BIN" run --model "$W/r" --backend cuda --gpu-budget 100G --preload \
                --prompt-ids "$(seq -s, 1 64)" --max-new 96 >/dev/null 2>"$OUT/nsys$v.err"
            timeout 120 "$NSYS" stats --report cuda_gpu_trace --format csv -o "/tmp/gt$v" "/tmp/nsys$v.nsys-rep" >/dev/null 2>&1
            python3 "$HERE/tools/device/gpu_gaps.py" "$(ls /tmp/gt$v*.csv | head -1)" 0.4 >>"$S" 2>&1
        else
            log "nsys: not installed"
        fi
        log "ncu, DF_CUDA_MOE_ROUTE=$v"
        mkdir -p "$OUT/r$v"
        O0=$OUT
        OUT=$OUT/r$v DF_CUDA_MOE_ROUTE=$v ncu_decode
        OUT=$O0
    done
    rm -rf "$W"
    ;;
22)
    gpu_tests
    resident_model
    knob_ab DF_CUDA_MOE_ROUTE
    rm -rf "$W"
    ;;
21)
    gpu_tests
    CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
    for o in ${OBJS:-}; do
        [ -n "$CUOBJ" ] && [ -f "$HERE/$o" ] || continue
        log "SASS of the one-token MXFP4 tile in $o"
        "$CUOBJ" --dump-sass "$HERE/$o" >"$OUT/sass-$(basename "$o").txt" 2>&1
        python3 - "$OUT/sass-$(basename "$o").txt" >>"$S" 2>&1 <<'PY'
import re, sys, collections
fn, body = None, {}
for l in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", l)
    if m: fn = m.group(1); body[fn] = []; continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
    if fn and m: body[fn].append((int(m.group(1), 16), m.group(2)))
for fn, ins in body.items():
    if "mma_group_kernelILi5ELi1ELi1ELi2ELi1E" not in fn: continue
    # the main loop: the longest backward branch
    best = None
    for a, t in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a and (best is None or a - int(m.group(1), 16) > best[1] - best[0]):
            best = (int(m.group(1), 16), a)
    loop = [t for a, t in ins if best and best[0] <= a <= best[1]]
    ops = collections.Counter(re.sub(r"^@!?U?P\d+\s+", "", t).split()[0].split(".")[0] for t in loop)
    print("sass %s: %d instructions, loop %d: %s" % (fn[-40:], len(ins), len(loop), ops.most_common(14)))
PY
    done
    resident_model
    for b in "$BIN" ${ALT:-deltafin.b}; do
        [ "$b" = "$BIN" ] || b=$D/$b
        log "bench kernels mxfp4, $(basename "$b")"
        timeout 120 "$b" bench kernels --backend cuda --types ${KTYPES:-mxfp4} --T 1,8 --shapes ${KSHAPES:-2048x7168,7168x2048} 2>&1 | grep -E "^(mxfp4|bf16|fp8|limits)" | cut -c1-200 >>"$S"
    done
    for i in 1 2; do
        for b in "$BIN" ${ALT:-deltafin.b}; do
            [ "$b" = "$BIN" ] || b=$D/$b
            log "cuda run --preload, $(basename "$b")"
            BIN=$b rp | grep -E "^(profile: (mla|experts|total)|stats:)|^[0-9]+(,[0-9]+)+$" | cut -c1-300 >>"$S"
        done
    done
    rm -rf "$W"
    ;;
19)
    # A/B of two builds: this binary against a carried deltafin.b (EXTRA_BINS=deltafin.b in pack.sh), the resident
    # decode alternated twice, then each binary's decode kernels (ncu_decode; the second's in OUT/b/). GPU tests first.
    gpu_tests
    resident_model
    for i in 1 2; do
        for b in "$BIN" "$D/deltafin.b"; do
            log "cuda run --preload, $(basename "$b")"
            BIN=$b rp | grep -E "^(profile: (mla|experts|total)|stats:)|^[0-9]+(,[0-9]+)+$" | cut -c1-300 >>"$S"
        done
    done
    ncu_decode
    B0=$BIN OUT0=$OUT
    BIN=$D/deltafin.b OUT=$OUT/b
    mkdir -p "$OUT"
    ncu_decode
    BIN=$B0 OUT=$OUT0
    rm -rf "$W"
    ;;
20)
    # issue 12: an MLA block starts the next MoE's shared expert before it returns (DF_CUDA_SHARED_EARLY on / off:
    # knob_ab); GPU tests first.
    gpu_tests
    resident_model
    knob_ab DF_CUDA_SHARED_EARLY
    rm -rf "$W"
    ;;
9)
    # where the drive waits during a streamed decode (tools/drive-idle.py on the store's events): the streamed model
    # of part 6, bench io into reused buffers and into a pool of the host budget, then the streamed GPU decode with
    # the lookahead gated and ungated, and a 16-thread CPU decode, each with --events.
    streamed_model
    for b in "" "--buffer ${HOST_BUDGET:-2816M}"; do
        log "bench io $b"
        timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 $b 2>&1 | tail -1 >>"$S"
    done
    for pf in auto ungated; do
        log "cuda decode, cold, --ram-budget ${HOST_BUDGET:-2816M} --gpu-budget ${GPU_BUDGET:-256M}, --prefetch $pf, 17 warm-up + 24 tokens, --events"
        timeout 150 "$BIN" bench decode --model "$W/m" --backend cuda --ram-budget "${HOST_BUDGET:-2816M}" \
            --gpu-budget "${GPU_BUDGET:-256M}" --warmup 17 --tokens 24 --io-seconds 2 --io-buffer "${HOST_BUDGET:-2816M}" \
            --prefetch $pf --events "$OUT/ev-cuda-$pf.jsonl" 2>&1 \
            | grep -E "bench io|decode: [0-9.]+ tok|experts:|storage bound" | cut -c1-400 >>"$S"
        python3 "$HERE/tools/drive-idle.py" "$OUT/ev-cuda-$pf.jsonl" >>"$S" 2>&1
    done
    log "cpu decode, 16 threads, cold, --ram-budget 3G, 24 tokens, --io-buffer 3G, --events"
    timeout 150 "$BIN" bench decode --model "$W/m" --backend cpu --ram-budget 3G --tokens 24 --io-seconds 2 --io-buffer 3G \
        --events "$OUT/ev-cpu.jsonl" 2>&1 | grep -E "bench io|decode: [0-9.]+ tok|experts:|storage bound" | cut -c1-400 >>"$S"
    python3 "$HERE/tools/drive-idle.py" "$OUT/ev-cpu.jsonl" >>"$S" 2>&1
    xz -T2 "$OUT"/ev-*.jsonl 2>/dev/null
    rm -rf "$W"
    ;;
10)
    # the store's read depth (--qd: the store's expert reads in flight per drive and its bench io): the streamed
    # model of part 6, bench io at QD 8 / 16 / 32, then the streamed GPU decode and a 16-thread CPU decode at QD 16
    # and 8, alternating (QD: "16 8 16 8").
    streamed_model
    for q in 16 8 32; do
        log "bench io --qd $q"
        timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 --qd $q 2>&1 | tail -1 >>"$S"
    done
    for q in ${QD:-16 8 16 8}; do
        log "cuda decode, cold, --ram-budget ${HOST_BUDGET:-2816M} --gpu-budget ${GPU_BUDGET:-256M}, --qd $q, 17 warm-up + 24 tokens"
        timeout 150 "$BIN" bench decode --model "$W/m" --backend cuda --ram-budget "${HOST_BUDGET:-2816M}" \
            --gpu-budget "${GPU_BUDGET:-256M}" --warmup 17 --tokens 24 --io-seconds 2 --qd $q 2>&1 \
            | grep -E "decode: [0-9.]+ tok|storage bound" | cut -c1-300 >>"$S"
    done
    for q in 16 8; do
        log "cpu decode, 16 threads, cold, --ram-budget 3G, 24 tokens, --qd $q"
        timeout 150 "$BIN" bench decode --model "$W/m" --backend cpu --ram-budget 3G --tokens 24 --io-seconds 2 --qd $q \
            2>&1 | grep -E "decode: [0-9.]+ tok|storage bound" | cut -c1-300 >>"$S"
    done
    rm -rf "$W"
    ;;
11)
    # the host CPU's kernels and decode, this binary against a carried deltafin.base (A/B, alternating): bench kernels
    # at 1 and 16 threads, the streamed model in RAM (--preload, 16 threads, 48 tokens), then a 16-thread CPU decode
    # under --ram-budget 3G (issue 10's 90% of the bound); before them the GPU tests, if carried. Knobs: NO_TESTS=1,
    # KROUNDS="" (no kernel tables), KT (the kernels' token counts, default 1,8), CAPPED_ROUNDS (1), CAPPED_FIRST=base (the carried base runs first in each pair), NO_RAM=1.
    B0=$D/deltafin.base
    [ -x "$B0" ] || B0=$BIN
    if [ -x "$D/test_cuda_kernels" ] && [ -z "${NO_TESTS:-}" ]; then
        log "test_cuda_kernels"
        (cd "$HERE" && timeout 150 "$D/test_cuda_kernels" 2>&1 | grep -E "FAIL|passed" | tail -15) >>"$S"
    fi
    [ -n "${NO_TESTS:-}" ] || for t in test_golden test_batch; do
        [ -x "$D/$t" ] || continue
        log "DF_BACKEND=cuda $t"
        (cd "$HERE" && DF_SRC="$HERE" DF_BACKEND=cuda timeout 150 "$D/$t" 2>&1 | grep -E "FAIL|passed|diff" | tail -15) >>"$S"
    done
    for r in ${KROUNDS-1}; do
        for b in "$B0" "$BIN"; do
            log "bench kernels --threads 1,16, $(basename "$b") (round $r)"
            timeout 120 "$b" bench kernels --threads 1,16 --types bf16,fp8_b128,mxfp4 --T "${KT:-1,8}" \
                --shapes 2048x7168,7168x2048 2>&1 | grep -E "^ *(threads|[0-9]+ )|^(bf16|fp8|mxfp4)" >>"$S"
        done
    done
    streamed_model
    [ -n "${NO_RAM:-}" ] || for r in 1 2; do
        for b in "$B0" "$BIN"; do
            log "in RAM, run --threads 16 --preload, 48 tokens, $(basename "$b") (round $r)"
            timeout 150 "$b" run --model "$W/m" --backend cpu --threads 16 --preload --prompt-ids 1,2,3,4,5,6,7,8 --max-new 48 \
                --stats --profile 2>&1 | grep -E "^(profile|stats):" >>"$S"
        done
    done
    PAIR="$BIN $B0"
    [ "${CAPPED_FIRST:-}" = base ] && PAIR="$B0 $BIN"
    for b in $(for r in $(seq "${CAPPED_ROUNDS:-1}"); do echo "$PAIR"; done); do
        log "cpu decode, 16 threads, cold, --ram-budget 3G, 24 tokens, $(basename "$b")"
        timeout 150 "$b" bench decode --model "$W/m" --backend cpu --ram-budget 3G --tokens 24 --io-seconds 2 \
            2>&1 | grep -E "decode: [0-9.]+ tok|storage bound" | cut -c1-300 >>"$S"
    done
    rm -rf "$W"
    ;;
12)
    streamed_model
    for i in 1 2; do
        log "cuda run, 512-token prompt, cold, --ram-budget ${HOST_BUDGET:-2816M} --gpu-budget ${GPU_BUDGET:-256M}, DF_CUDA_TRACE=1 (run $i)"
        DF_CUDA_TRACE=1 timeout 100 "$BIN" run --model "$W/m" --backend cuda --gpu-budget "${GPU_BUDGET:-256M}" \
            --ram-budget "${HOST_BUDGET:-2816M}" --prompt-ids "$(seq -s, 1 512)" --max-new 1 --stats --profile 2>&1 \
            | grep -E "^(profile|stats|cuda trace):" >>"$S"
        log "cuda bench prefill 512 (run $i)"
        timeout 100 "$BIN" bench prefill --model "$W/m" --backend cuda --tokens 512 --gpu-budget "${GPU_BUDGET:-256M}" \
            --ram-budget "${HOST_BUDGET:-2816M}" --io-seconds 2 2>&1 | grep -vE "^(model |bench prefill:)" >>"$S"
    done
    rm -rf "$W"
    B0=$D/deltafin.base
    [ -x "$B0" ] || B0=$BIN
    for t in test_kernels test_kernels_invariance; do
        [ -x "$D/$t" ] && { log "$t"; (cd "$HERE" && timeout 120 "$D/$t" 2>&1 | grep -E "FAIL|passed" | tail -5) >>"$S"; }
    done
    for r in 1 2; do
        for b in "$B0" "$BIN"; do
            log "bench kernels --threads 1,16 fp8/mxfp4 T 1,4,8, $(basename "$b") (round $r)"
            timeout 120 "$b" bench kernels --threads 1,16 --types fp8_b128,mxfp4 --T 1,4,8 --shapes 2048x7168,7168x2048 \
                2>&1 | grep -E "^ *(threads|[0-9]+ )|^(fp8|mxfp4)" >>"$S"
        done
    done
    ;;
13)
    streamed_model
    for b in "" "--buffer ${HOST_BUDGET:-2816M}"; do
        log "bench io $b"
        timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 $b 2>&1 | tail -1 >>"$S"
    done
    for rb in "${HOST_BUDGET:-2816M}" 8G "${HOST_BUDGET:-2816M}"; do
        log "cuda run, 512-token prompt, cold, --ram-budget $rb --gpu-budget ${GPU_BUDGET:-256M} --events"
        timeout 100 "$BIN" run --model "$W/m" --backend cuda --gpu-budget "${GPU_BUDGET:-256M}" --ram-budget "$rb" \
            --prompt-ids "$(seq -s, 1 512)" --max-new 1 --stats --events "$OUT/ev-$rb-$SECONDS.jsonl" 2>&1 \
            | grep -E "^stats:" >>"$S"
    done
    log "bench io"
    timeout 30 "$BIN" bench io --dir "$W/m" --run 22848K --group 8 --seconds 3 2>&1 | tail -1 >>"$S"
    rm -rf "$W"
    ;;
esac
log "done"
