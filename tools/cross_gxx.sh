#!/usr/bin/env bash
# Makes sure the aarch64 cross compiler (aarch64-linux-gnu-g++, Debian's
# g++-aarch64-linux-gnu) is on PATH, for the targets that cross-build the
# aarch64 variants (make release, make cross-gxx). As root: apt-get update
# once, then install it. Otherwise: one line naming the package and the
# command, and exit 1 (a Python traceback from deep inside the build is what
# a fresh machine got before).
set -euo pipefail

CXX=aarch64-linux-gnu-g++
PKG=g++-aarch64-linux-gnu
INSTALL="apt-get update && apt-get install -y --no-install-recommends $PKG"

if command -v "$CXX" >/dev/null; then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "cross_gxx: no $CXX on PATH; install Debian's $PKG as root: $INSTALL" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "cross_gxx: no $CXX on PATH and no apt-get here; install your distribution's aarch64-linux-gnu g++ (Debian: $PKG)" >&2
  exit 1
fi
echo "cross_gxx: installing $PKG (the aarch64 cross compiler)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null || { echo "cross_gxx: apt-get update failed; run: $INSTALL" >&2; exit 1; }
apt-get install -y -q --no-install-recommends "$PKG" >/dev/null \
  || { echo "cross_gxx: apt-get install $PKG failed; run: $INSTALL" >&2; exit 1; }
command -v "$CXX" >/dev/null || { echo "cross_gxx: $PKG installed but no $CXX on PATH" >&2; exit 1; }
echo "cross_gxx: $CXX $("$CXX" -dumpfullversion) ready" >&2
