#!/bin/sh
# setup_deps.sh — on the GPU machine (Ubuntu, no network): unpack the Debian
# .debs carried in .deps/ into a private prefix and print the environment that
# points CMake, pkg-config and the loader at it. Usage:
#   eval "$(tools/device/setup_deps.sh /tmp/deps)"
# Fill .deps on the dev machine (git-ignored; carry it with the run):
#   mkdir -p .deps && cd .deps && apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 \
#     libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12 \
#     libsndfile1-dev libsndfile1 libflac12 libogg0 libvorbis0a libvorbisenc2 libopus0 libmpg123-0 libmp3lame0 \
#     libsoxr-dev libsoxr0 libkissfft-dev libkissfft-float131 zlib1g-dev libgomp1 libsentencepiece0
# The -dev packages' private requirements (flac, ogg, gnutls, ...) are libraries the
# link never names directly; empty .pc stubs satisfy pkg-config's check for them.
set -eu
prefix=${1:-/tmp/deps}
mkdir -p "$prefix" "$prefix/stub-pc"
for f in .deps/*.deb; do dpkg -x "$f" "$prefix"; done
for p in flac ogg vorbis vorbisenc opus libmpg123 mp3lame gnutls; do
    printf 'Name: %s\nDescription: stub (private requirement only)\nVersion: 99\n' "$p" >"$prefix/stub-pc/$p.pc"
done
# pkg-config files say prefix=/usr; the sysroot rewrites -I/-L into the prefix
echo "export PKG_CONFIG_SYSROOT_DIR=$prefix"
echo "export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig:$prefix/stub-pc"
echo "export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:\${LD_LIBRARY_PATH:-}"
echo "export CMAKE_PREFIX_PATH=$prefix/usr"
