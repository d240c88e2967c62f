#!/usr/bin/env bash
# A native (-march=native: AVX-512/AMX here) llama.cpp built from the very source that
# llama-cpp-python==0.3.36 vendors, for measuring on THIS machine only: never shipped, never
# installed into a venv. The project venv's wheel stays the portable AVX2 build (Makefile,
# LLAMA_CMAKE_ARGS). Its libllama.so is ABI-compatible with the Python bindings, which load it
# with LLAMA_CPP_LIB_PATH=.cache/llama-native/bin (`bench_llama --llama-lib native` sets it);
# the same build gives llama.cpp's own llama-speculative-simple, llama-speculative, and its plain
# decoding: llama-completion, llama-bench.
#
#   tools/llama_native/build.sh        # or: make llama-native
#
# Idempotent: does nothing when .cache/llama-native/bin/ already holds the libraries and the
# four binaries. Everything goes under .cache/llama-native/ (git-ignored): src/ (the sdist and
# its vendor/llama.cpp), build/ (cmake), bin -> build/bin (libs + binaries, RUNPATH'd together).
# Took 11 min here (2 cores, one busy with another job), run under nice.
set -euo pipefail

VERSION=0.3.36
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/.cache/llama-native"
PY="${PY:-$ROOT/.venv/bin/python}"
SRC="$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
TARGETS=(llama llama-speculative-simple llama-speculative llama-bench llama-completion)

built() {
  for f in libllama.so libggml.so libggml-base.so libggml-cpu.so \
           llama-speculative-simple llama-speculative llama-bench llama-completion; do
    [ -e "$OUT/bin/$f" ] || return 1
  done
}
if built; then
  echo "llama-native: already built in $OUT/bin (rm -rf $OUT/build $OUT/bin to rebuild)"
  exit 0
fi

mkdir -p "$OUT/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  sdist="$OUT/src/llama_cpp_python-$VERSION.tar.gz"
  [ -f "$sdist" ] || nice -n 10 "$PY" -m pip download "llama-cpp-python==$VERSION" --no-binary :all: \
                        --no-deps -d "$OUT/src"
  tar -xzf "$sdist" -C "$OUT/src"
fi

# As the wheel's build (no OpenMP, no curl), but GGML_NATIVE=ON: only the instruction set differs.
nice -n 10 cmake -S "$SRC" -B "$OUT/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
nice -n 10 cmake --build "$OUT/build" --target "${TARGETS[@]}" -j2
ln -sfn build/bin "$OUT/bin"
built || { echo "llama-native: build finished but $OUT/bin lacks a library or binary" >&2; exit 1; }
echo "llama-native: built in $OUT/bin"
