"""Logits in: ``verify_logits``, ``sample_draft`` and ``warp_probs``.

The warping (temperature, top-k, top-p, min-p; defined in ``warping.py``) is
applied inside the op, identically to the draft and the target, so a caller
cannot verify against a distribution the draft did not sample from. CPU
tensors run the C++ ops (``csrc/ops_logits.cpp``), other devices the
pure-torch reference (``reference.py``).
"""

from __future__ import annotations

import torch

from . import reference
from ._checks import check_flag, check_generator, ragged_warp_types, warp_scalars
from ._dispatch import eager, runs_in_cpp
from ._ops import ops

__all__ = ["verify_logits", "verify_logits_batched", "verify_logits_ragged", "sample_draft", "warp_probs"]


def verify_logits(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    method: str = "token",
) -> tuple[int, int]:
    """Speculative sampling from raw logits, warped identically for draft and target.

    Each read row of ``target_logits`` and ``draft_logits`` is warped --
    temperature, then top-k, then top-p, then min-p (the order of
    transformers' logits processors) -- and the draft tokens are verified
    exactly as ``verify_sampled`` verifies them against the warped target
    and draft distributions. Since both sides are warped here, by one
    definition, the caller cannot verify against a distribution the draft
    did not sample from. Draw the draft tokens with ``sample_draft`` (same
    warping arguments) and the emitted tokens are distributed exactly as
    sampling from the warped target.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[K+1, V]`` float32, float16 or bfloat16 (read as float32): the
        target's logits at the K draft positions and the bonus position.
        Finite or ``-inf``; NaN, ``+inf``, or a row that is ``-inf``
        everywhere is an error (in a row that is read).
    draft_logits : torch.Tensor
        ``[K, V]``, same dtype: the logits each draft token was sampled from.
    draft_tokens : torch.Tensor
        ``[K]`` int64 or int32 in ``[0, V)``; each must lie in the support of
        its warped draft row. ``K = 0`` is valid.
    temperature : float, default 1.0
        ``>= 0`` and finite. ``0`` is greedy: every warped row is the point
        mass on its argmax (lowest id on ties), so this is ``verify_greedy``
        on the target logits, each draft token must be its draft row's
        argmax, and no uniform is used (the generator is not advanced).
    top_k : int, default 0
        Keep the tokens whose logit is ``>=`` the ``top_k``-th largest (every
        tie with it stays). ``0``, or ``>= V``: off.
    top_p : float, default 1.0
        In ``(0, 1]``. Keep the smallest head of the top-k set, ranked by
        logit, whose mass reaches ``top_p``, plus every token tied with its
        last logit. ``1``: off.
    min_p : float, default 0.0
        In ``[0, 1)``. Keep the tokens with ``p(x) >= min_p * max p``. ``0``: off.
    generator : torch.Generator, optional
        Source of the ``K+1`` uniforms when ``uniforms`` is None (the default
        CPU generator when None): the draws of
        ``torch.rand(K+1, dtype=torch.float64, generator=generator)``.
    uniforms : torch.Tensor, optional
        ``[K+1]`` float64 in ``[0, 1)``: ``uniforms[i]`` decides draft token
        ``i``, ``uniforms[K]`` drives the final draw. Validated even at
        temperature 0, where it is not used.
    method : {"token", "block"}, default "token"
        ``"token"``: token-wise rejection sampling (``verify_sampled``);
        ``"block"``: block verification (``verify_block``) on the same warped
        weights and uniforms. Ignored at temperature 0 (greedy).

    Returns
    -------
    tuple[int, int]
        ``(n_accepted, next_token)``.

    Notes
    -----
    The warping is defined in ``warping.py`` (its module docstring):
    weights ``exp_sv((x - max) / T)``, a float32 exponential that the C++
    and the reference compute bit for bit, and float64 mass sums; the
    result equals ``verify_sampled(warp_probs(target_logits, ...,
    normalize=False), warp_probs(draft_logits, ..., normalize=False),
    draft_tokens)`` for the same uniforms. No full sort of the vocabulary:
    top-k selects from a bounded candidate set, top-p walks the top-k set or
    one bin of a histogram. Rows after the first rejection are never read,
    and so never validated.

    Raises
    ------
    ValueError
        a warping argument out of range (``temperature < 0`` or NaN,
        ``top_k < 0``, ``top_p`` outside ``(0, 1]``, ``min_p`` outside
        ``[0, 1)``); wrong rank or shapes; NaN or ``+inf`` logits, or a row
        that is ``-inf`` everywhere, among the rows read; a draft token
        outside its warped draft support; bad uniforms. ``TypeError``: a
        wrong dtype, or a warping argument that is not a number.
        ``IndexError``: a draft token outside ``[0, V)``.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    >>> draft = torch.tensor([[1.0, 2.0, 0.0]])
    >>> u = torch.tensor([0.3, 0.5], dtype=torch.float64)
    >>> # top_k=2 keeps tokens {0, 1} of row 0: q_0(1) = 0.73, p_0(1) = 0.27, and
    >>> # 0.3 * 0.73 < 0.27 accepts token 1. The bonus row [0, 0, 3] keeps all three
    >>> # tokens (the tie at the cut-off stays whole); u = 0.5 draws token 2.
    >>> verify_logits(target, draft, torch.tensor([1]), top_k=2, uniforms=u)
    (1, 2)
    >>> verify_logits(target, draft, torch.tensor([2]), top_k=2, uniforms=u)
    Traceback (most recent call last):
    ...
    ValueError: draft_tokens[0] = 2 is outside the support of the warped draft distribution ...
    """
    # Types here (cheaply; the schema's own errors name no argument); values in the op.
    temperature, top_k, top_p, min_p = warp_scalars(temperature, top_k, top_p, min_p)
    check_generator(generator)
    block = reference._check_method(method)
    if runs_in_cpp(target_logits, draft_logits, draft_tokens, uniforms):
        args = (target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, min_p, uniforms, generator,
                block)
        if eager():
            return ops.verify_logits_ints(*args)
        n_accepted, next_token = ops.verify_logits(*args).tolist()
        return n_accepted, next_token
    return reference.verify_logits(
        target_logits, draft_logits, draft_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, generator=generator, uniforms=uniforms, method=method,
    )


