#!/usr/bin/env bash
# Runs the kernel's tests inside the arm64 root under qemu-aarch64, on the
# cross-built build/torch<MAJ><MIN>-cxx11-cpu-aarch64-linux/ variant, loaded
# through `kernels` exactly as on a Raspberry Pi.
#
# The tests, the package sources and that one variant are copied to
# /work/spec-verify inside the root (so `kernels` sees only the aarch64
# variant), together with tools/aarch64/test_aarch64_build.py, the check that
# the emulated process ran the NEON vectorized path (isa NEON, 4 float lanes).
# The run fails if that check did not run and pass.
#
#   tools/aarch64/test.sh                 the selection below
#   tools/aarch64/test.sh PYTEST_ARGS...  your own selection (the NEON check always runs)
# Environment: SV_A64_TEST_TIMEOUT (seconds, default 2400) bounds pytest.
source "$(dirname "$0")/common.sh"

# What runs emulated (tools/aarch64/README.md says why):
#   in full: the op tests (reference match, properties, bad input, logits,
#     registration and loading), the exact law, and the kernel's conformance
#     harness on the small families (~3 min emulated);
#   the decoder tests without the transformers models (transformers is not
#     installed in the root: the HF adapter is pure Python over torch, tested
#     natively by `make test`);
#   not run emulated: the two V = 32000 seed-pair conformance runs (200 000
#     and 20 000 rounds: ~17 min emulated, the same C++ path as the small
#     families at a larger V, which the fast == reference tests cover at
#     V = 32000 and 128256 bit for bit), and tests/test_model_pair.py
#     (a trained transformers pair).
# New op test files must be added here.
SELECTION=(
  tests/test_ops_match_reference.py
  tests/test_ops_properties.py
  tests/test_bad_input.py
  tests/test_logits.py
  tests/test_registration.py
  tests/test_law.py
  tests/test_conformance.py
  tests/test_decoder.py
)
# Deselected emulated:
#   hf_*, *transformers_processors: need transformers (not in the root);
#   *on_the_seed_pair: the ~17 min V = 32000 conformance runs (see above);
#   each_instruction_set_matches_reference: on aarch64 only DEFAULT (NEON) is
#     compiled, so its subprocess with ATEN_CPU_CAPABILITY=default re-runs the
#     path the main process tests (~1 min per file under emulation). (As
#     written it also expects x86's ISA name "default"; aarch64 reports NEON.)
DESELECT="hf_ or transformers_processors or on_the_seed_pair or each_instruction_set_matches_reference"

default_selection() {
  local file
  for file in "${SELECTION[@]}"; do
    [[ -f $REPO/$file ]] && printf '%s\n' "$file" || log "note: $file is gone; not run"
  done
  echo -k
  echo "not ($DESELECT)"
}

stage_tree() {
  local dest="$ROOTFS$STAGE_IN_ROOT" variant
  variant=$(ls -d "$REPO"/build/torch*-cpu-aarch64-linux 2>/dev/null | head -n1)
  [[ -n $variant ]] || die "no build/torch*-cpu-aarch64-linux variant (run tools/aarch64/build.sh)"
  rm -rf --one-file-system "$dest"
  mkdir -p "$dest/build" "$dest/tools"
  (cd "$REPO" && tar -cf - --exclude=__pycache__ tests torch-ext csrc pytest.ini build.toml requirements.txt) \
    | tar -xf - -C "$dest"
  cp "$REPO"/tools/*.py "$dest/tools/"
  cp -a "$variant" "$dest/build/"
  cp "$A64_TOOLS/test_aarch64_build.py" "$dest/tests/"
  log "staged tests and $(basename "$variant") in the root at $STAGE_IN_ROOT"
}

run_pytest() {
  local selection=("$@") report="$STAGE_IN_ROOT/aarch64-build-info.json"
  (( ${#selection[@]} )) || mapfile -t selection < <(default_selection)
  mount_root
  log "QEMU_CPU=$QEMU_CPU_MODEL; pytest ${selection[*]}"
  local status=0
  IN_ROOT_TIMEOUT="${SV_A64_TEST_TIMEOUT:-2400}" IN_ROOT_CWD="$STAGE_IN_ROOT" \
    in_root /usr/bin/env SV_A64_BUILD_INFO="$report" \
    "$VENV_IN_ROOT/bin/python" -m pytest -p no:cacheprovider --durations=15 \
    tests/test_aarch64_build.py "${selection[@]}" || status=$?
  # The in-process check must have run and passed, whatever pytest said.
  local info
  info=$(cat "$ROOTFS$report" 2>/dev/null || true)
  [[ -n $info ]] || die "the NEON check (tests/test_aarch64_build.py) did not run inside the emulator"
  log "emulated build_info: $info"
  grep -q '"isa": "NEON"' <<<"$info" && grep -q '"float_lanes": 4' <<<"$info" \
    || die "the emulated kernel did not run the NEON path with 4 float lanes: $info"
  if (( status == 124 || status == 137 )); then
    die "pytest under emulation exceeded SV_A64_TEST_TIMEOUT=${SV_A64_TEST_TIMEOUT:-2400} s"
  fi
  (( status == 0 )) || die "the emulated test suite failed (pytest exit $status)"
  printf '%s\n' "$info" >"$CACHE/build-info.json"
}

take_lock
stage stage-tests stage_tree
stage pytest-emulated run_pytest "$@"
