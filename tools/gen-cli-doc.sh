#!/usr/bin/env bash
# Regenerates docs/cli.md from the commands' --help output (run after changing flags).
set -eu
cd "$(dirname "$0")/.."
B=${DF_BIN:-build/deltafin}
{
  echo "# deltafin command-line reference"; echo
  echo "Generated from each command's \`--help\` (\`tools/gen-cli-doc.sh\`). Sizes accept K, M, G, T suffixes (powers of 1024)."
  echo "\`run\`, \`serve\` and \`bench decode\` echo the resolved configuration on one line to stderr at start (\`run --quiet\` hides it)."
  echo "Environment aliases: \`DF_PREFETCH=1|0\` (= \`--prefetch on|off\`), \`XDG_CACHE_HOME\` (default cache root)."
  for c in run convert tokenize serve bench synth doctor; do
    echo; echo "## deltafin $c"; echo; echo '```'; "$B" $c --help 2>&1 || true; echo '```'
  done
} > docs/cli.md
