"""Logits in: verify_logits, sample_draft and warp_probs against their definition.

* The warped weights equal the pure-torch reference (``reference.py``, ``warping.py``)
  bit for bit, on every compiled instruction set, for float32/16/bf16, odd
  vocabularies, -inf logits and ties at every cut-off.
* ``verify_logits`` == reference ``verify_logits`` == ``verify_sampled`` on
  the reference's warped weights, token for token under the same uniforms.
* ``sample_draft`` draws from exactly the warped q (chi-square, alpha = 1e-3,
  with negative controls that must fail).
* The emitted tokens follow the exact law of the warped pair (the
  conformance harness, alpha = 1e-3 family-wise, with negative controls).
* Tokens outside the warped draft support and bad arguments are refused with
  an error naming the argument; unread rows are never validated.
"""

from __future__ import annotations

import doctest
import math
import pathlib
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import check_isa_script

from tools import conformance as cf

ALPHA = 1e-3  # every statistical test here, family-wise per test function

# (temperature, top_k, top_p, min_p): each step alone, in pairs, all four, and edge values.
WARPS = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.3, 5, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (0.8, 0, 1.0, 0.05),
    (0.8, 50, 0.9, 0.0),
    (1.0, 20, 0.5, 0.02),
    (2.0, 3, 0.3, 0.1),
    (0.9, 1, 1.0, 0.0),
    (1.0, 5000, 0.95, 0.0),  # a top-k set too large to stay sparse
    (0.5, 0, 0.999, 0.5),
    (1e-3, 0, 1.0, 0.0),  # near-greedy: a scale of 1000
]


def _pair(gen, vocab, k, dtype=torch.float32, scale=2.0, neg_inf=False):
    target = torch.randn(k + 1, vocab, generator=gen) * scale
    draft = target[:k] + torch.randn(k, vocab, generator=gen)
    if neg_inf and vocab > 4:
        target[:, : vocab // 4] = -math.inf  # a banned range, in both
        draft[:, : vocab // 4] = -math.inf
    return target.to(dtype), draft.to(dtype)


def _three_way(sv, target, draft, tokens, u, warp):
    temperature, top_k, top_p, min_p = warp
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = sv.verify_logits(target, draft, tokens, uniforms=u, **kw)
    reference = sv.reference.verify_logits(target, draft, tokens, uniforms=u, **kw)
    if temperature == 0:
        via_sampled = sv.verify_greedy(target, tokens)
    else:
        weights = sv.reference.warp_weights
        via_sampled = sv.verify_sampled(
            weights(target, *warp), weights(draft, *warp) if len(tokens) else target[:0].float(),
            tokens, uniforms=u,
        )
    return ours, reference, via_sampled


# ----------------------------------------------------------------------------
# exp_sv and the warped weights
# ----------------------------------------------------------------------------


def test_exp_sv_is_accurate_and_exact_at_zero(sv):
    z = -torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 90
    w = sv.warping.exp_sv(z)
    exact = torch.exp(z.double())
    live = z >= -86
    assert float(((w.double() - exact) / exact)[live].abs().max()) < 2 * 2**-24  # within 2 ulp
    assert bool((w[~live] == 0).all())
    assert sv.warping.exp_sv(torch.tensor([0.0, -0.0, -math.inf])).tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("vocab", [1, 7, 83, 989, 32000])
def test_warped_weights_equal_the_reference_bit_for_bit(sv, vocab):
    gen = torch.Generator().manual_seed(vocab)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for warp in WARPS:
            logits = (torch.randn(3, vocab, generator=gen) * 3).to(dtype)
            if vocab > 8:
                logits[1, ::3] = -math.inf
            ours = sv.warp_probs(logits, temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3],
                                 normalize=False)
            reference = sv.reference.warp_weights(logits, *warp)
            assert torch.equal(ours, reference), (vocab, dtype, warp)
            probs = sv.warp_probs(logits, temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3])
            torch.testing.assert_close(probs, sv.reference.warp_probs(logits, *warp), rtol=2e-7, atol=0)
            assert torch.equal(probs > 0, reference > 0)


