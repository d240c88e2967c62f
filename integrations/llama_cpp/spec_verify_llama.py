"""llama-cpp-python ``Llama`` objects as ``draft_step`` / ``target_step`` callbacks.

    from llama_cpp import Llama
    draft_step, target_step = llama_step_pair(Llama("draft.gguf", logits_all=True),
                                              Llama("target.gguf", logits_all=True), temperature=0)
    out = sv.SpeculativeDecoder(draft_step, target_step, k=5).generate(prompt_ids, 128)

The same callback contract and shape as the kernel's Hugging Face adapter
(``spec_verify.hf_adapter``): each adapter keeps its model's KV cache between
calls with the tokens it holds, rolls the cache back to the longest prefix it
shares with the tokens asked about, and feeds only the rest. A round costs

* draft: ``k`` one-token evals (two tokens in the first after a fully accepted
  round: the last draft token and the bonus token);
* target: one eval of ``k + 1`` positions (the last committed token and the
  ``k`` proposals), whose ``k + 1`` logits rows are what is verified;

and the prefix is never run again: rollback is llama.cpp's own sequence
removal (``llama_memory_seq_rm`` on the context's memory, or
``llama_kv_self_seq_rm`` on older builds), positions ``[keep, inf)`` of
sequence 0. ``decode_calls``, ``tokens_fed`` and ``positions_removed`` count
the work, so a test can tell a rollback from a re-run.

Evals go straight to ``llama_decode`` with a batch built once per adapter
(``llama_batch_init``), asking for logits only at the positions whose rows are
wanted, not through ``Llama.eval`` (which copies every position's logits into
``Llama.scores``, a numpy array, and keeps its own token bookkeeping). The
target's rows are a **zero-copy** torch view of llama.cpp's logits buffer
(``llama_get_logits`` -> ``numpy.ctypeslib.as_array`` -> ``torch.from_numpy``):
valid until the next eval on the same context -- the decoder verifies them
before the next round's target eval, so nothing is copied. The draft's rows
are copied (``k`` rows of ``V`` floats) into a buffer of the adapter's, because
each draft eval overwrites the last; at temperature 0 the draft returns no
rows.

Warping: as in the HF adapter, the rows are raw logits and each adapter
carries its ``LogitsWarping`` as ``warping``: the draft samples its tokens
with ``sv.sample_draft`` under it, and ``SpeculativeDecoder`` verifies with
``sv.verify_logits`` under the same one (greedy: ``sv.verify_greedy``), so there
is one warping definition, the kernel's.

The ``Llama`` objects are made as the high-level API wants them for
several logits rows per eval (``logits_all=True``; the adapter itself asks
llama.cpp for exactly the rows it reads, batch by batch) with a context (``n_ctx``) long enough for
prompt + output + ``k``. The adapter owns the context's memory (sequence 0)
while it is used: do not interleave other evals on the same ``Llama``
(``reset()`` clears the memory and the adapter's record).

Hidden states: the head in the op (``hidden=True``)
---------------------------------------------------
A target made with ``LlamaCppStep(llama, hidden=True)`` returns the target's
last hidden states ``[len(proposed) + 1, d]`` (after the final norm) instead
of logits, and carries ``head`` (``sv.LMHead.from_gguf`` of the same file:
its ``output.weight`` or tied ``token_embd.weight``; a Q8_0 head repacked by
16 ids, a copy whose one-row pass runs at the memory's pace), which
``SpeculativeDecoder`` reads as it reads ``warping``: each round is then
``sv.verify_hidden`` -- the head's weights read once for all rows, where
llama.cpp computes one full logits row per position. How llama.cpp is kept
from computing its head: the adapter makes its own context from the model
with an eval callback (``cb_eval``, llama.cpp's ``ggml_backend_sched``
callback). The callback asks to observe only the tensor named
``result_norm`` (the final norm's output: the Llama, Gemma, Qwen, ... graphs
name it; an eval that never shows it is a ``RuntimeError`` naming the model),
copies its rows, and returns false, which ends the graph's computation
there: the output matmul and anything after it are never computed. The
decode still returns success (the scheduler breaks out of its node loop; it
does not report an abort), and the batch's KV entries were written by the
layers before the norm, so the cache holds the batch as after a full eval
(tested: the hidden rows of later evals equal, bit for bit, those of a context
that observes the norm and computes on, head included). The
price is one Python callback per graph node (~850 for Gemma 3 270M: 0.24 ms
of a 40.8 ms one-token eval here).
Greedy output then equals plain greedy decoding on the same head where
llama.cpp's hidden states are batch-invariant; they are not exactly, on
quantized models (as its logits are not: ``invariance.py``).

This module is outside the kernel package (which imports torch alone); it
imports ``llama_cpp`` and ``numpy``, and the kernel through ``kernels`` (or takes
it as ``sv=``).
"""

