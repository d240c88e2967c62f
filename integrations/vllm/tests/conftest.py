"""The vLLM plugin's tests run in .venv-vllm (``make test-vllm``), never in ``make test``.

The kernel comes through ``kernels.get_kernel`` as the plugin loads it;
``LOCAL_KERNELS`` points it at this checkout's ``build/`` (``make build``).
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/spec-verify={ROOT}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
