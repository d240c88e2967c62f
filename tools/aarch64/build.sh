#!/usr/bin/env bash
# Cross-compiles the kernel for aarch64 on the host (about 25 s, against
# about 4 min inside the emulator): tools/build_kernel.py with Debian's
# aarch64-linux-gnu-g++, against the arm64 root's torch headers and
# libraries. Writes build/torch<MAJ><MIN>-cxx11-cpu-aarch64-linux/.
#
# Needs tools/aarch64/setup.sh first, and a host Python with torch to run
# build_kernel.py (default: the repo's .venv, which `make` creates).
source "$(dirname "$0")/common.sh"

HOST_PYTHON="${SV_A64_HOST_PYTHON:-$REPO/.venv/bin/python}"
[[ -x $HOST_PYTHON ]] || die "no host Python at $HOST_PYTHON (run through 'make test-aarch64', which makes the venv, or set SV_A64_HOST_PYTHON)"
command -v aarch64-linux-gnu-g++ >/dev/null || die "no aarch64-linux-gnu-g++ (run tools/aarch64/setup.sh)"

cross_build() {
  local torch_dir
  torch_dir=$(ls -d "$ROOTFS$VENV_IN_ROOT"/lib/python3*/site-packages/torch 2>/dev/null | head -n1)
  [[ -n $torch_dir && -f $torch_dir/lib/libc10.so ]] || die "no torch in the arm64 root's venv (run tools/aarch64/setup.sh)"
  "$HOST_PYTHON" "$REPO/tools/build_kernel.py" --arch aarch64 --cxx aarch64-linux-gnu-g++ --torch-dir "$torch_dir" "$@"
  # What was built must be an AArch64 shared object.
  local variant lib
  variant=$(root_variant)
  lib=$(ls "$variant"/*.abi3.so | head -n1)
  aarch64-linux-gnu-readelf -h "$lib" | grep -q 'Machine:.*AArch64' || die "$lib is not an AArch64 object"
  log "built $(realpath --relative-to="$REPO" "$lib") (AArch64; needs: $(aarch64-linux-gnu-readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' '))"
}

take_lock
stage cross-build cross_build "$@"
