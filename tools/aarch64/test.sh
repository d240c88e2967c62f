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
#   tools/aarch64/test.sh                 tests -m "$MARKERS" (below)
#   tools/aarch64/test.sh PYTEST_ARGS...  your own selection (the NEON check always runs)
# Environment: SV_A64_TEST_TIMEOUT (seconds, default 3600) bounds pytest: the emulated suite runs 15-20x slower than natively, and CI (90 min) must still finish after the root set-up (~10 min).
source "$(dirname "$0")/common.sh"

# What runs emulated: the whole suite, selected by markers (pytest.ini
# declares them and says why; tools/aarch64/README.md too):
#   transformers  needs the transformers package, which the root does not install;
#   native_only   too slow or meaningless under emulation (the V = 32000 Pi-pair
#                 conformance runs; the every-instruction-set subprocess checks;
#                 the decode loops' pure-Python sequence-law tests);
#   llama_cpp     needs llama-cpp-python and gguf (llama.cpp is not built in the root).
# A new test file runs here unless its tests carry one of these markers.
MARKERS="not transformers and not native_only and not llama_cpp"

stage_tree() {
  local dest="$ROOTFS$STAGE_IN_ROOT" variant
  variant=$(root_variant)
  [[ -d $variant ]] || die "no $(basename "$variant") variant (run tools/aarch64/build.sh)"
  rm -rf --one-file-system "$dest"
  mkdir -p "$dest/build" "$dest/tools" "$dest/examples"
  (cd "$REPO" && tar -cf - --exclude=__pycache__ tests torch-ext csrc pytest.ini build.toml requirements.txt \
     integrations/__init__.py integrations/transformers/custom_generate) \
    | tar -xf - -C "$dest"
  # The packages the test modules import at collection (tools.conformance,
  # tools.kernel_loader, examples.e2e, integrations.transformers.custom_generate.lean_llama);
  # not models/: the tests that load them need transformers and are deselected.
  cp "$REPO"/tools/*.py "$dest/tools/"
  cp "$REPO"/examples/*.py "$dest/examples/"
  cp -a "$variant" "$dest/build/"
  cp "$A64_TOOLS/test_aarch64_build.py" "$dest/tests/"
  log "staged tests and $(basename "$variant") in the root at $STAGE_IN_ROOT"
}

run_pytest() {
  local selection=("$@") report="$STAGE_IN_ROOT/aarch64-build-info.json"
  (( ${#selection[@]} )) || selection=(tests -m "$MARKERS")
  mount_root
  log "QEMU_CPU=$QEMU_CPU_MODEL; pytest ${selection[*]}"
  local status=0
  IN_ROOT_TIMEOUT="${SV_A64_TEST_TIMEOUT:-3600}" IN_ROOT_CWD="$STAGE_IN_ROOT" \
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
    die "pytest under emulation exceeded SV_A64_TEST_TIMEOUT=${SV_A64_TEST_TIMEOUT:-3600} s"
  fi
  (( status == 0 )) || die "the emulated test suite failed (pytest exit $status)"
  printf '%s\n' "$info" >"$CACHE/build-info.json"
}

take_lock
stage stage-tests stage_tree
stage pytest-emulated run_pytest "$@"
