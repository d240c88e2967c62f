# spec-verify: every target installs what it needs (venv, pinned torch, build).
#   make demo   the main job: the seed's experiment on this machine
#   make test   the test suite, on the kernel as `kernels` loads it
#   make bench  speed against naive torch, transformers and the bandwidth floor
#   make build  compile the kernel into build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/
#   make test-aarch64  the tests on aarch64 (NEON) under qemu-user emulation (root)
#   make test-asan     the tests on an AddressSanitizer + UBSan build (opt-in; slow)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: build test demo bench clean

# The venv is (re)made when requirements.txt changes. torch is pinned there.
$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

build: $(STAMP)
	$(PY) tools/build_kernel.py

test: build
	$(PY) -m pytest tests

demo: build
	$(PY) -m examples.demo

bench: build
	$(PY) -m benchmarks.bench

clean:
	rm -rf build out .pytest_cache

# aarch64 under user-mode emulation (tools/aarch64/): an arm64 Debian root
# cached in .cache/aarch64/ (made on first use, 4-12 min), the variant
# build/torch<MAJ><MIN>-cxx11-cpu-aarch64-linux/ cross-compiled on the host,
# the tests run inside qemu-aarch64. Needs root (apt-get, mount, chroot).
.PHONY: test-aarch64
test-aarch64: $(STAMP)
	bash tools/aarch64/run.sh

# The suite on an ASan + UBSan build of the kernel (tools/test_asan.sh):
# built into .cache/asan/build/, never build/; fails on any sanitizer report.
.PHONY: test-asan
test-asan: $(STAMP)
	bash tools/test_asan.sh
