"""Hidden states in: ``verify_hidden`` (and ``verify_hidden_batched``) and ``sample_hidden``, the LM head inside the op.

The target's last hidden states and its ``LMHead`` replace the ``[K+1, V]``
logits: the C++ op (``csrc/ops_hidden.cpp``) reads the head's weights once
for all K+1 rows and keeps per row only what the decision needs (DESIGN.md,
Note [LM head logits]). The decisions are ``verify_logits``' on the head's
logits -- one defined function, the same on every ISA, in the reference and
at any thread count -- so greedy speculative decoding through
``verify_hidden`` emits exactly what plain greedy decoding through
``sample_hidden`` emits.

Where each call runs:

* the one-pass C++ op: CPU tensors, no soft-cap, ``method="token"``, point-mass
  drafts (``draft_logits=None``), greedy or temperature only (no top-k,
  top-p, min-p); ``verify_hidden_batched`` makes one pass for the rows of
  every sequence;
* other CPU calls (top-k, top-p, min-p, draft logits, block verification, a
  soft-capped head): every row's logits by one pass of the C++
  ``hidden_logits`` (the reference's logits bit for bit, the soft-cap applied
  by the reference's own expression), then ``verify_logits`` (or its batched
  form, or ``sample_draft``) on them -- the C++ ops of logits in. The
  ``[rows, V]`` logits are written here, unlike the one-pass op: a streaming
  candidate set for the cuts is not built yet. Bounded: while the logits are
  at most the head's own bytes (Gemma's Q8_0 head: 170 rows), else
  the reference's decision loop over rows computed by ``hidden_logits`` one
  when first read (a pass over the weights per row);
* another device: the pure-torch reference (``hidden_reference.py``).
"""

from __future__ import annotations

import torch

from . import hidden_reference
from ._dispatch import runs_in_cpp
from ._ops import ops
from .lm_head import LMHead, softcapped
from .logits import point_mass_rows, sample_draft, verify_logits, verify_logits_batched

__all__ = ["verify_hidden", "verify_hidden_batched", "sample_hidden"]


def _temperature_only(warp, vocab: int) -> bool:
    # What the one-pass op implements: greedy, or temperature with no cut.
    return warp.greedy or ((warp.top_k == 0 or warp.top_k >= vocab) and warp.top_p == 1.0
                           and warp.min_weight == 0.0)


def _one_pass(cpu: bool, head: LMHead, draft_logits, method: str, warp) -> bool:
    # The calls the one-pass C++ ops take (the module's docstring).
    return cpu and head.softcap is None and draft_logits is None and method == "token" and \
        _temperature_only(warp, head.vocab)


def _cpp_logits(head: LMHead):
    # One row (or a few) of the head's logits by the C++ op: reference_logits bit for bit.
    return lambda h: ops.hidden_logits(h, head.weight, head.bias, head.format_code, head.dim)


def _all_rows_fit(rows: int, head: LMHead) -> bool:
    # The [rows, V] float32 logits of one pass are at most the head's own bytes: never more memory
    # than the weights being read (the module's docstring).
    return rows * head.vocab * 4 <= head.weight.numel() * head.weight.element_size()


def _all_logits(hidden: torch.Tensor, head: LMHead) -> torch.Tensor:
    """``[n, V]`` float32: the head's logits of ``hidden [n, d]`` by one pass over the weights.

    ``reference_logits`` bit for bit: the C++ ``hidden_logits``, then the
    reference's own soft-cap (``lm_head.softcapped``).
    """
    return softcapped(ops.hidden_logits(hidden, head.weight, head.bias, head.format_code, head.dim), head.softcap)


