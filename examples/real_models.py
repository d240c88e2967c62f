"""The real public models (``make real-models``) on transformers: one loader, with a cache of the dequantized weights.

``load_hf(name)`` returns ``(tokenizer, model)`` for ``"gemma3-270m"`` or
``"smollm2-135m"``: the GGUF file of ``models/real/`` (``gguf_path(name)``),
read by transformers (``from_pretrained(dir, gguf_file=...)``, which needs
``gguf`` and ``accelerate``) and dequantized to float32. That read is slow
(Gemma 3 270M: ~70 s on 2 cores), so the first load saves the model and its
tokenizer with ``save_pretrained`` (safetensors) into
``.cache/real-hf/<name>/``, and later loads read that (seconds). The cache
records the sha256 of the GGUF it came from; a GGUF with another hash (a new
file placed) remakes it. ``.cache/`` is git-ignored.

Loading sets torch to one thread by default (``threads=1``): the
measurements of issue 23 are one-thread figures, and the machine is shared.

    python -m examples.real_models            # load both once (fills the cache), print a line each
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import time

import torch

from tools import real_models

ROOT = real_models.ROOT
CACHE_DIR = ROOT / ".cache" / "real-hf"
NAMES = tuple(real_models.MODELS)


def gguf_path(name: str) -> pathlib.Path:
    """The GGUF file of real model ``name`` in ``models/real/`` (``FileNotFoundError``: run ``make real-models``)."""
    path = real_models.model_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make real-models`")
    return path


def path_name(path: pathlib.Path) -> str:
    """The ``MODELS`` name of a placed GGUF file."""
    for name, (file_name, _, _) in real_models.MODELS.items():
        if path.name == file_name:
            return name
    raise ValueError(f"{path} is not one of the real models ({', '.join(NAMES)})")


def _cache_is_current(cache: pathlib.Path, path: pathlib.Path) -> bool:
    """Whether ``cache`` was made from a GGUF with ``path``'s sha256 (hashed again only when its mtime moved)."""
    try:
        stamp = json.loads((cache / "gguf.json").read_text())
    except (OSError, ValueError):
        return False
    st = path.stat()
    if stamp.get("size") != st.st_size:
        return False
    if stamp.get("mtime_ns") != st.st_mtime_ns:
        # Touched (make real-models) or replaced: the content decides.
        if stamp.get("sha256") != real_models.sha256_file(path):
            return False
        stamp["mtime_ns"] = st.st_mtime_ns
        (cache / "gguf.json").write_text(json.dumps(stamp))
    return True


def _dequantize_into(name: str, cache: pathlib.Path) -> None:
    """Read the GGUF with transformers (float32), check its hash, save tokenizer + model into ``cache``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = real_models.check(name, gguf_path(name))  # the sha256 of MODELS, or ValueError
    tmp = cache.with_name(cache.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer.save_pretrained(tmp)
    # The weights are dequantized float32 by now; transformers still marks the
    # model as GGUF-quantized and refuses to save it: unmark it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)  # safetensors
    st = path.stat()
    stamp = {"sha256": real_models.MODELS[name][1], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    (tmp / "gguf.json").write_text(json.dumps(stamp))
    shutil.rmtree(cache, ignore_errors=True)
    tmp.replace(cache)


def load_hf(name: str, *, threads: int | None = 1, verbose: bool = False):
    """``(tokenizer, model)`` of real model ``name`` on transformers, float32, in ``eval()`` mode.

    Parameters
    ----------
    name : str
        ``"gemma3-270m"`` or ``"smollm2-135m"`` (``tools.real_models.MODELS``).
    threads : int or None, default 1
        ``torch.set_num_threads(threads)`` before loading; None leaves it.
    verbose : bool, default False
        Print where the model came from and how long it took.

    Returns
    -------
    tuple
        ``(tokenizer, model)``: the GGUF-derived tokenizer and the
        ``AutoModelForCausalLM``, from ``.cache/real-hf/<name>/`` when it was
        made from a GGUF with the same sha256, else from the GGUF (then
        cached).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in real_models.MODELS:
        raise ValueError(f"unknown real model {name!r}; known: {', '.join(NAMES)}")
    if threads is not None:
        torch.set_num_threads(threads)
    path = gguf_path(name)
    cache = CACHE_DIR / name
    start = time.perf_counter()
    source = "cache"
    if not _cache_is_current(cache, path):
        source = "GGUF (dequantized, now cached)"
        _dequantize_into(name, cache)
    tokenizer = AutoTokenizer.from_pretrained(cache)
    model = AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32).eval()
    if verbose:
        print(f"{name}: loaded from {source} in {time.perf_counter() - start:.1f} s "
              f"({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters)")
    return tokenizer, model


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in (argv or sys.argv[1:]) or NAMES:
        load_hf(name, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
