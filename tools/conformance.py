"""Conformance harness: a verifier against the exact law of speculative sampling.

Runs N verification rounds on one fixed target/draft pair. Every round draws
each draft token afresh from its draft row (token i from q_i) and K+1 fresh
uniforms, calls the verifier, and records ``(n_accepted, next_token)``. The
record is then held to the law (``spec_verify.law``, from the built kernel):

* the accepted-length histogram against ``N * P(n = j)``: chi-square;
* the emitted token at every position ``j``, among the rounds with ``n == j``,
  against ``N_j * row_j`` of ``emitted_token_law``: one chi-square per position;
* the mean accepted length against ``E[n]``: a z-score with standard error
  ``sqrt(Var[n] / N)``, two-sided normal p-value.

Chi-square cells of expected count < 5 are pooled (and a pooled cell still
below 5 joins the smallest other cell). An observation in a cell of expected
count exactly zero (e.g. a token of zero probability) fails at once. One
significance level ``alpha`` (default 1e-3) is declared for the whole run and
split Bonferroni-style over the ``K + 3`` tests fixed in advance (length,
mean, K+1 positions); a position never reached counts as a test that passes.

Library use::

    from tools.conformance import run_conformance, kernel_verifier, family
    target, draft = family("zipf-smoothed")
    result = run_conformance(kernel_verifier(sv), target, draft, rounds=20_000)
    assert result.passed, result.report()

Command line (``python -m tools.conformance --help``)::

    python -m tools.conformance --family pi-0.678 --rounds 1000000
    python -m tools.conformance --verifier resample-from-target   # must FAIL

Verifiers follow the *rounds protocol*: ``verifier(target_probs [K+1, V],
draft_probs [K, V], draft_tokens [B, K] int64, uniforms [B, K+1] float64) ->
(n_accepted [B], next_token [B])``, B rounds of the same pair at once.
``single_round_verifier`` adapts a one-round ``verify(target_probs,
draft_probs, draft_tokens, uniforms=...)``; ``kernel_verifier(sv)`` wraps the
kernel's batched op. Two deliberately wrong verifiers (negative controls) ship
here as wrappers around any verifier (the kernel, on the command line):
``resample_from_target`` (on rejection, draws from p_i instead of the
residual) and ``ignore_uniform`` (accept tests use a fixed 0.5; 0.0 accepts
always). They must FAIL. ``numpy_verifier`` is an independent correct
implementation: the harness's positive control.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import sys
import time
from typing import Callable

import numpy as np
import torch
from scipy import stats

from tools.kernel_loader import load_kernel

REPO = pathlib.Path(__file__).resolve().parents[1]
MIN_EXPECTED = 5.0

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple]


# The exact law, from the built kernel package (spec_verify.law).
law = load_kernel().law


# ----------------------------------------------------------------------------
# Drawing the rounds
# ----------------------------------------------------------------------------


def _inverse_cdf(cumulative: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Smallest id whose cumulative mass exceeds ``u * total`` (never a zero-mass id)."""
    idx = np.searchsorted(cumulative, u * cumulative[-1], side="right")
    # u * total can round up to the total: fall back to the last positive-mass id.
    last = int(np.flatnonzero(np.diff(cumulative, prepend=0.0) > 0)[-1])
    return np.minimum(idx, last)


