"""Shared fixtures: the kernel exactly as a user loads it, through `kernels`.

`make test` builds `build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/` first; the
`sv` fixture loads that variant with `kernels.get_local_kernel`, never the
source tree, so every test exercises the artefact a user would get.
"""

from __future__ import annotations

import os
import pathlib

import pytest

# No test may reach the network: the kernel is local, models are built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def sv():
    """The spec-verify kernel module, loaded through `kernels`."""
    import kernels

    if not (REPO / "build").is_dir():
        pytest.fail("no build/ folder: run `make build` (or `make test`, which builds first)")
    return kernels.get_local_kernel(REPO)
