"""Probability rows in: ``verify_greedy``, ``verify_sampled`` and their batched forms.

Thin wrappers: CPU tensors run the C++ ops (``csrc/ops_probs.cpp``), other
devices the pure-torch reference (``reference.py``), which implements the
same contract (DESIGN.md). The glossary (accepted, correction and bonus
tokens, uniforms) is DESIGN.md's.
"""

from __future__ import annotations

import torch

from . import reference
from ._checks import check_generator
from ._dispatch import eager, runs_in_cpp
from ._ops import ops

__all__ = [
    "verify_greedy",
    "verify_sampled",
    "verify_greedy_batched",
    "verify_sampled_batched",
    "verify_block",
    "verify_block_batched",
    "verify_greedy_ragged",
    "verify_sampled_ragged",
    "build_info",
]


def verify_greedy(target_probs: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """Greedy (temperature 0) verification of K draft tokens.

    Accept ``draft_tokens[i]`` while it equals ``argmax(target_probs[i])``;
    at the first miss emit that argmax and stop; if all K match, emit
    ``argmax(target_probs[K])``. The emitted stream equals plain greedy
    decoding with the target.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]``, float32, float16 or bfloat16. Probabilities or logits:
        only the argmax of each row is read, compared in float32. ``-inf`` is
        allowed; NaN in a read row is an error.
    draft_tokens : torch.Tensor
        ``[K]``, int64 or int32, each in ``[0, V)``. ``K = 0`` is valid.

    Returns
    -------
    tuple[int, int]
        ``(n_accepted, next_token)`` with ``0 <= n_accepted <= K`` and
        ``0 <= next_token < V``.

    Notes
    -----
    Ties go to the lowest token id, exactly as ``torch.argmax``. Rows after
    the first miss are never read, and so never validated. Rows may be
    strided (a slice of a ``[T, V]`` logits tensor is fine); a row whose own
    elements are not contiguous is copied first.

    Raises
    ------
    TypeError
        wrong dtype. ``ValueError``: wrong rank or shapes that disagree, NaN
        in a read row, tensors on different devices. ``IndexError``: a draft
        token outside ``[0, V)``.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]])
    >>> verify_greedy(target, torch.tensor([1, 2]))   # 1 matches, 2 misses (argmax 0)
    (1, 0)
    """
    if runs_in_cpp(target_probs, draft_tokens):
        if eager():
            return ops.verify_greedy_ints(target_probs, draft_tokens)
        n_accepted, next_token = ops.verify_greedy(target_probs, draft_tokens).tolist()
        return n_accepted, next_token
    return reference.verify_greedy(target_probs, draft_tokens)


def verify_sampled(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    With ``p_i = target_probs[i] / sum(target_probs[i])`` and ``q_i`` likewise
    for ``draft_probs``: accept ``t_i = draft_tokens[i]`` iff
    ``u_i * q_i(t_i) < p_i(t_i)``; stop at the first rejection and emit a
    draw from ``norm(max(0, p_i - q_i))``; if all K are accepted emit a draw
    from ``p_K``. The emitted tokens are distributed exactly as sampling from
    the target, provided the draft tokens were sampled from ``draft_probs``.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]``, float32, float16 or bfloat16; finite, non-negative, each
        read row with positive sum. Rows need not be normalized: each is
        divided by its own sum, accumulated in float64.
    draft_probs : torch.Tensor
        ``[K, V]``, same dtype and rules as ``target_probs``. Must be the very
        distribution the draft tokens were sampled from (warped identically
        to the target: same temperature, top-k, top-p).
    draft_tokens : torch.Tensor
        ``[K]``, int64 or int32, in ``[0, V)``, with ``draft_probs[i, t_i] > 0``.
    generator : torch.Generator, optional
        Source of the ``K+1`` uniforms when ``uniforms`` is not given; the
        default CPU generator when None. The draws are those of
        ``torch.rand(K+1, dtype=torch.float64, generator=generator)``.
    uniforms : torch.Tensor, optional
        ``[K+1]`` float64 in ``[0, 1)``: ``uniforms[i]`` decides draft token
        ``i``; ``uniforms[K]`` drives the final draw. Overrides ``generator``.

    Returns
    -------
    tuple[int, int]
        ``(n_accepted, next_token)``.

    Notes
    -----
    The final draw is an inverse CDF in token order: the smallest id whose
    cumulative mass exceeds ``uniforms[K]`` times the row's total mass. A token
    of zero mass is never emitted. Rows after the first rejection are never
    read, and so never validated. Same uniforms, same result, whatever the
    thread count.

    Raises
    ------
    TypeError
        wrong dtype (``uniforms`` must be float64). ``ValueError``: wrong rank
        or shapes, a negative / NaN / inf entry or zero-sum row among the rows
        read, ``draft_probs[i, t_i] == 0``, uniforms outside ``[0, 1)`` or of
        the wrong length. ``IndexError``: a draft token outside ``[0, V)``.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    >>> draft = torch.tensor([[0.2, 0.8]])
    >>> # u_0 = 0.3: 0.3 * 0.8 = 0.24 < 0.4, so token 1 is accepted; the bonus
    >>> # draw from [0.5, 0.5] with u_1 = 0.75 lands on token 1.
    >>> verify_sampled(target, draft, torch.tensor([1]),
    ...                uniforms=torch.tensor([0.3, 0.75], dtype=torch.float64))
    (1, 1)
    """
    check_generator(generator)  # the schema's own error names no argument
    if runs_in_cpp(target_probs, draft_probs, draft_tokens, uniforms):
        if eager():
            return ops.verify_sampled_ints(target_probs, draft_probs, draft_tokens, uniforms, generator)
        n_accepted, next_token = ops.verify_sampled(
            target_probs, draft_probs, draft_tokens, uniforms, generator
        ).tolist()
        return n_accepted, next_token
    return reference.verify_sampled(
        target_probs, draft_probs, draft_tokens, generator=generator, uniforms=uniforms
    )


def verify_greedy_batched(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of B sequences at once, with ragged draft lengths.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[B, K+1, V]``, float32, float16 or bfloat16 (probabilities or logits).
    draft_tokens : torch.Tensor
        ``[B, K]``, int64 or int32.
    num_draft_tokens : torch.Tensor, optional
        ``[B]`` int64 or int32, each ``k_b`` in ``[0, K]``: sequence ``b`` uses
        ``draft_tokens[b, :k_b]`` and ``target_probs[b, :k_b+1]``; entries past
        ``k_b`` are never read. None means every sequence has K tokens.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64; entry ``b`` equals
        ``verify_greedy(target_probs[b, :k_b+1], draft_tokens[b, :k_b])``.

    Notes
    -----
    Sequences run in parallel over ``torch.get_num_threads()`` threads; the
    result does not depend on the thread count or on the rest of the batch.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[[0.9, 0.1], [0.2, 0.8]], [[0.3, 0.7], [0.6, 0.4]]])
    >>> n, nxt = verify_greedy_batched(target, torch.tensor([[0], [0]]))
    >>> n.tolist(), nxt.tolist()
    ([1, 0], [1, 1])
    """
    if runs_in_cpp(target_probs, draft_tokens, num_draft_tokens):
        return ops.verify_greedy_batched(target_probs, draft_tokens, num_draft_tokens)
    return reference.verify_greedy_batched(target_probs, draft_tokens, num_draft_tokens)


def verify_sampled_batched(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling for B sequences at once, with ragged draft lengths.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[B, K+1, V]``, float32, float16 or bfloat16, rules as in
        ``verify_sampled``.
    draft_probs : torch.Tensor
        ``[B, K, V]``, same dtype as ``target_probs``.
    draft_tokens : torch.Tensor
        ``[B, K]``, int64 or int32.
    num_draft_tokens : torch.Tensor, optional
        ``[B]``, each ``k_b`` in ``[0, K]`` (None: all K).
    generator : torch.Generator, optional
        Source of the uniforms when ``uniforms`` is None: ``B * (K+1)`` draws,
        as ``torch.rand(B, K+1, dtype=torch.float64, generator=generator)``.
    uniforms : torch.Tensor, optional
        ``[B, K+1]`` float64 in ``[0, 1)``. Sequence ``b`` uses
        ``uniforms[b, :k_b]`` for its tests and ``uniforms[b, k_b]`` for its
        final draw, exactly as ``verify_sampled`` on its own slice would.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[[0.6, 0.4], [0.5, 0.5]]])
    >>> draft = torch.tensor([[[0.2, 0.8]]])
    >>> u = torch.tensor([[0.3, 0.75]], dtype=torch.float64)
    >>> n, nxt = verify_sampled_batched(target, draft, torch.tensor([[1]]), uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([1], [1])
    """
    check_generator(generator)
    if runs_in_cpp(target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms):
        return ops.verify_sampled_batched(
            target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms, generator
        )
    return reference.verify_sampled_batched(
        target_probs,
        draft_probs,
        draft_tokens,
        num_draft_tokens,
        generator=generator,
        uniforms=uniforms,
    )


def verify_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Block verification (Sun et al. 2024, Algorithm 2): the K draft tokens judged jointly.

    With ``p_0 = 1`` and ``p_{i+1} = min(1, p_i * p_i(t_i) / q_i(t_i))`` (rows
    normalized by their float64 sums), ``h_K = p_K`` and, for ``0 < i < K``,
    ``h_i = r_i / (r_i + 1 - p_i)`` with ``r_i = sum_x max(0, p_i * p_i(x) - q_i(x))``:
    the accepted length is the largest ``i`` with ``uniforms[i-1] < h_i``
    (0 if none). After a full acceptance the bonus token is drawn from
    ``p_K``; otherwise the correction token from ``norm(max(0, p_n * p_n - q_n))``
    at the accepted length ``n``. The emitted tokens are distributed exactly as
    sampling from the target, and the expected number accepted is never below
    ``verify_sampled``'s (DESIGN.md, "Block verification").

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]``, float32, float16 or bfloat16; the rules of ``verify_sampled``.
    draft_probs : torch.Tensor
        ``[K, V]``, same dtype; the distribution the draft tokens were drawn from.
    draft_tokens : torch.Tensor
        ``[K]``, int64 or int32, in ``[0, V)``, with ``draft_probs[i, t_i] > 0``.
    generator : torch.Generator, optional
        Source of the ``K+1`` uniforms, as in ``verify_sampled``.
    uniforms : torch.Tensor, optional
        ``[K+1]`` float64 in ``[0, 1)``: ``uniforms[i]`` is the test of the block
        ending after draft token ``i``; ``uniforms[K]`` drives the final draw.

    Returns
    -------
    tuple[int, int]
        ``(n_accepted, next_token)``.

    Notes
    -----
    Rows past the first draft token with ``p_i(t_i) = 0`` are never read
    (every later ``h`` is 0). Every row before it is weighed (its mass), so a
    bad entry there raises even when the block ends early. A residual pass is
    made only where ``uniforms[i-1] < p_i`` (``h_i <= p_i``).

    Raises
    ------
    TypeError, ValueError, IndexError
        as ``verify_sampled``, with the same messages.

    Examples
    --------
    >>> import torch
    >>> # The paper's example: p = (1/3, 2/3), q = (2/3, 1/3) at every position.
    >>> target = torch.tensor([[1., 2.], [1., 2.], [1., 2.]])
    >>> draft = torch.tensor([[2., 1.], [2., 1.]])
    >>> # Tokens (0, 1): p_1 = 1/2, p_2 = 1 = h_2, so the block is kept whole.
    >>> verify_block(target, draft, torch.tensor([0, 1]),
    ...              uniforms=torch.tensor([0.9, 0.9, 0.5], dtype=torch.float64))
    (2, 1)
    """
    check_generator(generator)  # the schema's own error names no argument
    if runs_in_cpp(target_probs, draft_probs, draft_tokens, uniforms):
        if eager():
            return ops.verify_block_ints(target_probs, draft_probs, draft_tokens, uniforms, generator)
        n_accepted, next_token = ops.verify_block(target_probs, draft_probs, draft_tokens, uniforms, generator).tolist()
        return n_accepted, next_token
    return reference.verify_block(target_probs, draft_probs, draft_tokens, generator=generator, uniforms=uniforms)


def verify_block_batched(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification for B sequences at once, with ragged draft lengths.

    Parameters
    ----------
    target_probs, draft_probs, draft_tokens, num_draft_tokens, generator, uniforms
        ``[B, K+1, V]``, ``[B, K, V]``, ``[B, K]``, ``[B]`` (optional) and
        ``[B, K+1]`` (optional): exactly as ``verify_sampled_batched``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64; entry ``b`` equals
        ``verify_block`` on its own slice with the same uniforms.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[[1., 2.], [1., 2.], [1., 2.]]])
    >>> draft = torch.tensor([[[2., 1.], [2., 1.]]])
    >>> u = torch.tensor([[0.9, 0.9, 0.5]], dtype=torch.float64)
    >>> n, nxt = verify_block_batched(target, draft, torch.tensor([[0, 1]]), uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([2], [1])
    """
    check_generator(generator)
    if runs_in_cpp(target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms):
        return ops.verify_block_batched(target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms, generator)
    return reference.verify_block_batched(
        target_probs, draft_probs, draft_tokens, num_draft_tokens, generator=generator, uniforms=uniforms
    )


def build_info() -> dict[str, str | int]:
    """What the loaded C++ kernel was compiled for and which path it runs.

    Returns
    -------
    dict
        ``{"arch": "x86_64", "isa": "AVX512", "mass_isa": "AVX2",
        "warp_isa": ..., "head_isa": ..., "q8_isa": "AVX512_VNNI",
        "compiled": "DEFAULT,AVX2,AVX512", "float_lanes": 16}``: the
        instruction set chosen at run time for the argmax (ATen's CPU
        capability; ``ATEN_CPU_CAPABILITY=default`` forces the generic path),
        the one running the float64 mass and residual passes (measured per
        CPU under AVX-512, or ``SPEC_VERIFY_MASS_ISA``: DESIGN.md, Note
        [Float64 pass ISA]), the warping's, the LM head's (dense and Q8_0),
        and the width of ``at::vec::Vectorized<float>`` on the first.
    """
    fields = dict(item.split("=", 1) for item in ops.build_info().split(";"))
    fields["float_lanes"] = int(fields["float_lanes"])
    return fields


# ----------------------------------------------------------------------------
# The ragged forms: vLLM's flattened layout, read in place (DESIGN.md, "Ragged layout")
# ----------------------------------------------------------------------------


def verify_greedy_ragged(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    bonus_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of B sequences laid out flat, as vLLM lays them out.

    Sequence ``b`` has ``k_b = cu[b] - cu[b-1]`` draft tokens (``cu[-1]`` read as
    0), ``draft_tokens[cu[b-1] : cu[b]]``; its target rows are read in place, no
    padding copy. Entry ``b`` is exactly ``verify_greedy`` on sequence ``b``'s
    own rows and tokens; with ``bonus_tokens`` given, a full acceptance emits
    ``bonus_tokens[b]`` instead of the argmax of a bonus row.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[T+B, V]`` (sequence ``b``'s ``k_b+1`` rows start at flat row
        ``cu[b-1] + b``; its last is the bonus row), or ``[T, V]`` when
        ``bonus_tokens`` is given (``k_b`` rows from ``cu[b-1]``). float32,
        float16 or bfloat16, probabilities or logits (only argmaxes are read).
    draft_tokens : torch.Tensor
        ``[T]``, int64 or int32, each in ``[0, V)``; ``T = sum(k_b)``.
    cu_num_draft_tokens : torch.Tensor
        ``[B]``, int64 or int32: the inclusive cumulative sum of the ``k_b``
        (vLLM's convention), non-negative, nondecreasing, ``cu[B-1] = T``.
        ``k_b = 0`` is valid.
    bonus_tokens : torch.Tensor, optional
        ``[B]``, int64 or int32, in ``[0, V)``: the caller's bonus token per
        sequence (the target rows then hold no bonus row).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64.

    Notes
    -----
    Sequences run in parallel over ``torch.get_num_threads()`` threads; the
    result does not depend on the thread count. Rows after a sequence's first
    miss are never read (nor validated).

    Raises
    ------
    TypeError
        wrong dtype. ``ValueError``: wrong rank, target rows neither ``T+B``
        nor ``T`` with ``bonus_tokens``, ``cu_num_draft_tokens`` decreasing,
        negative or not ending at ``T``, NaN in a read row. ``IndexError``: a
        draft or bonus token outside ``[0, V)``.

    See Also
    --------
    verify_greedy : one sequence; entry ``b`` equals it on sequence ``b``'s slice.
    verify_greedy_batched : the padded ``[B, K+1, V]`` layout.
    verify_sampled_ragged : the sampled form, point-mass drafts included.

    Examples
    --------
    >>> import torch
    >>> # Two sequences: k_0 = 2, k_1 = 0, so T = 2 and T+B = 4 target rows.
    >>> target = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6],
    ...                        [0.3, 0.3, 0.4]])
    >>> n, nxt = verify_greedy_ragged(target, torch.tensor([1, 2]), torch.tensor([2, 2]))
    >>> n.tolist(), nxt.tolist()   # sequence 0: 1 matches, 2 misses (argmax 0); sequence 1: bonus 2
    ([1, 0], [0, 2])
    >>> # The caller's bonus tokens: T = 2 target rows only.
    >>> n, nxt = verify_greedy_ragged(target[:2], torch.tensor([1, 0]), torch.tensor([2, 2]),
    ...                               torch.tensor([2, 1]))
    >>> n.tolist(), nxt.tolist()
    ([2, 0], [2, 1])
    """
    required = (target_probs, draft_tokens, cu_num_draft_tokens)
    if all(isinstance(t, torch.Tensor) for t in required) and runs_in_cpp(*required, bonus_tokens):
        return ops.verify_greedy_ragged(target_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens)
    return reference.verify_greedy_ragged(target_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens)


def verify_sampled_ragged(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    bonus_tokens: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling for B sequences laid out flat, as vLLM lays them out.

    The layout of ``verify_greedy_ragged``; entry ``b`` is exactly
    ``verify_sampled`` on sequence ``b``'s own rows, tokens and uniforms.
    ``draft_probs=None`` is a point-mass draft (n-gram or greedy drafts):
    ``q(t) = 1`` on each draft token, so ``t`` is accepted iff ``u < p(t)/P``
    and a rejection draws the correction token from ``p`` with ``t``'s weight
    removed -- ``verify_sampled`` with a one-hot draft row, bit for bit.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[T+B, V]`` or ``[T, V]`` with ``bonus_tokens``, as in
        ``verify_greedy_ragged``; the rules of ``verify_sampled``.
    draft_probs : torch.Tensor or None
        ``[T, V]``, same dtype (row ``j`` goes with ``draft_tokens[j]``), or
        None: a point-mass draft.
    draft_tokens : torch.Tensor
        ``[T]``, int64 or int32, in ``[0, V)``, with ``draft_probs[j, t_j] > 0``.
    cu_num_draft_tokens : torch.Tensor
        ``[B]``, the inclusive cumulative sum of the draft counts.
    bonus_tokens : torch.Tensor, optional
        ``[B]``, in ``[0, V)``: emitted after a full acceptance instead of a
        draw from a bonus row (the sequence's final uniform goes unused then).
    generator : torch.Generator, optional
        Source of the uniforms when ``uniforms`` is None: ``T+B`` draws, as
        ``torch.rand(T+B, dtype=torch.float64, generator=generator)``.
    uniforms : torch.Tensor, optional
        ``[T+B]`` float64 in ``[0, 1)``: sequence ``b``'s ``k_b`` test uniforms
        then its final draw, from flat index ``cu[b-1] + b`` on.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``n_accepted [B]`` and ``next_token [B]``, int64.

    Raises
    ------
    TypeError, ValueError, IndexError
        as ``verify_sampled`` and ``verify_greedy_ragged``.

    See Also
    --------
    verify_sampled : one sequence; entry ``b`` equals it on sequence ``b``'s slice.
    verify_sampled_batched : the padded ``[B, K+1, V]`` layout.
    verify_greedy_ragged : the greedy form and the layout.

    Examples
    --------
    >>> import torch
    >>> # One sequence, k = 1: as verify_sampled's example (token 1 accepted, bonus 1).
    >>> target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    >>> u = torch.tensor([0.3, 0.75], dtype=torch.float64)
    >>> n, nxt = verify_sampled_ragged(target, torch.tensor([[0.2, 0.8]]), torch.tensor([1]),
    ...                                torch.tensor([1]), uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([1], [1])
    >>> # A point-mass draft: accept iff u < p(t) = 0.4; 0.5 rejects, and the
    >>> # correction is drawn from p without token 1: token 0.
    >>> u = torch.tensor([0.5, 0.9], dtype=torch.float64)
    >>> n, nxt = verify_sampled_ragged(target, None, torch.tensor([1]), torch.tensor([1]), uniforms=u)
    >>> n.tolist(), nxt.tolist()
    ([0], [0])
    """
    check_generator(generator)
    # None for a required tensor goes to the reference, which names it (the
    # dispatcher would pass an undefined tensor).
    required = (target_probs, draft_tokens, cu_num_draft_tokens)
    if all(isinstance(t, torch.Tensor) for t in required) and runs_in_cpp(
            *required, draft_probs, bonus_tokens, uniforms):
        return ops.verify_sampled_ragged(
            target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens, uniforms, generator
        )
    return reference.verify_sampled_ragged(
        target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens,
        generator=generator, uniforms=uniforms,
    )
