#!/usr/bin/env bash
# bench_spec.sh — speculative decoding on models/kimi-mini (issue 14): generated tok/s after the prompt
# (`run --stats` "generation" line) with --draft off, ngram and models/kimi-mini-draft (gated, and with
# --draft-gate off), for a natural-text prompt, a C prompt and a repetitive prompt, in RAM and under a
# --ram-budget smaller than the model's experts; REPS runs each, the median reported, acceptance from the
# draft stats line, and a check that every run printed the ids of --draft off.
# Binary: build/deltafin, or the one in .devcarry.tar.xz (tools/device/pack.sh) when that file exists.
# Usage: tools/device/bench_spec.sh OUTDIR   Env: REPS (5), TOKENS (256), THREADS (4), BUDGET (16M).
set -u
OUT=${1:?usage: bench_spec.sh OUTDIR}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$HERE/build/deltafin
if [ -f "$HERE/.devcarry.tar.xz" ]; then
    D=$(mktemp -d)
    tar xJf "$HERE/.devcarry.tar.xz" -C "$D"
    BIN="$D/deltafin"
    export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
REPS=${REPS:-5}; TOKENS=${TOKENS:-256}; THREADS=${THREADS:-4}; BUDGET=${BUDGET:-16M}
KM=$HERE/models/kimi-mini; KD=$HERE/models/kimi-mini-draft
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d)}
mkdir -p "$OUT"
R="$OUT/spec.txt"
{ echo "date: $(date -u)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo)"; echo "cores: $(nproc)"; uptime
  echo "tokens $TOKENS, threads $THREADS, reps $REPS (median), budget $BUDGET"; } >"$R"
P_text="In the beginning God created the heaven and the earth. And the earth was"
P_c="#include <stdio.h>

int main(int argc, char **argv)
{
"
P_rep="static const char *names[] = {
	\"alpha\", \"beta\", \"gamma\", \"delta\",
	\"alpha\", \"beta\", \"gamma\", \"delta\",
	\"alpha\", \"beta\", \"gamma\", \"delta\",
"
run1() { # prompt mem draft-args... -> "tok/s acceptance% gate_off ids"
    local p=$1 mem=$2; shift 2
    local b=()
    [ "$mem" = budget ] && b=(--ram-budget "$BUDGET" --heat off)
    local e ids
    e=$(mktemp)
    ids=$("$BIN" run --model "$KM" --prompt "$p" --max-new "$TOKENS" --threads "$THREADS" --quiet --print-ids --stats "${b[@]}" "$@" 2>"$e")
    local tps acc goff
    tps=$(sed -n 's/^stats: generation .*: \([0-9.]*\) tok\/s.*/\1/p' "$e")
    acc=$(sed -n 's/^stats: draft .*(acceptance \([0-9.]*\)%).*/\1/p' "$e")
    goff=$(sed -n 's/^stats: draft .*gate stopped it \([0-9]*\) times.*/\1/p' "$e")
    echo "${tps:-ERR} ${acc:--} ${goff:--} $(echo "$ids" | md5sum | cut -c1-8)"
    rm -f "$e"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
"$BIN" run --model "$KM" --prompt x --max-new 1 --quiet >/dev/null 2>&1   # convert once
"$BIN" run --model "$KD" --prompt x --max-new 1 --quiet >/dev/null 2>&1
echo "| memory | prompt | draft | gen tok/s (median) | vs off | acceptance | gate stops | ids = off |" >>"$R"
echo "|---|---|---|---:|---:|---:|---:|---|" >>"$R"
for mem in ram budget; do
  for pn in text c rep; do
    eval "p=\$P_$pn"
    base=""; base_ids=""
    for mode in off ngram ngram-nogate draft draft-nogate; do
      case $mode in
        off) a=(--draft off);; ngram) a=(--draft ngram);; ngram-nogate) a=(--draft ngram --draft-gate off);;
        draft) a=(--draft "$KD");; draft-nogate) a=(--draft "$KD" --draft-gate off);;
      esac
      rows=()
      for r in $(seq "$REPS"); do rows+=("$(run1 "$p" "$mem" "${a[@]}")"); done
      med=$(printf '%s\n' "${rows[@]}" | awk '{print $1}' | median)
      acc=$(printf '%s\n' "${rows[@]}" | awk '{print $2}' | head -1)
      goff=$(printf '%s\n' "${rows[@]}" | awk '{print $3}' | sort -u | tr '\n' ' ')
      ids=$(printf '%s\n' "${rows[@]}" | awk '{print $4}' | sort -u)
      [ "$mode" = off ] && { base=$med; base_ids=$ids; }
      same=$([ "$ids" = "$base_ids" ] && echo yes || echo "NO ($ids vs $base_ids)")
      ratio=$(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
      echo "| $mem | $pn | $mode | $med | $ratio | $acc | $goff | $same |" | tee -a "$R"
      echo "   runs: $(printf '%s ' "${rows[@]}" | awk '{for (i = 1; i <= NF; i += 4) printf "%s ", $i}')" >>"$OUT/runs.txt"
    done
  done
done
cat "$R"
