"""What is specific to the warping's one definition (``warping.py``): temperature,
top-k, top-p, min-p, in transformers' order.

* ``exp_sv``, the float32 exponential that the C++ and the reference compute
  bit for bit: accurate, exactly 1 at the top token, 0 for -inf;
* a cut never splits tied logits (top-k, top-p, min-p), in the weights and
  through verification;
* the same support as transformers' logits processors, probabilities within
  float32 rounding (needs transformers).

The warped weights == the reference's, bit for bit, are in test_match_reference.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.op_families import WARPS, logits_three_ways, warp_kwargs


def test_exp_sv_is_accurate_and_exact_at_zero(sv):
    z = -torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 90
    w = sv.warping.exp_sv(z)
    exact = torch.exp(z.double())
    live = z >= -86
    assert float(((w.double() - exact) / exact)[live].abs().max()) < 2 * 2**-24  # within 2 ulp
    assert bool((w[~live] == 0).all())
    assert sv.warping.exp_sv(torch.tensor([0.0, -0.0, -math.inf])).tolist() == [1.0, 1.0, 0.0]


@pytest.mark.transformers
def test_support_and_probabilities_match_transformers_processors(sv):
    # Continuous logits (no ties): the same support as transformers'
    # processors in the same order, and probabilities within float32 rounding.
    pytest.importorskip("transformers")
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
                tokens = sv.sample_draft(draft, **warp_kwargs(warp), generator=gen)
                u = torch.rand(4, dtype=torch.float64, generator=gen)
                ours, reference, via_sampled = logits_three_ways(sv, target, draft, tokens, u, warp)
                mismatches += not (ours == reference == via_sampled)
    assert mismatches == 0


def test_warped_target_with_unwarped_draft_emits_only_the_cut_set(sv):
    # verify_sampled on a top-k/top-p warped target and a full-support draft:
    # every accepted token and every emitted token has positive target mass.
    gen = torch.Generator().manual_seed(21)
    vocab, k = 200, 4
    for trial in range(60):
        logits = torch.randn(k + 1, vocab, generator=gen) * 2
        target = sv.warp_probs(logits, top_k=10, top_p=0.8)
        draft = torch.softmax(logits[:k] + torch.randn(k, vocab, generator=gen), -1)
        tokens = torch.multinomial(draft, 1, generator=gen).flatten()
        n, nxt = sv.verify_sampled(target, draft, tokens, generator=gen)
        kept = target > 0
        for i in range(n):
            assert kept[i, tokens[i]], f"trial {trial}: accepted token {int(tokens[i])} outside the cut set"
        assert kept[n, nxt], f"trial {trial}: emitted {nxt} outside the cut set"