def draw_rounds(draft_probs: torch.Tensor, rounds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """All draft tokens and uniforms for ``rounds`` rounds, vectorized.

    Returns ``draft_tokens [rounds, K]`` int64 (token i drawn from row i of
    ``draft_probs``, normalized in float64) and ``uniforms [rounds, K+1]``
    float64 in ``[0, 1)``, from ``numpy.random.default_rng([seed, 1])``: a
    stream distinct from the ``default_rng(seed)`` that builds the test pairs.
    """
    rng = np.random.default_rng([seed, 1])
    rows = draft_probs.detach().double().cpu().numpy()
    k = rows.shape[0]
    tokens = np.empty((rounds, k), dtype=np.int64)
    for i in range(k):
        tokens[:, i] = _inverse_cdf(np.cumsum(rows[i]), rng.random(rounds))
    uniforms = rng.random((rounds, k + 1))
    return tokens, uniforms


# ----------------------------------------------------------------------------
# Verifiers (rounds protocol)
# ----------------------------------------------------------------------------


def single_round_verifier(verify) -> Verifier:
    """Adapt ``verify(target, draft, tokens [K], uniforms=[K+1]) -> (n, next)`` to many rounds."""

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        out = np.empty((draft_tokens.shape[0], 2), dtype=np.int64)
        for b in range(draft_tokens.shape[0]):
            out[b] = verify(target_probs, draft_probs, draft_tokens[b], uniforms=uniforms[b])
        return out[:, 0], out[:, 1]

    return rounds


def batched_verifier(verify_sampled_batched) -> Verifier:
    """Adapt ``verify_sampled_batched(target [B,K+1,V], draft [B,K,V], tokens [B,K], uniforms=[B,K+1])``.

    The pair is broadcast over the batch without copying (stride-0 expand);
    if the verifier refuses a stride-0 batch, it is materialized instead.
    """
    state = {"expand": True}

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        b = draft_tokens.shape[0]
        target = target_probs.unsqueeze(0).expand(b, -1, -1)
        draft = draft_probs.unsqueeze(0).expand(b, -1, -1)
        if state["expand"]:
            try:
                return verify_sampled_batched(target, draft, draft_tokens, uniforms=uniforms)
            except (ValueError, RuntimeError):
                state["expand"] = False  # why: a kernel may refuse stride-0 batches
        return verify_sampled_batched(
            target.contiguous(), draft.contiguous(), draft_tokens, uniforms=uniforms
        )

    return rounds


def kernel_verifier(sv, batched: bool = True, method: str = "token") -> Verifier:
    """The kernel's ``verify_sampled_batched`` (or its one-round ``verify_sampled``);
    ``method="block"``: ``verify_block_batched`` / ``verify_block``."""
    if method == "block":
        return batched_verifier(sv.verify_block_batched) if batched else single_round_verifier(sv.verify_block)
    if batched:
        return batched_verifier(sv.verify_sampled_batched)
    return single_round_verifier(sv.verify_sampled)


def point_mass_verifier(sv) -> Verifier:
    """The kernel's ``verify_sampled_ragged`` with ``draft_probs=None``: each drawn token a point mass.

    The tokens are still drawn from the draft rows (``draw_rounds``), but the
    verifier is not told them: it accepts ``t`` with probability ``p(t)`` and
    else draws from ``p`` with ``t`` removed (DESIGN.md, "Short drafts, prompt
    lookup, point masses"). Its law is ``point_mass_law``.
    """

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        b, k = draft_tokens.shape
        # Flat layout: sequence i's K test uniforms and final draw at [i(K+1), (i+1)(K+1)).
        target = target_probs.unsqueeze(0).expand(b, -1, -1).reshape(b * (k + 1), -1)
        cu = torch.arange(1, b + 1, dtype=torch.int64) * k
        return sv.verify_sampled_ragged(target, None, draft_tokens.reshape(-1), cu, uniforms=uniforms.reshape(-1))

    return rounds


def hidden_pair(sv, vocab: int = 64, dim: int = 32, k: int = 4, temperature: float = 0.8, seed: int = 0):
    """``(head, hidden [K+1, d], target_probs [K+1, V], draft_probs [K, V])`` for ``verify_hidden``.

    A random float32 head and hidden rows (scaled so the rows are peaked, as a
    model's confident positions: point-mass drafts are often accepted); the
    target rows are the head's logits (the C++ op's, ``lm_head.reference_logits``
    bit for bit) warped at ``temperature``, in float64; the draft rows are
    0.7 target + 0.3 another random row. The law is computed from these rows,
    the verifier reads only ``hidden`` and ``head``.
    """
    g = torch.Generator().manual_seed(seed)
    head = sv.LMHead(torch.randn(vocab, dim, generator=g))
    hidden = 1.0 * torch.randn(k + 1, dim, generator=g)
    logits = sv.ops.hidden_logits(hidden, head.weight, head.bias, head.format_code, head.dim).double()
    target = torch.softmax(logits / temperature, -1)
    other = torch.softmax(torch.randn(k, vocab, generator=g, dtype=torch.float64) * 2, -1)
    draft = 0.7 * target[:k] + 0.3 * other
    return head, hidden, target, draft


def hidden_verifier(sv, head, hidden: torch.Tensor, temperature: float) -> Verifier:
    """The kernel's ``verify_hidden`` with point-mass drafts (``draft_logits=None``), one call per round.

    Tokens drawn from the draft rows are verified from ``hidden`` and ``head``
    alone (the target rows passed in are the law's, never read): the one-pass
    C++ op at ``temperature``. Its law is ``point_mass_law``.
    """

    return single_round_verifier(lambda target, draft, tokens, uniforms: sv.verify_hidden(
        hidden, head, tokens, temperature=temperature, uniforms=uniforms))


def point_mass_law(target_probs: torch.Tensor, draft_probs: torch.Tensor):
    """``(acceptance [K], emitted rows [K+1, V])`` of point-mass verification of tokens drawn from q.

    Position i accepts ``t ~ q_i`` with probability ``p_i(t)``: ``alpha_i =
    sum_x q_i(x) p_i(x)``. After a rejection at j the token is ``x`` with
    probability ``sum_{t != x} q_j(t) p_j(x) / (1 - alpha_j) = p_j(x) (1 -
    q_j(x)) / (1 - alpha_j)``; after a full acceptance it is drawn from
    ``p_K``. Rows normalized by their own float64 sums, as the kernel does.
    """
    p = target_probs.double()
    p = p / p.sum(-1, keepdim=True)
    q = draft_probs.double()
    q = q / q.sum(-1, keepdim=True)
    k = q.shape[0]
    alpha = (p[:k] * q).sum(-1)
    rows = p.clone()
    rows[:k] = p[:k] * (1.0 - q)
    rows[:k] = rows[:k] / rows[:k].sum(-1, keepdim=True).clamp_min(1e-300)
    return alpha, rows


class _NumpyRule:
    """The correct rejection sampler, vectorized in numpy over a fixed pair.

    Independent of the kernel: running it through the harness is the
    harness's own positive control, and it is the default base of the
    negative controls below.
    """

    def __init__(self):
        self._cache: tuple | None = None

    def _tables(self, target_probs, draft_probs):
        key = (id(target_probs), id(draft_probs))
        if self._cache is None or self._cache[0] != key:
            target_rows = target_probs.double().cpu().numpy()
            draft_rows = draft_probs.double().cpu().numpy()
            target_rows = target_rows / target_rows.sum(1, keepdims=True)
            draft_rows = draft_rows / draft_rows.sum(1, keepdims=True)
            k = draft_rows.shape[0]
            residual = np.clip(target_rows[:k] - draft_rows, 0.0, None)
            empty = residual.sum(1) == 0
            residual[empty] = target_rows[:k][empty]  # why: rows equal, rejection impossible; the kernel's fallback
            cdfs = [np.cumsum(r) for r in residual] + [np.cumsum(target_rows[k])]
            self._cache = (key, target_rows, draft_rows, cdfs)
        return self._cache[1:]

    def __call__(self, target_probs, draft_probs, draft_tokens, uniforms):
        target_rows, draft_rows, cdfs = self._tables(target_probs, draft_probs)
        tokens = np.asarray(draft_tokens)
        u = np.asarray(uniforms, dtype=np.float64)
        k = tokens.shape[1]
        cols = np.arange(k)
        accepted = u[:, :k] * draft_rows[cols, tokens] < target_rows[cols, tokens]
        n = np.where(accepted.all(1), k, np.argmin(accepted, axis=1)) if k else np.zeros(len(u), np.int64)
        nxt = np.empty(len(u), dtype=np.int64)
        for j in range(k + 1):
            sel = n == j
            if sel.any():
                nxt[sel] = _inverse_cdf(cdfs[j], u[sel, k])
        return n, nxt


def block_h_equals_p(seed: int = 0) -> Verifier:
    """NEGATIVE CONTROL for block verification: ``h_i = p_i`` (the residual weight
    left out), else as Algorithm 2: the block ends at the largest ``i`` with
    ``u_{i-1} < p_i``, the correction drawn from ``norm(max(0, p_i p_i - q_i))``.
    Numpy, one V-vector per correction. Must FAIL."""

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        t = target_probs.double().numpy()
        d = draft_probs.double().numpy()
        t, d = t / t.sum(1, keepdims=True), d / d.sum(1, keepdims=True)
        tokens, u = np.asarray(draft_tokens), np.asarray(uniforms, dtype=np.float64)
        count, k = tokens.shape
        weights = np.ones((count, k + 1))
        for i in range(k):
            weights[:, i + 1] = np.minimum(1.0, weights[:, i] * t[i, tokens[:, i]] / d[i, tokens[:, i]])
        n = np.zeros(count, dtype=np.int64)
        for i in range(1, k + 1):  # the largest i wins
            n = np.where(u[:, i - 1] < weights[:, i], i, n)
        nxt = np.empty(count, dtype=np.int64)
        for b in range(count):
            j = n[b]
            row = t[k] if j == k else np.clip(weights[b, j] * t[j] - d[j], 0.0, None)
            if row.sum() <= 0:
                row = t[j]
            nxt[b] = _inverse_cdf(np.cumsum(row), u[b, k : k + 1])[0]
        return n, nxt

    return rounds


def numpy_verifier() -> Verifier:
    """Correct, vectorized numpy implementation (the harness's positive control)."""
    return _NumpyRule()


def resample_from_target(base: Verifier | None = None) -> Verifier:
    """NEGATIVE CONTROL: on rejection at i, emit a draw from p_i instead of norm(max(0, p_i - q_i)).

    Wraps ``base`` (default: the numpy verifier; the kernel works too): its
    accept/reject decisions are kept, its correction token is replaced by
    the inverse-CDF draw from the target row with the same last uniform.
    """
    base = base or numpy_verifier()

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        out = base(target_probs, draft_probs, draft_tokens, uniforms)
        n, nxt = (torch.as_tensor(a).numpy().astype(np.int64) for a in out)
        k = draft_tokens.shape[1]
        rows = target_probs.double().cpu().numpy()
        u_last = np.asarray(uniforms)[:, k]
        for j in range(k):
            sel = n == j
            if sel.any():
                nxt[sel] = _inverse_cdf(np.cumsum(rows[j]), u_last[sel])
        return n, nxt

    return rounds


def ignore_uniform(base: Verifier | None = None, value: float = 0.5) -> Verifier:
    """NEGATIVE CONTROL: every accept test uses ``value`` instead of its own uniform u_i.

    Wraps ``base`` (default: the numpy verifier; the kernel works too), so
    t_i is accepted iff ``value * q_i(t_i) < p_i(t_i)``: deterministic given
    the tokens.
    """
    base = base or numpy_verifier()

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        fixed = uniforms.clone()
        fixed[:, : draft_tokens.shape[1]] = value
        return base(target_probs, draft_probs, draft_tokens, fixed)

    return rounds


# ----------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class ChiSquare:
    """One chi-square goodness-of-fit test after pooling small cells."""

    name: str
    labels: list[str]
    observed: np.ndarray
    expected: np.ndarray
    statistic: float
    df: int
    pvalue: float
    impossible: int  # observations in cells of expected count exactly 0

    def cells_table(self, limit: int = 12) -> str:
        """Expected beside observed, the cells contributing most to the statistic first."""
        with np.errstate(divide="ignore", invalid="ignore"):
            contrib = np.where(self.expected > 0, (self.observed - self.expected) ** 2 / self.expected, np.inf)
        order = np.argsort(-contrib)[:limit]
        lines = [f"    {'cell':>22} {'expected':>12} {'observed':>10} {'(o-e)^2/e':>10}"]
        for c in order:
            lines.append(
                f"    {self.labels[c]:>22} {self.expected[c]:12.2f} {int(self.observed[c]):10d} {contrib[c]:10.2f}"
            )
        if self.impossible:
            lines.append(f"    {self.impossible} observation(s) in cells of probability zero")
        return "\n".join(lines)


def chi_square(name: str, observed: np.ndarray, expected: np.ndarray, labels: list[str]) -> ChiSquare:
    """Chi-square test of counts against expected counts, pooling cells of expected < 5.

    Cells with expected count exactly 0 are dropped from the statistic; any
    observation in one makes the test fail outright (p = 0). Fewer than two
    cells after pooling leave nothing to test (df = 0, p = 1).
    """
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    impossible = int(observed[expected <= 0].sum())
    live = expected > 0
    big = live & (expected >= MIN_EXPECTED)
    small = live & ~big
    obs = list(observed[big])
    exp = list(expected[big])
    labs = [labels[i] for i in np.flatnonzero(big)]
    if small.any():
        pooled_obs, pooled_exp = float(observed[small].sum()), float(expected[small].sum())
        if pooled_exp >= MIN_EXPECTED or not exp:
            obs.append(pooled_obs), exp.append(pooled_exp), labs.append(f"{int(small.sum())} pooled")
        else:  # why: a pooled cell below 5 joins the smallest cell
            i = int(np.argmin(exp))
            obs[i] += pooled_obs
            exp[i] += pooled_exp
            labs[i] += f"+{int(small.sum())}"
    obs_a, exp_a = np.array(obs), np.array(exp)
    df = len(obs_a) - 1
    if df < 1:
        stat, pvalue = 0.0, 1.0
    else:
        exp_a = exp_a * (obs_a.sum() / exp_a.sum())  # why: float rounding in N * pmf
        stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
        pvalue = float(stats.chi2.sf(stat, df))
    if impossible:
        pvalue = 0.0
    return ChiSquare(name, labs, obs_a, exp_a, stat, df, pvalue, impossible)


@dataclasses.dataclass
class ConformanceResult:
    """Everything a run measured, and the verdict at the declared level."""

    name: str
    rounds: int
    k: int
    vocab: int
    alpha: float  # the declared family-wise significance level
    per_test_alpha: float  # alpha / number_of_tests (Bonferroni)
    acceptance: list[float]  # law: alpha_i per position
    pmf: np.ndarray  # law: P(n = j)
    histogram: np.ndarray  # observed counts of n
    mean: float
    mean_law: float
    std_error: float
    z: float
    z_pvalue: float
    chi_squares: list[ChiSquare]
    seconds: float  # whole run
    verifier_seconds: float  # inside the verifier calls only

    @property
    def pvalues(self) -> dict[str, float]:
        """Every test's p-value, by name."""
        out = {c.name: c.pvalue for c in self.chi_squares}
        out["mean z"] = self.z_pvalue
        return out

    @property
    def worst_pvalue(self) -> float:
        return min(self.pvalues.values())

    @property
    def worst_chi_square_pvalue(self) -> float:
        return min(c.pvalue for c in self.chi_squares)

    @property
    def passed(self) -> bool:
        return self.worst_pvalue >= self.per_test_alpha

    def table(self) -> str:
        """Accepted-length histogram beside the law, with the mean line."""
        lines = [f"  {'n':>3} {'law P(n)':>10} {'expected':>12} {'observed':>10} {'obs freq':>10}"]
        for j, (prob, count) in enumerate(zip(self.pmf, self.histogram)):
            lines.append(
                f"  {j:>3} {prob:10.6f} {prob * self.rounds:12.1f} {int(count):10d} {count / self.rounds:10.6f}"
            )
        lines.append(
            f"  mean accepted {self.mean:.5f} vs law {self.mean_law:.5f}"
            f" (se {self.std_error:.5f}, z = {self.z:+.2f}, p = {self.z_pvalue:.3g})"
        )
        return "\n".join(lines)

    def report(self) -> str:
        """Full verdict; failing tests show expected beside observed."""
        verdict = "PASS" if self.passed else "FAIL"
        head = (
            f"[{verdict}] {self.name}: {self.rounds} rounds, K = {self.k}, V = {self.vocab}; "
            f"alpha = {self.alpha:g} over {len(self.pvalues)} tests "
            f"(each at {self.per_test_alpha:.3g}); {self.seconds:.2f} s total, "
            f"{1e6 * self.verifier_seconds / max(self.rounds, 1):.2f} us/round in the verifier"
        )
        rates = "  law: alpha_i = " + ", ".join(f"{a:.4f}" for a in self.acceptance)
        lines = [head, rates, self.table()]
        for c in self.chi_squares:
            flag = "ok " if c.pvalue >= self.per_test_alpha else "BAD"
            lines.append(f"  {flag} {c.name:<22} cells {c.df + 1:>5}  chi2 {c.statistic:12.2f}  p = {c.pvalue:.3g}")
            if c.pvalue < self.per_test_alpha:
                lines.append(c.cells_table())
        return "\n".join(lines)


def _length_test(n: np.ndarray, pmf: np.ndarray) -> tuple[np.ndarray, ChiSquare]:
    k = len(pmf) - 1
    if (n < 0).any() or (n > k).any():
        raise ValueError(f"verifier returned n_accepted outside [0, {k}]")
    hist = np.bincount(n, minlength=k + 1)
    labels = [f"n={j}" for j in range(k + 1)]
    return hist, chi_square("accepted length", hist, len(n) * pmf, labels)


def _token_tests(n: np.ndarray, nxt: np.ndarray, rows: np.ndarray) -> list[ChiSquare]:
    k1, vocab = rows.shape
    if (nxt < 0).any() or (nxt >= vocab).any():
        raise ValueError(f"verifier returned next_token outside [0, {vocab})")
    labels = [f"x={x}" for x in range(vocab)]
    tests = []
    for j in range(k1):
        emitted = nxt[n == j]
        counts = np.bincount(emitted, minlength=vocab)
        tests.append(chi_square(f"next token | n={j}", counts, len(emitted) * rows[j], labels))
    return tests


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    # A live bar in a terminal; in a log (not a tty) a line every ~10 s instead of a flood.
    interactive = sys.stderr.isatty()
    return tqdm(total=total, unit="round", unit_scale=True, desc=desc, file=sys.stderr,
                mininterval=0.1 if interactive else 10.0)


def run_conformance(
    verifier: Verifier,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    rounds: int,
    *,
    seed: int = 0,
    alpha: float = 1e-3,
    chunk: int = 8192,
    progress: bool = False,
    name: str = "",
    law_module=None,
    method: str = "token",
) -> ConformanceResult:
    """Run ``rounds`` verification rounds of one pair and test them against the law.

    Parameters
    ----------
    verifier : callable
        Rounds protocol (module docstring); see ``kernel_verifier``.
    target_probs, draft_probs : torch.Tensor
        ``[K+1, V]`` and ``[K, V]``, passed to the verifier unchanged (the law
        is computed from these very tensors, in float64).
    rounds : int
        Number of rounds N.
    seed : int
        Seed of the draft tokens and uniforms (numpy ``default_rng``).
    alpha : float
        Family-wise significance level, split over the ``K + 3`` tests.
    chunk : int
        Rounds per verifier call.
    progress : bool
        Show a tqdm progress bar.
    name : str
        Label of the run in its report.
    law_module : module, optional
        Where the law comes from: anything with ``acceptance_rates``,
        ``accepted_length_pmf``, ``emitted_token_law``, ``expected_accepted``
        and ``accepted_length_variance`` (the loaded kernel qualifies).
        Default: ``torch-ext/spec_verify/law.py`` of this checkout.
    method : str
        The law tested: ``"token"`` (rejection sampling), ``"block"`` (block
        verification: ``block_joint_law``, by enumeration of ratio paths, so the
        pair needs few distinct ratios ``p/q`` per row: ``block-groups``) or
        ``"point-mass"`` (tokens drawn from the draft rows, verified as point
        masses: ``point_mass_law``; the verifier is ``point_mass_verifier``).
    """
    start = time.perf_counter()
    the_law = law if law_module is None else law_module
    k, vocab = draft_probs.shape
    acceptance = the_law.acceptance_rates(target_probs, draft_probs)
    if method == "block":
        joint = the_law.block_joint_law(target_probs, draft_probs)
        pmf_t = joint.sum(-1)
        rows = (joint / pmf_t.clamp_min(1e-300).unsqueeze(-1)).numpy()
        pmf = pmf_t.numpy()
        j = np.arange(k + 1)
        mean_law = float((pmf * j).sum())
        variance = float((pmf * j * j).sum()) - mean_law**2
    else:
        if method == "point-mass":
            acceptance, rows_t = point_mass_law(target_probs, draft_probs)
            rows = rows_t.numpy()
        else:
            rows = the_law.emitted_token_law(target_probs, draft_probs).numpy()
        pmf = the_law.accepted_length_pmf(acceptance).numpy()
        mean_law = the_law.expected_accepted(acceptance)
        variance = the_law.accepted_length_variance(acceptance)

    tokens, uniforms = draw_rounds(draft_probs, rounds, seed)
    n = np.empty(rounds, dtype=np.int64)
    nxt = np.empty(rounds, dtype=np.int64)
    in_verifier = 0.0
    bar = _progress(rounds, progress, name or "conformance")
    for lo in range(0, rounds, chunk):
        hi = min(rounds, lo + chunk)
        tok_t, u_t = torch.from_numpy(tokens[lo:hi]), torch.from_numpy(uniforms[lo:hi])
        t0 = time.perf_counter()
        out_n, out_next = verifier(target_probs, draft_probs, tok_t, u_t)
        in_verifier += time.perf_counter() - t0
        n[lo:hi], nxt[lo:hi] = torch.as_tensor(out_n).numpy(), torch.as_tensor(out_next).numpy()
        if bar is not None:
            bar.update(hi - lo)
    if bar is not None:
        bar.close()

    hist, length = _length_test(n, pmf)
    chis = [length] + _token_tests(n, nxt, rows)
    se = math.sqrt(max(variance, 0.0) / max(rounds, 1))
    mean = float(n.mean()) if rounds else float("nan")
    z = (mean - mean_law) / se if se > 0 else (0.0 if mean == mean_law else math.inf)
    z_p = float(2 * stats.norm.sf(abs(z)))
    n_tests = len(chis) + 1
    return ConformanceResult(
        name=name or "verifier",
        rounds=rounds,
        k=k,
        vocab=vocab,
        alpha=alpha,
        per_test_alpha=alpha / n_tests,
        acceptance=acceptance.tolist(),
        pmf=pmf,
        histogram=hist,
        mean=mean,
        mean_law=mean_law,
        std_error=se,
        z=z,
        z_pvalue=z_p,
        chi_squares=chis,
        seconds=time.perf_counter() - start,
        verifier_seconds=in_verifier,
    )


# ----------------------------------------------------------------------------
# Test pairs
# ----------------------------------------------------------------------------


def _zipf_row(rng: np.random.Generator, vocab: int, exponent: float) -> np.ndarray:
    """Zipf-like weights 1/(rank+1)^s on a random permutation of the vocabulary."""
    weights = 1.0 / np.arange(1, vocab + 1) ** exponent
    return weights[rng.permutation(vocab)]


def _normalize(row: np.ndarray) -> np.ndarray:
    return row / row.sum()


def _mix_for_acceptance(target_row: np.ndarray, other_row: np.ndarray, acceptance: float) -> np.ndarray:
    """``lam * p + (1 - lam) * r`` with ``sum min(p, .) = acceptance``, lam by bisection.

    The overlap is nondecreasing in lam (each term is p or grows toward p), so
    bisection finds it whenever ``sum min(p, r) <= acceptance < 1``.
    """
    target_row, other_row = _normalize(target_row), _normalize(other_row)

    def overlap(lam: float) -> float:
        return float(np.minimum(target_row, lam * target_row + (1 - lam) * other_row).sum())

    if overlap(0.0) > acceptance:
        raise ValueError(f"the pair already overlaps by {overlap(0.0):.4f} > {acceptance}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if overlap(mid) < acceptance else (lo, mid)
    lam = 0.5 * (lo + hi)
    return lam * target_row + (1 - lam) * other_row


def imperfect_pair(vocab: int, k: int, acceptance: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A Zipf target and a draft mixed toward an unrelated Zipf row, every alpha_i ~= ``acceptance``.

    Rows are float32 (the kernel's input dtype); tuning happens in float64
    before the cast, so the realized alpha_i is within ~1e-6 of the goal.
    """
    rng = np.random.default_rng(seed)
    target = np.stack([_normalize(_zipf_row(rng, vocab, 1.0 + 0.05 * i)) for i in range(k + 1)])
    draft = np.stack(
        [_mix_for_acceptance(target[i], _zipf_row(rng, vocab, 1.1), acceptance) for i in range(k)]
    )
    return torch.from_numpy(target).float(), torch.from_numpy(draft).float()


def _zipf_smoothed(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Draft: the target flattened (power < 1) and mixed with a little uniform mass.
    target = np.stack([_normalize(_zipf_row(rng, vocab, 0.9 + 0.1 * i)) for i in range(k + 1)])
    draft = np.stack([_normalize(0.95 * _normalize(target[i] ** 0.6) + 0.05 / vocab) for i in range(k)])
    return target, draft


def _sharper_draft(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Draft: the target squared (sharper, over-confident), softmax of gaussian logits.
    target = np.stack([_normalize(np.exp(1.5 * rng.standard_normal(vocab))) for _ in range(k + 1)])
    draft = np.stack([_normalize(target[i] ** 2) for i in range(k)])
    return target, draft


def _disjoint_zeros(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Row 0 identical (alpha = 1: never rejected), row 1 partial overlap with
    # exact zeros, row 2 disjoint supports (alpha = 0), later rows unreachable.
    assert k >= 3, "disjoint-zeros needs K >= 3"
    target = rng.random((k + 1, vocab))
    draft = rng.random((k, vocab))
    draft[0] = target[0]
    target[1, vocab // 2 :] = 0.0
    draft[1, : vocab // 4] = 0.0
    target[1, ::7] = 0.0
    target[2, vocab // 2 :] = 0.0
    draft[2, : vocab // 2] = 0.0
    target[k, ::3] = 0.0
    return target, draft


def _scales(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Unnormalized rows at 1e-20 and 1e20 (float32 keeps both), with zeros in the bonus row.
    target = rng.random((k + 1, vocab)) ** 3
    draft = rng.random((k, vocab)) ** 2
    target[k, ::5] = 0.0
    for i in range(k + 1):
        target[i] *= 1e-20 if i % 2 == 0 else 1e20
    for i in range(k):
        draft[i] *= 1e20 if i % 2 == 0 else 1e-20
    return target, draft


def _block_groups(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Block verification's law enumerates paths of ratios p/q: integer Zipf
    # weights (exact in float32) and a draft that multiplies each of three
    # token groups by 1, 2 or 5: three ratios per row, 3^K paths.
    target = np.stack([np.floor(2.0**20 / np.arange(1, vocab + 1)[rng.permutation(vocab)] ** (0.9 + 0.05 * i)) + 1
                       for i in range(k + 1)])
    factors = np.array([1.0, 2.0, 5.0])
    draft = np.stack([target[i] * factors[rng.integers(0, 3, vocab)] for i in range(k)])
    return target, draft


def _peaked(vocab: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # Lognormal rows (sigma 5): a few tokens carry most of the mass, as in a
    # model's confident positions, so a point-mass draft is often accepted and
    # its rejected token's removal matters (point-mass runs); the draft is
    # 0.7 target + 0.3 another such row.
    target = np.exp(5.0 * rng.standard_normal((k + 1, vocab)))
    other = np.exp(5.0 * rng.standard_normal((k, vocab)))
    target = target / target.sum(-1, keepdims=True)
    draft = 0.7 * target[:k] + 0.3 * other / other.sum(-1, keepdims=True)
    return target, draft


FAMILIES = {
    "zipf-smoothed": (_zipf_smoothed, 1000, 4),
    "sharper-draft": (_sharper_draft, 111, 5),
    "disjoint-zeros": (_disjoint_zeros, 64, 4),
    "scales": (_scales, 257, 3),
    "peaked": (_peaked, 1000, 4),
}
# The user's reference experiment (600 rounds on a Raspberry Pi, K = 4, every
# alpha_i = 0.678), as a pair: V = 32000 by default.
PI_FAMILY = "pi-0.678"
# Block verification's pair (few ratios p/q per row, so its law can be enumerated):
# not among FAMILIES, whose token-wise runs are sized for V ~ 1000.
BLOCK_FAMILY = "block-groups"


def family(
    name: str, vocab: int | None = None, k: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A named float32 target/draft pair ``([K+1, V], [K, V])``; ``seed`` seeds its RNG.

    ``zipf-smoothed``, ``sharper-draft``, ``disjoint-zeros``, ``scales``, ``peaked``, and
    ``pi-0.678`` (V = 32000, K = 4, every alpha_i ~= 0.678: the Pi experiment's pair),
    ``block-groups`` (V = 32000, K = 4, three ratios p/q per row: block verification's).
    """
    if name == PI_FAMILY:
        return imperfect_pair(vocab or 32000, 4 if k is None else k, 0.678, seed)
    if name not in FAMILIES and name != BLOCK_FAMILY:
        raise ValueError(f"unknown family {name!r}; choose from {sorted(FAMILIES) + [PI_FAMILY, BLOCK_FAMILY]}")
    build, default_vocab, default_k = FAMILIES[name] if name in FAMILIES else (_block_groups, 32000, 4)
    target, draft = build(vocab or default_vocab, default_k if k is None else k, np.random.default_rng(seed))
    return torch.from_numpy(target).float(), torch.from_numpy(draft).float()


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def _verifier_by_name(name: str) -> Verifier:
    if name == "kernel":
        return kernel_verifier(load_kernel())
    if name == "kernel-single":
        return kernel_verifier(load_kernel(), batched=False)
    if name == "reference":
        return single_round_verifier(load_kernel().reference.verify_sampled)
    if name == "block":
        return kernel_verifier(load_kernel(), method="block")
    if name == "block-h-equals-p":
        return block_h_equals_p()
    if name == "resample-from-target":
        return resample_from_target(kernel_verifier(load_kernel()))
    if name == "point-mass":
        return point_mass_verifier(load_kernel())
    if name == "point-mass-resample-from-target":
        return resample_from_target(point_mass_verifier(load_kernel()))
    if name == "ignore-uniform":
        return ignore_uniform(kernel_verifier(load_kernel()))
    return numpy_verifier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1_000_000, help="verification rounds (default 10^6)")
    parser.add_argument("--family", default=PI_FAMILY, help=f"pair: {PI_FAMILY} or one of " + ", ".join(FAMILIES))
    parser.add_argument("--vocab", type=int, default=None, help="override V")
    parser.add_argument("--k", type=int, default=None, help="override K")
    parser.add_argument(
        "--verifier",
        default="kernel",
        choices=["kernel", "kernel-single", "reference", "numpy", "resample-from-target", "ignore-uniform",
                 "block", "block-h-equals-p", "point-mass", "point-mass-resample-from-target",
                 "hidden", "hidden-resample-from-target"],
        help="block, block-h-equals-p: tested against block verification's law, on --family "
             "block-groups unless another is named; point-mass*: tokens drawn from the draft rows, "
             "verified as point masses (draft_probs=None), against point_mass_law (use --chunk 256 at V = 32000); "
             "hidden*: verify_hidden from hidden states and a random head (V = --vocab or 64, d = 32, K = --k "
             "or 4, T = 0.8), point-mass drafts, against point_mass_law",
    )
    parser.add_argument("--alpha", type=float, default=1e-3, help="family-wise significance level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=8192, help="rounds per verifier call")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    method = ("block" if args.verifier.startswith("block")
              else "point-mass" if args.verifier.startswith(("point-mass", "hidden")) else "token")
    family_name = BLOCK_FAMILY if method == "block" and args.family == PI_FAMILY else args.family
    if args.verifier.startswith("hidden"):
        sv = load_kernel()
        head, hidden, target, draft = hidden_pair(sv, args.vocab or 64, k=4 if args.k is None else args.k,
                                                  seed=args.seed)
        verifier = hidden_verifier(sv, head, hidden, 0.8)
        if args.verifier == "hidden-resample-from-target":
            verifier = resample_from_target(verifier)
        family_name = f"hidden (V = {target.shape[1]}, d = {head.dim}, T = 0.8)"
    else:
        target, draft = family(family_name, args.vocab, args.k, args.seed)
        verifier = _verifier_by_name(args.verifier)
    result = run_conformance(
        verifier,
        target,
        draft,
        args.rounds,
        seed=args.seed,
        alpha=args.alpha,
        chunk=args.chunk,
        progress=True,
        name=f"{args.verifier} on {family_name}",
        method=method,
    )
    print(result.report())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
