"""The plugin's rejection step, called as vLLM calls it (no engine).

* greedy: equal to stock vLLM's rejection sampler, token for token;
* sampled: equal to the kernel's per-sequence ops on each sequence's slice
  (the ragged layout, the uniforms, the emitted row), and the law: the first
  emitted token is distributed as the target row (chi-square, alpha = 1e-3),
  with a negative control (draft probabilities withheld) that must fail;
* mixed batches, seeded requests, the #55005 fix, and loud bad input.
"""

from __future__ import annotations

import types

import pytest
import torch
from scipy import stats

from integrations.vllm.spec_verify_vllm import rejection

ALPHA = 1e-3  # significance level of the statistical tests


@pytest.fixture(scope="module")
def stock():
    """Stock vLLM's ``rejection_sample``, runnable on the CPU (its C++ kernel overrides registered)."""
    from vllm.platforms import current_platform
    import vllm.v1.sample.rejection_sampler as rs

    current_platform.register_triton_kernel_overrides()
    return getattr(rs, "_spec_verify_stock", rs.rejection_sample)


def metadata(B, greedy_rows=(), seeds=None):
    """The fields of vLLM's SamplingMetadata that rejection sampling reads."""
    greedy = torch.zeros(B, dtype=torch.bool)
    greedy[list(greedy_rows)] = True
    temperature = torch.where(greedy, torch.tensor(0.0), torch.tensor(0.8))
    gens = {b: torch.Generator().manual_seed(s) for b, s in (seeds or {}).items()}
    return types.SimpleNamespace(all_greedy=bool(greedy.all()), all_random=not bool(greedy.any()),
                                 temperature=temperature, generators=gens)


def ragged(ks, V, seed, accept_bias=0.7):
    """A ragged batch: draft tokens (often the target's argmax, so accepts happen), logits, draft probs."""
    g = torch.Generator().manual_seed(seed)
    T = sum(ks)
    logits = torch.randn(T, V, generator=g) * 3
    draft_probs = torch.softmax(torch.randn(T, V, generator=g) * 2, -1)
    tokens = torch.multinomial(draft_probs, 1, generator=g).view(-1)
    take_argmax = torch.rand(T, generator=g) < accept_bias
    tokens = torch.where(take_argmax, logits.argmax(-1), tokens).to(torch.int32)
    cu = torch.tensor(ks, dtype=torch.int64).cumsum(0).to(torch.int32)
    bonus = torch.randint(V, (len(ks), 1), generator=g, dtype=torch.int64)
    return tokens, cu, logits, draft_probs, bonus


def call(fn, ks, tokens, cu, draft_probs, logits, bonus, md):
    return fn(tokens, list(ks), max(ks) if ks else 0, cu, draft_probs, logits.clone(), bonus, md)


CASES = [[3], [0], [2, 0, 5, 1], [4, 4, 4], [1, 2, 3, 4, 5, 6, 7, 0]]


# ----------------------------------------------------------------------------
# Greedy: stock vLLM's answer, token for token
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("ks", CASES)
@pytest.mark.parametrize("seed", range(5))
def test_greedy_equals_stock(stock, ks, seed):
    tokens, cu, logits, _, bonus = ragged(ks, 50, seed)
    md = metadata(len(ks), greedy_rows=range(len(ks)))
    ours = call(rejection.rejection_sample, ks, tokens, cu, None, logits, bonus, md)
    theirs = call(stock, ks, tokens, cu, None, logits, bonus, md)
    assert ours.dtype == theirs.dtype == torch.int32
    assert torch.equal(ours, theirs), (ours, theirs)


def test_greedy_cases_accept_and_reject():
    """The greedy cases above exercise accepts, rejects and full acceptance (bonus) alike."""
    seen = set()
    for ks in CASES:
        for seed in range(5):
            tokens, cu, logits, _, bonus = ragged(ks, 50, seed)
            md = metadata(len(ks), greedy_rows=range(len(ks)))
            out = call(rejection.rejection_sample, ks, tokens, cu, None, logits, bonus, md)
            for b, k in enumerate(ks):
                n = int((out[b] != -1).sum()) - 1
                seen.add("full" if n == k else "rejected")
                if 0 < n:
                    seen.add("accepted")
    assert seen == {"full", "rejected", "accepted"}


# ----------------------------------------------------------------------------
# Sampled: the kernel's per-sequence ops on each slice, bit for bit
# ----------------------------------------------------------------------------


def expected_rows(sv, ks, tokens, cu, draft_probs, logits, bonus, uniforms, point_mass, greedy_rows=()):
    """What each sequence's own ``verify_sampled`` / ``verify_greedy`` emits, as vLLM's rows."""
    probs = torch.softmax(logits, -1)
    rows = torch.full((len(ks), max(ks) + 1), -1, dtype=torch.int32)
    start = 0
    for b, k in enumerate(ks):
        sl = slice(start, start + k)
        # One-sequence ops take k+1 target rows; the bonus row is never read when
        # the bonus is given, so any row stands in for it (here: zeros + the bonus token).
        bonus_row = torch.zeros(1, logits.shape[1])
        bonus_row[0, bonus[b, 0]] = 1.0
        if b in greedy_rows:
            n, nxt = sv.verify_greedy(torch.cat([logits[sl], bonus_row]), tokens[sl].long())
        else:
            q = (torch.nn.functional.one_hot(tokens[sl].long(), logits.shape[1]).float()
                 if point_mass else draft_probs[sl])
            u = uniforms[start + b : start + b + k + 1]
            n, nxt = sv.verify_sampled(torch.cat([probs[sl], bonus_row]), q, tokens[sl].long(), uniforms=u)
        n, nxt = int(n), int(nxt)
        rows[b, :n] = tokens[sl][:n]
        rows[b, n] = nxt
        start += k
    return rows


