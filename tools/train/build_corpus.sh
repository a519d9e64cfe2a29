#!/usr/bin/env bash
# Builds the training corpus of the project's default model (issue 5) from named,
# version-pinned Debian 12 packages: installs them (as root), extracts plain text
# (tools/train/extract_corpus.py), dedups, shuffles by document with a fixed seed,
# splits off a held-out set and writes xz-compressed files to .trainpack/ (git-ignored).
# Usage: tools/train/build_corpus.sh [OUTDIR]   (default: <repo>/.trainpack)
# Records package versions and byte counts in tools/train/CORPUS.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/.trainpack}"
# name=version pins (Debian 12 "bookworm" as seen 2026-11-29). The packages only
# provide the text; changing a pin changes the corpus, so keep CORPUS.md in sync.
PKGS="python3.11-doc=3.11.2-6+deb12u9 wordnet-base=1:3.0-37 dict-gcide=0.48.5+nmu2
perl-doc=5.36.0-7+deb12u4 bible-kjv-text=4.38 bible-kjv=4.38 fortunes=1:1.99.1-7.3
fortunes-min=1:1.99.1-7.3 manpages=6.03-2 manpages-dev=6.03-2 zlib1g-dev=1:1.2.13.dfsg-1
gnulib=20230209+stable-1 jargon-text=4.4.7-4.1 bash-doc=5.2.15-2 linux-source-6.1=6.1.192-3
groff-base man-db perl"
need=""
for p in $PKGS; do
  name="${p%%=*}"
  want="${p#*=}"; [ "$want" = "$p" ] && want=""
  have="$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)"
  if [ -z "$have" ] || { [ -n "$want" ] && [ "$have" != "$want" ]; }; then need="$need $p"; fi
done
if [ -n "$need" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "build_corpus: missing packages; run as root or: sudo apt-get install -y$need" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -q --no-install-recommends $need
fi
mkdir -p "$out"
python3 "$here/extract_corpus.py" --out "$out" --seed 20261129 --heldout-frac 0.015 \
  --md "$here/CORPUS.md" --pkgs "$(echo $PKGS | tr '\n' ' ')"
ls -l "$out"
