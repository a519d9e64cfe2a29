#!/usr/bin/env bash
# e2e_cuda_cli.sh — `--backend` of run / bench on any machine: `--backend cuda` either runs on the GPU (the
# configuration line says "backend cuda" and the greedy ids equal the CPU's) or, without a CUDA device or a
# CUDA build, exits 1 with the reason; `--backend auto` always runs; an unknown name is a usage error (2);
# an invalid DF_CUDA_MMA, DF_CUDA_MLP_GROUP, DF_CUDA_ATTN, DF_CUDA_MLA_PROJECT, DF_CUDA_MLA_BLOCK, DF_CUDA_MOE_RESID,
# DF_CUDA_HOST_PIN, DF_CUDA_MV_ROWS, DF_CUDA_TILE, DF_CUDA_MMA_KS or DF_CUDA_KV_MIRROR stops cuda and auto (exit 1,
# naming the variable and the accepted values), not cpu; no NVIDIA driver is named as such.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
fail=0; pass=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_cuda.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# conversions without --cache-dir go to a cache in $TMP (removed at exit), never into the user's ~/.cache/deltafin
export XDG_CACHE_HOME="$TMP/xdg-cache"
M="$SRC/models/kimi-mini"
[ -f "$M/config.json" ] || { echo "no $M: skipped"; echo "$pass passed, $fail failed"; exit 0; }
run() { "$BIN" run --model "$M" --cache-dir "$TMP/cache" --prompt-ids 1,2,3,4 --max-new 6 --print-ids "$@"; }
# refused VAR VALUE EXPECT: with VAR=VALUE, --backend auto and cuda exit 1 with "environment variable VAR="VALUE":
# expected EXPECT; unset it or fix its value"
refused() {
    local k=$1 v=$2 msg=$3 b out rc
    for b in auto cuda; do
        out=$(export "$k=$v"; run --backend $b 2>&1); rc=$?
        [ $rc -eq 1 ] && echo "$out" | grep -qF "environment variable $k=\"$v\": expected $msg; unset it or fix its value" \
            && ok "$k='$v' --backend $b -> rc 1" || bad "$k='$v' --backend $b: rc $rc: $out"
    done
}
# runs VAR VALUE [BACKEND]: with VAR=VALUE, `run` (--backend auto, or BACKEND) succeeds with the CPU's ids
runs() {
    local k=$1 v=$2 ids rc
    ids=$(export "$k=$v"; run ${3:+--backend $3} 2>"$TMP/err"); rc=$?
    [ $rc -eq 0 ] && [ "$ids" = "$cpu" ] && ok "$k=$v (${3:-auto}): same ids" || bad "$k=$v (${3:-auto}): rc $rc '$ids' $(cat "$TMP/err")"
}

