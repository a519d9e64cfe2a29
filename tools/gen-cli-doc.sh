#!/usr/bin/env bash
# Regenerates docs/cli.md from the commands' --help output (run after changing flags).
# Usage: tools/gen-cli-doc.sh [OUT]   (OUT: another file to write instead, e.g. to diff against docs/cli.md)
set -eu
OUT=${1:-}
case $OUT in "" | /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/cli.md}
B=${DF_BIN:-build/deltafin}   # e.g. DF_BIN=build-cli/deltafin for another build directory
{
  echo "# deltafin command-line reference"; echo
  echo "Generated from each command's \`--help\` (\`tools/gen-cli-doc.sh\`). Sizes accept K, M, G, T suffixes (powers of 1024)."
  echo "\`run\`, \`chat\`, \`serve\`, \`bench decode\` and \`bench prefill\` echo the resolved configuration (backend, budget, I/O, prefetch, prefault,"
  echo "heat, ...) on one line to stderr at start (\`--quiet\` hides it); the results of \`bench\` go to stdout."
  echo "On that line \`prefetch\` is \`on\` (router lookahead for prompts and decode steps, decode measured on vs off),"
  echo "\`ungated\` (always on), \`off\`, or \`prompts\`: the lookahead for prompts (prefill) only, the \`--prefetch auto\` default"
  echo "without \`--ram-budget\` (with one, \`auto\` is \`on\`)."
  echo "Environment aliases: \`DF_PREFETCH=1|on|0|off|ungated\` (= \`--prefetch on|off|ungated\`), \`DF_PREFAULT=1|on|0|off\` (= \`--prefault on|off\`; the flag"
  echo "wins; any other value is a usage error, exit 2, as a bad flag), \`DF_BACKEND\` (the default \`--backend\`; likewise), \`XDG_CACHE_HOME\` (default cache root when absolute; a relative one is ignored, with a one-line note on stderr naming it; see the README on the conversion cache; a \`--cache-dir\` or cache root that does not exist is created),"
  echo "\`HF_ENDPOINT\` (= \`setup --mirror\`), \`HF_TOKEN\` (the mirror's token), \`DELTAFIN_REGISTRY\` (= \`--registry\`: the installed-models"
  echo "registry that \`run\`, \`chat\`, \`serve\`, \`tokenize\`, \`bench decode\` / \`prefill\` / \`batch\` and \`doctor\` read without \`--model\`; default"
  echo "\`\$XDG_DATA_HOME/deltafin/models.json\`)."
  echo "An option's value may follow it (\`--max-new 64\`) or be joined to it with \`=\` (\`--max-new=64\`), in every command; an"
  echo "unknown option is one line naming it (with the closest option when one is near) and exit status 2, and so is an option"
  echo "that takes a value given twice (\`--prompt a --prompt b\`: one line naming it and both values; the later value is not"
  echo "taken silently)."
  echo "\`deltafin help COMMAND\` is \`deltafin COMMAND --help\`; \`deltafin version\` (or \`deltafin --version\`) prints the version."
  echo "The CUDA backend's knobs (\`DF_CUDA_MMA\`: the encodings on the tensor-core kernel, a bit mask, decimal or 0x hex: 0 (none),"
  echo "2 = 0x2 (BF16), 32 = 0x20 (MXFP4, the default) or 34 = 0x22 (both); \`DF_CUDA_MLP_GROUP\`,"
  echo "\`DF_CUDA_ATTN\`, \`DF_CUDA_MLA_PROJECT\`, \`DF_CUDA_MLA_BLOCK\`, \`DF_CUDA_MOE_RESID\`, \`DF_CUDA_HOST_PIN\`,"
  echo "\`DF_CUDA_SPLIT\`, \`DF_CUDA_SHARED_EARLY\`, \`DF_CUDA_PDL\`, \`DF_CUDA_SIDE_STREAM\`, \`DF_CUDA_COPY_KERNEL\`, \`DF_CUDA_MOE_ROUTE\`, \`DF_CUDA_GREEDY\`, \`DF_CUDA_KDA\`, \`DF_CUDA_KDA_BLOCK\`, \`DF_CUDA_KDA_SNAP\`: 1 or on (default) / 0 or off, lower case: grouped expert MLPs, the attention core on the GPU, the MLA"
  echo "projections in one round trip, a layer's whole MLA block in one round trip, a decode step's MoE added into the device's"
  echo "residual stream without a round trip, pinned host buffers, matrices of at most 2048 rows split over K (changes their"
  echo "bits), the MLA block starting the next MoE's shared expert, kernels launched with programmatic dependent launch, that shared expert on a second stream beside the routed experts, small host <-> GPU copies as kernels, the MLA block routing and running the next MoE (or dense MLP) on the GPU"
  echo "without waiting, greedy tokens chosen on the GPU with the next step queued before they are read back, the KDA convolution and recurrence (Kimi Linear, K3) on the GPU, a KDA layer's whole mixer in one GPU call, a rollback snapshot of a KDA state kept on the GPU (off: copied to the host); \`DF_CUDA_TILE\`, \`DF_CUDA_MV_ROWS\`: kernel variant 0 (automatic) | 1 | 2 | 4 | 8;"
  echo "\`DF_CUDA_MMA_KS\`: the tensor-core kernel's most K slices 1 | 2 (default) | 4 | 8 (changes its bits);"
  echo "\`DF_CUDA_KV_MIRROR\`: 1|on (the default: up to 1/8 of the GPU's memory) / 0|off / a size with a unit such as 512M or 4G, the GPU memory of the attention core's"
  echo "KV-cache mirrors (and, a budget of the same size of their own, of the KDA states kept on the GPU); \`DF_CUDA_TRACE\`: 1|on / 2 (host clocks only) / 0|off (default), each GPU call's wall, queue, wait"
  echo "and device time per stage on stderr at exit; each an error for \`--backend cuda\` / \`auto\` when invalid):"
  echo "[docs/cuda.md](cuda.md)."
  for c in run chat convert tokenize serve bench synth doctor setup list warm; do
    echo; echo "## deltafin $c"; echo; echo '```'; "$B" $c --help 2>&1 || true; echo '```'
    if [ $c = bench ]; then
      for b in io decode prefill batch project machine kernels cache store; do
        echo; echo "### deltafin bench $b"; echo; echo '```'; "$B" bench $b --help 2>&1 || true; echo '```'
      done
    fi
  done
  echo; echo "## Notes"; echo
  echo "\`bench io --dir D1,D2,...\` reports GB/s per directory and a line"
  echo "\`suggested: --stripe-weights 1.00,0.52\` (each directory's GB/s divided by the fastest) to pass to"
  echo "\`deltafin convert\` / \`deltafin synth\` with \`--expert-dirs D1,D2,...\` in the same order, so each drive's share of"
  echo "an expert read takes the same expected time (docs/native-format.md)."
  # hand-written notes that do not fit a --help text (tools/cli-doc-notes.md)
  [ -f tools/cli-doc-notes.md ] && { echo; cat tools/cli-doc-notes.md; }
} > "$OUT"
