"""Pure-torch reference path: the contract every fast path is tested against.

One decision stack, written once for both op families (the glossary and the
contract are in DESIGN.md):

* ``greedy_sequence``: accept draft tokens while each equals the target row's
  argmax; the first miss emits that argmax (the correction token), a full
  acceptance emits the argmax of row K (the bonus token);
* ``sampled_sequence``: accept ``t_i`` iff ``u_i * q_i(t_i) < p_i(t_i)``;
  the first rejection emits a draw from the residual ``norm(max(0, p_i - q_i))``
  (the correction token), a full acceptance a draw from ``p_K`` (the bonus).

Both read their rows through a *row source*: ``ProbRows`` (probability rows,
``verify_greedy`` / ``verify_sampled``) or ``WarpedRows`` (logits warped by
``warping.py``, ``verify_logits``). The C++ kernel has the same shape
(``csrc/decide.h``), and its arithmetic is written in the same order
(float64, no fused multiply-add; DESIGN.md, "Numerics"), so for the same
uniforms both paths emit the same tokens. The only place they may differ is
the order of float64 additions inside a row sum, which moves a decision only
when a uniform lands within ~1e-16 of a boundary.

This path also serves tensors on devices the C++ kernel does not (CUDA,
MPS): the public wrappers route anything that is not on the CPU here.
"""

from __future__ import annotations

import torch

from ._checks import (
    check_flag,
    check_generator,
    check_has_values,
    check_ragged,
    check_rows_tensor,
    ragged_warp_types,
    ragged_warp_vectors,
    check_sequences,
    check_uniforms,
    check_vocab,
    checked_argmax,
    warp_scalars,
    where,
    RAGGED_UNIFORMS,
)
from .warping import Warp, check_warp, warp_row, warp_weights

__all__ = [
    "verify_greedy",
    "verify_sampled",
    "verify_greedy_batched",
    "verify_sampled_batched",
    "verify_block",
    "verify_block_batched",
    "verify_greedy_ragged",
    "verify_sampled_ragged",
    "verify_logits",
    "verify_logits_batched",
    "verify_logits_ragged",
    "sample_draft",
    "warp_probs",
    "warp_weights",
    "inverse_cdf",
    "residual",
]


# ----------------------------------------------------------------------------
# The two draws: inverse CDF, and the residual it draws from after a rejection
# ----------------------------------------------------------------------------


def inverse_cdf(weights64: torch.Tensor, uniform: float) -> int:
    """The smallest id whose cumulative weight exceeds ``uniform * total``.

    ``weights64`` is a non-negative float64 row with a positive total. A
    token of zero weight is never returned: the cumulative sum only grows at
    positive weights, and if rounding leaves no cumulative value above the
    threshold (``uniform`` within an ulp of 1) the last positive-weight id is
    returned instead.
    """
    total = weights64.sum()
    threshold = uniform * total
    cumulative = torch.cumsum(weights64, 0)
    idx = int(torch.searchsorted(cumulative, threshold.reshape(1), right=True))
    if idx >= weights64.numel():
        # Fallback: rounding kept every cumulative value <= threshold.
        idx = int((weights64 > 0).nonzero()[-1, 0])
    return idx


def residual(p: torch.Tensor, q: torch.Tensor, p_mass: float, q_mass: float) -> torch.Tensor:
    """``max(0, p * Q - q * P)``: ``norm(max(0, p/P - q/Q))`` scaled by ``P * Q``.

    Multiplied out (no division), in this order, as the C++ (DESIGN.md,
    "Numerics": the same expression, the same order, no FMA).
    """
    return torch.clamp(p * q_mass - q * p_mass, min=0.0)


def _draw_correction(p, q, p_mass, q_mass, u: float) -> int:
    r = residual(p, q, p_mass, q_mass)
    if float(r.sum()) > 0.0:
        return inverse_cdf(r, u)
    # Fallback: the residual rounded to zero everywhere (p equals q to within
    # rounding), so the target row itself is the residual's law.
    return inverse_cdf(p, u)


