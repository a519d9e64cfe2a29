#!/usr/bin/env bash
# fuzz.sh [SECONDS] [TARGET...] — build the libFuzzer programs of tests/fuzz in build-fuzz (clang, -DDF_FUZZ=ON:
# ASan + UBSan) and run each named target (default: all) for SECONDS (default 60) on as many jobs as cores.
# Each starts from its committed corpus tests/fuzz/corpus/NAME (read only) and writes the inputs it finds to
# build-fuzz/corpus/NAME; a crash, a sanitizer report or a failed property stops it and leaves the input as
# build-fuzz/crash-NAME-* (replay it: build/NAME_replay FILE). Exit status: 0 when every target ran clean.
set -u
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (libFuzzer): apt-get install clang" >&2; exit 2; }
B=build-fuzz
[ -f $B/CMakeCache.txt ] || CC=clang cmake -S . -B $B -DDF_FUZZ=ON -DDF_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//'))
cmake --build $B -j "$(nproc)" --target "${targets[@]}" -- --no-print-directory | grep -v -E '^\[ *[0-9]+%\] ' || true
rc=0
for t in "${targets[@]}"; do
    [ -x $B/$t ] || { echo "fuzz.sh: $B/$t was not built" >&2; rc=1; continue; }
    mkdir -p $B/corpus/$t
    echo "== $t: $SECS s"
    if DF_SRC=$PWD $B/$t -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
        -artifact_prefix="$B/crash-$t-" -print_final_stats=1 $B/corpus/$t tests/fuzz/corpus/$t 2>$B/$t.log; then
        grep -E "^stat::number_of_executed_units|^stat::new_units_added" $B/$t.log | tr '\n' ' '; echo
    else
        rc=1
        echo "$t: FAILED, see $B/$t.log:"
        grep -E "ERROR|property failed|Test unit written" $B/$t.log | head -5
    fi
done
exit $rc
