#!/usr/bin/env bash
# Sets up (or re-uses) what the aarch64 build and tests need, from nothing:
#
#   host-packages  qemu-user-static (bookworm-backports: qemu 10; bookworm's
#                  qemu 7.2 segfaults importing torch), binfmt-support,
#                  debootstrap, the aarch64-linux-gnu cross g++
#   binfmt         binfmt_misc mounted, qemu-aarch64 enabled
#   arm64-root     debootstrap arm64 minbase + python3, python3-venv,
#                  ca-certificates, libgomp1, in $SV_A64_CACHE/root
#   python-env     a venv in the root: torch $SV_A64_TORCH (CPU wheel) and
#                  the tests' pinned packages from requirements.txt
#
# Each finished step leaves a stamp in $SV_A64_CACHE/stamps and is skipped
# next time; an unfinished root is wiped and made again. Runs as root.
source "$(dirname "$0")/common.sh"

[[ $(id -u) == 0 ]] || die "must run as root (apt-get, mount, chroot); CI runs as root"

APT_OPTS=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
# The packages the tests import inside the root, pinned as in requirements.txt.
# transformers is left out on purpose (see README: the HF adapter is pure
# Python over torch and is tested natively by `make test`).
ROOT_PIP_PACKAGES=(kernels numpy scipy pytest hypothesis tqdm)

host_codename() { . /etc/os-release && echo "${VERSION_CODENAME:-}"; }

# The first non-security Debian mirror that this machine's apt sources name
# for its own suite; deb.debian.org if none is found.
detect_mirror() {
  local codename uri
  codename=$(host_codename)
  uri=$(
    {
      # deb822 (*.sources): URIs and Suites lines of one stanza
      for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        awk -v want="$codename" '
          /^[[:space:]]*$/ { if (u != "" && s) print u; u = ""; s = 0; next }
          tolower($1) == "uris:" { u = $2 }
          tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == want) s = 1 }
          END { if (u != "" && s) print u }' "$f"
      done
      # one-line format (*.list, sources.list)
      for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        awk -v want="$codename" '$1 == "deb" {
            i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == want) print $i }' "$f"
      done
    } | grep -v -e security -e '^$' | head -n1
  )
  echo "${SV_A64_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

qemu_major() {
  local bin
  bin=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
  [[ -n $bin ]] || { echo 0; return; }
  "$bin" --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -n1
}

