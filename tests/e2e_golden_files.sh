#!/usr/bin/env bash
# Validates the committed golden files and the shipped default model's export (structure, sizes, checksums);
# standard-library Python only.
set -u
cd "${DF_SRC:-$(dirname "$0")/..}"
pass=0; fail=0
if python3 tools/reference/check_goldens.py tests/golden; then pass=$((pass+1)); else fail=$((fail+1)); fi
if python3 tools/train/check_export.py; then pass=$((pass+1)); else fail=$((fail+1)); fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
