#!/usr/bin/env bash
# bench_host.sh — storage/compute benchmarks on the accelerator machine's host (16 cores, one NVMe drive), run
# through the `device` tool with a binary built on the development machine and its shared libraries carried in
# .devcarry.tar.xz (tools/device/pack.sh). Writes a K2-shaped synthetic model 4x+ larger than the RAM budget, then:
# bench io (and fio when installed), cold `bench decode`, and `bench prefill` for 64/256/1024-token prompts.
# Usage: tools/device/bench_host.sh OUTDIR [SIZE (24G)] [BUDGET (6G)]
# Env: SPINE (bf16 | fp8_b128; synth --spine-encoding), PREFILL ("64 256 1024"), TOKENS (32 decode tokens),
#      SKIP_DECODE (set: no decode benchmark), IO_PAIRS (3 alternated bench io / fio pairs), IO_S (8 s each),
#      SETTLE (10 s after sync before the I/O pairs), KERNELS (set: `bench machine` + `bench kernels` first),
#      BACKEND (cpu: decode and prefill on the host's cores; auto or cuda to use the GPU backend).
set -u
OUT=${1:?usage: bench_host.sh OUTDIR [SIZE] [BUDGET]}
SIZE=${2:-24G}
BUDGET=${3:-6G}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
D=$(mktemp -d)
tar xJf "$HERE/.devcarry.tar.xz" -C "$D"
BIN="$D/deltafin"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
W=${WORK:-/tmp/df-bench}
mkdir -p "$OUT" "$W"
log() { echo "== $*" | tee -a "$OUT/bench.txt"; }
{ echo "date: $(date -u)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo)"; echo "cores: $(nproc)";
  free -g | head -2; df -h "$W" | tail -1; } >>"$OUT/bench.txt"
if [ -n "${KERNELS:-}" ]; then
    log "bench kernels (T=1 and 8; MXFP4, BF16, FP8, INT4; 1, 2 and all threads)"
    "$BIN" bench kernels --threads "1,2,$(nproc)" --types mxfp4,bf16,fp8_b128,int4_g32 --T 1,8 2>&1 | tee -a "$OUT/bench.txt"
fi
log "synth $SIZE"
"$BIN" synth "$W/m" --size "$SIZE" --spine-encoding "${SPINE:-bf16}" --quiet --force 2>&1 | tail -2 >>"$OUT/bench.txt"
# bench io vs fio on the same files (the expert packs, hard-linked into one directory), same pattern (1 MiB
# random reads, QD16, O_DIRECT, io_uring), alternated IO_PAIRS times after synth's writes have reached the drive
sync
sleep "${SETTLE:-10}"
mkdir -p "$W/packs"
for f in "$W"/m/experts-L*.pack; do ln -f "$f" "$W/packs/"; done
PACK_LIST=$(ls "$W"/packs/experts-L*.pack | tr '\n' ':' | sed 's/:$//')
for r in $(seq 1 "${IO_PAIRS:-3}"); do
    log "bench io, pair $r"
    "$BIN" bench io --dir "$W/packs" --size 1M --qd 16 --seconds "${IO_S:-8}" 2>&1 | tee -a "$OUT/bench.txt"
    if command -v fio >/dev/null; then
        log "fio, pair $r (same files and pattern)"
        fio --name=packs --filename="$PACK_LIST" --rw=randread --bs=1M --iodepth=16 --ioengine=io_uring \
            --direct=1 --readonly --runtime="${IO_S:-8}" --time_based --numjobs=1 2>&1 | grep -E "READ:" | tee -a "$OUT/bench.txt"
    fi
done
rm -rf "$W/packs"
[ -n "${SKIP_DECODE:-}" ] || log "bench decode (cold, budget $BUDGET)"
[ -n "${SKIP_DECODE:-}" ] || "$BIN" bench decode --backend "${BACKEND:-cpu}" --model "$W/m" --ram-budget "$BUDGET" --tokens "${TOKENS:-32}" 2>&1 | tee -a "$OUT/bench.txt"
for n in ${PREFILL:-64 256 1024}; do
    log "bench prefill $n tokens (cold, budget $BUDGET)"
    "$BIN" bench prefill --backend "${BACKEND:-cpu}" --model "$W/m" --tokens "$n" --ram-budget "$BUDGET" --io-seconds 3 2>&1 | tee -a "$OUT/bench.txt"
done
rm -rf "$W"