out=$(run --backend bogus 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q 'expected auto, cpu' && ok "--backend bogus -> usage error" || bad "--backend bogus: rc $rc: $out"
cpu=$(run --backend cpu 2>"$TMP/err_cpu"); rc=$?
[ $rc -eq 0 ] && grep -q "backend cpu" "$TMP/err_cpu" && ok "--backend cpu: $cpu" || bad "--backend cpu: rc $rc $(cat "$TMP/err_cpu")"
auto=$(run 2>"$TMP/err_auto"); rc=$?
[ $rc -eq 0 ] && [ "$auto" = "$cpu" ] && grep -q "backend c" "$TMP/err_auto" && ok "default (auto): same ids" || bad "auto: rc $rc '$auto' vs '$cpu'"
gpu=$(run --backend cuda 2>"$TMP/err_cuda"); rc=$?
if [ $rc -eq 0 ]; then
    grep -q "backend cuda" "$TMP/err_cuda" && [ "$gpu" = "$cpu" ] && ok "--backend cuda: same ids as the CPU" ||
        bad "--backend cuda: '$gpu' vs '$cpu' $(head -c 300 "$TMP/err_cuda")"
else
    [ $rc -eq 1 ] && grep -Eq 'backend "cuda": (no CUDA device|this build has no CUDA backend|CUDA device)' "$TMP/err_cuda" &&
        ok "--backend cuda without a device -> rc 1: $(cat "$TMP/err_cuda")" || bad "--backend cuda: rc $rc: $(cat "$TMP/err_cuda")"
fi
out=$(run --gpu-budget lots 2>&1); rc=$?
[ $rc -eq 2 ] && ok "--gpu-budget lots -> usage error" || bad "--gpu-budget lots: rc $rc: $out"
# DF_CUDA_MMA (the tensor-core encodings, docs/cuda.md): a value that is not a mask of them (decimal or 0x hex) stops
# --backend cuda and auto with a message naming the variable and the accepted values, on any machine (never a silent
# fallback); --backend cpu does not read it; valid values run
for v in junk -1 32x 0x 0x2g " 32" 64 0x100 99999999999999999999999; do
    for b in auto cuda; do
        out=$(DF_CUDA_MMA="$v" run --backend $b 2>&1); rc=$?
        [ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin run: backend \"$b\": environment variable DF_CUDA_MMA=\"$v\": expected a bit mask .*0x20 (MXFP4, the default).*; unset it or fix its value" \
            && ok "DF_CUDA_MMA='$v' --backend $b -> rc 1" || bad "DF_CUDA_MMA='$v' --backend $b: rc $rc: $out"
    done
done
out=$(DF_CUDA_MMA=junk "$BIN" serve --model "$M" --port 0 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'environment variable DF_CUDA_MMA="junk": expected a bit mask' \
    && ok "DF_CUDA_MMA=junk serve -> rc 1" || bad "DF_CUDA_MMA=junk serve: rc $rc: $out"
runs DF_CUDA_MMA junk cpu
# the on/off knobs DF_CUDA_MLP_GROUP, DF_CUDA_ATTN, DF_CUDA_MLA_PROJECT, DF_CUDA_MLA_BLOCK, DF_CUDA_MOE_RESID: 1 / 0 / unset run, anything else stops cuda
# and auto
for k in DF_CUDA_MLP_GROUP DF_CUDA_ATTN DF_CUDA_MLA_PROJECT DF_CUDA_MLA_BLOCK DF_CUDA_MOE_RESID; do
    refused $k yes "1 or on (the default), 0 or off (lower case)"
    for v in 0 1; do runs $k $v; done
done
# DF_CUDA_HOST_PIN: 1 / on / 0 / off / unset run, anything else (e.g. "no") stops cuda and auto like the switches above
refused DF_CUDA_HOST_PIN no "1 or on (the default), 0 or off (lower case)"
for v in 0 1 on off; do runs DF_CUDA_HOST_PIN $v; done
# doctor with an invalid knob: it says the default backend cannot start and exits 1 (run / serve would stop on it)
out=$(DF_CUDA_TRACE=bogus "$BIN" doctor --model "$M" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'the default backend (auto) cannot start: environment variable DF_CUDA_TRACE="bogus"' \
    && ok "doctor with DF_CUDA_TRACE=bogus -> rc 1" || bad "doctor with DF_CUDA_TRACE=bogus: rc $rc: $out"
# doctor with DF_BACKEND set: the backend line is DF_BACKEND's (not auto's), and one that cannot start is exit 1
out=$(DF_BACKEND=cpu "$BIN" doctor --model "$M" 2>/dev/null | grep '^backend'); rc=$?
[[ "$out" == "backend cpu (DF_BACKEND): cpu-"* ]] \
    && ok "doctor with DF_BACKEND=cpu: its backend line" || bad "doctor with DF_BACKEND=cpu: '$out'"
if ! nvidia-smi >/dev/null 2>&1; then
    out=$(DF_BACKEND=cuda "$BIN" doctor --model "$M" 2>/dev/null); rc=$?
    [ $rc -eq 1 ] && echo "$out" | grep -q '^backend cuda (DF_BACKEND): cannot start' && ! echo "$out" | grep -q '^backend auto' \
        && ok "doctor with DF_BACKEND=cuda and no GPU: cannot start, rc 1" || bad "doctor with DF_BACKEND=cuda: rc $rc: $out"
fi
# DF_CUDA_TRACE (off by default): 1 / on / 0 / off / unset run, anything else stops cuda and auto
refused DF_CUDA_TRACE yes "1 (on), 2 (host clocks only) or 0 (off, the default)"
for v in 0 1 2 on off; do runs DF_CUDA_TRACE $v; done
# DF_CUDA_KV_MIRROR (the attention core's device mirrors of the KV cache): 1 / on / 0 / off / a size with a unit run;
# anything else (a size without a unit, a sign, junk) stops cuda and auto, naming the variable; --backend cpu ignores it
for v in lots 4096 -1G 4X 1.5 G; do
    refused DF_CUDA_KV_MIRROR "$v" "1 or on (the default: up to 1/8 of the GPU's memory), 0 or off, or a size with a unit such as 512M or 4G"
done
for v in 0 1 on off 512M 4G 1.5GiB 64kb; do runs DF_CUDA_KV_MIRROR $v; done
runs DF_CUDA_KV_MIRROR junk cpu
# DF_CUDA_MMA_KS, the tensor-core kernel's most K slices: 1, 2, 4, 8 (or unset) run; anything else (0 too) stops
# cuda and auto with its own message
for v in 0 3 16 abc; do refused DF_CUDA_MMA_KS "$v" "the tensor-core kernel's most K slices, 1, 2 (the default), 4 or 8"; done
for v in 1 2 4 8; do runs DF_CUDA_MMA_KS $v; done
# the kernel variants DF_CUDA_MV_ROWS / DF_CUDA_TILE: 0 (automatic), 1, 2, 4, 8 run; anything else ("abc", "3", a
# sign, trailing characters) stops cuda and auto, naming the variable; --backend cpu ignores them
for k in DF_CUDA_MV_ROWS DF_CUDA_TILE; do
    for v in abc 3 16 -2 4x; do refused $k "$v" "a kernel variant 0 (automatic, the default), 1, 2, 4 or 8"; done
    for v in 0 1 2 4 8; do runs $k $v; done
    runs $k junk cpu
done
# no NVIDIA driver at all: the reason says so, not "driver version is insufficient"
if grep -q "no CUDA device (cudaGetDeviceCount: " "$TMP/err_cuda" && ! ls /usr/lib*/libcuda.so.1 /usr/lib/*/libcuda.so.1 >/dev/null 2>&1 \
    && ! ldconfig -p 2>/dev/null | grep -q "libcuda.so.1 "; then
    grep -q "no NVIDIA driver found (libcuda.so.1 not loadable)" "$TMP/err_cuda" && ! grep -q "insufficient" "$TMP/err_cuda" \
        && ok "no driver: named" || bad "no driver: $(cat "$TMP/err_cuda")"
fi
for v in 0 2 32 34 0x0 0x2 0x20 0x22 0X22; do runs DF_CUDA_MMA $v; done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