host_packages() {
  local need=()
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
  command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
  command -v flock >/dev/null || need+=(util-linux)
  local qemu_ok=1
  (( $(qemu_major) >= 8 )) || qemu_ok=0
  if (( ${#need[@]} == 0 && qemu_ok )); then
    log "host packages present (qemu $(qemu_major), $(aarch64-linux-gnu-g++ -dumpfullversion) cross g++)"
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  local codename qemu_release=()
  codename=$(host_codename)
  if [[ $codename == bookworm ]] && (( ! qemu_ok )); then
    # bookworm's qemu 7.2 crashes importing torch: take qemu 10 from backports.
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
      log "adding bookworm-backports ($(detect_mirror)) to apt's sources for qemu"
      echo "deb $(detect_mirror) bookworm-backports main" >/etc/apt/sources.list.d/sv-bookworm-backports.list
    fi
    qemu_release=(-t bookworm-backports)
  fi
  retry 4 "apt-get update" apt-get update -q
  if (( ${#need[@]} )); then
    log "installing ${need[*]}"
    retry 4 "apt-get install ${need[*]}" apt-get install "${APT_OPTS[@]}" "${need[@]}"
  fi
  if (( ! qemu_ok )); then
    log "installing qemu-user-static ${qemu_release[*]}"
    retry 4 "apt-get install qemu-user-static" apt-get install "${APT_OPTS[@]}" "${qemu_release[@]}" qemu-user-static
    (( $(qemu_major) >= 8 )) || die "qemu-aarch64 $(qemu_major) is too old (torch needs qemu >= 8; bookworm-backports has 10)"
  fi
  log "host packages ready (qemu $(qemu_major), cross g++ $(aarch64-linux-gnu-g++ -dumpfullversion))"
}

arm64_root() {
  local stamp="$STAMPS/root-$SUITE"
  if [[ -f $stamp && -x $ROOTFS/usr/bin/python3 ]]; then
    log "re-using the arm64 root in $ROOTFS"
    return
  fi
  local mirror keyring=()
  mirror=$(detect_mirror)
  [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
  mkdir -p "$CACHE/debs"
  attempt_root() {
    # Start clean: a half-made root (or the mounts debootstrap left) goes.
    umount_root || true
    rm -rf --one-file-system "$ROOTFS"
    debootstrap --arch=arm64 --variant=minbase "${keyring[@]}" --cache-dir="$CACHE/debs" \
      --include=python3,python3-venv,ca-certificates,libgomp1 \
      "$SUITE" "$ROOTFS" "$mirror" >"$LOGS/debootstrap.log" 2>&1 \
      || { tail -n 25 "$LOGS/debootstrap.log" >&2; log "full log: $LOGS/debootstrap.log"; return 1; }
  }
  rm -f "$STAMPS"/root-* "$STAMPS"/venv-*
  log "debootstrap arm64 $SUITE from $mirror into $ROOTFS (a few minutes)"
  retry 3 "debootstrap" attempt_root
  umount_root || true
  touch "$stamp"
}

# The host's CA bundle (it may hold a proxy's CA), pip configuration and
# resolver, copied into the root on every run (cheap; the host may change).
copy_host_config() {
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] && cp -f /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
  [[ -f /etc/pip.conf ]] && cp -f /etc/pip.conf "$ROOTFS/etc/pip.conf"
  if [[ -d /etc/xdg/pip ]]; then
    mkdir -p "$ROOTFS/etc/xdg"
    rm -rf "$ROOTFS/etc/xdg/pip"
    cp -a /etc/xdg/pip "$ROOTFS/etc/xdg/pip"
  fi
  cp -fL /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
}

python_env() {
  local reqs="$CACHE/requirements-aarch64.txt" name line
  {
    echo "torch==$TORCH_VERSION"
    for name in "${ROOT_PIP_PACKAGES[@]}"; do
      line=$(grep -iE "^$name==" "$REPO/requirements.txt" || true)
      [[ -n $line ]] || die "requirements.txt pins no $name (the arm64 root installs it at the same pin)"
      echo "$line"
    done
  } >"$reqs"
  local stamp="$STAMPS/venv-$(sha256sum "$reqs" | cut -c1-12)"
  if [[ -f $stamp && -x $ROOTFS$VENV_IN_ROOT/bin/python ]]; then
    log "re-using the Python environment in the root ($(tr '\n' ' ' <"$reqs"))"
    return
  fi
  rm -f "$STAMPS"/venv-*
  mount_root
  cp "$reqs" "$ROOTFS/tmp/requirements-aarch64.txt"
  rm -rf --one-file-system "$ROOTFS$VENV_IN_ROOT"
  in_root /usr/bin/python3 -m venv "$VENV_IN_ROOT" || die "python3 -m venv failed inside the arm64 root"
  log "pip install (emulated, several minutes): $(tr '\n' ' ' <"$reqs")"
  # torch for aarch64 from PyPI: 2.9.1 is a CPU-only wheel; later aarch64
  # wheels are CUDA builds that pull ~2.4 GB of nvidia packages.
  # --no-compile: the byte-code is compiled natively below instead, which
  # takes seconds instead of minutes under emulation.
  retry 3 "pip install in the arm64 root" \
    in_root "$VENV_IN_ROOT/bin/python" -m pip install --quiet --no-cache-dir --no-compile -r /tmp/requirements-aarch64.txt
  compile_natively
  if in_root "$VENV_IN_ROOT/bin/python" -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
    die "torch $TORCH_VERSION for aarch64 pulled nvidia packages (a CUDA build): choose a CPU-only version with SV_A64_TORCH"
  fi
  touch "$stamp"
}

# .pyc files do not depend on the machine, only on the Python version: when
# the host's python3 is the root's (both 3.11 on bookworm), compile the venv's
# byte-code natively, recording the paths as seen from inside the root.
compile_natively() {
  local site host_ver root_ver
  site=$(ls -d "$ROOTFS$VENV_IN_ROOT"/lib/python3*/site-packages | head -n1)
  root_ver=$(basename "$(dirname "$site")")
  host_ver=$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || true)
  if [[ $host_ver == "$root_ver" ]]; then
    python3 -m compileall -q -j 0 -s "$ROOTFS" -p / "$site" >/dev/null || log "native byte-compilation had errors (harmless: Python compiles what is missing)"
  else
    log "host $host_ver != root $root_ver: byte-code is compiled inside the emulator"
    in_root "$VENV_IN_ROOT/bin/python" -m compileall -q "${site#"$ROOTFS"}" >/dev/null || true
  fi
}

main() {
  take_lock
  stage host-packages host_packages
  stage binfmt binfmt_enable
  stage arm64-root arm64_root
  copy_host_config
  binfmt_enable  # copies qemu into the root if binfmt lacks the F flag
  stage python-env python_env
}

main "$@"
