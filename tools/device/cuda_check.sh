#!/usr/bin/env bash
# cuda_check.sh — the CUDA backend's checks on the accelerator machine, from a checkout that holds
# tests/golden, tests/golden_model and models/ (the goldens) and the tarball of tools/device/cuda_pack.sh:
#   1. test_cuda_kernels: every CUDA kernel against the CPU reference, batch invariance;
#   2. the golden tests with the CUDA backend (DF_BACKEND=cuda): greedy tokens and logit differences;
#      e2e_cuda_cli.sh: --backend cpu / auto / cuda give the same ids;
#   3. `deltafin run` with --backend cpu and --backend cuda on models/kimi-mini: the same text;
#   4. `deltafin bench kernels --backend cuda` (kernel speed vs measured HBM / peaks);
#   5. `bench decode` and `bench prefill` on a synthetic K2-shaped model held in RAM, cuda vs cpu
#      (SYNTH_LAYERS layers, default 8 = 14.4 GB; 0 = skip; TOKENS decode tokens, default 32).
# Usage (device tool, in the checkout): mkdir -p /tmp/dc && tar xJf .devcarry-cuda.tar.xz -C /tmp/dc &&
#        /tmp/dc/cuda_check.sh $OUT. Writes at most 8 files to OUTDIR (the device tool's limit): summary.txt and
#        the main logs; every log is kept in /tmp/dc-logs.
set -u
OUTD=${1:?usage: cuda_check.sh OUTDIR}
D=$(cd "$(dirname "$0")" && pwd)
SRC=$(pwd)
L=/tmp/dc-logs
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DF_SRC="$SRC" DF_BIN="$D/deltafin"
mkdir -p "$OUTD" "$L"
S="$OUTD/summary.txt"
step() { echo "== $*" | tee -a "$S"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; nproc; } >>"$S"
ldd "$D/deltafin" | grep "not found" | tee -a "$S"

step "1 test_cuda_kernels"
timeout 120 "$D/test_cuda_kernels" >"$L/kernels.log" 2>&1; echo "rc=$?" >>"$L/kernels.log"
grep -E "FAIL|passed|skipped|rc=" "$L/kernels.log" | head -40 | tee -a "$S"

step "2 goldens with DF_BACKEND=cuda"
for t in test_golden test_golden_model test_store_golden; do
    [ -x "$D/$t" ] || continue
    DF_BACKEND=cuda timeout 150 "$D/$t" >"$L/$t.log" 2>&1; echo "rc=$?" >>"$L/$t.log"
    echo "-- $t" | tee -a "$S"
    grep -E "FAIL|passed|rc=" "$L/$t.log" | head -20 | tee -a "$S"
done
timeout 120 bash "$D/e2e_cuda_cli.sh" >"$L/e2e.log" 2>&1; echo "rc=$?" >>"$L/e2e.log"
tail -n 8 "$L/e2e.log" >>"$S"

step "3 run cpu vs cuda (kimi-mini, 24 greedy tokens)"
for b in cpu cuda; do
    "$D/deltafin" run --model models/kimi-mini --cache-dir /tmp/dc-cache --prompt "In the beginning God created" \
        --max-new 24 --backend $b --stats >"$L/run_$b.txt" 2>"$L/run_$b.err"; echo "$b rc=$?" | tee -a "$S"
    grep -v converting "$L/run_$b.err" | head -c 1500 >>"$S"; echo >>"$S"
done
cmp -s "$L/run_cpu.txt" "$L/run_cuda.txt" && echo "same text" | tee -a "$S" || echo "TEXT DIFFERS" | tee -a "$S"
"$D/deltafin" run --model models/kimi-mini --prompt-ids 1,2,3 --max-new 8 --print-ids --backend cuda --gpu-budget 1M \
    --cache-dir /tmp/dc-cache 2>/dev/null | tee -a "$S"; echo "gpu-budget 1M rc=$?" | tee -a "$S"
"$D/deltafin" run --model models/kimi-mini --prompt-ids 1,2,3 --max-new 8 --print-ids --backend cpu \
    --cache-dir /tmp/dc-cache 2>/dev/null | tee -a "$S"

step "4 bench kernels --backend cuda"
timeout 150 "$D/deltafin" bench kernels --backend cuda >"$L/bench_kernels.log" 2>&1; echo "rc=$?" >>"$L/bench_kernels.log"
cat "$L/bench_kernels.log" >>"$S"

N=${SYNTH_LAYERS:-8}
if [ "$N" != 0 ]; then
    step "5 synthetic K2-shaped model ($N layers) in RAM: decode and prefill, cuda vs cpu"
    W=/tmp/dc-synth
    timeout 200 "$D/deltafin" synth "$W" --layers "$N" --force >"$L/synth.log" 2>&1; echo "synth rc=$?" | tee -a "$S"
    grep -v "^\s*$" "$L/synth.log" | tail -n 6 >>"$S"
    for b in cuda cpu; do
        timeout 150 "$D/deltafin" bench decode --model "$W" --tokens "${TOKENS:-32}" --no-drop --io-seconds 1 --backend $b \
            >"$L/decode_$b.log" 2>&1; echo "decode $b rc=$?" | tee -a "$S"
        tail -n 12 "$L/decode_$b.log" >>"$S"
    done
    for b in cuda cpu; do
        timeout 120 "$D/deltafin" bench prefill --model "$W" --tokens 64 --no-drop --io-seconds 1 --backend $b \
            >"$L/prefill_$b.log" 2>&1; echo "prefill $b rc=$?" | tee -a "$S"
        tail -n 8 "$L/prefill_$b.log" >>"$S"
    done
    rm -rf "$W"
fi
step "done $(date -u)"
for f in kernels.log test_golden.log test_golden_model.log bench_kernels.log decode_cuda.log e2e.log run_cuda.err; do
    [ -f "$L/$f" ] && cp "$L/$f" "$OUTD/"
done
