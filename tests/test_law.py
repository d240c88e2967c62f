"""The exact law of speculative sampling (``spec_verify.law``), checked exactly.

Three independent routes to the same numbers, none of them read off the code
under test:

* hand-derived cases (a few rows worked out on paper);
* brute-force enumeration of the rejection-sampling *process* in exact
  rational arithmetic (``fractions.Fraction``): every draft-token sequence,
  each accept/reject branch with probability ``min(1, p/q)``, the residual on
  rejection; this is the algorithm of Leviathan et al., not the closed form;
* interval enumeration of the *kernel*: for every draft-token sequence, the
  kernel's own decision boundaries in each uniform are located by bisection,
  so the exact output law of ``verify_sampled`` (and of the reference path) is
  measured without any sampling and compared with ``joint_law``.

Everything loads through the ``sv`` fixture: the kernel as a user gets it.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
import torch


@pytest.fixture(scope="module")
def law(sv):
    """The law functions, as exported by the loaded kernel package."""
    return sv


# ----------------------------------------------------------------------------
# Hand-derived cases
# ----------------------------------------------------------------------------


def test_acceptance_rate_hand_case(law):
    # min(.6,.2) + min(.4,.8) = 0.6; min(.25,.5)+min(.25,.25)+min(.5,.25) = 0.75
    target = torch.tensor([[0.6, 0.4, 0.0], [0.25, 0.25, 0.5], [1.0, 1.0, 1.0]])
    draft = torch.tensor([[0.2, 0.8, 0.0], [0.5, 0.25, 0.25]])
    alpha = law.acceptance_rates(target, draft)
    assert alpha.dtype == torch.float64 and alpha.shape == (2,)
    assert alpha.tolist() == pytest.approx([0.6, 0.75], abs=1e-7)


def test_acceptance_rate_extremes(law):
    same = torch.tensor([[0.1, 0.2, 0.7]])
    assert law.acceptance_rates(same, same).item() == pytest.approx(1.0, abs=1e-12)
    disjoint_t = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
    disjoint_d = torch.tensor([[0.0, 0.0, 3.0, 5.0]])
    assert law.acceptance_rates(disjoint_t, disjoint_d).item() == 0.0


def test_acceptance_rate_ignores_scale_and_dtype(law):
    # Each row is normalized by its own sum: 1e-20 and 1e20 scales change nothing.
    target = torch.tensor([[3.0, 1.0, 0.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    draft = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    want = (min(3, 2) + min(1, 2) + min(0, 2) + min(4, 2)) / 8  # = 5/8
    for t_scale, d_scale in [(1e-20, 1e20), (1e20, 1e-20), (1.0, 7.0)]:
        got = law.acceptance_rates(target * t_scale, draft * d_scale).item()
        assert got == pytest.approx(want, abs=1e-12)
    got64 = law.acceptance_rates(target.double() * 1e-300, draft.double() * 1e300).item()
    assert got64 == pytest.approx(want, abs=1e-12)
    assert law.acceptance_rates(target.half(), draft.bfloat16()).item() == pytest.approx(want, abs=1e-12)


def test_acceptance_rates_accepts_k_or_k_plus_one_target_rows(law):
    target = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    draft = torch.tensor([[1.0, 0.0]])
    assert law.acceptance_rates(target, draft).tolist() == [0.5]
    assert law.acceptance_rates(target[:1], draft).tolist() == [0.5]


def test_pmf_hand_cases(law):
    assert law.accepted_length_pmf([0.5, 0.5]).tolist() == [0.5, 0.25, 0.25]
    # alpha_0 = 1, alpha_1 = 0: always exactly one token accepted.
    assert law.accepted_length_pmf([1.0, 0.0]).tolist() == [0.0, 1.0, 0.0]
    assert law.accepted_length_pmf([0.0, 1.0, 1.0]).tolist() == [1.0, 0.0, 0.0, 0.0]
    # K = 0: nothing to accept.
    assert law.accepted_length_pmf([]).tolist() == [1.0]
    pmf = law.accepted_length_pmf(torch.tensor([0.2, 0.9, 0.4], dtype=torch.float64))
    # P(0)=.8, P(1)=.2*.1, P(2)=.2*.9*.6, P(3)=.2*.9*.4
    assert pmf.tolist() == pytest.approx([0.8, 0.02, 0.108, 0.072], abs=1e-15)


def test_expected_accepted_constant_alpha_closed_form(law):
    # Constant a: E[n] = a + a^2 + ... + a^K = a (1 - a^K) / (1 - a).
    for a, k in [(0.678, 4), (0.678, 5), (0.3, 1), (0.999, 7)]:
        closed = a * (1 - a**k) / (1 - a)
        assert law.expected_accepted([a] * k) == pytest.approx(closed, rel=1e-13)
    # The seed's numbers: K = 4, a = 0.678 gives 1.6607, not 1.86.
    assert law.expected_accepted([0.678] * 4) == pytest.approx(1.66066, abs=1e-5)
    assert law.expected_accepted([]) == 0.0
    assert law.expected_accepted([1.0] * 6) == 6.0


def test_expected_and_variance_match_pmf_moments(law):
    alpha = [0.9, 0.2, 0.75, 0.5]
    # By hand: P(n>=1)=.9, P(n>=2)=.18, P(n>=3)=.135, P(n>=4)=.0675
    assert law.expected_accepted(alpha) == pytest.approx(0.9 + 0.18 + 0.135 + 0.0675, abs=1e-15)
    pmf = [0.1, 0.72, 0.045, 0.0675, 0.0675]
    mean = sum(j * w for j, w in enumerate(pmf))
    var = sum(j * j * w for j, w in enumerate(pmf)) - mean**2
    assert law.accepted_length_pmf(alpha).tolist() == pytest.approx(pmf, abs=1e-15)
    assert law.accepted_length_variance(alpha) == pytest.approx(var, abs=1e-14)
    assert law.accepted_length_variance([0.5]) == pytest.approx(0.25, abs=1e-15)


def test_emitted_token_law_hand_case(law):
    target = torch.tensor([[0.6, 0.4], [0.1, 0.9], [0.5, 0.5]])
    draft = torch.tensor([[0.2, 0.8], [0.3, 0.7]])
    # Row 0: max(0, p-q) = (.4, 0) -> (1, 0). Row 1: (0, .2) -> (0, 1). Row 2: p_2.
    rows = law.emitted_token_law(target, draft)
    assert rows.dtype == torch.float64 and rows.shape == (3, 2)
    assert rows.flatten().tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0, 0.5, 0.5], abs=1e-7)


def test_emitted_token_law_fallback_and_zeros(law):
    # Row 0: p == q, residual all zero -> fallback p_0 (rejection has prob. 0).
    # Row 1: p has exact zeros: the residual can never put mass there.
    target = torch.tensor([[1.0, 3.0, 0.0], [0.0, 2.0, 2.0], [0.0, 0.0, 5.0]])
    draft = torch.tensor([[2.0, 6.0, 0.0], [1.0, 1.0, 0.0]])
    rows = law.emitted_token_law(target, draft)
    assert rows[0].tolist() == pytest.approx([0.25, 0.75, 0.0], abs=1e-15)
    # p_1 = (0, .5, .5), q_1 = (.5, .5, 0): residual (0, 0, .5) -> (0, 0, 1).
    assert rows[1].tolist() == pytest.approx([0.0, 0.0, 1.0], abs=1e-15)
    assert rows[2].tolist() == [0.0, 0.0, 1.0]
    assert bool((rows[target == 0] == 0).all())


def test_joint_law_hand_case(law):
    target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    draft = torch.tensor([[0.2, 0.8]])
    # alpha = .6: P(n=0) = .4 all on token 0; P(n=1) = .6 split evenly.
    joint = law.joint_law(target, draft)
    assert joint.flatten().tolist() == pytest.approx([0.4, 0.0, 0.3, 0.3], abs=1e-7)
    assert float(joint.sum()) == pytest.approx(1.0, abs=1e-15)


def test_batched_forms_equal_stacked_single(law):
    gen = torch.Generator().manual_seed(3)
    target = torch.rand(4, 3, 11, generator=gen)
    draft = torch.rand(4, 2, 11, generator=gen)
    alpha = law.acceptance_rates(target, draft)
    assert alpha.shape == (4, 2)
    pmf = law.accepted_length_pmf(alpha)
    rows = law.emitted_token_law(target, draft)
    means = law.expected_accepted(alpha)
    for b in range(4):
        assert torch.equal(alpha[b], law.acceptance_rates(target[b], draft[b]))
        assert torch.equal(pmf[b], law.accepted_length_pmf(alpha[b]))
        assert torch.equal(rows[b], law.emitted_token_law(target[b], draft[b]))
        assert float(means[b]) == pytest.approx(law.expected_accepted(alpha[b]), abs=1e-15)


# ----------------------------------------------------------------------------
# Bad input: clear errors naming the argument
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, draft, exc, match",
    [
        ([[0.5, 0.5]], torch.ones(1, 2), TypeError, "target_probs"),
        (torch.ones(2, 2, dtype=torch.int64), torch.ones(1, 2), TypeError, "target_probs"),
        (torch.ones(2, 2), torch.ones(1, 2, dtype=torch.int32), TypeError, "draft_probs"),
        (torch.ones(2), torch.ones(1, 2), ValueError, "target_probs"),
        (torch.ones(3, 3), torch.ones(1, 3), ValueError, "K\\+1"),
        (torch.ones(2, 4), torch.ones(1, 3), ValueError, "K\\+1"),
        (torch.ones(2, 2, 3), torch.ones(2, 3), ValueError, "both be batched"),
        (torch.tensor([[0.5, -0.1], [1.0, 1.0]]), torch.ones(1, 2), ValueError, "target_probs\\[0, 1\\]"),
        (torch.ones(2, 2), torch.tensor([[float("nan"), 1.0]]), ValueError, "draft_probs\\[0, 0\\]"),
        (torch.ones(2, 2), torch.tensor([[float("inf"), 1.0]]), ValueError, "draft_probs"),
        (torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.ones(1, 2), ValueError, "target_probs\\[0\\] sums to zero"),
        (torch.ones(2, 2), torch.zeros(1, 2), ValueError, "draft_probs\\[0\\] sums to zero"),
    ],
)
def test_acceptance_rates_rejects_bad_input(law, target, draft, exc, match):
    with pytest.raises(exc, match=match):
        law.acceptance_rates(target, draft)


def test_emitted_token_law_needs_bonus_row(law):
    with pytest.raises(ValueError, match="K\\+1"):
        law.emitted_token_law(torch.ones(2, 3), torch.ones(2, 3))


@pytest.mark.parametrize(
    "alpha, exc, match",
    [
        ([0.5, 1.5], ValueError, "alpha\\[1\\]"),
        ([-0.1], ValueError, "alpha\\[0\\]"),
        ([float("nan")], ValueError, "alpha"),
        (torch.tensor([[[0.5]]]), ValueError, "alpha must have shape"),
        (torch.tensor([1, 0]), TypeError, "alpha"),
        ("0.5", TypeError, "alpha"),
        (0.5, TypeError, "alpha"),
    ],
)
def test_alpha_functions_reject_bad_input(law, alpha, exc, match):
    for fn in (law.accepted_length_pmf, law.expected_accepted, law.accepted_length_variance):
        with pytest.raises(exc, match=match):
            fn(alpha)


# ----------------------------------------------------------------------------
# Brute force 1: the rejection-sampling process, in exact rationals
# ----------------------------------------------------------------------------


def _normalized(weights: list[int]) -> list[Fraction]:
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


def _process_joint(target_w: list[list[int]], draft_w: list[list[int]]) -> list[list[Fraction]]:
    """P(n = j, next = x) by walking every branch of the algorithm, exactly.

    Draft token t ~ q_i; accepted w.p. min(1, p_i(t)/q_i(t)); on rejection the
    next token ~ norm(max(0, p_i - q_i)); after K acceptances next ~ p_K.
    """
    k, vocab = len(draft_w), len(target_w[0])
    target = [_normalized(row) for row in target_w]
    draft = [_normalized(row) for row in draft_w]
    joint = [[Fraction(0)] * vocab for _ in range(k + 1)]

    def walk(i: int, weight: Fraction) -> None:
        if i == k:
            for x in range(vocab):
                joint[k][x] += weight * target[k][x]
            return
        residual = [max(Fraction(0), target[i][x] - draft[i][x]) for x in range(vocab)]
        res_mass = sum(residual)
        for t in range(vocab):
            if draft[i][t] == 0:
                continue  # the draft never proposes t
            accept = min(Fraction(1), target[i][t] / draft[i][t])
            walk(i + 1, weight * draft[i][t] * accept)
            reject = weight * draft[i][t] * (1 - accept)
            if reject:
                assert res_mass > 0  # rejection is possible only if the rows differ
                for x in range(vocab):
                    joint[i][x] += reject * residual[x] / res_mass

    walk(0, Fraction(1))
    return joint


def _random_weights(rng: random.Random, rows: int, vocab: int) -> list[list[int]]:
    """Small integer rows with exact zeros, each with positive total."""
    out = []
    for _ in range(rows):
        row = [rng.choice([0, 0, 1, 2, 3, 7]) for _ in range(vocab)]
        if sum(row) == 0:
            row[rng.randrange(vocab)] = 1
        out.append(row)
    return out


def _cases(count: int, seed: int):
    rng = random.Random(seed)
    shapes = [(0, 1), (0, 3), (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 2), (3, 3), (2, 4)]
    for n in range(count):
        k, vocab = shapes[n % len(shapes)]
        target_w = _random_weights(rng, k + 1, vocab)
        draft_w = _random_weights(rng, k, vocab)
        if n % 5 == 0 and k:
            draft_w[0] = list(target_w[0])  # an alpha = 1 row: the fallback case
        yield target_w, draft_w


@pytest.mark.parametrize("case", list(_cases(40, seed=12345)), ids=lambda c: f"K{len(c[1])}V{len(c[0][0])}")
def test_law_equals_exact_enumeration_of_the_process(law, case):
    target_w, draft_w = case
    exact = _process_joint(target_w, draft_w)
    target = torch.tensor(target_w, dtype=torch.float32)
    draft = torch.tensor(draft_w, dtype=torch.float32).reshape(len(draft_w), len(target_w[0]))
    k = len(draft_w)

    got = law.joint_law(target, draft)
    want = torch.tensor([[float(v) for v in row] for row in exact], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-14, rtol=0), (got, want)

    # Marginals: pmf, mean, and the conditional rows wherever n = j is reachable.
    pmf_exact = [sum(row) for row in exact]
    assert law.accepted_length_pmf(law.acceptance_rates(target, draft)).tolist() == pytest.approx(
        [float(v) for v in pmf_exact], abs=1e-14
    )
    mean_exact = sum(j * w for j, w in enumerate(pmf_exact))
    assert law.expected_accepted(law.acceptance_rates(target, draft)) == pytest.approx(float(mean_exact), abs=1e-14)
    rows = law.emitted_token_law(target, draft)
    for j in range(k + 1):
        if pmf_exact[j]:
            cond = [float(v / pmf_exact[j]) for v in exact[j]]
            assert rows[j].tolist() == pytest.approx(cond, abs=1e-14)


# ----------------------------------------------------------------------------
# Brute force 2: the kernel's exact output law, by interval enumeration
# ----------------------------------------------------------------------------

_ONE_MINUS = math.nextafter(1.0, 0.0)


def _steps(f, lo: float = 0.0, hi: float = _ONE_MINUS, f_lo=None, f_hi=None, tol: float = 1e-15):
    """Pieces ``(lo, hi, value, at)`` of a nondecreasing step function on ``[lo, hi]``.

    Bisects only where the value changes, so it finds the function's own
    breakpoints (to ``tol``) without being told where they are; ``f(at) ==
    value`` with ``at`` inside the piece.
    """
    f_lo = f(lo) if f_lo is None else f_lo
    f_hi = f(hi) if f_hi is None else f_hi
    if f_lo == f_hi:
        return [(lo, hi, f_lo, 0.5 * (lo + hi))]
    if hi - lo <= tol:
        return [(lo, hi, f_hi, hi)]  # straddles a breakpoint: weight ~1e-15
    mid = 0.5 * (lo + hi)
    f_mid = f(mid)
    return _merge(_steps(f, lo, mid, f_lo, f_mid, tol) + _steps(f, mid, hi, f_mid, f_hi, tol))


def _merge(pieces):
    """Join neighbouring pieces of equal value (keeping the widest piece's ``at``)."""
    out = []
    for lo, hi, value, at in pieces:
        if out and out[-1][2] == value:
            p_lo, p_hi, _, p_at = out[-1]
            wider = (hi - lo) > (p_hi - p_lo)
            out[-1] = (p_lo, hi, value, at if wider else p_at)
        else:
            out.append((lo, hi, value, at))
    return out


def _measured_joint(verify, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """The exact law of ``verify``'s output when t_i ~ q_i and uniforms ~ U[0, 1)."""
    k, vocab = draft.shape
    draft_rows = (draft.double() / draft.double().sum(-1, keepdim=True)).tolist()
    filler = [max(range(vocab), key=lambda x: draft_rows[i][x]) for i in range(k)]  # any proposable token
    joint = torch.zeros(k + 1, vocab, dtype=torch.float64)

    def call(tokens, decided, u_last):
        # Positions past the decided ones are never read; fill them validly.
        toks = torch.tensor(tokens + filler[len(tokens):], dtype=torch.int64)
        u = torch.tensor(decided + [0.0] * (k - len(decided)) + [u_last], dtype=torch.float64)
        return verify(target, draft, toks, uniforms=u)

    def final(i, tokens, decided, weight):
        def emit(u_last):
            n, nxt = call(tokens, decided, u_last)
            assert n == i
            return nxt

        for lo, hi, x, _ in _steps(emit):
            joint[i, x] += weight * (hi - lo)

    def explore(i, tokens, decided, weight):
        if i == k:
            final(k, tokens, decided, weight)
            return
        for t in range(vocab):
            if draft_rows[i][t] == 0:
                continue  # the draft never proposes t
            toks = tokens + [t]
            # "Rejected at i" is nondecreasing in u_i (accept iff u_i below a threshold).
            for lo, hi, rejected, mid in _steps(lambda u: call(toks, decided + [u], 0.0)[0] == i):
                w = weight * draft_rows[i][t] * (hi - lo)
                if rejected:
                    final(i, toks, decided + [mid], w)
                else:
                    explore(i + 1, toks, decided + [mid], w)

    explore(0, [], [], 1.0)
    return joint


@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.parametrize("case", list(_cases(20, seed=777)), ids=lambda c: f"K{len(c[1])}V{len(c[0][0])}")
def test_verifier_output_law_equals_law_exactly(sv, law, path, case):
    """No sampling: the verifier's decision boundaries are found by bisection."""
    target_w, draft_w = case
    k, vocab = len(draft_w), len(target_w[0])
    target = torch.tensor(target_w, dtype=torch.float32)
    draft = torch.tensor(draft_w, dtype=torch.float32).reshape(k, vocab)
    verify = sv.verify_sampled if path == "kernel" else sv.reference.verify_sampled
    measured = _measured_joint(verify, target, draft)
    want = law.joint_law(target, draft)
    assert torch.allclose(measured, want, atol=1e-12, rtol=0), (measured, want)


def test_interval_enumeration_detects_a_wrong_residual(sv, law):
    """Negative control for the test above: resampling from p on rejection is caught."""

    def wrong(target, draft, tokens, uniforms):
        n, nxt = sv.reference.verify_sampled(target, draft, tokens, uniforms=uniforms)
        if n < tokens.numel():
            nxt = sv.reference.inverse_cdf(target[n].double(), float(uniforms[-1]))
        return n, nxt

    target = torch.tensor([[6.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    draft = torch.tensor([[2.0, 7.0, 1.0]])
    measured = _measured_joint(wrong, target, draft)
    assert not torch.allclose(measured, law.joint_law(target, draft), atol=1e-3)


def test_enumeration_helpers_cover_all_mass():
    # Sanity of the test machinery itself: a step function with known pieces.
    total = {}
    for lo, hi, v, _ in _steps(lambda u: int(u >= 0.25) + int(u >= 0.6)):
        total[v] = total.get(v, 0.0) + (hi - lo)
    assert sorted(total) == [0, 1, 2]
    assert [total[0], total[1], total[2]] == pytest.approx([0.25, 0.35, 0.4], abs=1e-14)


# ----------------------------------------------------------------------------
# Block verification (Sun et al. 2024), exactly: rationals, prefix-dependent rows
# ----------------------------------------------------------------------------
#
# The algorithm is written here a second time, in Fractions, from the paper
# (Algorithm 2), not from the kernel: over every draft path the weights p_i and
# h_i, P(tau = i | path) = h_i prod_{j > i} (1 - h_j), and the emitted tokens.
# Rows depend on the whole prefix (a table per prefix), as language models'
# do. Whole output sequences of N tokens, round after round, must follow the
# target's law exactly; block's mean accepted length must be >= token-wise's.


def _table(salt: int, vocab: int, zeros: bool):
    """``row(prefix) -> [Fraction] * vocab``: a fixed, prefix-dependent distribution."""
    memo = {}

    def row(prefix: tuple) -> list:
        if prefix not in memo:
            rng = random.Random(hash((salt, vocab) + prefix))
            w = [rng.choice([0, 1, 1, 2, 3, 5] if zeros else [1, 2, 3, 5]) for _ in range(vocab)]
            if sum(w) == 0:
                w[rng.randrange(vocab)] = 1
            memo[prefix] = _normalized(w)
        return memo[prefix]

    return row


def _residual(weight: Fraction, p: list, q: list) -> list:
    return [max(Fraction(0), weight * a - b) for a, b in zip(p, q)]


def _block_round(target, draft, prefix: tuple, k: int, vocab: int, variant: str = "paper") -> dict:
    """``{emitted tokens: probability}`` of one round of block verification (variant
    ``"h=p"``: the negative control, h_i = p_i; ``"token"``: token-wise verification)."""
    out: dict = {}

    def add(seq, prob):
        if prob:
            out[seq] = out.get(seq, Fraction(0)) + prob

    def emit_from(seq, prob, row):
        total = sum(row)
        for x in range(vocab):
            add(seq + (x,), prob * row[x] / total)

    def end(tokens, weights, prob):
        # Scan down: P(tau = i) = h_i * prod_{j > i} (1 - h_j), h_0 = 1.
        above = Fraction(1)
        for i in range(k, -1, -1):
            p_i = weights[i]
            ctx = prefix + tokens[:i]
            if i == k:
                h, row = p_i, target(ctx)
            else:
                row = _residual(p_i, target(ctx), draft(ctx))
                r = sum(row)
                if i == 0:
                    h = Fraction(1)
                elif variant == "h=p":
                    h = p_i
                else:
                    h = r / (r + 1 - p_i) if r + 1 - p_i else Fraction(0)
                if r == 0:
                    row = target(ctx)  # only reachable at i = 0 with p = q (and in the control)
            emit_from(tokens[:i], prob * above * h, row)
            above *= 1 - h
            if above == 0:
                return

    def walk(tokens, weights, prob):
        i = len(tokens)
        if i == k:
            end(tokens, weights, prob)
            return
        p, q = target(prefix + tokens), draft(prefix + tokens)
        for t in range(vocab):
            if q[t]:
                walk(tokens + (t,), weights + [min(Fraction(1), weights[-1] * p[t] / q[t])], prob * q[t])

    def walk_token(tokens, prob):
        i = len(tokens)
        p = target(prefix + tokens)
        if i == k:
            emit_from(tokens, prob, p)
            return
        q = draft(prefix + tokens)
        row = _residual(Fraction(1), p, q)
        for t in range(vocab):
            if q[t]:
                accept = min(Fraction(1), p[t] / q[t])
                walk_token(tokens + (t,), prob * q[t] * accept)
                if accept < 1:
                    emit_from(tokens, prob * q[t] * (1 - accept), row)

    if variant == "token":
        walk_token((), Fraction(1))
    else:
        walk((), [Fraction(1)], Fraction(1))
    return out


def _decoded_law(target, draft, k: int, vocab: int, length: int, variant: str = "paper") -> dict:
    """Exact law of the first ``length`` tokens, rounds drafting min(k, left - 1) as the decoder."""
    law: dict = {}

    def go(prefix: tuple, prob: Fraction):
        left = length - len(prefix)
        if left == 0:
            law[prefix] = law.get(prefix, Fraction(0)) + prob
            return
        for seq, pr in _block_round(target, draft, prefix, min(k, left - 1), vocab, variant).items():
            go(prefix + seq, prob * pr)

    go((), Fraction(1))
    return law


def _target_law(target, vocab: int, length: int) -> dict:
    law = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob = Fraction(1)
        for i, x in enumerate(seq):
            prob *= target(seq[:i])[x]
        if prob:
            law[seq] = prob
    return law


def _mean_accepted(target, draft, k: int, vocab: int, variant: str) -> Fraction:
    return sum(p * (len(seq) - 1) for seq, p in _block_round(target, draft, (), k, vocab, variant).items())


_BLOCK_PAIRS = [(salt, vocab, k) for salt in range(6) for vocab, k in ((2, 3), (3, 2), (3, 3))]


@pytest.mark.parametrize("salt, vocab, k", _BLOCK_PAIRS)
def test_block_sequence_law_equals_the_target_law_exactly(salt, vocab, k):
    target, draft = _table(2 * salt, vocab, zeros=True), _table(2 * salt + 1, vocab, zeros=False)
    length = k + 1
    assert _decoded_law(target, draft, k, vocab, length) == _target_law(target, vocab, length)
    # ... and block verification accepts at least as much as token-wise, in expectation.
    assert _mean_accepted(target, draft, k, vocab, "paper") >= _mean_accepted(target, draft, k, vocab, "token")


def test_block_negative_control_h_equals_p_breaks_the_law():
    """The broken variant h_i = p_i must differ from the target law on some pair."""
    broken = 0
    for salt, vocab, k in _BLOCK_PAIRS[:6]:
        target, draft = _table(2 * salt, vocab, zeros=True), _table(2 * salt + 1, vocab, zeros=False)
        broken += _decoded_law(target, draft, k, vocab, k + 1, "h=p") != _target_law(target, vocab, k + 1)
    assert broken >= 3  # 4 of these 6 at the time of writing: some pairs hide it


def test_block_paper_example_eleven_ninths():
    """Sun et al. 2024, section 2: p = (1/3, 2/3), q = (2/3, 1/3), K = 2: 10/9 token-wise, 11/9 block."""
    target = lambda prefix: [Fraction(1, 3), Fraction(2, 3)]  # noqa: E731
    draft = lambda prefix: [Fraction(2, 3), Fraction(1, 3)]  # noqa: E731
    assert _mean_accepted(target, draft, 2, 2, "token") == Fraction(10, 9)
    assert _mean_accepted(target, draft, 2, 2, "paper") == Fraction(11, 9)


def _fixed_rows(target_w, draft_w):
    """Position-fixed rows (law.py's setting) as prefix tables."""
    target = [_normalized(r) for r in target_w]
    draft = [_normalized(r) for r in draft_w]
    return (lambda prefix: target[len(prefix)]), (lambda prefix: draft[len(prefix)])


@pytest.mark.parametrize("case", list(_cases(30, seed=4242)), ids=lambda c: f"K{len(c[1])}V{len(c[0][0])}")
def test_block_law_functions_equal_exact_enumeration(law, case):
    target_w, draft_w = case
    k, vocab = len(draft_w), len(target_w[0])
    target, draft = _fixed_rows(target_w, draft_w)
    exact = _block_round(target, draft, (), k, vocab)
    want = torch.zeros(k + 1, vocab, dtype=torch.float64)
    for seq, p in exact.items():
        want[len(seq) - 1, seq[-1]] += float(p)
    t = torch.tensor(target_w, dtype=torch.float32)
    d = torch.tensor(draft_w, dtype=torch.float32).reshape(k, vocab)
    got = law.block_joint_law(t, d)
    assert torch.allclose(got, want, atol=1e-14, rtol=0), (got, want)
    mean = sum(p * (len(seq) - 1) for seq, p in exact.items())
    assert law.expected_accepted_block(t, d) == pytest.approx(float(mean), abs=1e-14)
    assert law.expected_accepted_block(t, d) >= law.expected_accepted(law.acceptance_rates(t, d)) - 1e-15


def _measured_block_joint(verify, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """The exact output law of a block verifier: for every draft path, each
    test uniform's threshold by bisection (u_{i-1} matters only once the scan
    reaches i), then the final draw's pieces."""
    k, vocab = draft.shape
    draft_rows = (draft.double() / draft.double().sum(-1, keepdim=True)).tolist()
    joint = torch.zeros(k + 1, vocab, dtype=torch.float64)

    def call(tokens, u_tests, u_last):
        return verify(target, draft, torch.tensor(tokens, dtype=torch.int64),
                      uniforms=torch.tensor(u_tests + [u_last], dtype=torch.float64))

    def scan(tokens, i, u_tests, weight):
        # Uniforms u_i .. u_{K-1} are fixed (u_tests[i:]); u_{i-1} decides whether the block ends at i.
        if i == 0:
            final(tokens, 0, u_tests, weight)
            return
        def ends_here(u):
            trial = u_tests[: i - 1] + [u] + u_tests[i:]
            return call(tokens, trial, 0.0)[0] == i
        for lo, hi, passes_on, mid in _steps(lambda u: not ends_here(u)):
            trial = u_tests[: i - 1] + [mid] + u_tests[i:]
            if not passes_on:
                final(tokens, i, trial, weight * (hi - lo))
            else:
                scan(tokens, i - 1, trial, weight * (hi - lo))

    def final(tokens, n, u_tests, weight):
        def emit(u_last):
            got_n, nxt = call(tokens, u_tests, u_last)
            assert got_n == n
            return nxt
        for lo, hi, x, _ in _steps(emit):
            joint[n, x] += weight * (hi - lo)

    for tokens in itertools.product(range(vocab), repeat=k):
        weight = math.prod(draft_rows[i][t] for i, t in enumerate(tokens))
        if weight:
            # Lower uniforms are placeholders until the scan reaches them: whether the
            # block ends at i reads only u_{i-1}.
            scan(list(tokens), k, [0.999] * k, weight)
    return joint


def _block_cases():
    """The paper's example, dense random pairs (p_i < 1 with a positive residual, where
    h_i < p_i: the sparse ``_cases`` rarely get there), and some sparse ones."""
    yield [[1, 2], [1, 2], [1, 2]], [[2, 1], [2, 1]]
    rng = random.Random(31)
    for k, vocab in ((2, 2), (2, 3), (3, 2), (3, 3), (2, 4)):
        yield ([[rng.randint(1, 6) for _ in range(vocab)] for _ in range(k + 1)],
               [[rng.randint(1, 6) for _ in range(vocab)] for _ in range(k)])
    yield from _cases(6, seed=999)


# The reference path is pure Python (3 min emulated, the same on every arch):
# native_only; the kernel path runs everywhere (pytest.ini).
@pytest.mark.parametrize("path", ["kernel", pytest.param("reference", marks=pytest.mark.native_only)])
@pytest.mark.parametrize("case", list(_block_cases()), ids=lambda c: f"K{len(c[1])}V{len(c[0][0])}")
def test_block_verifier_output_law_equals_law_exactly(sv, law, path, case):
    target_w, draft_w = case
    k, vocab = len(draft_w), len(target_w[0])
    target = torch.tensor(target_w, dtype=torch.float32)
    draft = torch.tensor(draft_w, dtype=torch.float32).reshape(k, vocab)
    verify = sv.verify_block if path == "kernel" else sv.reference.verify_block
    measured = _measured_block_joint(verify, target, draft)
    assert torch.allclose(measured, law.block_joint_law(target, draft), atol=1e-12, rtol=0)


@pytest.mark.native_only  # the enumeration method's own negative control, pure Python; see pytest.ini
def test_block_interval_enumeration_detects_h_equal_to_p(sv, law, monkeypatch):
    """Negative control for the test above: the reference with h_i = p_i is caught."""
    monkeypatch.setattr(sv.reference, "block_stops", lambda *args: True)
    caught = 0
    for target_w, draft_w in _block_cases():
        k, vocab = len(draft_w), len(target_w[0])
        target = torch.tensor(target_w, dtype=torch.float32)
        draft = torch.tensor(draft_w, dtype=torch.float32).reshape(k, vocab)
        measured = _measured_block_joint(sv.reference.verify_block, target, draft)
        caught += not torch.allclose(measured, law.block_joint_law(target, draft), atol=1e-6)
    assert caught >= 3  # the paper's example and most dense pairs
