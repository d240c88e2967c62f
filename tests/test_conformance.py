"""The kernel's ``verify_sampled`` against the exact law, by the conformance harness.

Every run draws fresh draft tokens (token i from q_i) and uniforms for each
round and holds the record to ``spec_verify.law``: chi-square on the
accepted-length histogram, chi-square on the emitted token at every reached
position, z-score of the mean accepted length (``tools/conformance.py``).

Significance level: each run is tested at a family-wise alpha = 1e-3, split
Bonferroni over its K + 3 tests (per test 1e-3 / (K + 3)). Seeds are fixed, so
a run is deterministic: a correct kernel fails a given seed with probability
at most 1e-3, once, not at random from run to run.

Negative controls: the same harness must reject two deliberately wrong
verifiers built on the kernel itself (resampling from p instead of the
residual; ignoring the accept uniforms), and a positive control (an
independent numpy implementation) must pass, so a harness that passes
everything, or nothing, is caught.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import torch

from tools import conformance as cf

ALPHA = 1e-3
ROUNDS = 500_000  # small vocabularies: cheap (~1 us/round), so far more than the 20 000 floor
SEED_ROUNDS = 20_000  # V = 32000 through the one-round op (~20 us/round)
SEED_BATCHED_ROUNDS = 200_000  # V = 32000 through the batched op (~15 us/round)


@pytest.fixture(scope="module")
def run(sv):
    """run_conformance at ALPHA, with the law taken from the loaded kernel package."""

    def _run(verifier, target, draft, rounds, seed, name):
        return cf.run_conformance(verifier, target, draft, rounds, seed=seed, alpha=ALPHA, name=name, law_module=sv)

    return _run


# ----------------------------------------------------------------------------
# The kernel conforms (alpha = 1e-3 per run)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(cf.FAMILIES))
def test_kernel_batched_conforms(sv, run, name):
    """Batched op, one family per run, at alpha = 1e-3 family-wise."""
    target, draft = cf.family(name, seed=1)
    result = run(cf.kernel_verifier(sv, batched=True), target, draft, ROUNDS, seed=11, name=name)
    assert result.passed, result.report()


def test_kernel_single_round_conforms_on_the_seed_pair(sv, run):
    """The one-round op on the seed's pair (V = 32000, K = 4, alpha_i = 0.678), alpha = 1e-3."""
    target, draft = cf.family("seed-0.678", seed=2)
    assert cf.law.acceptance_rates(target, draft).tolist() == pytest.approx([0.678] * 4, abs=1e-4)
    result = run(cf.kernel_verifier(sv, batched=False), target, draft, SEED_ROUNDS, seed=12, name="seed")
    assert result.passed, result.report()


def test_kernel_batched_conforms_on_the_seed_pair(sv, run):
    """The batched op on the seed's pair (V = 32000, K = 4), alpha = 1e-3."""
    target, draft = cf.family("seed-0.678", seed=4)
    result = run(cf.kernel_verifier(sv), target, draft, SEED_BATCHED_ROUNDS, seed=14, name="seed batched")
    assert result.passed, result.report()


def test_kernel_conforms_at_odd_vocabulary_and_k1(sv, run):
    """SIMD tails (V = 7) and K = 1 through the batched op, alpha = 1e-3."""
    target, draft = cf.family("sharper-draft", vocab=7, k=1, seed=3)
    result = run(cf.kernel_verifier(sv), target, draft, ROUNDS, seed=13, name="V7K1")
    assert result.passed, result.report()


def test_numpy_positive_control_conforms(run):
    """The harness accepts an independent correct implementation (alpha = 1e-3)."""
    for name in sorted(cf.FAMILIES):
        target, draft = cf.family(name, seed=1)
        result = run(cf.numpy_verifier(), target, draft, ROUNDS, seed=11, name=name)
        assert result.passed, result.report()


@pytest.mark.parametrize("name", sorted(cf.FAMILIES) + ["seed-0.678"])
def test_kernel_equals_independent_numpy_verifier_round_by_round(sv, name):
    """Same tokens, same uniforms: the kernel and the harness's numpy verifier agree on every round.

    Exact, not statistical: only a uniform within ~1e-16 of a decision
    boundary could split them, which 20 000 rounds will not draw.
    """
    target, draft = cf.family(name, seed=5)
    tokens, uniforms = cf.draw_rounds(draft, 20_000, seed=15)
    tokens_t, uniforms_t = torch.from_numpy(tokens), torch.from_numpy(uniforms)
    kernel_n, kernel_next = cf.kernel_verifier(sv)(target, draft, tokens_t, uniforms_t)
    numpy_n, numpy_next = cf.numpy_verifier()(target, draft, tokens_t, uniforms_t)
    assert np.array_equal(np.asarray(kernel_n), numpy_n)
    assert np.array_equal(np.asarray(kernel_next), numpy_next)


