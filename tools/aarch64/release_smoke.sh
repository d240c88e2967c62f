#!/usr/bin/env bash
# Loads the release aarch64 variants (build/torch212-... and torch213-
# cxx11-cpu-aarch64-linux, from `make release`) under their own torch inside
# the arm64 root (qemu-aarch64) and runs tools/aarch64/release_smoke.py.
#
# PyPI's aarch64 torch 2.12.1 and 2.13.0 are CUDA builds: libtorch_cpu.so
# itself links libcudart and libcupti. So each torch goes, with the nvidia
# wheels its .so files link (its Requires-Dist minus triton and
# cuda-bindings), into .cache/aarch64/torch-<version>/ by the host's pip
# (`pip install --target --platform manylinux_2_{36..17}_aarch64`: native speed,
# nothing emulated), bound read-only into the root and put on PYTHONPATH
# ahead of the root venv, which supplies kernels and torch's pure-Python
# dependencies. Needs tools/aarch64/setup.sh first (make test-aarch64 runs it).
source "$(dirname "$0")/common.sh"

HOST_PYTHON="${SV_A64_HOST_PYTHON:-$REPO/.venv/bin/python}"
VERSIONS=("${@:-2.12.1 2.13.0}")
read -r -a VERSIONS <<<"${VERSIONS[*]}"

# torch <version> for aarch64 with the CUDA runtime it links, on the host.
install_torch() {
  local version="$1" dest="$CACHE/torch-$1" wheel
  [[ -f $dest/.installed ]] && return 0
  rm -rf "$dest"
  mkdir -p "$REPO/.cache/wheels"
  wheel=$(ls "$REPO"/.cache/wheels/torch-"$version"-cp311-cp311-manylinux_2_28_aarch64.whl 2>/dev/null || true)
  if [[ -z $wheel ]]; then
    "$HOST_PYTHON" -m pip download "torch==$version" --no-deps --only-binary=:all: \
      --platform manylinux_2_28_aarch64 --python-version 3.11 -d "$REPO/.cache/wheels"
    wheel=$(ls "$REPO"/.cache/wheels/torch-"$version"-cp311-cp311-manylinux_2_28_aarch64.whl)
  fi
  # The root is bookworm (glibc 2.36): every manylinux tag from 2_17 (= manylinux2014) to
  # 2_36 runs there, and pip matches only the tags it is given (cuDNN and cuBLAS ship 2_27).
  local target=(--target "$dest" --python-version 3.11 --only-binary=:all: --quiet)
  local glibc
  for glibc in $(seq 36 -1 17); do target+=(--platform "manylinux_2_${glibc}_aarch64"); done
  target+=(--platform manylinux2014_aarch64)
  unzip -p "$wheel" "torch-$version.dist-info/METADATA" | sed -n 's/^Requires-Dist: //p' \
    | grep -E '^(cuda-toolkit|nvidia-)' | sed 's/;.*//' >"$CACHE/torch-$version-runtime.txt"
  "$HOST_PYTHON" -m pip install "${target[@]}" --no-deps "$wheel"
  "$HOST_PYTHON" -m pip install "${target[@]}" -r "$CACHE/torch-$version-runtime.txt"
  touch "$dest/.installed"
}

smoke() {
  local version="$1" major minor variant stage="/work/spec-verify-release" mnt="/opt/torch-$1"
  IFS=. read -r major minor _ <<<"$version"
  variant="$REPO/build/torch$major$minor-cxx11-cpu-aarch64-linux"
  [[ -d $variant ]] || die "no $(basename "$variant") (run make release)"
  rm -rf --one-file-system "$ROOTFS$stage"
  mkdir -p "$ROOTFS$stage/build" "$ROOTFS$mnt"
  cp -a "$variant" "$ROOTFS$stage/build/"
  cp "$A64_TOOLS/release_smoke.py" "$ROOTFS$stage/"
  mount_root
  mount --bind "$CACHE/torch-$version" "$ROOTFS$mnt"
  mount -o remount,bind,ro "$ROOTFS$mnt"
  IN_ROOT_TIMEOUT=1800 IN_ROOT_CWD="$stage" in_root /usr/bin/env PYTHONPATH="$mnt" \
    SV_SMOKE_TORCH="$version" SV_SMOKE_ROOT="$stage" HF_HUB_OFFLINE=1 \
    "$VENV_IN_ROOT/bin/python" release_smoke.py | tee "$CACHE/release-smoke-$version.json"
}

take_lock
for version in "${VERSIONS[@]}"; do
  stage "torch-$version" install_torch "$version"
  stage "smoke-$version" smoke "$version"
done
