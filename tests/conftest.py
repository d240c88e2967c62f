"""Shared fixtures: the kernel exactly as a user loads it, through `kernels`.

`make test` builds `build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/` first; the
`sv` fixture loads that variant with `kernels.get_local_kernel`, never the
source tree, so every test exercises the artefact a user would get.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

# No test may reach the network: the kernel is local, models are built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]


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


def check_isa_script(sv, capability: str, script: str) -> None:
    """Run `script` (prints the ISA that ran, then a mismatch count) in a fresh
    process with ATEN_CPU_CAPABILITY=capability; assert it ran that ISA and
    found no mismatch. Skips an ISA this machine's build does not compile."""
    import torch

    compiled = sv.build_info()["compiled"].lower().split(",")
    if capability not in compiled:
        pytest.skip(f"{capability} is not compiled on this machine")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    isa, mismatches = out.stdout.split()
    native = torch.backends.cpu.get_cpu_capability().lower()
    # ATEN_CPU_CAPABILITY only lowers the ISA: it cannot raise it past the CPU.
    # On aarch64 the DEFAULT build is NEON, and build_info says so.
    expected = "neon" if capability == "default" and sv.build_info()["arch"] == "aarch64" else capability
    if capability == "default" or capability == native or (capability == "avx2" and native == "avx512"):
        assert isa.lower() == expected, f"asked for {capability}, ran {isa}"
    assert mismatches == "0", f"{mismatches} mismatches on {isa}"
