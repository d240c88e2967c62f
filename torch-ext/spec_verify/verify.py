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
        "compiled": "DEFAULT,AVX2,AVX512", "float_lanes": 16}``: the
        instruction set chosen at run time for the argmax (ATen's CPU
        capability; ``ATEN_CPU_CAPABILITY=default`` forces the generic path),
        the one running the float64 mass and residual passes, and the width
        of ``at::vec::Vectorized<float>`` on the former.
    """
    fields = dict(item.split("=", 1) for item in ops.build_info().split(";"))
    fields["float_lanes"] = int(fields["float_lanes"])
    return fields
