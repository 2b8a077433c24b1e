#!/bin/sh
# build.sh — on the GPU machine: unpack the carried .debs, configure and build
# kiln for sm_90 into ${1:-/tmp/b}, quietly; prints only errors. Then run e.g.
#   (cd /tmp/b && ctest)                      every test, CUDA ones included
#   /tmp/b/kiln bench --synthetic bench/shapes/llama3-8b.json --backend cuda
# Usage (from the repo root, .deps carried): . tools/device/build.sh [/tmp/b]
b=${1:-/tmp/b}
eval "$(tools/device/setup_deps.sh /tmp/deps)"
cmake -S . -B "$b" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1 || cmake -S . -B "$b"
cmake --build "$b" -j"$(nproc)" 2>&1 | grep -E "error|Error" || true