def test_support_and_probabilities_match_transformers_processors(sv):
    # Continuous logits (no ties): the same support as transformers'
    # processors in the same order, and probabilities within float32 rounding.
    pytest.importorskip("transformers")  # absent in the aarch64 emulated run
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=gen) * 2
    for temperature, top_k, top_p, min_p in WARPS[:9]:
        scores = TemperatureLogitsWarper(temperature)(None, logits)
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        if min_p:
            scores = MinPLogitsWarper(min_p)(None, scores)
        expected = scores.softmax(-1)
        ours = sv.warp_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        assert torch.equal(ours > 0, expected > 0), (temperature, top_k, top_p, min_p)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)


def test_ties_at_every_cut_off_stay_together(sv):
    r = sv.reference
    row = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    for fn in (lambda *a, **k: sv.warp_probs(*a, **k, normalize=False), r.warp_weights):
        # top-k = 2 cuts inside the tie {1, 2, 3}: all three stay.
        assert (fn(row, temperature=1.0, top_k=2) > 0).tolist() == [True] * 4 + [False] * 2
        # top-p boundary inside the tie: the head {0} has mass 0.43 < 0.5; the
        # next rank is in the tie group, which stays whole.
        assert (fn(row, temperature=1.0, top_p=0.5) > 0).tolist() == [True] * 4 + [False] * 2
        # A top-p boundary exactly at a group's end keeps nothing more.
        assert (fn(row, temperature=1.0, top_p=0.3) > 0).tolist() == [True] + [False] * 5
        # All equal: every cut keeps everything (one tie group).
        flat = torch.zeros(7)
        assert bool((fn(flat, temperature=1.0, top_k=3, top_p=0.2) == 1.0).all())
        # min-p is a threshold on the weight: exactly p = min_p * max stays.
        two = torch.tensor([0.0, math.log(0.25), math.log(0.25) - 1e-3])
        kept = fn(two, temperature=1.0, min_p=float(sv.warping.exp_sv(torch.tensor([math.log(0.25)]))))
        assert (kept > 0).tolist() == [True, True, False]


def test_ties_at_cut_offs_through_verification(sv):
    # Many rows with heavy ties (integer logits): all paths agree token for token.
    gen = torch.Generator().manual_seed(5)
    mismatches = 0
    for vocab in (7, 83, 989):
        for warp in [(1.0, 3, 1.0, 0.0), (1.0, 0, 0.6, 0.0), (0.5, 10, 0.8, 0.1), (1.0, 2, 0.5, 0.3)]:
            for _ in range(25):
                target = torch.randint(-3, 3, (4, vocab), generator=gen).float()
                draft = torch.randint(-3, 3, (3, vocab), generator=gen).float()
                tokens = sv.sample_draft(draft, temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3],
                                         generator=gen)
                u = torch.rand(4, dtype=torch.float64, generator=gen)
                ours, reference, via_sampled = _three_way(sv, target, draft, tokens, u, warp)
                mismatches += not (ours == reference == via_sampled)
    assert mismatches == 0


# ----------------------------------------------------------------------------
# verify_logits == reference warping -> verify_sampled, token for token
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [1, 7, 83, 989, 32000])
def test_verify_logits_matches_reference_token_for_token(sv, vocab):
    gen = torch.Generator().manual_seed(100 + vocab)
    outcomes, mismatches = set(), []
    warps = WARPS + [(0.0, 0, 1.0, 0.0), (0.0, 5, 0.5, 0.1)]
    # V = 32000: the reference's full sorts are slow; fewer dtypes and -inf variants.
    dtypes = (torch.float32, torch.bfloat16) if vocab > 10_000 else (torch.float32, torch.float16, torch.bfloat16)
    for dtype in dtypes:
        for k in (0, 1, 4) if vocab < 10_000 else (1, 4):
            for w, warp in enumerate(warps):
                for neg_inf in (False, True) if vocab < 10_000 else (w % 2 == 1,):
                    target, draft = _pair(gen, vocab, k, dtype, neg_inf=neg_inf)
                    if warp[0] == 0:
                        tokens = draft.float().argmax(-1)
                    else:
                        tokens = sv.sample_draft(draft, temperature=warp[0], top_k=warp[1], top_p=warp[2],
                                                 min_p=warp[3], generator=gen)
                    u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
                    result = _three_way(sv, target, draft, tokens, u, warp)
                    outcomes.add(result[0][0])
                    if not result[0] == result[1] == result[2]:
                        mismatches.append((dtype, k, warp, neg_inf, result))
    assert not mismatches, mismatches[:5]
    assert {0, 1} <= outcomes and max(outcomes) >= 2  # rejections and acceptances both occurred