def _checked_warp(generator, temperature, top_k, top_p, min_p) -> Warp:
    # The wrappers' order, so both paths name the same argument first: the
    # warping's types, the generator, then the warping's values (in the op).
    scalars = warp_scalars(temperature, top_k, top_p, min_p)
    check_generator(generator)
    return check_warp(*scalars)


def _draw_uniforms(count: int, generator: torch.Generator | None) -> torch.Tensor:
    # The one place randomness enters: count float64 uniforms in [0, 1), drawn
    # in order from the generator (the default CPU generator when None).
    return torch.rand(count, dtype=torch.float64, generator=generator)


def _take_uniforms(uniforms, generator, shape: tuple[int, ...], draw: bool,
                   what: str = "one per draft token plus one for the final draw"):
    """Given uniforms (always validated), else ``shape`` fresh draws when ``draw``."""
    if uniforms is not None:
        check_uniforms(uniforms, shape, what)
        return uniforms.double().cpu()
    if not draw:
        return None
    count = 1
    for s in shape:
        count *= s
    return _draw_uniforms(count, generator).reshape(shape)


# ----------------------------------------------------------------------------
# Row sources: what the decision loops read
# ----------------------------------------------------------------------------


class _BonusFromRow:
    """The bonus token from target row K: its argmax (greedy) or a draw from it (sampled)."""

    def bonus_argmax(self, k: int) -> int:
        return self.target_argmax(k)

    def draw_bonus(self, k: int, u: float) -> int:
        return inverse_cdf(self.target_row(k)[0], u)


class GivenBonus:
    """A row source whose bonus token is the caller's (the ragged ops' ``bonus_tokens``):
    a full acceptance emits it, reading no row and drawing nothing; all else is ``rows``'."""

    def __init__(self, rows, bonus: int):
        self.rows, self.bonus = rows, bonus

    def __getattr__(self, name):
        return getattr(self.rows, name)

    def bonus_argmax(self, k: int) -> int:
        return self.bonus

    def draw_bonus(self, k: int, u: float) -> int:
        return self.bonus


class ProbRows(_BonusFromRow):
    """Rows of probabilities (not necessarily normalized): ``verify_greedy`` / ``verify_sampled``."""

    target_name, draft_name = "target_probs", "draft_probs"

    def __init__(self, target, draft, prefix: tuple[int, ...] = ()):
        self.target, self.draft, self.prefix = target, draft, prefix

    def check_draft_token(self, i: int, token: int) -> None:
        pass  # a probability row says nothing about which token a greedy draft picked

    def target_argmax(self, i: int) -> int:
        return checked_argmax(self.target[i], self.target_name, (*self.prefix, i))

    def _row(self, rows, name: str, i: int) -> tuple[torch.Tensor, float]:
        row64 = rows[i].double()
        index = (*self.prefix, i)
        bad = ~(torch.isfinite(row64) & (row64 >= 0))
        if bool(bad.any()):
            col = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{name}[{where((*index, col))}] is {row64[col].item()}: "
                "probabilities must be finite and non-negative"
            )
        mass = float(row64.sum())
        if mass <= 0.0:
            raise ValueError(f"{name}[{where(index)}] sums to zero: every read row needs positive mass")
        return row64, mass

    def target_row(self, i: int) -> tuple[torch.Tensor, float]:
        return self._row(self.target, self.target_name, i)

    def draft_row(self, i: int) -> tuple[torch.Tensor, float]:
        return self._row(self.draft, self.draft_name, i)

    def unsampled(self, i: int, token: int) -> ValueError:
        return ValueError(
            f"{self.draft_name}[{where((*self.prefix, i, token))}] is zero: "
            f"the draft cannot have sampled token {token}"
        )


