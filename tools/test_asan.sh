#!/usr/bin/env bash
# make test-asan: the test suite on an AddressSanitizer + UBSan build of the kernel.
#
# The kernel is built with `tools/build_kernel.py --sanitize` into
# .cache/asan/build/ (never build/), loaded through SPEC_VERIFY_ROOT. Python
# itself is not instrumented, so libasan must come first in the process:
# LD_PRELOAD it (with libubsan and libstdc++, whose operator new/delete ASan
# must see before torch's first allocation). pytest captures the output of
# the tests, so reports go to files (log_path) and the run fails if any exist.
# Leak detection is off: torch and CPython keep allocations alive at exit by
# design, which would drown the kernel's own (the kernel allocates no heap
# memory of its own per call beyond its output tensors).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CXX=${CXX:-g++}

# The sanitizer runtimes: gcc's own (Debian: libasan8 / libubsan1 come with g++).
asan=$($CXX -print-file-name=libasan.so)
ubsan=$($CXX -print-file-name=libubsan.so)
stdcxx=$($CXX -print-file-name=libstdc++.so)
for lib in "$asan" "$ubsan"; do
  if [ ! -e "$lib" ]; then
    echo "test-asan: $lib missing; installing the sanitizer runtimes" >&2
    apt-get install -y libasan8 libubsan1 >&2
  fi
done

"$PY" tools/build_kernel.py --sanitize

reports=.cache/asan/reports
rm -rf "$reports" && mkdir -p "$reports"
export SPEC_VERIFY_ROOT=$PWD/.cache/asan
export LD_PRELOAD="$(readlink -f "$asan") $(readlink -f "$ubsan") $(readlink -f "$stdcxx")"
export ASAN_OPTIONS="log_path=$PWD/$reports/asan:detect_leaks=0:halt_on_error=1:abort_on_error=1:verify_asan_link_order=0"
export UBSAN_OPTIONS="log_path=$PWD/$reports/ubsan:print_stacktrace=1:halt_on_error=1"
status=0
"$PY" -m pytest -q -p no:cacheprovider "${@:-tests}" || status=$?
unset LD_PRELOAD
if compgen -G "$reports/*" > /dev/null; then
  echo "test-asan: sanitizer reports in $reports:" >&2
  head -50 "$reports"/* >&2
  exit 1
fi
echo "test-asan: no sanitizer report (pytest exit status $status)"
exit $status