def verify_hidden(
    hidden: torch.Tensor,
    head: LMHead,
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    method: str = "token",
) -> tuple[int, int]:
    """Speculative verification from the target's hidden states and its LM head.

    Equal to ``verify_logits(logits, draft_logits, draft_tokens, ...)`` with
    ``logits`` the head's logits of ``hidden`` (DESIGN.md, Note [LM head
    logits]), and, when ``draft_logits`` is None, to point-mass drafts (as
    ``verify_sampled_ragged`` without ``draft_probs``): accept ``t`` iff
    ``u * P < p(t)``, a correction drawn from ``p`` with ``t`` removed.

    Parameters
    ----------
    hidden : torch.Tensor
        ``[K+1, d]`` float32, bfloat16 or float16: the target's last hidden
        states (after the final norm) at the K draft positions and the bonus
        position.
    head : LMHead
        The target's output projection (``LMHead(weight)``, ``LMHead.from_gguf``).
    draft_tokens : torch.Tensor
        ``[K]`` int64 or int32 in ``[0, V)``.
    draft_logits : torch.Tensor, optional
        ``[K, V]``: the draft's logits each token was sampled from (warped as
        the target). None: point-mass drafts (n-gram, prompt lookup, greedy drafts).
    temperature, top_k, top_p, min_p : optional
        As in ``verify_logits``; temperature 0 is greedy.
    generator : torch.Generator, optional
        Source of the ``K+1`` uniforms, as in ``verify_logits``.
    uniforms : torch.Tensor, optional
        ``[K+1]`` float64 in ``[0, 1)``.
    method : {"token", "block"}, default "token"
        As in ``verify_logits``.

    Returns
    -------
    tuple[int, int]
        ``(n_accepted, next_token)``.

    Raises
    ------
    TypeError
        ``head`` not an ``LMHead``; wrong dtypes; a warping argument that is not a number.
    ValueError
        Wrong shapes (``hidden`` not ``[K+1, d]``, ``draft_logits`` not
        ``[K, V]``); bad warping arguments or uniforms; NaN or ``+inf`` logits
        (or NaN at temperature 0) in a row that is read.
    IndexError
        A draft token outside ``[0, V)``.

    Examples
    --------
    >>> import torch
    >>> head = LMHead(torch.eye(3))
    >>> hidden = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    >>> verify_hidden(hidden, head, torch.tensor([1]), temperature=0.0)
    (1, 0)

    See Also
    --------
    verify_hidden_batched : B sequences of ragged draft lengths, one pass over the head for all.
    """
    warp, _, _ = hidden_reference.check_hidden_call(hidden, head, draft_tokens, draft_logits, temperature, top_k,
                                                    top_p, min_p, generator, method)
    cpu = runs_in_cpp(hidden, draft_tokens, draft_logits, uniforms, head.weight)
    if _one_pass(cpu, head, draft_logits, method, warp):
        n_accepted, next_token = ops.verify_hidden(hidden, head.weight, head.bias, draft_tokens, head.format_code,
                                                   head.dim, float(temperature), uniforms, generator).tolist()
        return n_accepted, next_token
    if cpu and _all_rows_fit(hidden.shape[0], head):
        logits = _all_logits(hidden, head)  # [K+1, V]
        draft = point_mass_rows(draft_tokens, logits, logits=True) if draft_logits is None else draft_logits.float()
        return verify_logits(logits, draft, draft_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, generator=generator, uniforms=uniforms, method=method)
    logits_fn = _cpp_logits(head) if cpu and head.softcap is None else None
    return hidden_reference.verify_hidden(
        hidden, head, draft_tokens, draft_logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        generator=generator, uniforms=uniforms, method=method, logits_fn=logits_fn,
    )