class PointMassRows(ProbRows):
    """Probability rows with a point-mass draft (``verify_sampled_ragged`` without
    ``draft_probs``): draft row i is the one-hot row on ``tokens[i]`` -- exactly the
    row ``verify_sampled`` would be given -- so q(t) = Q = 1, the accept test is
    ``u * P < p(t)`` and the residual is ``p`` with t's weight removed."""

    def __init__(self, target, tokens: list[int], prefix: tuple[int, ...] = ()):
        super().__init__(target, None, prefix)
        self.tokens = tokens

    def draft_row(self, i: int) -> tuple[torch.Tensor, float]:
        row64 = torch.zeros(self.target.shape[-1], dtype=torch.float64)
        row64[self.tokens[i]] = 1.0
        return row64, 1.0


class WarpedRows(_BonusFromRow):
    """Rows of logits, warped on read (``warping.py``): ``verify_logits``."""

    target_name, draft_name = "target_logits", "draft_logits"

    def __init__(self, target, draft, warp: Warp, prefix: tuple[int, ...] = ()):
        self.target, self.draft, self.warp, self.prefix = target, draft, warp, prefix

    def check_draft_token(self, i: int, token: int) -> None:
        # Temperature 0: the warped draft row is the point mass on its argmax.
        index = (*self.prefix, i)
        best = checked_argmax(self.draft[i], self.draft_name, index)
        if token != best:
            raise ValueError(
                f"draft_tokens[{where(index)}] = {token} is outside the support of the warped draft "
                f"distribution: at temperature 0 it is a point mass on "
                f"argmax({self.draft_name}[{where(index)}]) = {best}"
            )

    def target_argmax(self, i: int) -> int:
        return checked_argmax(self.target[i], self.target_name, (*self.prefix, i))

    def _row(self, rows, name: str, i: int) -> tuple[torch.Tensor, float]:
        row64 = warp_row(rows[i], self.warp, name, (*self.prefix, i)).double()
        return row64, float(row64.sum())

    def target_row(self, i: int) -> tuple[torch.Tensor, float]:
        return self._row(self.target, self.target_name, i)

    def draft_row(self, i: int) -> tuple[torch.Tensor, float]:
        return self._row(self.draft, self.draft_name, i)

    def unsampled(self, i: int, token: int) -> ValueError:
        index = where((*self.prefix, i))
        return ValueError(
            f"draft_tokens[{index}] = {token} is outside the support of the warped draft "
            f"distribution ({self.draft_name}[{index}] after temperature, top-k, top-p and "
            f"min-p): the draft cannot have sampled it; draw draft tokens with sample_draft "
            f"and the same arguments"
        )


# ----------------------------------------------------------------------------
# The decision loops, once (lazy: row i is read only if rows 0..i-1 were accepted)
# ----------------------------------------------------------------------------


def greedy_sequence(rows, tokens: list[int]) -> tuple[int, int]:
    """``(n_accepted, next_token)``: the correction at the first miss, else the bonus."""
    k = len(tokens)
    for i, token in enumerate(tokens):
        rows.check_draft_token(i, token)
        best = rows.target_argmax(i)
        if token != best:
            return i, best
    return k, rows.bonus_argmax(k)


def sampled_sequence(rows, tokens: list[int], u: list[float]) -> tuple[int, int]:
    """``(n_accepted, next_token)`` by rejection sampling with ``len(tokens) + 1`` uniforms."""
    k = len(tokens)
    u_final = float(u[k])
    for i, token in enumerate(tokens):
        p, p_mass = rows.target_row(i)
        q, q_mass = rows.draft_row(i)
        p_t, q_t = float(p[token]), float(q[token])
        if q_t == 0.0:
            raise rows.unsampled(i, token)
        # Accept iff u * q(t)/Q < p(t)/P, multiplied out (no division).
        if float(u[i]) * q_t * p_mass < p_t * q_mass:
            continue
        return i, _draw_correction(p, q, p_mass, q_mass, u_final)
    return k, rows.draw_bonus(k, u_final)


