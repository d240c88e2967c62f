# spec-verify: every target installs what it needs (venv, pinned torch, build).
#   make demo   the main job: the seed's experiment on this machine
#   make test   the test suite, on the kernel as `kernels` loads it
#   make bench  speed against naive torch, transformers and the bandwidth floor
#   make build  compile the kernel into build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/

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
	$(PY) tools/demo.py

bench: build
	$(PY) tools/bench.py

clean:
	rm -rf build out .pytest_cache