from __future__ import annotations

import array
import ctypes
import time

import numpy as np
import torch

import llama_cpp

__all__ = ["LlamaCppStep", "llama_step_pair", "load_sv", "seq_rm_function"]


def load_sv():
    """The spec-verify kernel: this checkout's ``build/`` (``tools.kernel_loader``), else the Hub's."""
    try:
        from tools.kernel_loader import load_kernel
    except ImportError:  # used outside this repository
        from kernels import get_kernel

        return get_kernel("phanerozoic/spec-verify", version=1, trust_remote_code=True)
    return load_kernel()


def seq_rm_function():
    """``(name, fn(ctx, seq_id, p0, p1))``: llama.cpp's sequence removal, whichever this build exposes."""
    if hasattr(llama_cpp, "llama_memory_seq_rm") and hasattr(llama_cpp, "llama_get_memory"):
        rm, get_mem = llama_cpp.llama_memory_seq_rm, llama_cpp.llama_get_memory
        return "llama_memory_seq_rm", lambda ctx, s, p0, p1: rm(get_mem(ctx), s, p0, p1)
    for name in ("llama_kv_self_seq_rm", "llama_kv_cache_seq_rm"):
        if hasattr(llama_cpp, name):
            return name, getattr(llama_cpp, name)
    raise RuntimeError("this llama_cpp exposes no sequence-removal function")


# ----------------------------------------------------------------------------
# The eval callback that stops llama.cpp's graph at the final norm
# ----------------------------------------------------------------------------


class _GgmlTensor(ctypes.Structure):
    """The head of ``struct ggml_tensor`` (ggml.h of the llama.cpp llama-cpp-python 0.3.36 vendors)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


_NAME_OFFSET = _GgmlTensor.name.offset
_RESULT_NORM = b"result_norm\0"  # with its terminator: "result_norm-3" is not it
_GGML_TYPE_F32 = 0


class _FinalNormCapture:
    """``cb_eval``: copy ``result_norm``'s rows, then end the graph there (the head is ours)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.stop = True  # False: observe only, the graph (head included) runs on -- for tests
        self.rows: list = []  # one [n_outputs, d] tensor per ubatch of the current eval
        self.error: str | None = None
        self.fn = llama_cpp.ggml_backend_sched_eval_callback(self._callback)  # kept alive with us

    def _callback(self, tensor, ask, user_data) -> bool:
        if ctypes.string_at(tensor + _NAME_OFFSET, len(_RESULT_NORM)) != _RESULT_NORM:
            return not ask  # observe nothing else; compute on
        if ask:
            return True
        t = _GgmlTensor.from_address(tensor)
        n, d = int(t.ne[1]), int(t.ne[0])
        if t.type != _GGML_TYPE_F32 or d != self.dim or t.nb[1] != 4 * d or t.ne[2] != 1 or t.ne[3] != 1:
            self.error = (f"result_norm is type {t.type}, ne {list(t.ne)}, nb {list(t.nb)}: expected "
                          f"contiguous float32 [n, {self.dim}]")
            return False
        data = (ctypes.c_float * (n * d)).from_address(t.data) if n else None
        self.rows.append(torch.frombuffer(data, dtype=torch.float32).view(n, d).clone() if n
                         else torch.empty(0, d))
        return not self.stop  # stop: the output matmul (and any soft-cap) after the norm is never computed


def _gguf_softcap(llama) -> float | None:
    """The model's final logit soft-cap from its GGUF metadata (Gemma 2 has one; Gemma 3 none)."""
    meta = getattr(llama, "metadata", {}) or {}
    arch = meta.get("general.architecture", "")
    value = float(meta.get(f"{arch}.final_logit_softcapping", 0) or 0)
    return value if value > 0 else None


def _int64_bytes(prefix) -> bytes | None:
    """A 1-D contiguous int64 CPU tensor's bytes (one copy), or None for anything else (then compared as a list)."""
    if type(prefix) is torch.Tensor and prefix.dtype is torch.int64 and prefix.is_cpu and prefix.dim() == 1 \
            and prefix.is_contiguous():
        return ctypes.string_at(prefix.data_ptr(), 8 * prefix.shape[0])
    return None