# Block verification (Sun et al. 2024, Algorithm 2; DESIGN.md, "Block").
# p_0 = 1, p_{i+1} = min(1, p_i * (p_i(t_i) / P_i) / (q_i(t_i) / Q_i)); the block
# ends at the largest i in [1, K] whose weight h_i beats u_{i-1} (else 0):
# h_K = p_K; for i < K, h_i = r_i / (r_i + 1 - p_i) with r_i the mass of
# max(0, p_i * p_i(x)/P_i - q_i(x)/Q_i). Every product below is written in the
# C++'s order (csrc/decide.h, block_sequence), so both paths decide alike.


def block_ratio_step(weight: float, p_t: float, q_t: float, p_mass: float, q_mass: float) -> float:
    """``min(1, weight * (p(t)/P) / (q(t)/Q))`` as ``weight * ((p(t)*Q) / (q(t)*P))``."""
    step = weight * ((p_t * q_mass) / (q_t * p_mass))
    return step if step < 1.0 else 1.0


def block_stops(u: float, weight: float, residual_total: float, p_mass: float, q_mass: float) -> bool:
    """``u < h = r / (r + 1 - weight)`` multiplied out by ``P * Q`` (``residual_total = r * P * Q``)."""
    return u * (residual_total + ((1.0 - weight) * p_mass) * q_mass) < residual_total


def block_sequence(rows, tokens: list[int], u: list[float]) -> tuple[int, int]:
    """``(n_accepted, next_token)`` by block verification with ``len(tokens) + 1`` uniforms.

    Lazy: rows past the first ``i`` with ``p_i = 0`` are never read (no later
    position can end the block). Scanning down from K, the first ``i`` whose
    test passes is the accepted length; the residual at ``i`` is computed only
    when ``u_{i-1} < p_i`` (``h_i <= p_i``, so otherwise the test fails).
    """
    k = len(tokens)
    u_final = float(u[k])
    weights, masses = [1.0], []
    for i, token in enumerate(tokens):
        p, p_mass = rows.target_row(i)
        q, q_mass = rows.draft_row(i)
        p_t, q_t = float(p[token]), float(q[token])
        if q_t == 0.0:
            raise rows.unsampled(i, token)
        masses.append((p_mass, q_mass))
        weights.append(block_ratio_step(weights[-1], p_t, q_t, p_mass, q_mass))
        if weights[-1] == 0.0:
            break
    reached = len(weights) - 1
    if reached == k and k > 0 and float(u[k - 1]) < weights[k]:
        return k, inverse_cdf(rows.target_row(k)[0], u_final)
    if k == 0:
        return 0, inverse_cdf(rows.target_row(0)[0], u_final)
    for i in range(min(reached, k - 1), -1, -1):
        w = weights[i]
        if i > 0 and not float(u[i - 1]) < w:
            continue
        p, p_mass = rows.target_row(i)
        q, _ = rows.draft_row(i)
        q_mass = masses[i][1]
        r = residual(p, q, p_mass, w * q_mass)
        total = float(r.sum())
        if i == 0 or block_stops(float(u[i - 1]), w, total, p_mass, q_mass):
            if total > 0.0:
                return i, inverse_cdf(r, u_final)
            return i, inverse_cdf(p, u_final)  # i = 0 only: the residual rounded to zero (p equals q)
    raise AssertionError("unreachable: i = 0 always ends the block")


def _run_batch(shape, decide) -> tuple[torch.Tensor, torch.Tensor]:
    n_acc = torch.empty(shape.batch, dtype=torch.int64)
    nxt = torch.empty(shape.batch, dtype=torch.int64)
    for b in range(shape.batch):
        n_acc[b], nxt[b] = decide(b, shape.counts[b])
    return n_acc, nxt


# ----------------------------------------------------------------------------
# Probability rows in
# ----------------------------------------------------------------------------


