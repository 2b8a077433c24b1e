#!/bin/sh
# setup_deps.sh — on the GPU machine (Ubuntu, no network): unpack the Debian
# .debs carried in .deps/ into a private prefix and print the environment that
# points CMake, pkg-config and the loader at it. Usage:
#   eval "$(tools/device/setup_deps.sh /tmp/deps)"
# The .debs come from `apt-get download` on the dev machine (see docs/FEATURES.md).
set -eu
prefix=${1:-/tmp/deps}
mkdir -p "$prefix"
for f in .deps/*.deb; do dpkg -x "$f" "$prefix"; done
# pkg-config files say prefix=/usr; the sysroot rewrites -I/-L into the prefix
echo "export PKG_CONFIG_SYSROOT_DIR=$prefix"
echo "export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
echo "export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:\${LD_LIBRARY_PATH:-}"
echo "export CMAKE_PREFIX_PATH=$prefix/usr"
