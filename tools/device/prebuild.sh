#!/bin/sh
# prebuild.sh — on the dev machine (no GPU): build the CUDA binaries a GPU call
# needs (sm_90, Release) in build-cuda/ and pack them into build-gpu/bin.tar.xz
# (both git-ignored), so the call carries them instead of spending a couple of
# minutes of device time on the build. Carry build-gpu and .deps (with
# libsentencepiece0 among the .debs when the build here links it); there:
#   eval "$(tools/device/setup_deps.sh /tmp/deps)"; eval "$(tools/device/unpack.sh /tmp/b)"
#   KILN_TEST_BACKEND=cuda /tmp/b/test_ops; /tmp/b/kiln bench --backend cuda ...
# Usage (repo root): tools/device/prebuild.sh [TARGET...]  (default: kiln-cli test_ops test_parity)
set -eu
[ $# -gt 0 ] || set -- kiln-cli test_ops test_parity
cmake -S . -B build-cuda -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cuda -j"$(nproc)" --target "$@" 2>&1 | grep -E "error|warning" || true
# One solid xz archive: the binaries share most of their code (libkiln and its
# kernels are linked into each), which a solid archive stores once (~11 MB
# for the three default binaries against ~40 MB gzip'd one by one), and a
# call may carry at most 64 MiB with the working tree.
rm -rf build-gpu && mkdir -p build-gpu/bin
for t in "$@"; do
    exe=$t
    [ "$t" = kiln-cli ] && exe=kiln # the CLI target's binary is named kiln
    strip -o "build-gpu/bin/$exe" "build-cuda/$exe"
done
tar -C build-gpu/bin -cf - . | xz -9 -T1 --lzma2=preset=9,dict=128MiB >build-gpu/bin.tar.xz
rm -rf build-gpu/bin
du -sh build-gpu