def _sampled_probs(sequence, target_probs, draft_probs, draft_tokens, generator, uniforms) -> tuple[int, int]:
    """One sequence decided by ``sequence`` (token-wise or block) with K+1 uniforms."""
    check_generator(generator)
    shape = check_sequences(target_probs, draft_probs, draft_tokens, batched=False,
                            target_name="target_probs", draft_name="draft_probs")
    u = _take_uniforms(uniforms, generator, (shape.k + 1,), draw=True)
    return sequence(ProbRows(target_probs, draft_probs), draft_tokens.tolist(), u.tolist())


def _sampled_probs_batched(sequence, target_probs, draft_probs, draft_tokens, num_draft_tokens, generator, uniforms):
    """B sequences decided by ``sequence``; sequence b uses u[b, :k_b] for its tests and u[b, k_b] to draw."""
    check_generator(generator)
    shape = check_sequences(target_probs, draft_probs, draft_tokens, num_draft_tokens, batched=True,
                            target_name="target_probs", draft_name="draft_probs")
    u = _take_uniforms(uniforms, generator, (shape.batch, shape.k + 1), draw=True)
    return _run_batch(shape, lambda b, kb: sequence(
        ProbRows(target_probs[b], draft_probs[b], (b,)), draft_tokens[b, :kb].tolist(), u[b, : kb + 1].tolist()))