def test_batched_equals_single_and_is_ragged(sv):
    gen = torch.Generator().manual_seed(7)
    b, k, vocab = 6, 4, 257
    target = torch.randn(b, k + 1, vocab, generator=gen) * 2
    draft = target[:, :k] + torch.randn(b, k, vocab, generator=gen)
    warp = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.01)
    tokens = sv.sample_draft(draft, generator=gen, **warp)
    counts = torch.tensor([4, 0, 2, 1, 3, 4])
    u = torch.rand(b, k + 1, dtype=torch.float64, generator=gen)
    n, nxt = sv.verify_logits_batched(target, draft, tokens, counts, uniforms=u, **warp)
    rn, rnxt = sv.reference.verify_logits_batched(target, draft, tokens, counts, uniforms=u, **warp)
    assert n.tolist() == rn.tolist() and nxt.tolist() == rnxt.tolist()
    for i in range(b):
        kb = int(counts[i])
        single = sv.verify_logits(target[i, : kb + 1], draft[i, :kb], tokens[i, :kb],
                                  uniforms=u[i, : kb + 1].contiguous(), **warp)
        assert single == (int(n[i]), int(nxt[i]))
    # The same generator state gives the same answer at 1 and 2 threads.
    results = []
    for threads in (1, 2):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            g = torch.Generator().manual_seed(3)
            results.append([t.tolist() for t in sv.verify_logits_batched(target, draft, tokens, counts,
                                                                         generator=g, **warp)])
        finally:
            torch.set_num_threads(previous)
    assert results[0] == results[1]