@pytest.mark.parametrize("ks", CASES[2:])
@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("greedy_rows", [(), (1,)])
def test_sampled_equals_per_sequence_ops(ks, point_mass, greedy_rows):
    sv = rejection.kernel()
    tokens, cu, logits, draft_probs, bonus = ragged(ks, 40, 11)
    seeds = {b: 100 + b for b in range(len(ks))}  # every request seeded: the uniforms are known
    md = metadata(len(ks), greedy_rows=greedy_rows, seeds=seeds)
    out = call(rejection.rejection_sample, ks, tokens, cu, None if point_mass else draft_probs, logits, bonus, md)
    uniforms = torch.zeros(sum(ks) + len(ks), dtype=torch.float64)  # a k = 0 entry is never read
    start = 0
    for b, k in enumerate(ks):
        if k:
            uniforms[start : start + k + 1].uniform_(generator=torch.Generator().manual_seed(seeds[b]))
        start += k + 1
    want = expected_rows(sv, ks, tokens, cu, draft_probs, logits, bonus, uniforms, point_mass, greedy_rows)
    assert torch.equal(out, want), (out, want)


def test_seeded_request_ignores_its_neighbours():
    """A seeded request's row is the same whatever else shares its batch (vLLM's seed promise)."""
    ks = [3, 4, 2]
    tokens, cu, logits, draft_probs, bonus = ragged(ks, 40, 5, accept_bias=0.3)
    rows = []
    for other_seed in (1, 2, 3):
        torch.manual_seed(other_seed)  # the unseeded requests draw from the default generator
        md = metadata(3, seeds={1: 77})
        rows.append(call(rejection.rejection_sample, ks, tokens, cu, draft_probs, logits, bonus, md))
    assert all(torch.equal(r[1], rows[0][1]) for r in rows)
    assert not all(torch.equal(r, rows[0]) for r in rows), "unseeded requests should vary (control)"


# ----------------------------------------------------------------------------
# The law: the first emitted token follows the target row
# ----------------------------------------------------------------------------


def first_token_pvalue(true_q, N=20000, seed=0):
    """Chi-square p-value of the first emitted token against p, over N sequences in one call.

    The draft tokens are drawn from ``q``; ``true_q=False`` verifies them as if
    drawn from the uniform row instead (a draft-probability mix-up).
    """
    g = torch.Generator().manual_seed(seed)
    V, k = 5, 2
    p_logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0], [0.3, 0.3, 0.3, 0.3, 0.3]])  # [k, V]
    q = torch.tensor([[0.1, 0.5, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]])  # [k, V]
    tokens = torch.multinomial(q.repeat(N, 1), 1, generator=g).view(-1).to(torch.int32)  # [N*k]
    logits = p_logits.repeat(N, 1)
    cu = torch.arange(1, N + 1, dtype=torch.int32) * k
    bonus = torch.zeros(N, 1, dtype=torch.int64)
    torch.manual_seed(seed)
    md = metadata(N)
    out = rejection.rejection_sample(tokens, [k] * N, k, cu, (q if true_q else torch.full_like(q, 1 / V)).repeat(N, 1),
                                     logits, bonus, md)
    counts = torch.bincount(out[:, 0].long(), minlength=V).double()
    p0 = torch.softmax(p_logits[0].double(), -1)
    return stats.chisquare(counts.numpy(), (p0 * N).numpy()).pvalue


def test_first_token_follows_target():
    assert first_token_pvalue(true_q=True) > ALPHA


def test_law_negative_control_wrong_draft_probs():
    """Verifying a draft against probabilities it was not drawn from breaks the law; the test must see it.

    (Withholding them instead would not: a point-mass verification keeps the
    first token's law whatever chose the token -- vLLM's greedy-draft mode.)
    """
    assert first_token_pvalue(true_q=False) < ALPHA


# ----------------------------------------------------------------------------
# vllm#55005: per-request parameters expanded per draft token
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_batch_to_tokens(dtype):
    x = torch.tensor([0, 3, 5, 0], dtype=dtype)
    ks = [2, 0, 3, 1]
    cu = torch.tensor(ks).cumsum(0).to(torch.int32)
    got = rejection.expand_batch_to_tokens(x, cu, sum(ks), replace_from=0, replace_to=1)
    want = torch.tensor([1, 1, 5, 5, 5, 1], dtype=dtype)  # written out by hand
    assert got.dtype == dtype and torch.equal(got, want)


# ----------------------------------------------------------------------------
# Bad input is loud: the kernel's named errors come through
# ----------------------------------------------------------------------------


def test_nan_target_is_a_value_error():
    ks = [2, 1]
    tokens, cu, logits, draft_probs, bonus = ragged(ks, 20, 3)
    logits[0, :] = float("nan")
    with pytest.raises(ValueError):
        call(rejection.rejection_sample, ks, tokens, cu, draft_probs, logits, bonus, metadata(2))


def test_draft_token_out_of_vocabulary_is_an_index_error():
    ks = [2, 1]
    tokens, cu, logits, draft_probs, bonus = ragged(ks, 20, 3)
    tokens[1] = 20
    with pytest.raises(IndexError):
        call(rejection.rejection_sample, ks, tokens, cu, None, logits, bonus, metadata(2, greedy_rows=[0, 1]))


def test_synthetic_mode_is_not_ours():
    with pytest.raises(NotImplementedError):
        rejection.rejection_sample(torch.zeros(0, dtype=torch.int32), [], 0, torch.zeros(0, dtype=torch.int32),
                                   None, torch.zeros(0, 4), torch.zeros(0, 1, dtype=torch.int64),
                                   metadata(0), synthetic_mode=True)
