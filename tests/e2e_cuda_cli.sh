#!/usr/bin/env bash
# e2e_cuda_cli.sh — `--backend` of run / bench on any machine: `--backend cuda` either runs on the GPU (the
# configuration line says "backend cuda" and the greedy ids equal the CPU's) or, without a CUDA device or a
# CUDA build, exits 1 with the reason; `--backend auto` always runs; an unknown name is a usage error (2).
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
fail=0; pass=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_cuda.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
M="$SRC/models/kimi-mini"
[ -f "$M/config.json" ] || { echo "no $M: skipped"; echo "$pass passed, $fail failed"; exit 0; }
run() { "$BIN" run --model "$M" --cache-dir "$TMP/cache" --prompt-ids 1,2,3,4 --max-new 6 --print-ids "$@"; }

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
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
