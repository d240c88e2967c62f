#!/usr/bin/env bash
# llama.cpp built from the very source that llama-cpp-python==0.3.36 vendors, for measuring on THIS
# machine only: never shipped, never installed into the project venv. The project venv's wheel stays
# the portable AVX2 build (Makefile, LLAMA_CMAKE_ARGS). Two variants, one source:
#
#   native    (default) -march=native (AVX-512 here), into .cache/llama-native/. Its libllama.so is
#             ABI-compatible with the Python bindings, which load it with
#             LLAMA_CPP_LIB_PATH=.cache/llama-native/bin (`bench_llama --llama-lib native` sets it);
#             the same build gives llama.cpp's own llama-speculative-simple (also its ngram-simple
#             prompt lookup: --spec-type ngram-simple), llama-speculative, llama-lookup, and its plain
#             decoding: llama-completion, llama-bench.
#   dispatch  llama.cpp's runtime CPU dispatch, as its own releases ship it (GGML_BACKEND_DL=ON,
#             GGML_CPU_ALL_VARIANTS=ON, GGML_NATIVE=OFF), into .cache/llama-dispatch/: libggml-cpu-*.so,
#             one per x86 level (x64 .. zen4, sapphirerapids), of which ggml_backend_load_all picks the
#             best this CPU runs (zen4 on an EPYC Zen 4). Portable, like the wheel; as fast as native:
#             `python -m benchmarks.bench_llama_builds`. The library and llama-bench only. llama.cpp's
#             binaries find the modules beside themselves; Python does not (llama-cpp-python 0.3.36
#             never registers them, and ggml searches only Python's folder and the working directory):
#             bench_llama_builds.load_backends does, so `bench_llama --llama-lib DIR` cannot use it.
#
#   tools/llama_native/build.sh [native|dispatch]     # or LLAMA_VARIANT=dispatch; make llama-native
#
# Idempotent: does nothing when .cache/llama-<variant>/bin/ already holds the libraries and binaries.
# Everything goes under .cache/ (git-ignored): .cache/llama-native/src/ (the sdist and its
# vendor/llama.cpp, shared by both variants), .cache/llama-<variant>/build/ (cmake), bin -> build/bin
# (libs + binaries, RUNPATH'd together). Run under nice, 2 cores, one busy with another job: native
# took 9-11 min here; dispatch 11 min (it compiles the CPU backend once per variant, 14 on x86).
set -euo pipefail

VERSION=0.3.36
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VARIANT="${1:-${LLAMA_VARIANT:-native}}"
PY="${PY:-$ROOT/.venv/bin/python}"
SRC_ROOT="$ROOT/.cache/llama-native/src"
SRC="$SRC_ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp"

# Per variant: the output folder, the cmake flags that differ, the targets, and what must exist after.
case "$VARIANT" in
  native)
    OUT="$ROOT/.cache/llama-native"
    FLAGS=(-DGGML_NATIVE=ON)
    TARGETS=(llama llama-speculative-simple llama-speculative llama-lookup llama-bench llama-completion)
    PRODUCTS=(libllama.so libggml.so libggml-base.so libggml-cpu.so
              llama-speculative-simple llama-speculative llama-lookup llama-bench llama-completion)
    ;;
  dispatch)
    OUT="$ROOT/.cache/llama-dispatch"
    FLAGS=(-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON)
    TARGETS=(llama llama-bench)  # llama -> ggml, which depends on every libggml-cpu-<variant> module
    PRODUCTS=(libllama.so libggml.so libggml-base.so libggml-cpu-x64.so libggml-cpu-haswell.so
              libggml-cpu-zen4.so llama-bench)
    ;;
  *)
    echo "usage: $0 [native|dispatch]  (got '$VARIANT')" >&2
    exit 2
    ;;
esac

built() {
  for f in "${PRODUCTS[@]}"; do
    [ -e "$OUT/bin/$f" ] || return 1
  done
}
if built; then
  echo "llama-$VARIANT: already built in $OUT/bin (rm -rf $OUT/build $OUT/bin to rebuild)"
  exit 0
fi

mkdir -p "$SRC_ROOT"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  sdist="$SRC_ROOT/llama_cpp_python-$VERSION.tar.gz"
  # The sdist only (its build requirements, for pip's metadata step, as wheels), and nothing into
  # ~/.cache/pip: with --no-binary :all: pip built those requirements from source into its wheel cache.
  [ -f "$sdist" ] || nice -n 10 "$PY" -m pip download "llama-cpp-python==$VERSION" --no-binary llama-cpp-python \
                        --no-deps --no-cache-dir -d "$SRC_ROOT"
  tar -xzf "$sdist" -C "$SRC_ROOT"
fi

# As the wheel's build (no OpenMP, no curl); only the instruction-set flags (FLAGS) differ.
nice -n 10 cmake -S "$SRC" -B "$OUT/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON "${FLAGS[@]}" -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
nice -n 10 cmake --build "$OUT/build" --target "${TARGETS[@]}" -j2
ln -sfn build/bin "$OUT/bin"
built || { echo "llama-$VARIANT: build finished but $OUT/bin lacks one of: ${PRODUCTS[*]}" >&2; exit 1; }
echo "llama-$VARIANT: built in $OUT/bin"