def _clear_memory(ctx) -> None:
    if hasattr(llama_cpp, "llama_memory_clear") and hasattr(llama_cpp, "llama_get_memory"):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    elif hasattr(llama_cpp, "llama_kv_self_clear"):
        llama_cpp.llama_kv_self_clear(ctx)
    else:
        llama_cpp.llama_kv_cache_clear(ctx)


class LlamaCppStep:
    """One llama-cpp-python ``Llama`` with its KV cache, as speculative-decoding callbacks.

    Parameters
    ----------
    llama : llama_cpp.Llama
        Made with ``logits_all=True``; its context is driven directly.
    temperature, top_k, top_p, min_p : warping, as ``spec_verify.LogitsWarping``
        ``temperature=0`` is greedy (the draft takes the argmax, returns no rows).
    generator : torch.Generator, optional
        The draft's uniforms (one per drawn token).
    sv : module, optional
        The spec-verify kernel (``load_sv()`` when None).
    hidden : bool, default False, keyword only
        ``target_step`` returns the last hidden states ``[k + 1, d]`` float32
        instead of logits, llama.cpp never computes its head, and the adapter
        carries ``head`` for ``verify_hidden`` (module docstring, "Hidden
        states"). Target only: ``draft_step`` needs logits and refuses.
    head : sv.LMHead, optional, keyword only
        With ``hidden=True``: the head to carry (default
        ``sv.LMHead.from_gguf(llama.model_path)`` with the file's soft-cap).

    Attributes
    ----------
    warping : sv.LogitsWarping
        Read by ``SpeculativeDecoder`` from the bound callbacks.
    head : sv.LMHead or None
        With ``hidden=True``, the head ``SpeculativeDecoder`` verifies the
        hidden states with (it reads it from the bound ``target_step``).
    decode_calls, tokens_fed, positions_removed, rollbacks : int
        ``llama_decode`` calls, tokens evaluated, KV positions removed by
        sequence removal, and removals, since construction or ``reset()``.
    decode_seconds : float
        Wall time inside ``llama_decode`` (the rest of a callback's time is
        the adapter's Python and the draft's sampling).
    """

    def __init__(self, llama, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None, sv=None,
                 hidden=False, head=None):
        self.sv = sv if sv is not None else load_sv()
        self.warping = self.sv.LogitsWarping(temperature, top_k, top_p, min_p)
        self.greedy = self.warping.greedy
        self.generator = generator
        self._sample_kwargs = dict(self.warping.kwargs(), generator=generator)
        self.llama = llama
        self.ctx = llama.ctx
        self.head = None
        self._capture = self._own_ctx = None
        if hidden:
            self._init_hidden(head)
        elif head is not None:
            raise ValueError("head= is for hidden=True (the adapter then returns hidden states)")
        self.n_vocab = int(llama.n_vocab())
        self.n_ctx = int(llama.n_ctx())
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.seq_rm_name, self._seq_rm = seq_rm_function()
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._free_batch = llama_cpp.llama_batch_free  # kept: module globals may be gone at interpreter exit
        self._draft_rows = torch.empty(0, self.n_vocab)
        self._logits_at, self._logits_views = None, {}  # _logits_view
        self.reset()

    def _init_hidden(self, head) -> None:
        """An own context whose eval callback stops every graph at the final norm."""
        dim = int(llama_cpp.llama_model_n_embd(self.llama.model))
        if head is None:
            head = self.sv.LMHead.from_gguf(self.llama.model_path, softcap=_gguf_softcap(self.llama))
        if not isinstance(head, self.sv.LMHead):
            raise TypeError(f"head must be an sv.LMHead, got {type(head).__name__}")
        if head.dim != dim or head.vocab != int(self.llama.n_vocab()):
            raise ValueError(f"head {head} does not match the model (d = {dim}, V = {self.llama.n_vocab()})")
        self._capture = _FinalNormCapture(dim)
        params = llama_cpp.llama_context_params.from_buffer_copy(self.llama.context_params)
        params.cb_eval = self._capture.fn
        params.cb_eval_user_data = None
        ctx = llama_cpp.llama_init_from_model(self.llama.model, params)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed for the hidden-state context")
        self.ctx = self._own_ctx = ctx
        self._free_ctx = llama_cpp.llama_free
        self.head = head

    def __del__(self):
        batch = getattr(self, "_batch", None)
        if batch is not None:
            self._batch = None
            self._free_batch(batch)
        ctx = getattr(self, "_own_ctx", None)
        if ctx is not None:
            self._own_ctx = None
            self._free_ctx(ctx)

    def reset(self) -> None:
        """Empty the context's memory; forget the record and the counters."""
        _clear_memory(self.ctx)
        self._cached = array.array("q")  # the tokens the KV cache holds, positions 0..n-1 (int64: compared as bytes, _logits_after)
        self.decode_calls = 0
        self.tokens_fed = 0
        self.positions_removed = 0
        self.rollbacks = 0
        self.decode_seconds = 0.0

    # -- callbacks -------------------------------------------------------------

    def draft_step(self, prefix: torch.Tensor, k: int):
        """``k`` tokens after ``prefix``: ``(tokens [k] int64, logits [k, V] float32 or None)``."""
        if self.head is not None:
            raise ValueError("a hidden=True adapter is a target: its draft_step would need logits rows")
        logits = self._logits_after(prefix, [], rows=1)[0]
        tokens = []
        rows = None
        if not self.greedy:
            if self._draft_rows.shape[0] < k:
                self._draft_rows = torch.empty(k, self.n_vocab)
            rows = self._draft_rows[:k]
        for i in range(k):
            token = self._pick(logits)
            tokens.append(token)
            if rows is not None:
                rows[i].copy_(logits)  # the next eval overwrites llama.cpp's buffer
            if i + 1 < k:
                logits = self._feed([token], rows=1)[0]
        return torch.tensor(tokens, dtype=torch.int64), rows

    def target_step(self, prefix: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
        """Raw logits ``[len(proposed) + 1, V]`` float32 from one eval: a view of llama.cpp's buffer, valid until the next eval.

        With ``hidden=True``: the hidden states ``[len(proposed) + 1, d]`` float32 (a copy) instead.
        """
        tail = proposed.tolist()
        return self._logits_after(prefix, tail, rows=len(tail) + 1)

    # -- sampling --------------------------------------------------------------

    def _pick(self, logits: torch.Tensor) -> int:
        if self.greedy:
            return int(torch.argmax(logits))
        return int(self.sv.sample_draft(logits, **self._sample_kwargs))

    # -- KV cache --------------------------------------------------------------

    def _logits_after(self, prefix: torch.Tensor, tail: list, rows: int) -> torch.Tensor:
        """The last ``rows`` rows of ``prefix + tail``: the cache kept as far as it agrees, the rest fed.

        The prefix is compared as bytes (``_int64_bytes``), not as a list: a decode step's prefix
        is every token so far, and ``tolist()`` plus a list compare is O(L) in Python objects --
        ~160 us at 3,000 tokens right after an eval against ~45 us for one copy of its bytes and a
        memcmp (AMD EPYC Zen 3), paid by every plain step and every round.
        """
        raw = _int64_bytes(prefix)
        cached = self._cached
        n = len(raw) // 8 if raw is not None else 0
        keep = max(0, min(len(cached), n + len(tail) - rows))
        if raw is None or keep > n:  # not a plain int64 prefix (or the rows end inside it): by lists
            return self._logits_for_last_rows(prefix.tolist() + tail, rows)
        if not raw.startswith(memoryview(cached)[:keep]):  # one memcmp in the usual case; else find the split
            ids = array.array("q", raw[: 8 * keep])
            keep = next(i for i in range(keep) if cached[i] != ids[i])
        self._rollback(keep)
        return self._feed(array.array("q", raw[8 * keep:]).tolist() + tail, rows)

    def _logits_for_last_rows(self, seq: list, rows: int) -> torch.Tensor:
        cached = self._cached
        keep = min(len(cached), len(seq) - rows)
        if cached[:keep].tolist() != seq[:keep]:  # one C-speed compare in the usual case; else find the split
            keep = next(i for i in range(keep) if cached[i] != seq[i])
        self._rollback(keep)
        return self._feed(seq[keep:], rows)

    def _rollback(self, keep: int) -> None:
        """Remove positions ``[keep, inf)`` of sequence 0 from the KV cache (llama.cpp's own removal)."""
        held = len(self._cached)
        if keep >= held:
            return
        if not self._seq_rm(self.ctx, 0, keep, -1):
            raise RuntimeError(f"{self.seq_rm_name}(seq 0, {keep}, -1) failed")
        self.positions_removed += held - keep
        self.rollbacks += 1
        del self._cached[keep:]

    def _feed(self, tokens: list, rows: int) -> torch.Tensor:
        """Eval ``tokens`` on top of the cache; float32 logits of the last ``rows`` (a view of llama.cpp's buffer)."""
        n = len(tokens)
        if rows > self.n_batch:  # the rows must come from one eval's output buffer
            raise ValueError(f"{rows} logits rows asked for, more than one eval gives (n_batch={self.n_batch})")
        if len(self._cached) + n > self.n_ctx:
            raise ValueError(f"the sequence ({len(self._cached) + n} tokens) outgrows the context (n_ctx={self.n_ctx})")
        if self._capture is not None:
            self._capture.rows.clear()
        start = 0
        while start < n:  # chunks of at most n_batch tokens (a long prompt)
            end = min(n, start + self.n_batch)
            self._decode(tokens[start:end], len(self._cached), want=max(0, rows - (n - end)))
            self._cached.extend(tokens[start:end])
            start = end
        if self._capture is not None:
            return self._captured_rows(rows)
        return self._logits_view(rows)

    def _logits_view(self, rows: int) -> torch.Tensor:
        """Zero copy: the ``[rows, V]`` rows llama.cpp wrote for the last batch's outputs.

        One tensor per row count, kept while llama.cpp's output buffer stays where it is. Why:
        ``np.ctypeslib.as_array`` builds a ctypes array type per call, ~80 us after an eval has
        evicted the caches against ~35 us for the buffer's address and a dict (AMD EPYC Zen 2): ~1%
        of a tiny model's step, paid by every plain step and every round alike.
        """
        ptr = llama_cpp.llama_get_logits(self.ctx)
        at = ctypes.cast(ptr, ctypes.c_void_p).value
        if at != self._logits_at:  # a new buffer (llama.cpp grew its outputs): the old views are stale
            self._logits_at, self._logits_views = at, {}
        view = self._logits_views.get(rows)
        if view is None:
            view = self._logits_views[rows] = torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab)))
        return view

    def _captured_rows(self, rows: int) -> torch.Tensor:
        """The last ``rows`` hidden states the eval callback copied (one block per ubatch)."""
        cap = self._capture
        if cap.error is not None:
            error, cap.error = cap.error, None
            raise RuntimeError(f"llama.cpp's graph: {error}")
        if not cap.rows:
            raise RuntimeError(f"llama.cpp's graph for {self.llama.model_path} has no tensor named result_norm: "
                               "hidden=True cannot end it at the final norm (use the adapter without hidden)")
        hidden = cap.rows[0] if len(cap.rows) == 1 else torch.cat(cap.rows)
        if hidden.shape[0] < rows:
            raise RuntimeError(f"the eval produced {hidden.shape[0]} hidden rows, {rows} were asked for")
        return hidden[hidden.shape[0] - rows:]

    def _decode(self, tokens: list, pos0: int, want: int) -> None:
        b = self._batch
        n = len(tokens)
        b.n_tokens = n
        tok, pos, nseq, seq, logit = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        first_out = n - want
        for i, t in enumerate(tokens):
            tok[i] = t
            pos[i] = pos0 + i
            nseq[i] = 1
            seq[i][0] = 0
            logit[i] = i >= first_out
        self.decode_calls += 1
        self.tokens_fed += n
        t0 = time.perf_counter()
        status = llama_cpp.llama_decode(self.ctx, b)
        self.decode_seconds += time.perf_counter() - t0
        if status != 0:
            # Nothing is recorded as cached; drop whatever the failed eval left.
            self._seq_rm(self.ctx, 0, pos0, -1)
            raise RuntimeError(f"llama_decode returned {status}")


def llama_step_pair(draft_llama, target_llama, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, generator=None,
                    *, sv=None):
    """``(draft_step, target_step)`` for two ``Llama`` objects (``logits_all=True``) under one warping.

    The two must share one vocabulary. ``temperature=0`` (the default) is
    greedy. Bound methods of two ``LlamaCppStep`` adapters (reach them via
    ``__self__``), whose ``warping`` ``SpeculativeDecoder`` reads.
    """
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    draft = LlamaCppStep(draft_llama, generator=generator, sv=sv, **warp)
    target = LlamaCppStep(target_llama, sv=draft.sv, **warp)
    if draft.n_vocab != target.n_vocab:
        raise ValueError(f"the draft's vocabulary ({draft.n_vocab}) differs from the target's ({target.n_vocab})")
    return draft.draft_step, target.target_step
