#!/usr/bin/env bash
# sass.sh — the SASS of one CUDA source's kernels on this machine (no GPU needed): nvcc -cubin for sm_90, then
# nvdisasm from Debian non-free's nvidia-cuda-toolkit 11.8 (the CUDA 13 toolkit here ships no nvdisasm/cuobjdump).
# nvdisasm 11.8 refuses a CUDA 13 cubin's ELF header, so its ABI version byte and e_flags are set to the 11.x form
# for sm_90 first (the code sections are unchanged).
#   tools/sass.sh src/kernels/cuda/cuda_mma.cu [OUT.sass]   (OUT defaults to /tmp/<name>.sass; -Xptxas -v on stderr)
# Needs: the CUDA toolkit under /usr/local/cuda; network to Debian's mirror the first time (the .deb is unpacked
# into /tmp/cudatk; the sources list gains "contrib non-free" for bookworm if it lacks them).
set -eu
SRC=${1:?usage: tools/sass.sh FILE.cu [OUT.sass]}
OUTF=${2:-/tmp/$(basename "$SRC" .cu).sass}
cd "$(dirname "$0")/.."
TK=/tmp/cudatk
if [ ! -x "$TK/usr/bin/nvdisasm" ]; then
    if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q Candidate:.*[0-9]; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            >/etc/apt/sources.list.d/deltafin-nonfree.sources
        apt-get update -qq
    fi
    (cd /tmp && apt-get download -qq nvidia-cuda-toolkit)
    mkdir -p "$TK" && dpkg -x /tmp/nvidia-cuda-toolkit_*.deb "$TK"
fi
CUBIN=$(mktemp --suffix=.cubin)
trap 'rm -f "$CUBIN"' EXIT
/usr/local/cuda/bin/nvcc -O2 -DNDEBUG -arch=sm_90 -std=c++17 -Iinclude -Isrc -cubin -Xptxas -v -o "$CUBIN" "$SRC"
python3 - "$CUBIN" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
b[8] = 7                                   # EI_ABIVERSION of CUDA 11.x cubins
struct.pack_into("<I", b, 0x30, 0x005a055a) # e_flags: sm_90, virtual sm_90, 64-bit, unified textures
open(p, "wb").write(b)
PY
"$TK/usr/bin/nvdisasm" "$CUBIN" >"$OUTF"
echo "SASS in $OUTF"
