#!/usr/bin/env bash
# cuda_check.sh — the CUDA backend's checks on the accelerator machine, from a checkout that holds
# tests/golden, tests/golden_model and models/ (the goldens) and the tarball of tools/device/cuda_pack.sh:
#   1. test_cuda_kernels: every CUDA kernel against the CPU reference, batch invariance;
#   2. the golden tests with the CUDA backend (DF_BACKEND=cuda): greedy tokens and logit differences;
#   3. `deltafin run` with --backend cpu and --backend cuda on models/kimi-mini: the same tokens;
#   4. `deltafin bench kernels --backend cuda` (kernel speed vs measured HBM / peaks);
#   5. `bench decode` on a synthetic K2-shaped model held in RAM, cpu vs cuda (SYNTH_LAYERS, default 4; 0 = skip).
# Usage (device tool, in the checkout): bash -c 'mkdir -p /tmp/dc && tar xJf .devcarry-cuda.tar.xz -C /tmp/dc &&
#        /tmp/dc/cuda_check.sh $OUT'. Logs: OUTDIR/*.log; a summary line per step in OUTDIR/summary.txt.
set -u
OUTD=${1:?usage: cuda_check.sh OUTDIR}
D=$(cd "$(dirname "$0")" && pwd)
SRC=$(pwd)
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DF_SRC="$SRC" DF_BIN="$D/deltafin"
mkdir -p "$OUTD"
S="$OUTD/summary.txt"
step() { echo "== $*" | tee -a "$S"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; nproc; } >>"$S"
ldd "$D/deltafin" | grep "not found" | tee -a "$S"

step "1 test_cuda_kernels"
timeout 120 "$D/test_cuda_kernels" >"$OUTD/kernels.log" 2>&1; echo "rc=$?" >>"$OUTD/kernels.log"
grep -E "FAIL|passed|skipped|rc=" "$OUTD/kernels.log" | head -40 | tee -a "$S"

step "2 goldens with DF_BACKEND=cuda"
for t in test_golden test_golden_model test_store_golden; do
    [ -x "$D/$t" ] || continue
    DF_BACKEND=cuda timeout 150 "$D/$t" >"$OUTD/$t.log" 2>&1; echo "rc=$?" >>"$OUTD/$t.log"
    echo "-- $t" | tee -a "$S"
    grep -E "FAIL|max \|logit|greedy|passed|rc=" "$OUTD/$t.log" | head -40 | tee -a "$S"
done

step "3 run cpu vs cuda (kimi-mini, 24 greedy tokens)"
for b in cpu cuda; do
    "$D/deltafin" run --model models/kimi-mini --cache-dir /tmp/dc-cache --prompt "In the beginning God created" \
        --max-new 24 --backend $b >"$OUTD/run_$b.txt" 2>"$OUTD/run_$b.err"; echo "$b rc=$?" | tee -a "$S"
    head -c 400 "$OUTD/run_$b.err" | tr '\n' ' ' | tee -a "$S"; echo | tee -a "$S"
done
cmp -s "$OUTD/run_cpu.txt" "$OUTD/run_cuda.txt" && echo "same text" | tee -a "$S" || echo "TEXT DIFFERS" | tee -a "$S"
"$D/deltafin" run --model models/kimi-mini --prompt-ids 1,2,3 --max-new 2 --backend cuda --gpu-budget 1M --cache-dir /tmp/dc-cache \
    >/dev/null 2>>"$S"; echo "gpu-budget 1M rc=$?" | tee -a "$S"

step "4 bench kernels --backend cuda"
timeout 120 "$D/deltafin" bench kernels --backend cuda >"$OUTD/bench_kernels.log" 2>&1; echo "rc=$?" >>"$OUTD/bench_kernels.log"
cat "$OUTD/bench_kernels.log" >>"$S"

L=${SYNTH_LAYERS:-4}
if [ "$L" != 0 ]; then
    step "5 decode on a synthetic K2-shaped model ($L layers) in RAM: cpu vs cuda"
    W=/tmp/dc-synth
    timeout 150 "$D/deltafin" synth "$W" --layers "$L" --quiet --force >"$OUTD/synth.log" 2>&1; echo "synth rc=$?" | tee -a "$S"
    for b in cuda cpu; do
        timeout 100 "$D/deltafin" bench decode --model "$W" --tokens "${TOKENS:-16}" --no-drop --io-seconds 1 --backend $b \
            >"$OUTD/decode_$b.log" 2>&1; echo "$b rc=$?" | tee -a "$S"
        tail -n 12 "$OUTD/decode_$b.log" >>"$S"
    done
    rm -rf "$W"
fi
step "done $(date -u)"
