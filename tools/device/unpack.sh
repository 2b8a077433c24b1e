#!/bin/sh
# unpack.sh — on the GPU machine: unpack the binaries tools/device/prebuild.sh
# packed into build-gpu/ (carried with the call) into ${1:-/tmp/b}; prints the
# loader path for the CUDA libraries (to eval) and, on stderr, any library the
# binaries cannot find.
# Usage (repo root): eval "$(tools/device/setup_deps.sh /tmp/deps)"; eval "$(tools/device/unpack.sh /tmp/b)"
set -eu
b=${1:-/tmp/b}
mkdir -p "$b"
xz -dc build-gpu/bin.tar.xz | tar -C "$b" -xf -
cuda=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$cuda/lib64:${LD_LIBRARY_PATH:-}"
for f in "$b"/*; do ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|unpack.sh: $f: |" >&2 || true; done
echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
