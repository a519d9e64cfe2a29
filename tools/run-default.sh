#!/usr/bin/env bash
# run-default.sh PROMPT MAXNEW — what `make run` does: run build/deltafin on the
# project's default model (models/<name>/, the trained model of issue 5) if it is
# there, else on a golden checkpoint (tests/golden/<case>/) with --prompt-ids.
set -eu
PROMPT=${1:-"In the beginning God created the heaven and the earth. And the earth was"}
MAXNEW=${2:-32}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DF_BIN:-$ROOT/${BUILD:-build}/deltafin}
[ -x "$BIN" ] || { echo "run-default.sh: $BIN not built (run make)" >&2; exit 1; }
for d in "$ROOT"/models/kimi-mini/ "$ROOT"/models/*/; do
    if [ -f "$d/config.json" ] || [ -f "$d/manifest.json" ]; then
        # the command as a shell would take it back: the prompt in single quotes ($( ), backquotes and quotes literal)
        sq="'\\''" m=${d%/}
        echo "+ deltafin run --model '${m//\'/$sq}' --prompt '${PROMPT//\'/$sq}' --max-new '${MAXNEW//\'/$sq}' --stats" >&2
        exec "$BIN" run --model "${d%/}" --prompt "$PROMPT" --max-new "$MAXNEW" --stats
    fi
done
for d in "$ROOT"/tests/golden/*/; do
    if [ -f "$d/golden.json" ] && [ -f "$d/config.json" ]; then
        ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$d/golden.json" 2>/dev/null \
              || sed -n 's/.*"prompt_ids": *\[\([0-9, ]*\)\].*/\1/p' "$d/golden.json" | tr -d ' ')
        echo "no default model under models/ yet (issue 5); running golden checkpoint ${d%/} on its prompt ids:" >&2
        echo "+ deltafin run --model ${d%/} --prompt-ids $ids --max-new $MAXNEW --print-ids --stats" >&2
        exec "$BIN" run --model "${d%/}" --prompt-ids "$ids" --max-new "$MAXNEW" --print-ids --stats
    fi
done
echo "run-default.sh: no model under models/ and no golden case under tests/golden/" >&2
exit 1
