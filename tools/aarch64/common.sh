# Shared by tools/aarch64/*.sh (sourced, never run): settings, logging,
# retries, stage timing, the arm64 root's mounts and running a command in it.
#
# Settings (environment variables, all optional):
#   SV_A64_CACHE     the cache folder (default: <repo>/.cache/aarch64, git-ignored)
#   SV_A64_SUITE     the Debian suite of the arm64 root (default: bookworm, Python 3.11)
#   SV_A64_MIRROR    the Debian mirror (default: the first one this machine's apt sources name)
#   SV_A64_TORCH     the torch wheel inside the root (default: 2.9.1, a CPU-only aarch64
#                    wheel on PyPI; 2.13.0's is a CUDA build; see tools/aarch64/README.md)
#   SV_A64_QEMU_CPU  the emulated CPU (default: cortex-a72, the Raspberry Pi 4's core)

set -euo pipefail

A64_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$A64_TOOLS/../.." && pwd)"
# Resolved: /proc/mounts names real paths, and umount_root matches the root's
# mounts by this prefix (a linked cache, as in a git worktree, leaked them all).
CACHE="$(realpath -m "${SV_A64_CACHE:-$REPO/.cache/aarch64}")"
ROOTFS="$CACHE/root"
STAMPS="$CACHE/stamps"
LOGS="$CACHE/logs"
SUITE="${SV_A64_SUITE:-bookworm}"
TORCH_VERSION="${SV_A64_TORCH:-2.9.1}"
QEMU_CPU_MODEL="${SV_A64_QEMU_CPU:-cortex-a72}"
VENV_IN_ROOT="/opt/sv-venv"         # the Python environment, as seen from inside the root
STAGE_IN_ROOT="/work/spec-verify"   # where the tests are copied, as seen from inside the root
TIMES_FILE="$CACHE/stage-times.txt" # "stage seconds" lines, for the closing summary

mkdir -p "$CACHE" "$STAMPS" "$LOGS"

log() { printf '[aarch64] %s\n' "$*" >&2; }
die() { printf '[aarch64] ERROR: %s\n' "$*" >&2; exit 1; }

# retry ATTEMPTS DESCRIPTION COMMAND...: for network steps (mirror, PyPI).
# Waits 15 s, then 45 s, ... between attempts; the last failure is fatal.
retry() {
  # (_retry_* names: bash locals are visible to the function being retried.)
  local _retry_max="$1" _retry_what="$2" _retry_n=1 _retry_wait=15
  shift 2
  while true; do
    if "$@"; then return 0; fi
    if (( _retry_n >= _retry_max )); then
      die "$_retry_what failed $_retry_max times; the last error is above (a network or mirror problem if it says 'Failed to fetch', 'Temporary failure', 'Connection', 'Hash Sum mismatch' or 'Read timed out')"
    fi
    log "$_retry_what failed (attempt $_retry_n of $_retry_max); retrying in ${_retry_wait} s"
    sleep "$_retry_wait"
    _retry_n=$((_retry_n + 1))
    _retry_wait=$((_retry_wait * 3))
  done
}

# stage NAME COMMAND...: runs COMMAND in a subshell (its mounts are undone
# when it ends), prints and records how long it took, pass or fail.
stage() {
  local name="$1" start status
  shift
  start=$(date +%s)
  log "stage $name: start"
  set +e
  (set -e; "$@")
  status=$?
  set -e
  printf '%-18s %5d s%s\n' "$name" "$(($(date +%s) - start))" "$( ((status)) && echo "  (failed)")" >>"$TIMES_FILE"
  (( status == 0 )) || { log "stage $name: FAILED after $(($(date +%s) - start)) s"; exit "$status"; }
  log "stage $name: done in $(($(date +%s) - start)) s"
}

# The variant for the root's torch (build/ may also hold the release
# variants for other torch versions, from `make release`).
root_variant() {
  local major minor
  IFS=. read -r major minor _ <<<"$TORCH_VERSION"
  echo "$REPO/build/torch$major$minor-cxx11-cpu-aarch64-linux"
}

# One run at a time per cache folder (mounts and the root are shared state).
take_lock() {
  exec 9>"$CACHE/lock"
  if ! flock -n 9; then
    log "another run holds $CACHE/lock; waiting for it (up to 60 min)"
    flock -w 3600 9 || die "timed out waiting for $CACHE/lock"
  fi
}

# ----------------------------------------------------------------------------
# binfmt: the kernel hands aarch64 ELF files to qemu
# ----------------------------------------------------------------------------

QEMU_BINFMT=/proc/sys/fs/binfmt_misc/qemu-aarch64

