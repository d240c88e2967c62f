"""The shipped pair laid out as vLLM loads a model: one folder each, tokenizer included.

``models/`` keeps the tokenizer once (``models/tokenizer/``) beside the two
weight folders; vLLM wants ``config.json``, the weights and the tokenizer
files in one folder. ``layout()`` makes ``.cache/vllm-models/{target,draft}``
of symbolic links (no copy, so they follow ``models/`` when it changes).
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = pathlib.Path(os.environ.get("SV_MODELS", ROOT / "models"))
OUT = ROOT / ".cache" / "vllm-models"


def layout(models: pathlib.Path = MODELS, out: pathlib.Path = OUT) -> dict[str, pathlib.Path]:
    """``{"target": path, "draft": path}``, each a folder vLLM can load."""
    paths = {}
    for name in ("target", "draft"):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for src in [*(models / name).iterdir(), *(models / "tokenizer").iterdir()]:
            link = folder / src.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(src.resolve())
        paths[name] = folder
    return paths


if __name__ == "__main__":
    for name, path in layout().items():
        print(name, path)
