"""Shared fixtures: the kernel exactly as a user loads it, through `kernels`.

`make test` builds `build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/` first; the
`sv` fixture loads that variant through `tools.kernel_loader.load_kernel()`
(`kernels.get_local_kernel`; `SPEC_VERIFY_ROOT` names another folder holding
`build/`), never the source tree, so every test exercises the artefact a user
would get. Helpers shared by the op tests live in `tests/op_families.py`.

Markers (pytest.ini): `transformers` (needs the transformers package) and
`native_only` (too slow or meaningless under emulation); the aarch64
emulated run (tools/aarch64/test.sh) deselects both.
"""

from __future__ import annotations

import os

import pytest

# No test may reach the network: the kernel is local, models are built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def sv():
    """The spec-verify kernel module, loaded through `kernels`."""
    from tools.kernel_loader import load_kernel

    return load_kernel()


# ----------------------------------------------------------------------------
# The shipped model pair (models/, loaded by examples/e2e.py)
# ----------------------------------------------------------------------------


def _e2e():
    from examples import e2e

    return e2e


@pytest.fixture(scope="session")
def pair():
    """``(tokenizer, draft, target)`` from ``models/`` (``SV_MODELS`` overrides), float32, eval mode."""
    e2e = _e2e()
    if not (e2e.MODELS / "target" / "model.safetensors").is_file():
        pytest.fail("models/ has no trained pair: run `python -m examples.train_pair`")
    with e2e.torch_threads(1):
        return e2e.load_pair(e2e.MODELS)


@pytest.fixture
def one_thread():
    """One torch thread for the test: the models are small, and results do not depend on it."""
    with _e2e().torch_threads(1):
        yield