# ----------------------------------------------------------------------------
# Negative controls: these must FAIL at the same alpha = 1e-3
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("family_name", ["zipf-smoothed", "sharper-draft", "scales"])
def test_resampling_from_target_is_rejected(sv, run, family_name):
    """On rejection, drawing from p_i instead of the residual fails (alpha = 1e-3)."""
    target, draft = cf.family(family_name, seed=1)
    wrong = cf.resample_from_target(cf.kernel_verifier(sv))
    result = run(wrong, target, draft, 20_000, seed=21, name="resample-from-target")
    assert not result.passed, result.report()
    # The length law is untouched by this bug: the token tests must be what catches it.
    assert result.chi_squares[0].pvalue >= result.per_test_alpha
    assert min(c.pvalue for c in result.chi_squares[1:-1]) < 1e-12, result.report()


@pytest.mark.parametrize("family_name", ["zipf-smoothed", "sharper-draft"])
def test_ignoring_the_uniform_is_rejected(sv, run, family_name):
    """Accepting iff 0.5 * q(t) < p(t) (u_i ignored) fails (alpha = 1e-3)."""
    target, draft = cf.family(family_name, seed=1)
    wrong = cf.ignore_uniform(cf.kernel_verifier(sv), value=0.5)
    result = run(wrong, target, draft, 20_000, seed=22, name="ignore-uniform")
    assert not result.passed, result.report()
    assert result.chi_squares[0].pvalue < 1e-12, result.report()


def test_accepting_always_is_rejected(sv, run):
    """u_i = 0 accepts every token the target can emit: fails (alpha = 1e-3)."""
    target, draft = cf.family("zipf-smoothed", seed=1)
    wrong = cf.ignore_uniform(cf.kernel_verifier(sv), value=0.0)
    result = run(wrong, target, draft, 20_000, seed=23, name="accept-always")
    assert not result.passed
    assert result.z_pvalue < 1e-12


# ----------------------------------------------------------------------------
# The harness's own machinery
# ----------------------------------------------------------------------------


def test_draw_rounds_follows_the_draft_rows():
    draft = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 2.0]])
    tokens, uniforms = cf.draw_rounds(draft, 40_000, seed=5)
    assert tokens.shape == (40_000, 2) and uniforms.shape == (40_000, 3)
    assert (uniforms >= 0).all() and (uniforms < 1).all()
    freq0 = np.bincount(tokens[:, 0], minlength=3) / 40_000
    freq1 = np.bincount(tokens[:, 1], minlength=3) / 40_000
    # Zero-mass tokens never drawn; frequencies within 5 sigma (sd <= 0.0025).
    assert freq0[0] == 0 and freq1[1] == 0
    assert abs(freq0[2] - 0.75) < 0.0125 and abs(freq1[0] - 0.5) < 0.0125


def test_chi_square_pooling_and_impossible_cells():
    labels = [str(i) for i in range(5)]
    # Cells 3 and 4 have expected 2 + 2 = 4 < 5: pooled, then joined to the smallest cell.
    res = cf.chi_square("t", np.array([50, 30, 14, 3, 3]), np.array([50.0, 30.0, 16.0, 2.0, 2.0]), labels)
    assert res.df == 2 and res.observed.sum() == 100
    assert res.statistic == pytest.approx((20 - 20) ** 2 / 20 + 0.0 + 0.0, abs=1e-12)
    # An observation where the law puts zero mass fails outright.
    bad = cf.chi_square("t", np.array([10, 1]), np.array([11.0, 0.0]), labels[:2])
    assert bad.impossible == 1 and bad.pvalue == 0.0
    # Nothing to test: one live cell.
    assert cf.chi_square("t", np.array([7, 0]), np.array([7.0, 0.0]), labels[:2]).pvalue == 1.0


def test_mixing_hits_the_requested_acceptance():
    target, draft = cf.imperfect_pair(vocab=5000, k=3, acceptance=0.678, seed=9)
    assert cf.law.acceptance_rates(target, draft).tolist() == pytest.approx([0.678] * 3, abs=1e-5)
