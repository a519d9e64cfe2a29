#!/usr/bin/env bash
# asan_draft.sh OUT — a KDA draft model drafting for a KDA target on the GPU: test_speculative (cuda) with every
# failure printed, the CLI on small and K3-sized synths (release), then the same under AddressSanitizer
# (.devcarry-asan.tar.xz, carried beside .devcarry.tar.xz: deltafin.asan, a build of this tree configured with
# -DDF_ASAN=ON, `strip --strip-debug`, and its shared libraries with libasan / libubsan under lib/).
set -u
OUT=${1:?usage: asan_draft.sh OUTDIR}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
D=$(mktemp -d); A=$(mktemp -d)
tar xJf "$HERE/.devcarry.tar.xz" -C "$D"; tar xJf "$HERE/.devcarry-asan.tar.xz" -C "$A"
export LD_LIBRARY_PATH="$D/lib"
S=$OUT/asan.txt
mkdir -p "$OUT"
log() { echo "== $(date -u +%T) $*" | tee -a "$S"; }
log "release test_speculative, DF_BACKEND=cuda"
(cd "$HERE" && DF_SRC="$HERE" DF_BACKEND=cuda timeout 120 "$D/test_speculative" >"$OUT/ts.txt" 2>&1; echo "rc $?" >>"$OUT/ts.txt")
grep -E -A3 "FAIL" "$OUT/ts.txt" | head -30 >>"$S"; grep -E "passed|^rc|draft-|abort|Abort|invalid" "$OUT/ts.txt" | tail -20 >>"$S"
P=$(for i in $(seq 16); do printf '5,6,7,8,9,10,11,12,'; done)13
"$D/deltafin" synth /tmp/k3d --arch kimi_k3 --layers 4 --experts 8 --top-k 4 --hidden 512 --latent 256 --moe-inter 256 \
    --inter 512 --heads 4 --quiet --force 2>&1 | tail -1 >>"$S"
"$D/deltafin" synth /tmp/k3t --arch kimi_k3 --layers 4 --experts 16 --top-k 4 --hidden 1024 --latent 512 --moe-inter 512 \
    --inter 1024 --heads 8 --quiet --force 2>&1 | tail -1 >>"$S"
for b in "$D/deltafin" "$A/deltafin.asan"; do
    for snap in 1 0; do
        log "$(basename "$b") small target, draft model, DF_CUDA_KDA_SNAP=$snap"
        ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 DF_CUDA_KDA_SNAP=$snap timeout 200 "$b" run --model /tmp/k3t \
            --backend cuda --prompt-ids "$P" --max-new 48 --draft /tmp/k3d --draft-gate off --draft-adaptive off \
            --draft-max 4 --stats --print-ids >"$OUT/o-$(basename "$b")-$snap.txt" 2>"$OUT/e-$(basename "$b")-$snap.txt"
        echo "rc $?" >>"$S"
        grep -E -v "^    #[0-9]+ 0x[0-9a-f]+ in (__|std::|start_thread|clone)" "$OUT/e-$(basename "$b")-$snap.txt" |
            grep -E "ERROR|SUMMARY|#[0-9]|located|allocated|freed|invalid|stats: draft|draft:" | head -40 >>"$S"
        md5sum <"$OUT/o-$(basename "$b")-$snap.txt" | cut -c1-8 >>"$S"
    done
done
log "plain decode, small target"
timeout 100 "$D/deltafin" run --model /tmp/k3t --backend cuda --prompt-ids "$P" --max-new 48 --print-ids 2>/dev/null |
    md5sum | cut -c1-8 >>"$S"
rm -rf /tmp/k3t /tmp/k3d "$D" "$A"