binfmt_enable() {
  if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
      || die "cannot mount binfmt_misc (needs root on a kernel with CONFIG_BINFMT_MISC; in a container, --privileged)"
  fi
  # qemu >= 8 ships its registration for systemd-binfmt; without systemd
  # running (CI, containers) we write it to the kernel ourselves.
  local conf=/usr/lib/binfmt.d/qemu-aarch64.conf line="" want=""
  if [[ -f $conf ]]; then
    line=$(grep -m1 '^:qemu-aarch64:' "$conf" || true)
    want=$(awk -F: '{ print $(NF - 1) }' <<<"$line")
  fi
  if [[ -e $QEMU_BINFMT && -n $want ]] && ! grep -qx "interpreter $want" "$QEMU_BINFMT"; then
    # Registered by an older qemu (e.g. bookworm's 7.2 before the upgrade):
    # with the F flag the kernel keeps running that old binary. Replace it.
    log "binfmt: replacing the qemu-aarch64 entry ($(sed -n 's/^interpreter //p' "$QEMU_BINFMT")) with $want"
    echo -1 >"$QEMU_BINFMT"
  fi
  if [[ ! -e $QEMU_BINFMT ]]; then
    if [[ -n $line ]]; then
      printf '%s\n' "$line" >/proc/sys/fs/binfmt_misc/register \
        || die "binfmt: writing $conf to /proc/sys/fs/binfmt_misc/register failed"
    else
      update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true  # binfmt-support style (qemu 7)
    fi
  elif ! grep -qx enabled "$QEMU_BINFMT"; then
    log "binfmt: qemu-aarch64 was disabled; enabling it"
    echo 1 >"$QEMU_BINFMT"
  fi
  [[ -e $QEMU_BINFMT ]] && grep -qx enabled "$QEMU_BINFMT" \
    || die "qemu-aarch64 is not registered with binfmt_misc (no $conf and update-binfmts --enable qemu-aarch64 failed: is qemu-user-static installed?)"
  local interp
  interp=$(sed -n 's/^interpreter //p' "$QEMU_BINFMT")
  # Without the F (fix-binary) flag, the kernel opens the interpreter inside
  # the chroot: put it there at the same path.
  if ! grep -q '^flags:.*F' "$QEMU_BINFMT" && [[ -d $ROOTFS/usr ]]; then
    mkdir -p "$ROOTFS$(dirname "$interp")"
    cp -fL "$interp" "$ROOTFS$interp"
  fi
}

# ----------------------------------------------------------------------------
# Mounts: proc, a read-only sys, and a private /dev (never the host's /dev
# bound in, so nothing done inside the root can touch the host's devices)
# ----------------------------------------------------------------------------

MOUNTED_BY_US=0

mount_root() {
  [[ -x $ROOTFS/bin/sh ]] || die "no arm64 root at $ROOTFS (run tools/aarch64/setup.sh)"
  binfmt_enable
  MOUNTED_BY_US=1
  trap 'umount_root' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
  mountpoint -q "$ROOTFS/sys" || mount -t sysfs -o ro sysfs "$ROOTFS/sys"
  if ! mountpoint -q "$ROOTFS/dev"; then
    mount -t tmpfs -o mode=755,size=1m sv-dev "$ROOTFS/dev"
    mknod -m 666 "$ROOTFS/dev/null" c 1 3
    mknod -m 666 "$ROOTFS/dev/zero" c 1 5
    mknod -m 666 "$ROOTFS/dev/full" c 1 7
    mknod -m 666 "$ROOTFS/dev/random" c 1 8
    mknod -m 666 "$ROOTFS/dev/urandom" c 1 9
    mknod -m 666 "$ROOTFS/dev/tty" c 5 0
    ln -s /proc/self/fd "$ROOTFS/dev/fd"
    ln -s /proc/self/fd/0 "$ROOTFS/dev/stdin"
    ln -s /proc/self/fd/1 "$ROOTFS/dev/stdout"
    ln -s /proc/self/fd/2 "$ROOTFS/dev/stderr"
    mkdir "$ROOTFS/dev/shm" "$ROOTFS/dev/pts"
  fi
  # torch's shared memory and Python's multiprocessing want a real /dev/shm.
  mountpoint -q "$ROOTFS/dev/shm" || mount -t tmpfs -o mode=1777,size=2g sv-shm "$ROOTFS/dev/shm"
  # Name resolution for pip and apt inside the root.
  cp -fL /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
}

# Unmounts everything under the root, deepest first (also what debootstrap
# may have left behind after a failure).
umount_root() {
  local status=$? mp
  [[ -d $ROOTFS ]] || return "$status"
  while read -r mp; do
    umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || log "could not unmount $mp"
  done < <(awk -v root="$ROOTFS/" 'index($2 "/", root) == 1 { print $2 }' /proc/mounts | sort -r)
  return "$status"
}

# in_root COMMAND...: runs COMMAND (an arm64 program) inside the root, under
# qemu, with a clean environment: no host variables leak in except the proxy
# and pip settings.
in_root() {
  local env=(
    PATH="$VENV_IN_ROOT/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 TERM="${TERM:-dumb}"
    DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
    QEMU_CPU="$QEMU_CPU_MODEL" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
  )
  local var
  for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
    [[ -n ${!var:-} ]] && env+=("$var=${!var}")
  done
  # IN_ROOT_CWD: the working folder inside the root; IN_ROOT_TIMEOUT: seconds.
  local pre=()
  [[ -n ${IN_ROOT_TIMEOUT:-} ]] && pre=(timeout --kill-after=30 "$IN_ROOT_TIMEOUT")
  "${pre[@]}" chroot "$ROOTFS" /usr/bin/env -i -C "${IN_ROOT_CWD:-/}" "${env[@]}" "$@"
}
