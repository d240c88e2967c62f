#!/usr/bin/env bash
# `make test-aarch64`: set up (or re-use) the arm64 root, cross-build the
# aarch64 variant, run the tests under qemu-aarch64; prints each stage's time.
# Arguments go to pytest (default: the selection in test.sh).
source "$(dirname "$0")/common.sh"

: >"$TIMES_FILE"
START=$(date +%s)
summary() {
  local status=$?
  {
    echo "[aarch64] stage times (this run):"
    sed 's/^/[aarch64]   /' "$TIMES_FILE"
    printf '[aarch64]   %-18s %5d s\n' total "$(($(date +%s) - START))"
    if [[ -f $CACHE/build-info.json && $status == 0 ]]; then
      echo "[aarch64] emulated kernel (QEMU_CPU=$QEMU_CPU_MODEL): $(cat "$CACHE/build-info.json")"
    fi
    (( status == 0 )) && echo "[aarch64] PASSED" || echo "[aarch64] FAILED (exit $status)"
  } >&2
}
trap summary EXIT

rm -f "$CACHE/build-info.json"
bash "$A64_TOOLS/setup.sh"
bash "$A64_TOOLS/build.sh"
bash "$A64_TOOLS/test.sh" "$@"