def verify_logits_batched(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    method: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify_logits`` for B sequences at once, with ragged draft lengths.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[B, K+1, V]`` float32, float16 or bfloat16.
    draft_logits : torch.Tensor
        ``[B, K, V]``, same dtype.
    draft_tokens : torch.Tensor
        ``[B, K]`` int64 or int32.
    num_draft_tokens : torch.Tensor, optional
        ``[B]``, each ``k_b`` in ``[0, K]`` (None: all K); entries past
        ``k_b`` are never read.
    temperature, top_k, top_p, min_p : optional
        As in ``verify_logits``, one warping for the whole batch.
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
        ``n_accepted [B]`` and ``next_token [B]``, int64; entry ``b`` equals
        ``verify_logits`` on sequence ``b``'s slices with its uniforms, at any
        thread count.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]]]).repeat(2, 1, 1)
    >>> draft = torch.tensor([[[1.0, 2.0, 0.0]]]).repeat(2, 1, 1)
    >>> u = torch.tensor([[0.3, 0.5], [0.9, 0.5]], dtype=torch.float64)
    >>> n, nxt = verify_logits_batched(target, draft, torch.tensor([[1], [1]]), top_k=2, uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([1, 0], [2, 0])
    """
    # Types here (cheaply; the schema's own errors name no argument); values in the op.
    temperature, top_k, top_p, min_p = warp_scalars(temperature, top_k, top_p, min_p)
    check_generator(generator)
    if runs_in_cpp(target_logits, draft_logits, draft_tokens, num_draft_tokens, uniforms):
        return ops.verify_logits_batched(
            target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature, top_k, top_p, min_p,
            uniforms, generator, reference._check_method(method),
        )
    return reference.verify_logits_batched(
        target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, generator=generator, uniforms=uniforms, method=method,
    )


def verify_logits_ragged(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    bonus_tokens: torch.Tensor | None = None,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify_logits`` for B sequences laid out flat, as vLLM lays them out, each with its own warping.

    The layout of ``verify_sampled_ragged`` (``draft_tokens [T]``,
    ``cu_num_draft_tokens [B]``, target rows ``[T+B, V]`` or ``[T, V]`` with
    ``bonus_tokens``, uniforms ``[T+B]``); entry ``b`` is exactly
    ``verify_logits`` on sequence ``b``'s own rows, tokens and uniforms with
    sequence ``b``'s warping -- at temperature 0, greedy for that sequence.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[T+B, V]``, or ``[T, V]`` with ``bonus_tokens``; the rules of ``verify_logits``.
    draft_logits : torch.Tensor
        ``[T, V]``, same dtype: row ``j`` is what ``draft_tokens[j]`` was sampled from.
    draft_tokens : torch.Tensor
        ``[T]``, int64 or int32; each in its warped draft row's support.
    cu_num_draft_tokens : torch.Tensor
        ``[B]``, the inclusive cumulative sum of the draft counts.
    bonus_tokens : torch.Tensor, optional
        ``[B]``, in ``[0, V)``: emitted after a full acceptance instead of a
        bonus from a target row.
    temperature, top_k, top_p, min_p : scalar or torch.Tensor
        Each a scalar (every sequence alike) or a ``[B]`` tensor (floating;
        ``top_k`` integer), with ``verify_logits``' rules per sequence. A
        negative temperature is a ValueError.
    generator : torch.Generator, optional
        Source of the ``T+B`` uniforms when ``uniforms`` is None (none are
        drawn when every sequence is greedy).
    uniforms : torch.Tensor, optional
        ``[T+B]`` float64 in ``[0, 1)``, laid out as in ``verify_sampled_ragged``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64.

    Raises
    ------
    TypeError, ValueError, IndexError
        as ``verify_logits`` and ``verify_sampled_ragged``; a warping tensor
        of another length than B is a ValueError.

    See Also
    --------
    verify_logits : one sequence; entry ``b`` equals it on sequence ``b``'s slice.
    verify_logits_batched : the padded layout, one warping for the batch.
    verify_sampled_ragged : the layout, on probability rows.

    Examples
    --------
    >>> import torch
    >>> # Sequence 0 is verify_logits' example (k = 1, top_k = 2): token 1 accepted,
    >>> # bonus 2. Sequence 1 (k = 0) runs at temperature 0: its bonus is the argmax, 1.
    >>> target = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0], [0.0, 5.0, 1.0]])
    >>> draft = torch.tensor([[1.0, 2.0, 0.0]])
    >>> u = torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64)
    >>> n, nxt = verify_logits_ragged(target, draft, torch.tensor([1]), torch.tensor([1, 1]),
    ...                               temperature=torch.tensor([1.0, 0.0]), top_k=2, uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([1, 0], [2, 1])
    """
    values = ragged_warp_types(temperature, top_k, top_p, min_p)
    check_generator(generator)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    required = (target_logits, draft_logits, draft_tokens, cu_num_draft_tokens)
    # None for a required tensor goes to the reference, which names it (the
    # dispatcher would pass an undefined tensor).
    if all(isinstance(t, torch.Tensor) for t in required) and runs_in_cpp(*required, bonus_tokens, uniforms, *tensors):
        # Scalars broadcast to [B]; tensors converted to the schema's dtypes, their
        # lengths checked by the op (after the layout, as the reference does).
        batch = cu_num_draft_tokens.shape[0] if cu_num_draft_tokens.dim() == 1 else 0
        vectors = [v.to(dtype) if isinstance(v, torch.Tensor) else torch.full((batch,), v, dtype=dtype)
                   for v, dtype in zip(values, (torch.float64, torch.int64, torch.float64, torch.float64))]
        return ops.verify_logits_ragged(target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, *vectors,
                                        bonus_tokens, uniforms, generator)
    return reference.verify_logits_ragged(
        target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, bonus_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, generator=generator, uniforms=uniforms,
    )


def _as_rows(logits):
    # [..., V] -> [N, V] for the 2-D ops; None routes the call to the reference
    # (which names the argument for a non-tensor, a 0-d tensor or V = 0).
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or logits.shape[-1] == 0 or not logits.is_cpu:
        return None
    return logits.reshape(-1, logits.shape[-1])


def sample_draft(
    draft_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    return_probs: bool = False,
):
    """Draft tokens drawn from exactly the warped distribution ``verify_logits`` uses.

    Parameters
    ----------
    draft_logits : torch.Tensor
        ``[..., V]`` float32, float16 or bfloat16: one row per token to
        draw (usually ``[V]`` or ``[1, V]`` per autoregressive draft step,
        or ``[B, V]`` for a batch).
    temperature, top_k, top_p, min_p : optional
        The warping, as in ``verify_logits``; pass the same values to both.
    generator : torch.Generator, optional
        Source of the uniforms when ``uniforms`` is None (the default CPU
        generator when None): one per row, the draws of
        ``torch.rand(N, dtype=torch.float64, generator=generator)`` with N the
        number of rows (row-major). Using one generator for ``sample_draft``
        and ``verify_logits`` is fine: the draws are sequential, hence
        independent. At temperature 0 nothing is drawn.
    uniforms : torch.Tensor, optional
        float64 in ``[0, 1)`` with one entry per row (shape ``[...]`` or
        ``[N]``): row ``j`` draws with ``uniforms[j]``.
    return_probs : bool, default False
        Also return the warped draft probabilities ``[..., V]`` float32
        (``warp_probs``), e.g. for ``verify_sampled`` or the exact law.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        int64 tokens of shape ``draft_logits.shape[:-1]`` (a 0-d tensor for a
        ``[V]`` row), and the probabilities if ``return_probs``.

    Notes
    -----
    Row ``j``'s token is the inverse CDF of its warped weights in token
    order: the smallest id whose cumulative weight exceeds ``uniforms[j]``
    times the row's total (float64); a token of zero weight is never drawn.
    At temperature 0 it is the argmax (lowest id on ties).

    Raises
    ------
    ValueError, TypeError
        As ``verify_logits`` for the warping arguments, dtypes and logits;
        uniforms of the wrong count or outside ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[3.0, 2.0, 1.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    >>> # top_k=2: row 0 keeps {0, 1}; row 1 is a four-way tie at the cut-off, all kept.
    >>> sample_draft(logits, top_k=2, uniforms=torch.tensor([0.9, 0.6], dtype=torch.float64))
    tensor([1, 2])
    >>> sample_draft(logits[0], temperature=0)
    tensor(0)
    """
    temperature, top_k, top_p, min_p = warp_scalars(temperature, top_k, top_p, min_p)
    check_generator(generator)
    check_flag("return_probs", return_probs)
    rows = _as_rows(draft_logits)
    if rows is not None and runs_in_cpp(uniforms):
        flat_uniforms = None if uniforms is None else uniforms.reshape(-1)
        tokens = ops.sample_draft(rows, temperature, top_k, top_p, min_p, flat_uniforms, generator)
        tokens = tokens.reshape(draft_logits.shape[:-1])
    else:
        tokens = reference.sample_draft(
            draft_logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            generator=generator, uniforms=uniforms,
        )
    if return_probs:
        return tokens, warp_probs(draft_logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return tokens


def warp_probs(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    normalize: bool = True,
) -> torch.Tensor:
    """The warped distribution of each row of logits, as ``verify_logits`` sees it.

    Parameters
    ----------
    logits : torch.Tensor
        ``[..., V]`` float32, float16 or bfloat16.
    temperature, top_k, top_p, min_p : optional
        The warping, as in ``verify_logits``.
    normalize : bool, default True
        True: probabilities, ``w / sum(w)`` computed in float64 and rounded
        once to float32. False: the unnormalized weights ``w`` themselves
        (``exp_sv((x - max) / T)`` on the support, exactly 1 at the top
        token, 0 elsewhere) -- the very values ``verify_logits`` decides on.

    Returns
    -------
    torch.Tensor
        ``[..., V]`` float32. At temperature 0: the point mass on each row's
        argmax.

    Examples
    --------
    >>> import torch
    >>> warp_probs(torch.tensor([2.0, 1.0, 0.0, 0.0]), top_k=2)
    tensor([0.7311, 0.2689, 0.0000, 0.0000])
    >>> warp_probs(torch.tensor([2.0, 1.0, 0.0, 0.0]), top_p=0.8, normalize=False)
    tensor([1.0000, 0.3679, 0.0000, 0.0000])
    """
    temperature, top_k, top_p, min_p = warp_scalars(temperature, top_k, top_p, min_p)
    check_flag("normalize", normalize)
    rows = _as_rows(logits)
    if rows is None:
        return reference.warp_probs(logits, temperature, top_k, top_p, min_p, normalize)
    return ops.warp_probs(rows, temperature, top_k, top_p, min_p, normalize).reshape(logits.shape)


def point_mass_rows(tokens: torch.Tensor, target_rows: torch.Tensor, logits: bool) -> torch.Tensor:
    """The rows of a point-mass draft (``rows=None``): all mass on each draft token.

    ``[*lead, K, V]`` for ``tokens [*lead, K]``: probability rows of 0 with a 1
    at the token, or logits rows of -inf with a 0 there (which every warping
    keeps a point mass). Verifying them is the contract's rule at
    ``q = delta_t`` -- accept ``t`` with probability ``p(t)``, else draw from
    ``p`` with ``t`` removed -- exactly as ``verify_sampled_ragged`` does with
    ``draft_probs=None`` (DESIGN.md, "Ragged layout" and "Prompt lookup").
    """
    shape = (*tokens.shape, target_rows.shape[-1])
    fill, mark = (float("-inf"), 0.0) if logits else (0.0, 1.0)
    rows = torch.full(shape, fill, dtype=target_rows.dtype, device=target_rows.device)
    return rows.scatter_(-1, tokens.to(rows.device).unsqueeze(-1), mark)
