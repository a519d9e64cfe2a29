#!/usr/bin/env bash
# kda_check.sh OUT — the GPU's KDA recurrence on the accelerator machine: the GPU tests of the carried binaries
# (tools/device/pack.sh with EXTRA_BINS="test_cuda_kernels test_golden test_batch test_speculative"), then a K3-shaped synth (4 layers:
# dense, 2 KDA, MLA; 32 experts top-8, 12 GB) prompted with PROMPT (512) tokens on the GPU, the KDA mixer in one GPU
# call (DF_CUDA_KDA=1 DF_CUDA_KDA_BLOCK=1), step by step with the recurrence on the GPU (1 0) and on the CPU (0 0),
# alternated ROUNDS (2) times (VARIANTS: which, default "11 10 00"; NEW generated tokens, default 32): TTFT, decode,
# the profile's phases and the ids (the same bits expected). SKIP_TESTS=1 / SKIP_RUNS=1: only the runs / the tests.
# SPEC=ngram|model: then drafting with the KDA snapshots on the GPU and on the host, against plain decode.
set -u
OUT=${1:?usage: kda_check.sh OUTDIR}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
D=$(mktemp -d)
tar xJf "$HERE/.devcarry.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
S=$OUT/kda.txt
log() { echo "== $(date -u +%T) $*" | tee -a "$S"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -1; } >>"$S"
if [ -z "${SKIP_TESTS:-}" ]; then
log "DF_BACKEND=cuda test_cuda_kernels"
(cd "$HERE" && DF_BACKEND=cuda timeout 200 "$D/test_cuda_kernels" 2>&1 | grep -E "FAIL|passed" | tail -8) >>"$S"
for t in test_golden test_batch test_speculative; do
    [ -x "$D/$t" ] || continue
    log "DF_BACKEND=cuda $t"
    (cd "$HERE" && DF_SRC="$HERE" DF_BACKEND=cuda timeout 150 "$D/$t" 2>&1 | grep -E "FAIL|passed|diff" | tail -6) >>"$S"
done
fi
[ -z "${SKIP_RUNS:-}" ] || exit 0
W=/tmp/df-kda
log "synth kimi_k3 4 layers, 32 experts top-8"
"$D/deltafin" synth "$W" --arch kimi_k3 --layers 4 --experts 32 --top-k 8 --quiet --force 2>&1 | tail -1 >>"$S"
N=${PROMPT:-512}
for r in $(seq "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-11 10 00}; do # DF_CUDA_KDA, DF_CUDA_KDA_BLOCK
        log "run --backend cuda, $N-token prompt, ${NEW:-32} new, DF_CUDA_KDA=${v%?} DF_CUDA_KDA_BLOCK=${v#?} (round $r)"
        DF_CUDA_KDA=${v%?} DF_CUDA_KDA_BLOCK=${v#?} timeout 150 "$D/deltafin" run --model "$W" --backend cuda \
            --gpu-budget 40G --preload --prompt-ids "$(seq -s, 1 "$N")" --max-new "${NEW:-32}" --stats --profile --print-ids \
            2>"$OUT/run-$v-$r.err" >"$OUT/run-$v-$r.out"
        grep -E "TTFT|decode|profile: (kda|mla|norm|experts|dense|total)" "$OUT/run-$v-$r.err" | cut -c1-220 >>"$S"
        echo "ids md5 $(md5sum <"$OUT/run-$v-$r.out" | cut -c1-8)" >>"$S"
    done
done
# drafting on the same model: each verification's rollback snapshot of the KDA states kept on the GPU
# (DF_CUDA_KDA_SNAP=1) or fetched to the host (0), against plain decode (the same ids expected). SPEC=ngram: n-gram
# drafts on a repeating prompt; SPEC=model: a 26 MB kimi_k3 synth (same vocabulary) drafts 4 tokens per
# verification, the gate off (its drafts are mostly rejected: a rollback per verification)
if [ -n "${SPEC:-}" ]; then
    P=$(for i in $(seq 16); do printf '5,6,7,8,9,10,11,12,'; done)13
    DA="--draft ngram"
    if [ "$SPEC" = model ]; then
        "$D/deltafin" synth /tmp/df-kda-draft --arch kimi_k3 --layers 4 --experts 8 --top-k 4 --hidden 512 \
            --latent 256 --moe-inter 256 --inter 512 --heads 4 --quiet --force 2>&1 | tail -1 >>"$S"
        DA="--draft /tmp/df-kda-draft --draft-gate off --draft-adaptive off --draft-max 4"
    fi
    for r in $(seq "${ROUNDS:-2}"); do
        for v in off 1 0; do
            a=$DA; [ "$v" = off ] && a="--draft off"
            log "run --backend cuda, $a, DF_CUDA_KDA_SNAP=${v#off} (round $r)"
            DF_CUDA_KDA_SNAP=${v#off} timeout 150 "$D/deltafin" run --model "$W" --backend cuda --gpu-budget 40G \
                --preload --prompt-ids "$P" --max-new "${NEW:-32}" $a --stats --print-ids \
                2>"$OUT/spec-$v-$r.err" >"$OUT/spec-$v-$r.out"
            grep -E "decode|draft" "$OUT/spec-$v-$r.err" | cut -c1-260 >>"$S"
            echo "ids md5 $(md5sum <"$OUT/spec-$v-$r.out" | cut -c1-8)" >>"$S"
        done
    done
    rm -rf /tmp/df-kda-draft
fi
rm -rf "$W"
