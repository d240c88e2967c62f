"""The exact law of speculative sampling (rejection sampling) for a fixed pair.

Setting. A target gives rows ``p_0 .. p_K`` and a draft gives rows
``q_0 .. q_{K-1}`` over a vocabulary of ``V`` tokens (each row normalized by
its own sum). Draft token ``t_i`` is drawn from ``q_i``, independently for each
position, and ``verify_sampled`` accepts it with probability
``min(1, p_i(t_i) / q_i(t_i))``, stops at the first rejection and emits one
more token. Then, exactly (Leviathan et al. 2023, Chen et al. 2023):

* position ``i`` accepts with probability
  ``alpha_i = sum_x q_i(x) min(1, p_i(x)/q_i(x)) = sum_x min(p_i(x), q_i(x))``,
  independently of the other positions;
* the number of accepted tokens ``n`` has the truncated-geometric pmf
  ``P(n = j) = (prod_{i<j} alpha_i) (1 - alpha_j)`` for ``j < K`` and
  ``P(n = K) = prod_{i<K} alpha_i``, with mean
  ``E[n] = sum_{j=1..K} prod_{i<j} alpha_i`` (``= sum_{i=1..K} alpha^i``
  when every ``alpha_i = alpha``);
* given ``n = j < K`` the emitted token is drawn from the residual
  ``norm(max(0, p_j - q_j))``; given ``n = K`` it is drawn from ``p_K``.

These are the laws the conformance harness (``tools/conformance.py``) holds
the kernel to. The rows need not be related across positions: the law is for
a *fixed* pair, which is exactly what the harness runs.

Only ``torch`` and the standard library are used here, since this module is
part of the kernel package. All arithmetic is float64 on the CPU, whatever the
input dtype or device.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_has_values

__all__ = [
    "acceptance_rates",
    "accepted_length_pmf",
    "expected_accepted",
    "accepted_length_variance",
    "emitted_token_law",
    "joint_law",
    "block_joint_law",
    "expected_accepted_block",
]


# ----------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------


def _as_float64_rows(name: str, probs: torch.Tensor) -> torch.Tensor:
    """Check a probability tensor ``[..., rows, V]`` and return it as float64 on the CPU."""
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(probs).__name__}")
    if not probs.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating-point dtype, got {probs.dtype}")
    if probs.dim() not in (2, 3):
        raise ValueError(
            f"{name} must have shape [rows, V] or [B, rows, V], got shape {tuple(probs.shape)}"
        )
    if probs.shape[-1] < 1:
        raise ValueError(f"{name} must have a vocabulary of at least one token, got shape {tuple(probs.shape)}")
    check_has_values(**{name: probs})
    rows = probs.detach().to(device="cpu", dtype=torch.float64)
    bad = ~(torch.isfinite(rows) & (rows >= 0))
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name}{list(where)} is {rows[where].item()}: probabilities must be finite and non-negative"
        )
    return rows


def _normalize(name: str, rows64: torch.Tensor) -> torch.Tensor:
    """Divide every row by its own float64 sum; a zero-sum row is an error."""
    mass = rows64.sum(dim=-1, keepdim=True)
    zero = mass.squeeze(-1) <= 0
    if bool(zero.any()):
        where = tuple(int(i) for i in zero.nonzero()[0])
        raise ValueError(f"{name}{list(where)} sums to zero: every row needs positive mass")
    return rows64 / mass


def _pair(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a target/draft pair; return the normalized float64 rows (target keeps all rows)."""
    target = _as_float64_rows("target_probs", target_probs)
    draft = _as_float64_rows("draft_probs", draft_probs)
    if target.dim() != draft.dim():
        raise ValueError(
            f"target_probs and draft_probs must both be batched or both not, got shapes "
            f"{tuple(target.shape)} and {tuple(draft.shape)}"
        )
    k = draft.shape[-2]
    lead_ok = target.shape[:-2] == draft.shape[:-2]
    if not lead_ok or target.shape[-1] != draft.shape[-1] or target.shape[-2] not in (k, k + 1):
        raise ValueError(
            f"target_probs must have shape [..., K+1, V] or [..., K, V] for draft_probs of shape "
            f"[..., K, V] = {list(draft.shape)}, got {list(target.shape)}"
        )
    return _normalize("target_probs", target), _normalize("draft_probs", draft)