def verify_greedy(target_probs: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """Reference ``spec_verify.verify_greedy``."""
    check_sequences(target_probs, None, draft_tokens, batched=False, target_name="target_probs", draft_name=None)
    return greedy_sequence(ProbRows(target_probs, None), draft_tokens.tolist())


def verify_sampled(target_probs, draft_probs, draft_tokens, *, generator=None, uniforms=None) -> tuple[int, int]:
    """Reference ``spec_verify.verify_sampled``."""
    return _sampled_probs(sampled_sequence, target_probs, draft_probs, draft_tokens, generator, uniforms)


def verify_greedy_batched(target_probs, draft_tokens, num_draft_tokens=None):
    """Reference ``spec_verify.verify_greedy_batched``."""
    shape = check_sequences(target_probs, None, draft_tokens, num_draft_tokens, batched=True,
                            target_name="target_probs", draft_name=None)
    return _run_batch(shape, lambda b, kb: greedy_sequence(
        ProbRows(target_probs[b], None, (b,)), draft_tokens[b, :kb].tolist()))


def verify_sampled_batched(target_probs, draft_probs, draft_tokens, num_draft_tokens=None, *,
                           generator=None, uniforms=None):
    """Reference ``spec_verify.verify_sampled_batched``."""
    return _sampled_probs_batched(sampled_sequence, target_probs, draft_probs, draft_tokens, num_draft_tokens,
                                  generator, uniforms)


def verify_block(target_probs, draft_probs, draft_tokens, *, generator=None, uniforms=None) -> tuple[int, int]:
    """Reference ``spec_verify.verify_block``."""
    return _sampled_probs(block_sequence, target_probs, draft_probs, draft_tokens, generator, uniforms)


def verify_block_batched(target_probs, draft_probs, draft_tokens, num_draft_tokens=None, *,
                         generator=None, uniforms=None):
    """Reference ``spec_verify.verify_block_batched``."""
    return _sampled_probs_batched(block_sequence, target_probs, draft_probs, draft_tokens, num_draft_tokens,
                                  generator, uniforms)


# ----------------------------------------------------------------------------
# The ragged forms (vLLM's flattened layout; DESIGN.md, "Ragged layout")
# ----------------------------------------------------------------------------


def _run_ragged(shape, decide) -> tuple[torch.Tensor, torch.Tensor]:
    n_acc = torch.empty(shape.batch, dtype=torch.int64)
    nxt = torch.empty(shape.batch, dtype=torch.int64)
    for b in range(shape.batch):
        n_acc[b], nxt[b] = decide(b, shape.count(b))
    return n_acc, nxt


def _ragged_slices(shape, b: int, k: int, target, draft, draft_tokens, bonus_tokens):
    """Sequence b's own slices of the flat tensors: target rows (k_b+1, or k_b with a
    given bonus), draft rows (None: none), ids; and its bonus token (None: from row k_b)."""
    t0, d0 = shape.target_start(b), shape.starts[b]
    rows = target[t0:t0 + k + (0 if shape.given_bonus else 1)]
    drafts = None if draft is None else draft[d0:d0 + k]
    bonus = None if bonus_tokens is None else int(bonus_tokens[b])
    return rows, drafts, draft_tokens[d0:d0 + k].tolist(), bonus


def _with_bonus(rows, bonus):
    return rows if bonus is None else GivenBonus(rows, bonus)


def verify_greedy_ragged(target_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens=None):
    """Reference ``spec_verify.verify_greedy_ragged``."""
    shape = check_ragged(target_probs, None, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_probs", draft_name="draft_probs")

    def decide(b, k):
        rows, _, tokens, bonus = _ragged_slices(shape, b, k, target_probs, None, draft_tokens, bonus_tokens)
        return greedy_sequence(_with_bonus(ProbRows(rows, None, (b,)), bonus), tokens)

    return _run_ragged(shape, decide)


def verify_sampled_ragged(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens=None, *,
                          generator=None, uniforms=None):
    """Reference ``spec_verify.verify_sampled_ragged`` (``draft_probs`` None: a point-mass draft)."""
    check_generator(generator)
    shape = check_ragged(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_probs", draft_name="draft_probs")
    u = _take_uniforms(uniforms, generator, (shape.total + shape.batch,), draw=True, what=RAGGED_UNIFORMS)

    def decide(b, k):
        rows, drafts, tokens, bonus = _ragged_slices(shape, b, k, target_probs, draft_probs, draft_tokens,
                                                     bonus_tokens)
        source = PointMassRows(rows, tokens, (b,)) if drafts is None else ProbRows(rows, drafts, (b,))
        u0 = shape.uniform_start(b)
        return sampled_sequence(_with_bonus(source, bonus), tokens, u[u0:u0 + k + 1].tolist())

    return _run_ragged(shape, decide)


# ----------------------------------------------------------------------------
# Logits in (warped by warping.py, identically for draft and target)
# ----------------------------------------------------------------------------


def _check_method(method) -> bool:
    """True for block verification; the one check of ``method`` on the reference path."""
    if method not in ("token", "block"):
        raise ValueError(f'method must be "token" or "block", got {method!r}')
    return method == "block"


def _logits_sequence(rows: WarpedRows, tokens: list[int], u, block: bool = False) -> tuple[int, int]:
    if rows.warp.greedy:
        return greedy_sequence(rows, tokens)
    return (block_sequence if block else sampled_sequence)(rows, tokens, u)


def verify_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, top_k=0, top_p=1.0,
                  min_p=0.0, generator=None, uniforms=None, method="token") -> tuple[int, int]:
    """Reference ``spec_verify.verify_logits``."""
    warp = _checked_warp(generator, temperature, top_k, top_p, min_p)
    block = _check_method(method)
    shape = check_sequences(target_logits, draft_logits, draft_tokens, batched=False,
                            target_name="target_logits", draft_name="draft_logits")
    u = _take_uniforms(uniforms, generator, (shape.k + 1,), draw=not warp.greedy)
    return _logits_sequence(WarpedRows(target_logits, draft_logits, warp), draft_tokens.tolist(),
                            None if u is None else u.tolist(), block)


def verify_logits_batched(target_logits, draft_logits, draft_tokens, num_draft_tokens=None, *,
                          temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None, uniforms=None,
                          method="token"):
    """Reference ``spec_verify.verify_logits_batched``."""
    warp = _checked_warp(generator, temperature, top_k, top_p, min_p)
    block = _check_method(method)
    shape = check_sequences(target_logits, draft_logits, draft_tokens, num_draft_tokens, batched=True,
                            target_name="target_logits", draft_name="draft_logits")
    u = _take_uniforms(uniforms, generator, (shape.batch, shape.k + 1), draw=not warp.greedy,
                       what="B rows of one per draft token plus one for the final draw")
    return _run_batch(shape, lambda b, kb: _logits_sequence(
        WarpedRows(target_logits[b], draft_logits[b], warp, (b,)), draft_tokens[b, :kb].tolist(),
        None if u is None else u[b, : kb + 1].tolist(), block))


def verify_logits_ragged(target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, bonus_tokens=None, *,
                         temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None, uniforms=None):
    """Reference ``spec_verify.verify_logits_ragged``: the ragged layout, each sequence its own warping."""
    values = ragged_warp_types(temperature, top_k, top_p, min_p)
    check_generator(generator)
    check_rows_tensor("target_logits", target_logits, 2)
    check_rows_tensor("draft_logits", draft_logits, 2)  # required: None is no point mass here
    shape = check_ragged(target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_logits", draft_name="draft_logits")
    vectors = ragged_warp_vectors(values, shape.batch)
    warps = [check_warp(*args) for args in zip(*(v.tolist() for v in vectors))]
    u = _take_uniforms(uniforms, generator, (shape.total + shape.batch,),
                       draw=not all(w.greedy for w in warps), what=RAGGED_UNIFORMS)

    def decide(b, k):
        rows, drafts, tokens, bonus = _ragged_slices(shape, b, k, target_logits, draft_logits, draft_tokens,
                                                     bonus_tokens)
        u0 = shape.uniform_start(b)
        return _logits_sequence(_with_bonus(WarpedRows(rows, drafts, warps[b], (b,)), bonus), tokens,
                                None if u is None else u[u0:u0 + k + 1].tolist())

    return _run_ragged(shape, decide)


def sample_draft(draft_logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None,
                 uniforms=None) -> torch.Tensor:
    """Reference ``spec_verify.sample_draft`` on ``[..., V]`` logits -> int64 ``[...]``.

    Row ``j`` (rows in row-major order) is drawn with ``uniforms[j]`` by
    inverse CDF over its warped weights: the smallest id whose cumulative
    weight exceeds ``u * total``. Temperature 0: the argmax, no uniform used.
    """
    warp = _checked_warp(generator, temperature, top_k, top_p, min_p)
    check_rows_tensor("draft_logits", draft_logits, None)
    check_vocab("draft_logits", draft_logits.shape[-1] if draft_logits.dim() >= 1 else 0)
    check_has_values(draft_logits=draft_logits)
    rows = draft_logits.reshape(-1, draft_logits.shape[-1])
    count = rows.shape[0]
    if isinstance(uniforms, torch.Tensor):
        uniforms = uniforms.reshape(-1)
    u = _take_uniforms(uniforms, generator, (count,), draw=not warp.greedy, what="one per row of draft_logits")
    tokens = torch.empty(count, dtype=torch.int64)
    for j in range(count):
        if warp.greedy:
            tokens[j] = checked_argmax(rows[j], "draft_logits", (j,))
        else:
            tokens[j] = inverse_cdf(warp_row(rows[j], warp, "draft_logits", (j,)).double(), float(u[j]))
    return tokens.reshape(draft_logits.shape[:-1]).to(draft_logits.device)


def warp_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, normalize=True) -> torch.Tensor:
    """Reference ``spec_verify.warp_probs``: the warped weights, divided by their
    float64 sum (rounded once to float32) when ``normalize``."""
    scalars = warp_scalars(temperature, top_k, top_p, min_p)
    check_flag("normalize", normalize)
    check_warp(*scalars)
    weights = warp_weights(logits, temperature, top_k, top_p, min_p)
    if not normalize:
        return weights
    w64 = weights.double()
    return (w64 / w64.sum(-1, keepdim=True)).float()
