#!/bin/sh
# timeline.sh — on the GPU machine: build kernel_timeline.c against the CUDA
# toolkit's CUPTI and run a command under it, writing its kernel timeline.
# Usage (repo root): tools/device/timeline.sh OUT.csv CMD [ARGS...]
#   then: python3 tools/device/timeline_report.py OUT.csv --show 14
out=$1
shift
cuda=${CUDA_HOME:-/usr/local/cuda}
inc= lib=
for d in "$cuda/include" "$cuda/extras/CUPTI/include"; do [ -f "$d/cupti.h" ] && inc=$d && break; done
for d in "$cuda/extras/CUPTI/lib64" "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib" \
    $(python3 -c 'import nvidia.cuda_cupti, os; print(os.path.dirname(nvidia.cuda_cupti.__file__) + "/lib")' 2>/dev/null); do
    ls "$d"/libcupti.so* >/dev/null 2>&1 && lib=$d && break
done
if [ -z "$inc" ] || [ -z "$lib" ]; then
    echo "timeline.sh: CUPTI not found under $cuda (include: '$inc', lib: '$lib')" >&2
    exit 1
fi
so=$(ls "$lib"/libcupti.so* | head -1)
gcc -std=c11 -D_GNU_SOURCE -O2 -shared -fPIC tools/device/kernel_timeline.c -I"$inc" "$so" -Wl,-rpath,"$lib" \
    -o /tmp/libkntl.so || exit 1
KN_TIMELINE_OUT="$out" LD_PRELOAD=/tmp/libkntl.so "$@"
