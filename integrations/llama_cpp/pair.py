"""The shipped pair on llama.cpp: opening the GGUF files, and plain decoding to compare against.

Used by ``tests/test_llama_cpp.py``, ``benchmarks/bench.py --engine llama_cpp``
and ``examples/e2e.py --engine llama_cpp``.
"""

from __future__ import annotations

import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def ensure_gguf(models: pathlib.Path = MODELS) -> pathlib.Path:
    """``models/gguf/`` holding ``target.gguf`` and ``draft.gguf``, (re)made when older than their sources (as ``make gguf``)."""
    from . import hf_to_gguf

    out = models / "gguf"
    sources = [models / r / f for r in ("target", "draft") for f in ("model.safetensors", "config.json")]
    sources += [models / "tokenizer" / "tokenizer.json", models / "tokenizer" / "tokenizer_config.json",
                pathlib.Path(hf_to_gguf.__file__)]
    newest = max(p.stat().st_mtime for p in sources)
    made = [out / "target.gguf", out / "draft.gguf"]
    if not all(p.is_file() and p.stat().st_mtime >= newest for p in made):
        hf_to_gguf.main(["--models", str(models), "--out", str(out)])
    return out


def open_llama(path, n_ctx: int = 1024, threads: int = 1):
    """A ``llama_cpp.Llama`` for speculative decoding: ``logits_all=True``, ``threads`` for decode and batch, quiet."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 logits_all=True, verbose=False)


def generate_plain(llama, prompt_ids, max_new: int, temperature: float = 0.0, seed: int = 0) -> list:
    """llama.cpp's own plain decoding through ``Llama.generate``: greedy at 0, else temperature alone
    (top-k 0, top-p 1, min-p 0, no penalties). Returns the new token ids."""
    llama.reset()
    if temperature > 0:
        llama.set_seed(seed)
    out = []
    gen = llama.generate(list(map(int, prompt_ids)), temp=temperature, top_k=0, top_p=1.0, min_p=0.0,
                         typical_p=1.0, repeat_penalty=1.0, reset=True)
    for token in gen:
        out.append(int(token))
        if len(out) == max_new:
            break
    return out


def plain_decode(step, prompt_ids, max_new: int, generator: torch.Generator | None = None) -> list:
    """The lean plain loop: one ``llama_decode`` per token on a ``LlamaCppStep``'s context, the token
    its argmax (greedy adapter) or a ``sample_draft`` draw under its warping. Returns the new token ids."""
    step.reset()
    seq = list(map(int, prompt_ids))
    logits = step._feed(seq, rows=1)[0]
    out = []
    sample = None if step.greedy else dict(step.warping.kwargs(), generator=generator)
    sv = step.sv
    for i in range(max_new):
        token = int(torch.argmax(logits)) if sample is None else int(sv.sample_draft(logits, **sample))
        out.append(token)
        if i + 1 < max_new:
            logits = step._feed([token], rows=1)[0]
    return out