def test_generator_draws_and_temperature_zero_draws_nothing(sv):
    gen = torch.Generator().manual_seed(11)
    target, draft = _pair(gen, 50, 3)
    tokens = sv.sample_draft(draft, temperature=0.9, top_k=10, generator=gen)
    warp = dict(temperature=0.9, top_k=10)
    g1 = torch.Generator().manual_seed(4)
    u = torch.rand(4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert sv.verify_logits(target, draft, tokens, generator=g1, **warp) == sv.verify_logits(
        target, draft, tokens, uniforms=u, **warp)
    # Temperature 0: verify_greedy on the target, and the generator is untouched.
    greedy_tokens = draft.argmax(-1)
    g2 = torch.Generator().manual_seed(4)
    before = g2.get_state()
    assert sv.verify_logits(target, draft, greedy_tokens, temperature=0.0, generator=g2) == sv.verify_greedy(
        target, greedy_tokens)
    assert torch.equal(g2.get_state(), before)
    g3 = torch.Generator().manual_seed(4)
    sv.sample_draft(draft, temperature=0.0, generator=g3)
    assert torch.equal(g3.get_state(), before)


def test_rows_after_the_first_rejection_are_never_read(sv):
    gen = torch.Generator().manual_seed(2)
    target, draft = _pair(gen, 64, 4)
    # Row 0: the draft puts its token where the target has no mass after top-k.
    draft[0] = -5.0
    draft[0, 7] = 5.0
    target[0, 7] = -50.0
    tokens = torch.tensor([7, 1, 2, 3])
    target[1:] = float("nan")
    draft[1:] = float("nan")
    for impl in (sv, sv.reference):
        n, _ = impl.verify_logits(target, draft, tokens, top_k=8, uniforms=torch.full((5,), 0.5, dtype=torch.float64))
        assert n == 0


# ----------------------------------------------------------------------------
# sample_draft draws from exactly the warped q
# ----------------------------------------------------------------------------


def _draw_test(sv, tokens, law, name):
    counts = np.bincount(np.asarray(tokens), minlength=law.shape[0])
    return cf.chi_square(name, counts, len(tokens) * law, [f"x={x}" for x in range(law.shape[0])])


def test_sample_draft_draws_from_the_warped_distribution(sv):
    """Chi-square at alpha = 1e-3 per warping, with two negative controls that must fail."""
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(60, generator=gen) * 2
    draws = 40_000
    for warp in [(0.7, 0, 0.9, 0.0), (1.0, 12, 1.0, 0.0), (1.3, 20, 0.8, 0.02), (1.0, 0, 1.0, 0.05)]:
        kw = dict(temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3])
        law = sv.warp_probs(logits, **kw).double().numpy()
        law /= law.sum()
        batch = sv.sample_draft(logits.expand(draws, -1), generator=gen, **kw)
        test = _draw_test(sv, batch.numpy(), law, f"sample_draft {warp}")
        assert test.pvalue >= ALPHA, test.cells_table()
        # The single-row form draws the same token for the same uniform as the reference.
        u = torch.rand(draws // 100, dtype=torch.float64, generator=gen)
        ours = sv.sample_draft(logits.expand(len(u), -1), uniforms=u, **kw)
        assert torch.equal(ours, sv.reference.sample_draft(logits.expand(len(u), -1), uniforms=u, **kw))
        # Negative control 1: drafting from the unwarped softmax (the footgun) fails.
        unwarped = torch.multinomial(torch.softmax(logits / warp[0], -1), draws, replacement=True, generator=gen)
        assert _draw_test(sv, unwarped.numpy(), law, "unwarped").pvalue < ALPHA
        # Negative control 2: the right support with a 10% wrong temperature fails.
        wrong = sv.sample_draft(logits.expand(draws, -1), generator=gen, **dict(kw, temperature=warp[0] * 1.1))
        assert _draw_test(sv, wrong.numpy(), law, "wrong temperature").pvalue < ALPHA


# ----------------------------------------------------------------------------
# Conformance to the exact law of the warped pair
# ----------------------------------------------------------------------------


def _logits_verifier(sv, target_logits, draft_logits, **warp):
    """The rounds protocol over verify_logits_batched (it ignores the probs it is handed)."""

    def rounds(target_probs, draft_probs, draft_tokens, uniforms):
        b = draft_tokens.shape[0]
        return sv.verify_logits_batched(
            target_logits.expand(b, -1, -1), draft_logits.expand(b, -1, -1), draft_tokens, uniforms=uniforms, **warp
        )

    return rounds


CONFORMANCE_CASES = {
    # name: (vocab, k, warp, rounds)
    "V83 K3 T0.8 top-k 20 top-p 0.9": (83, 3, dict(temperature=0.8, top_k=20, top_p=0.9), 100_000),
    "V83 K3 T1.2 min-p 0.05": (83, 3, dict(temperature=1.2, min_p=0.05), 100_000),
    "V7 K1 T3.0 top-p 0.9": (7, 1, dict(temperature=3.0, top_p=0.9), 100_000),
    "V32000 K4 T0.7 top-k 50 top-p 0.9": (32000, 4, dict(temperature=0.7, top_k=50, top_p=0.9), 20_000),
}


def _conformance_pair(sv, vocab, k, warp, seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(k + 1, vocab, generator=gen) * 2.5
    draft = target[:k] * 0.7 + torch.randn(k, vocab, generator=gen) * 1.2
    return target, draft, sv.warp_probs(target, **warp), sv.warp_probs(draft, **warp)


@pytest.mark.parametrize("name", sorted(CONFORMANCE_CASES))
def test_verify_logits_conforms_to_the_law_of_the_warped_pair(sv, name):
    """Harness at alpha = 1e-3 family-wise (Bonferroni over K + 3 tests), fixed seeds."""
    vocab, k, warp, rounds = CONFORMANCE_CASES[name]
    target, draft, target_probs, draft_probs = _conformance_pair(sv, vocab, k, warp, seed=vocab + k)
    result = cf.run_conformance(_logits_verifier(sv, target, draft, **warp), target_probs, draft_probs, rounds,
                                seed=31, alpha=ALPHA, name=name)
    print(result.report())
    assert result.passed, result.report()
    assert 0.05 < min(result.acceptance) and max(result.acceptance) < 0.95  # both branches exercised


def test_conformance_negative_controls_fail(sv):
    """Verifying against a warping other than the draft's must fail the same harness."""
    vocab, k, warp, rounds = CONFORMANCE_CASES["V83 K3 T0.8 top-k 20 top-p 0.9"]
    target, draft, target_probs, draft_probs = _conformance_pair(sv, vocab, k, warp, seed=vocab + k)
    # 1. The op told a different warping than the draft used (top-p dropped).
    mismatched = _logits_verifier(sv, target, draft, temperature=0.8, top_k=20)
    result = cf.run_conformance(mismatched, target_probs, draft_probs, rounds, seed=31, alpha=ALPHA)
    assert not result.passed, result.report()
    # 2. The classic footgun: warped target, but the unwarped draft softmax as q.
    unwarped_q = torch.softmax(draft / 0.8, -1)

    def footgun(target_probs, draft_probs, draft_tokens, uniforms):
        b = draft_tokens.shape[0]
        return sv.verify_sampled_batched(target_probs.expand(b, -1, -1), unwarped_q.expand(b, -1, -1),
                                         draft_tokens, uniforms=uniforms)

    result = cf.run_conformance(footgun, target_probs, draft_probs, rounds, seed=31, alpha=ALPHA)
    assert not result.passed, result.report()


# ----------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------


@pytest.fixture(params=["kernel", "reference"])
def impl(request, sv):
    return sv if request.param == "kernel" else sv.reference


def test_tokens_outside_the_warped_draft_support_are_refused(impl):
    target = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0]])
    draft = torch.tensor([[1.0, 2.0, 0.0, -1.0]])
    u = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for bad_token, warp in [(2, dict(top_k=2)), (3, dict(top_p=0.7)), (3, dict(min_p=0.2)),
                            (0, dict(temperature=0.0))]:
        with pytest.raises(ValueError, match=r"draft_tokens\[0\] = \d is outside the support"):
            impl.verify_logits(target, draft, torch.tensor([bad_token]), uniforms=u, **warp)
    # -inf logits have no mass at any warping.
    draft_inf = draft.clone()
    draft_inf[0, 3] = -math.inf
    with pytest.raises(ValueError, match="outside the support"):
        impl.verify_logits(target, draft_inf, torch.tensor([3]), uniforms=u)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(min_p=float("nan")), "min_p"),
    ],
)
def test_bad_warping_arguments(impl, kwargs, pattern):
    target = torch.zeros(2, 5)
    draft = torch.zeros(1, 5)
    with pytest.raises(ValueError, match=pattern):
        impl.verify_logits(target, draft, torch.tensor([1]), **kwargs)
    with pytest.raises(ValueError, match=pattern):
        impl.sample_draft(draft, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        impl.warp_probs(draft, **kwargs)


@pytest.mark.parametrize("value, name", [(float("nan"), "nan"), (float("inf"), "inf")])
@pytest.mark.parametrize("which", ["target_logits", "draft_logits"])
def test_nan_and_pos_inf_logits_in_a_read_row(impl, value, name, which):
    target = torch.zeros(2, 37)
    draft = torch.zeros(1, 37)
    (target if which == "target_logits" else draft)[0, 33] = value
    with pytest.raises(ValueError, match=rf"{which}\[0, 33\] is {name}: logits must be finite or -inf"):
        impl.verify_logits(target, draft, torch.tensor([1]))
    everywhere = torch.full((2, 37), -math.inf)
    with pytest.raises(ValueError, match="-inf everywhere"):
        impl.verify_logits(everywhere, draft, torch.tensor([1]))


def test_bad_shapes_dtypes_and_uniforms(sv):
    target, draft = torch.zeros(3, 5), torch.zeros(2, 5)
    tokens = torch.tensor([0, 1])
    for impl in (sv, sv.reference):
        with pytest.raises(ValueError, match="target_logits must have K\\+1"):
            impl.verify_logits(target[:2], draft, tokens)
        with pytest.raises(ValueError, match="draft_logits must have shape"):
            impl.verify_logits(target, draft[:, :4], tokens)
        with pytest.raises(TypeError, match="draft_logits must have the dtype"):
            impl.verify_logits(target, draft.half(), tokens)
        with pytest.raises(TypeError, match="target_logits must be float32"):
            impl.verify_logits(target.double(), draft, tokens)
        with pytest.raises(IndexError, match="draft_tokens"):
            impl.verify_logits(target, draft, torch.tensor([0, 5]))
        with pytest.raises(ValueError, match="uniforms must lie in"):
            impl.verify_logits(target, draft, tokens, uniforms=torch.tensor([0.1, 0.2, 1.0], dtype=torch.float64))
        with pytest.raises(ValueError, match="uniforms must have shape"):
            impl.verify_logits(target, draft, tokens, uniforms=torch.tensor([0.1, 0.2], dtype=torch.float64))
        with pytest.raises(ValueError, match="uniforms must have shape"):
            impl.sample_draft(draft, uniforms=torch.tensor([0.1], dtype=torch.float64))
    with pytest.raises(TypeError, match="top_k must be an int"):
        sv.verify_logits(target, draft, tokens, top_k=2.5)
    with pytest.raises(TypeError, match="temperature must be a real number"):
        sv.sample_draft(draft, temperature="hot")


# ----------------------------------------------------------------------------
# Every compiled instruction set computes the same bits
# ----------------------------------------------------------------------------

ISA_SCRIPT = textwrap.dedent(
    """
    import math, pathlib, sys, torch, kernels
    sv = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))
    r = sv.reference
    print(sv.ops.warp_info().split("=")[1])
    gen = torch.Generator().manual_seed(0)
    bad = 0
    warps = [(1.0, 0, 1.0, 0.0), (0.7, 20, 0.9, 0.0), (1.1, 0, 0.85, 0.02), (0.9, 0, 1.0, 0.1), (1.0, 3000, 0.9, 0.0)]
    for vocab in [1, 7, 17, 83, 989, 32000]:
        for dtype in [torch.float32, torch.float16, torch.bfloat16]:
            for warp in warps:
                target = (torch.randn(4, vocab, generator=gen) * 2).to(dtype)
                if vocab > 8:
                    target[2, ::5] = -math.inf
                draft = (target[:3].float() + torch.randn(3, vocab, generator=gen)).to(dtype)
                kw = dict(temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3])
                bad += not torch.equal(sv.warp_probs(target, normalize=False, **kw), r.warp_weights(target, *warp))
                tokens = sv.sample_draft(draft, generator=gen, **kw)
                u = torch.rand(4, dtype=torch.float64, generator=gen)
                bad += sv.verify_logits(target, draft, tokens, uniforms=u, **kw) != r.verify_logits(
                    target, draft, tokens, uniforms=u, **kw)
    print(bad)
    """
)


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_instruction_set_matches_reference(sv, capability):
    check_isa_script(sv, capability, ISA_SCRIPT)


# ----------------------------------------------------------------------------
# Registration: opcheck, fakes, torch.compile, docstrings
# ----------------------------------------------------------------------------


def _op_args():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(5, 37, generator=gen)
    draft = target[:4] + torch.randn(4, 37, generator=gen)
    u = torch.rand(5, dtype=torch.float64, generator=gen)
    return target, draft, u


def test_opcheck_and_fakes(sv):
    target, draft, u = _op_args()
    warp = (0.8, 10, 0.9, 0.01)
    tokens = sv.sample_draft(draft, temperature=0.8, top_k=10, top_p=0.9, min_p=0.01, uniforms=u[:4])
    cases = [
        (sv.ops.verify_logits, (target, draft, tokens, *warp, u, None)),
        (sv.ops.verify_logits, (target.bfloat16(), draft.bfloat16(), tokens.int(), 0.0, 0, 1.0, 0.0, None, None)),
        (sv.ops.verify_logits_batched, (target.repeat(2, 1, 1), draft.repeat(2, 1, 1), tokens.repeat(2, 1),
                                        torch.tensor([4, 1]), *warp, u.repeat(2, 1), None)),
        (sv.ops.sample_draft, (draft, *warp, u[:4], None)),
        (sv.ops.warp_probs, (draft.half(), *warp, True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    args = (target, draft, tokens, *warp, u, None)
    torch.library.opcheck(sv.ops.verify_logits_ints, args, test_utils=("test_schema", "test_autograd_registration"))
    assert list(sv.ops.verify_logits_ints(*args)) == sv.ops.verify_logits(*args).tolist()

    def decide(target, draft, tokens, u):
        return sv.ops.verify_logits(target, draft, tokens, *warp, u, None) + 0

    compiled = torch.compile(decide, fullgraph=True, backend="eager")
    assert compiled(target, draft, tokens, u).tolist() == list(sv.verify_logits(
        target, draft, tokens, temperature=0.8, top_k=10, top_p=0.9, min_p=0.01, uniforms=u))


@pytest.mark.parametrize("name", ["verify_logits", "verify_logits_batched", "sample_draft", "warp_probs"])
def test_docstring_examples(sv, name):
    fn = getattr(sv, name)
    globs = {"torch": torch, name: fn}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = doctest.DocTestFinder().find(fn, name, globs=globs)
    assert tests and tests[0].examples, f"{name} has no runnable example"
    for test in tests:
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {name}'s docstring"