def _check_alpha(alpha) -> torch.Tensor:
    """Return ``alpha`` as a float64 tensor ``[K]`` or ``[B, K]`` with entries in [0, 1]."""
    if isinstance(alpha, torch.Tensor):
        if not alpha.dtype.is_floating_point:
            raise TypeError(f"alpha must be a floating-point tensor, got {alpha.dtype}")
        check_has_values(alpha=alpha)
        a = alpha.detach().to(device="cpu", dtype=torch.float64)
    elif isinstance(alpha, (list, tuple)):
        try:
            a = torch.tensor(alpha, dtype=torch.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"alpha must be a sequence of numbers: {exc}") from None
    else:
        raise TypeError(f"alpha must be a torch.Tensor or a sequence of floats, got {type(alpha).__name__}")
    if a.dim() not in (1, 2):
        raise ValueError(f"alpha must have shape [K] or [B, K], got shape {tuple(a.shape)}")
    bad = ~((a >= 0) & (a <= 1))  # also catches NaN
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"alpha{where} is {a[tuple(where)].item()}: acceptance rates must lie in [0, 1]")
    return a


# ----------------------------------------------------------------------------
# Per-position acceptance
# ----------------------------------------------------------------------------


def acceptance_rates(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Per-position acceptance probability ``alpha_i = sum_x min(p_i(x), q_i(x))``.

    ``p_i`` and ``q_i`` are the rows normalized by their own float64 sums, so
    unnormalized inputs (any positive scale) give the same result.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]`` (the last row, the bonus row, is ignored) or ``[K, V]``;
        or batched ``[B, K+1, V]`` / ``[B, K, V]``. Any floating dtype, any
        device; finite, non-negative, every row with positive sum.
    draft_probs : torch.Tensor
        ``[K, V]`` or ``[B, K, V]``, same rules.

    Returns
    -------
    torch.Tensor
        float64 ``[K]`` (or ``[B, K]``), each entry in ``[0, 1]``. ``K = 0``
        gives an empty tensor.

    Raises
    ------
    TypeError
        a non-tensor or a non-floating dtype (the message names the argument).
    ValueError
        shapes that disagree, a negative / NaN / inf entry, a zero-sum row.

    Notes
    -----
    ``alpha_i = 1`` iff the rows are equal; ``alpha_i = 0`` iff their
    supports are disjoint. The sum is clamped to ``[0, 1]`` against rounding.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[0.6, 0.4, 0.0], [1.0, 1.0, 2.0]])
    >>> draft = torch.tensor([[0.2, 0.8, 0.0]])
    >>> acceptance_rates(target, draft)      # min(.6,.2) + min(.4,.8) = 0.6
    tensor([0.6000], dtype=torch.float64)
    """
    target, draft = _pair(target_probs, draft_probs)
    k = draft.shape[-2]
    overlap = torch.minimum(target[..., :k, :], draft).sum(dim=-1)
    return overlap.clamp(0.0, 1.0)


# ----------------------------------------------------------------------------
# Accepted length
# ----------------------------------------------------------------------------


def _prefix_products(a: torch.Tensor) -> torch.Tensor:
    """``[..., K] -> [..., K+1]``: entry ``j`` is ``prod_{i<j} alpha_i`` (entry 0 is 1)."""
    ones = torch.ones(a.shape[:-1] + (1,), dtype=torch.float64)
    return torch.cumprod(torch.cat([ones, a], dim=-1), dim=-1)


def accepted_length_pmf(alpha) -> torch.Tensor:
    """Law of the number of accepted draft tokens ``n`` in one round.

    ``P(n = j) = (prod_{i<j} alpha_i) (1 - alpha_j)`` for ``0 <= j < K`` and
    ``P(n = K) = prod_{i<K} alpha_i``.

    Parameters
    ----------
    alpha : torch.Tensor or sequence of float
        ``[K]`` (or ``[B, K]``) acceptance rates in ``[0, 1]``, e.g. from
        :func:`acceptance_rates`.

    Returns
    -------
    torch.Tensor
        float64 ``[K+1]`` (or ``[B, K+1]``), non-negative, summing to 1
        (exactly, up to float64 rounding). ``K = 0`` gives ``[1.0]``.

    Raises
    ------
    TypeError
        ``alpha`` is not a tensor or a sequence of numbers.
    ValueError
        ``alpha`` has the wrong rank, or an entry outside ``[0, 1]`` or NaN.

    Examples
    --------
    >>> accepted_length_pmf([0.5, 0.5])
    tensor([0.5000, 0.2500, 0.2500], dtype=torch.float64)
    """
    a = _check_alpha(alpha)
    reach = _prefix_products(a)  # P(n >= j)
    stop = torch.cat([1.0 - a, torch.ones(a.shape[:-1] + (1,), dtype=torch.float64)], dim=-1)
    return reach * stop


def expected_accepted(alpha):
    """Mean accepted length ``E[n] = sum_{j=1..K} prod_{i<j} alpha_i``.

    Each term is ``P(n >= j)``. For a constant ``alpha_i = a`` this is
    ``sum_{i=1..K} a^i`` (e.g. ``a = 0.678, K = 4`` gives ``1.6607``). The
    tokens emitted per round are ``E[n] + 1`` (the correction / bonus token).

    Parameters
    ----------
    alpha : torch.Tensor or sequence of float
        ``[K]`` or ``[B, K]`` acceptance rates in ``[0, 1]``.

    Returns
    -------
    float or torch.Tensor
        A Python float for ``[K]``; float64 ``[B]`` for ``[B, K]``.

    Raises
    ------
    TypeError, ValueError
        as :func:`accepted_length_pmf`.

    Examples
    --------
    >>> round(expected_accepted([0.678] * 4), 4)
    1.6607
    """
    a = _check_alpha(alpha)
    mean = _prefix_products(a)[..., 1:].sum(dim=-1)
    return float(mean) if a.dim() == 1 else mean


def accepted_length_variance(alpha):
    """Variance of the accepted length, ``Var[n] = sum_j j^2 P(n=j) - E[n]^2``.

    Used for the standard error of a measured mean: over ``N`` independent
    rounds, ``se = sqrt(Var[n] / N)``.

    Parameters
    ----------
    alpha : torch.Tensor or sequence of float
        ``[K]`` or ``[B, K]`` acceptance rates in ``[0, 1]``.

    Returns
    -------
    float or torch.Tensor
        A Python float for ``[K]``; float64 ``[B]`` for ``[B, K]``.

    Examples
    --------
    >>> accepted_length_variance([0.5])     # Bernoulli(1/2)
    0.25
    """
    pmf = accepted_length_pmf(alpha)
    j = torch.arange(pmf.shape[-1], dtype=torch.float64)
    mean = (j * pmf).sum(dim=-1)
    var = ((j - mean.unsqueeze(-1)) ** 2 * pmf).sum(dim=-1)
    return float(var) if pmf.dim() == 1 else var


# ----------------------------------------------------------------------------
# Emitted token
# ----------------------------------------------------------------------------


def emitted_token_law(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Law of the emitted ``next_token`` given the accepted length.

    Row ``j < K`` is the residual ``norm(max(0, p_j - q_j))``, the law of
    ``next_token`` given ``n_accepted == j``. If that residual is zero
    everywhere (``p_j == q_j``, so ``alpha_j = 1`` and rejection at ``j`` has
    probability 0) the row is ``p_j``, the kernel's fallback. Row ``K`` is
    ``p_K``, the law of the bonus token given all ``K`` were accepted.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]`` or ``[B, K+1, V]`` (the bonus row is needed here), any
        floating dtype; finite, non-negative, rows with positive sums.
    draft_probs : torch.Tensor
        ``[K, V]`` or ``[B, K, V]``, same rules.

    Returns
    -------
    torch.Tensor
        float64 ``[K+1, V]`` (or ``[B, K+1, V]``); every row sums to 1 and is
        zero wherever ``p_j`` is zero.

    Raises
    ------
    TypeError, ValueError
        as :func:`acceptance_rates`; also when ``target_probs`` has only
        ``K`` rows.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    >>> draft = torch.tensor([[0.2, 0.8]])
    >>> emitted_token_law(target, draft)   # residual (0.4, 0) -> (1, 0); bonus row p_1
    tensor([[1.0000, 0.0000],
            [0.5000, 0.5000]], dtype=torch.float64)
    """
    target, draft = _pair(target_probs, draft_probs)
    k = draft.shape[-2]
    if target.shape[-2] != k + 1:
        raise ValueError(
            f"target_probs must have K+1 = {k + 1} rows (the bonus row included) for "
            f"draft_probs with K = {k} rows, got shape {list(target.shape)}"
        )
    residual = torch.clamp(target[..., :k, :] - draft, min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    # Where the residual vanishes, rejection is impossible; the kernel falls back to p_j.
    rows = torch.where(mass > 0, residual / mass.clamp_min(math.ulp(0.0)), target[..., :k, :])
    return torch.cat([rows, target[..., k:, :]], dim=-2)


def joint_law(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Joint law ``P(n_accepted = j, next_token = x) = P(n = j) * row_j(x)``.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]`` or ``[B, K+1, V]``.
    draft_probs : torch.Tensor
        ``[K, V]`` or ``[B, K, V]``.

    Returns
    -------
    torch.Tensor
        float64 ``[K+1, V]`` (or ``[B, K+1, V]``) summing to 1: the product of
        :func:`accepted_length_pmf` and :func:`emitted_token_law`.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    >>> draft = torch.tensor([[0.2, 0.8]])
    >>> joint_law(target, draft)           # alpha_0 = 0.6
    tensor([[0.4000, 0.0000],
            [0.3000, 0.3000]], dtype=torch.float64)
    """
    rows = emitted_token_law(target_probs, draft_probs)
    pmf = accepted_length_pmf(acceptance_rates(target_probs, draft_probs))
    return pmf.unsqueeze(-1) * rows


# ----------------------------------------------------------------------------
# Block verification (Sun et al. 2024; DESIGN.md, "Block verification")
# ----------------------------------------------------------------------------

# Enumerated paths above this many raise: the law is for small cases.
_BLOCK_MAX_PATHS = 1 << 20


def _ratio_atoms(target_row: torch.Tensor, draft_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The law of ``p(t)/q(t)`` for ``t ~ q``: distinct ratios ``[A]`` and their masses ``[A]``.

    Ratios within 1e-12 relative of their group's smallest are one atom: rows
    built as exact multiples of each other (``q = c * p`` on a group of tokens)
    give one ratio per group, up to the rounding of the normalizing division.
    """
    support = draft_row > 0
    raw, order = torch.sort(target_row[support] / draft_row[support])
    new_group = torch.ones_like(raw, dtype=torch.bool)
    new_group[1:] = raw[1:] - raw[:-1] > 1e-12 * raw[1:]
    inverse = torch.cumsum(new_group.long(), 0) - 1
    ratios = raw[new_group]
    mass = torch.zeros_like(ratios).scatter_add_(0, inverse, draft_row[support][order])
    return ratios, mass


def _block_weights(target: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every path of ``(p_1 .. p_K)``: ``weights [N, K+1]`` (``p_0 = 1`` first) and path masses ``[N]``.

    ``p_{i+1} = min(1, p_i * p_i(t_i)/q_i(t_i))`` depends on the draft tokens only
    through their ratios, so tokens of equal ratio are one path.
    """
    weights = torch.ones(1, 1, dtype=torch.float64)
    mass = torch.ones(1, dtype=torch.float64)
    for i in range(draft.shape[0]):
        ratios, atom_mass = _ratio_atoms(target[i], draft[i])
        if weights.shape[0] * ratios.numel() > _BLOCK_MAX_PATHS:
            raise ValueError(
                f"the block law enumerates every path of ratios: {weights.shape[0] * ratios.numel()} paths "
                f"at position {i} exceed {_BLOCK_MAX_PATHS}; use fewer distinct ratios p/q or a smaller K"
            )
        step = torch.clamp(weights[:, -1:] * ratios.unsqueeze(0), max=1.0).reshape(-1, 1)
        weights = torch.cat([weights.repeat_interleave(ratios.numel(), 0), step], dim=1)
        mass = (mass.unsqueeze(1) * atom_mass.unsqueeze(0)).reshape(-1)
    return weights, mass


def block_joint_law(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Joint law ``P(n_accepted = j, next_token = x)`` of block verification.

    Each draft token ``t_i`` is drawn from ``q_i`` (rows fixed per position,
    as in the conformance harness). With ``p_0 = 1``,
    ``p_{i+1} = min(1, p_i * p_i(t_i)/q_i(t_i))``, ``h_K = p_K`` and
    ``h_i = r_i / (r_i + 1 - p_i)`` (``r_i = sum_x max(0, p_i p_i(x) - q_i(x))``;
    ``h_i = 0`` when both vanish), ``P(n = j | path) = h_j prod_{i > j} (1 - h_i)``
    with ``h_0 = 1``; the next token is ``norm(max(0, p_j p_j - q_j))`` (``p_j``
    when that is empty) for ``j < K``, ``p_K`` for ``j = K``. Computed by
    enumerating every path of ratios (a ``ValueError`` past 2^20 paths).

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]`` (rows normalized by their float64 sums).
    draft_probs : torch.Tensor
        ``[K, V]``.

    Returns
    -------
    torch.Tensor
        float64 ``[K+1, V]`` summing to 1.

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[1., 2.], [1., 2.], [1., 2.]])   # the paper's example
    >>> draft = torch.tensor([[2., 1.], [2., 1.]])
    >>> round(float((block_joint_law(target, draft).sum(-1) * torch.arange(3)).sum() * 9), 10)
    11.0
    """
    target, draft = _pair(target_probs, draft_probs)
    k = draft.shape[-2]
    if target.dim() != 2 or target.shape[0] != k + 1:
        raise ValueError(f"target_probs must have shape [K+1, V] = [{k + 1}, V], got {list(target.shape)}")
    weights, mass = _block_weights(target, draft)
    n_paths, vocab = weights.shape[0], target.shape[1]
    h = torch.zeros(n_paths, k + 1, dtype=torch.float64)
    h[:, 0] = 1.0
    residuals = []
    for i in range(k + 1):
        w = weights[:, i : i + 1]
        if i == k:
            h[:, k] = w.squeeze(1)
            residuals.append(target[k].expand(n_paths, vocab))
            continue
        r = torch.clamp(w * target[i] - draft[i], min=0.0)
        total = r.sum(-1)
        if i > 0:
            denominator = total + 1.0 - w.squeeze(1)
            h[:, i] = torch.where(denominator > 0, total / denominator.clamp_min(math.ulp(0.0)), 0.0)
        residuals.append(torch.where(total.unsqueeze(1) > 0, r / total.clamp_min(math.ulp(0.0)).unsqueeze(1), target[i]))
    # P(n = j | path) = h_j * prod_{i > j} (1 - h_i)
    above = torch.ones(n_paths, dtype=torch.float64)
    joint = torch.zeros(k + 1, vocab, dtype=torch.float64)
    for j in range(k, -1, -1):
        p_end = mass * h[:, j] * above
        joint[j] = (p_end.unsqueeze(1) * residuals[j]).sum(0)
        above = above * (1.0 - h[:, j])
    return joint


def expected_accepted_block(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> float:
    """``E[n_accepted]`` under block verification: the mean of :func:`block_joint_law`.

    At least ``expected_accepted(acceptance_rates(target_probs, draft_probs))``
    on every pair (Sun et al. 2024, Theorem 2).

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[K+1, V]``.
    draft_probs : torch.Tensor
        ``[K, V]``.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> target = torch.tensor([[1., 2.], [1., 2.], [1., 2.]])
    >>> draft = torch.tensor([[2., 1.], [2., 1.]])
    >>> round(expected_accepted_block(target, draft) * 9, 10)   # token-wise: 10/9
    11.0
    """
    pmf = block_joint_law(target_probs, draft_probs).sum(-1)
    return float((pmf * torch.arange(pmf.numel(), dtype=torch.float64)).sum())