def verify_hidden_batched(
    hidden: torch.Tensor,
    head: LMHead,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    method: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify_hidden`` for B sequences at once, with ragged draft lengths.

    Sequence ``b`` is exactly ``verify_hidden(hidden[b, :k_b+1], head,
    draft_tokens[b, :k_b], draft_logits[b, :k_b], ..., uniforms=uniforms[b,
    :k_b+1])``, the layout of ``verify_logits_batched``; its rows past
    ``k_b`` are padding, never read. On the CPU, with point-mass drafts at
    temperature only (or greedy), one C++ op reads the head's weights once for
    the rows of every sequence (DESIGN.md, Note [LM head logits]), then decides
    the sequences in order; other calls run the reference per sequence.

    Parameters
    ----------
    hidden : torch.Tensor
        ``[B, K+1, d]`` float32, bfloat16 or float16: each sequence's last
        hidden states at its draft positions and its bonus position (row
        ``k_b`` is sequence ``b``'s bonus position).
    head : LMHead
        The target's output projection.
    draft_tokens : torch.Tensor
        ``[B, K]`` int64 or int32; the first ``k_b`` of row ``b`` in ``[0, V)``.
    num_draft_tokens : torch.Tensor, optional
        ``[B]`` int64 or int32, each ``k_b`` in ``[0, K]`` (None: all K).
    draft_logits : torch.Tensor, optional
        ``[B, K, V]``: the draft's logits each token was sampled from. None:
        point-mass drafts.
    temperature, top_k, top_p, min_p : optional
        As in ``verify_logits``, one warping for the whole batch; temperature 0 is greedy.
    generator : torch.Generator, optional
        Source of ``B * (K+1)`` uniforms when ``uniforms`` is None, as
        ``torch.rand(B, K+1, dtype=torch.float64, generator=generator)``
        (none at temperature 0).
    uniforms : torch.Tensor, optional
        ``[B, K+1]`` float64 in ``[0, 1)``; sequence ``b`` uses
        ``uniforms[b, :k_b]`` for its tests and ``uniforms[b, k_b]`` for its
        final draw.
    method : {"token", "block"}, default "token"
        As in ``verify_logits``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64.

    Raises
    ------
    TypeError
        ``head`` not an ``LMHead``; wrong dtypes; a warping argument that is not a number.
    ValueError
        Wrong shapes (``hidden`` not ``[B, K+1, d]``, ``num_draft_tokens``
        not ``[B]`` or a count outside ``[0, K]``, ``draft_logits`` not
        ``[B, K, V]``); bad warping arguments or uniforms; NaN or ``+inf``
        logits (or NaN at temperature 0) in a row that is read, named
        ``logits[b, i, x]``.
    IndexError
        A draft token (among the first ``k_b`` of its sequence) outside ``[0, V)``.

    See Also
    --------
    verify_hidden : one sequence.
    verify_logits_batched : the same layout, logits in.

    Examples
    --------
    >>> import torch
    >>> head = LMHead(torch.eye(3))
    >>> hidden = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]], [[2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]])
    >>> n, nxt = verify_hidden_batched(hidden, head, torch.tensor([[1], [1]]), torch.tensor([1, 0]),
    ...                                temperature=0.0)
    >>> n.tolist(), nxt.tolist()
    ([1, 0], [0, 0])
    """
    warp, _, _ = hidden_reference.check_hidden_batched_call(hidden, head, draft_tokens, num_draft_tokens,
                                                            draft_logits, temperature, top_k, top_p, min_p,
                                                            generator, method)
    cpu = runs_in_cpp(hidden, draft_tokens, num_draft_tokens, draft_logits, uniforms, head.weight)
    if _one_pass(cpu, head, draft_logits, method, warp):
        return ops.verify_hidden_batched(hidden, head.weight, head.bias, draft_tokens, num_draft_tokens,
                                         head.format_code, head.dim, float(temperature), uniforms, generator)
    batch, width = hidden.shape[0], hidden.shape[1]
    if cpu and _all_rows_fit(batch * width, head):
        logits = _all_logits(hidden.reshape(batch * width, -1), head).view(batch, width, head.vocab)  # [B, K+1, V]
        draft = point_mass_rows(draft_tokens, logits, logits=True) if draft_logits is None else draft_logits.float()
        return verify_logits_batched(logits, draft, draft_tokens, num_draft_tokens, temperature=temperature,
                                     top_k=top_k, top_p=top_p, min_p=min_p, generator=generator, uniforms=uniforms,
                                     method=method)
    logits_fn = _cpp_logits(head) if cpu and head.softcap is None else None
    return hidden_reference.verify_hidden_batched(
        hidden, head, draft_tokens, num_draft_tokens, draft_logits, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, generator=generator, uniforms=uniforms, method=method, logits_fn=logits_fn,
    )


def sample_hidden(
    hidden: torch.Tensor,
    head: LMHead,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """The plain decoding step on the same head: one token per row of ``hidden``.

    Equal to ``sample_draft(logits, ...)`` on the head's logits of
    ``hidden``: row ``j`` drawn with ``uniforms[j]`` by inverse CDF over its
    warped weights, its argmax at temperature 0 (lowest id on ties).

    Parameters
    ----------
    hidden : torch.Tensor
        ``[n, d]`` float32, bfloat16 or float16.
    head : LMHead
        The output projection.
    temperature, top_k, top_p, min_p : optional
        As in ``sample_draft``.
    generator : torch.Generator, optional
        Source of the ``n`` uniforms when ``uniforms`` is None (none at temperature 0).
    uniforms : torch.Tensor, optional
        ``[n]`` float64 in ``[0, 1)``.

    Returns
    -------
    torch.Tensor
        ``[n]`` int64 token ids.

    Raises
    ------
    TypeError
        ``head`` not an ``LMHead``; wrong dtypes.
    ValueError
        ``hidden`` not ``[n, d]``; bad warping arguments or uniforms; NaN /
        ``+inf`` logits.

    Examples
    --------
    >>> import torch
    >>> sample_hidden(torch.tensor([[0.0, 2.0, 1.0]]), LMHead(torch.eye(3)), temperature=0.0).tolist()
    [1]
    """
    warp = hidden_reference.check_sample_call(hidden, head, temperature, top_k, top_p, min_p, generator)
    cpu = runs_in_cpp(hidden, uniforms, head.weight)
    if cpu and head.softcap is None and _temperature_only(warp, head.vocab):
        return ops.sample_hidden(hidden, head.weight, head.bias, head.format_code, head.dim, float(temperature),
                                 uniforms, generator)
    if cpu and hidden.shape[0] and _all_rows_fit(hidden.shape[0], head):
        return sample_draft(_all_logits(hidden, head), temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, generator=generator, uniforms=uniforms).view(-1)
    logits_fn = _cpp_logits(head) if cpu and head.softcap is None else None
    return hidden_reference.sample_hidden(hidden, head, temperature=temperature, top_k=top_k, top_p=top_p,
                                          min_p=min_p, generator=generator, uniforms=uniforms, logits_fn=logits_fn)
