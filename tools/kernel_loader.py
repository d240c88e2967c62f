"""How the tools load the kernel: through `kernels`, as a user would."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_kernel():
    """The spec-verify module from build/ (run `make build` first)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the kernel is local: never reach the Hub
    import kernels

    if not (ROOT / "build").is_dir():
        raise SystemExit("no build/ folder: run `make build` first")
    return kernels.get_local_kernel(ROOT)
