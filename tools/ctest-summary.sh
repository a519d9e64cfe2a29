#!/usr/bin/env bash
# ctest-summary.sh BUILD_DIR JOBS [ctest args...] — what `make test` runs: CTest in
# parallel, one status line per test as it finishes, then each test program's
# closing "N passed, N failed" line (every test program prints one; plain
# `ctest --output-on-failure` hides the output of passing tests), the full output
# of any failed test, and CTest's verdict. Exit status: CTest's.
# The complete verbose log is kept in BUILD_DIR/Testing/make-test.log.
set -u
B=${1:?usage: ctest-summary.sh BUILD_DIR JOBS [ctest args...]}
J=${2:-1}
shift 2
mkdir -p "$B/Testing"
LOG=$B/Testing/make-test.log
# -V prefixes every output line of test K with "K: "; keep only the per-test status lines on screen
(cd "$B" && ctest -V -j "$J" "$@") 2>&1 | tee "$LOG" | grep --line-buffered -E '^ *[0-9]+/[0-9]+ Test +#'
rc=${PIPESTATUS[0]}
awk '
    match($0, /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: [^ ]+/) {
        s = substr($0, RSTART, RLENGTH); sub(/^.*#/, "", s)
        k = s; sub(/:.*/, "", k); n = s; sub(/^[0-9]+: /, "", n)
        name[k] = n; order[++cnt] = k
        status[k] = ($0 ~ /Passed/) ? "passed" : ($0 ~ /Skipped/) ? "skipped" : "FAILED"
        next
    }
    match($0, /^[0-9]+: /) {
        k = substr($0, 1, RLENGTH - 2); text = substr($0, RLENGTH + 1)
        if (text ~ /^[0-9]+ passed, [0-9]+ failed$/) closing[k] = text
        out[k] = out[k] text "\n"
    }
    /tests passed, .* tests failed out of|^Total Test time/ { verdict = verdict $0 "\n" }
    END {
        printf "\nEach test program'"'"'s closing line:\n"
        for (i = 1; i <= cnt; i++) {
            k = order[i]
            printf "  %-24s %s%s\n", name[k], (k in closing) ? closing[k] : "(no \"N passed, N failed\" line)",
                   status[k] == "passed" ? "" : status[k] == "skipped" ? "   (skipped: does not apply on this machine)" : "   <- FAILED"
        }
        for (i = 1; i <= cnt; i++) {
            k = order[i]
            if (status[k] == "FAILED") printf "\n---- output of %s (FAILED):\n%s", name[k], out[k]
        }
        printf "\n%s", verdict
    }' "$LOG"
exit "$rc"
