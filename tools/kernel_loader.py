"""The one way this repository loads the kernel: through `kernels`, as a user would.

Tests, examples, benchmarks and the conformance harness all call
``load_kernel()``; it loads the variant that ``make build`` wrote into
``build/`` with ``kernels.get_local_kernel``, never the source tree, so every
caller exercises the artefact a user gets. ``SPEC_VERIFY_ROOT`` names another
folder holding ``build/`` (default: this checkout).
"""

from __future__ import annotations

import functools
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


@functools.cache
def load_kernel():
    """The spec-verify module from ``build/`` (run ``make build`` first)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the kernel is local: never reach the Hub
    import kernels

    root = pathlib.Path(os.environ.get("SPEC_VERIFY_ROOT", ROOT))
    if not (root / "build").is_dir():
        raise RuntimeError(f"no build/ folder in {root}: run `make build` first")
    # backend="cpu": this is a CPU kernel, and on a CUDA build of torch (PyPI's
    # default on Linux, e.g. the torch 2.12 of `make test-torch212`) `kernels`
    # would otherwise look only for CUDA variants.
    return kernels.get_local_kernel(root, backend="cpu")
