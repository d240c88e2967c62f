"""The contract's properties, in both op families (probability rows in; logits in).

* Laziness: rows after the first miss / rejection are never read (so never
  validated), nor anything past a sequence's draft length.
* Determinism: same generator state, same result, at any thread count; the
  uniforms are exactly torch.rand's draws from the generator (the default one
  when none is given), and temperature 0 draws nothing.
* Zero mass is never emitted, whatever the uniforms and the rounding.
* Batched == single, ragged, and independent of the rest of the batch.
* No O(V) temporary per call.

Fast == reference token for token is in test_match_reference.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from examples.e2e import torch_threads
from tests.op_families import OPS, RANDOM_OPS, logits_pair

ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
RANDOM = pytest.mark.parametrize("op", [OPS[name] for name in RANDOM_OPS], ids=RANDOM_OPS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F64 = torch.float64


def _lists(result):
    """A batched result ``(n [B], next [B])`` as lists, to compare."""
    return [t.tolist() for t in result]


# ----------------------------------------------------------------------------
# Laziness: rows after the stop are never read (so never validated)
# ----------------------------------------------------------------------------


def _greedy_miss_at_row_1(sv):
    target = torch.rand(6, 101)
    tokens = target[:5].argmax(-1)
    tokens[1] = (tokens[1] + 1) % 101  # miss at row 1
    return target, target[:5].clone(), tokens, {}, 1


def _sampled_rejection_at_row_1(sv):
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(5, 211, generator=gen)
    draft = torch.rand(4, 211, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    draft[1, tokens[1]] = 1e3  # the draft over-weights its own token: with u_1 = 0.999, certain rejection
    uniforms = torch.tensor([0.0, 0.999, 0.5, 0.5, 0.3], dtype=F64)
    return target, draft, tokens, dict(uniforms=uniforms), 1


def _logits_rejection_at_row_0(sv):
    target, draft = logits_pair(torch.Generator().manual_seed(2), 64, 4)
    # Row 0: the draft puts its token where the target has no mass after top-k.
    draft[0] = -5.0
    draft[0, 7] = 5.0
    target[0, 7] = -50.0
    tokens = torch.tensor([7, 1, 2, 3])
    warp = dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    return target, draft, tokens, dict(warp, uniforms=torch.full((5,), 0.5, dtype=F64)), 0


def _block_zero_weight_after_row_1(sv):
    # Block verification reads every row up to the first draft token of zero
    # target mass (there p_2 = 0, so no block can end past row 1), and no further.
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(5, 211, generator=gen)
    draft = torch.rand(4, 211, generator=gen)
    draft[0] = target[0]  # p_1 = 1
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    target[1, tokens[1]] = 0.0  # p_2 = 0
    uniforms = torch.tensor([0.0, 0.5, 0.5, 0.5, 0.3], dtype=F64)  # u_0 = 0 < h_1: the block ends at 1
    return target, draft, tokens, dict(uniforms=uniforms), 1


LAZY_CASES = {"greedy": _greedy_miss_at_row_1, "sampled": _sampled_rejection_at_row_1,
              "block": _block_zero_weight_after_row_1, "logits": _logits_rejection_at_row_0}


@ALL
def test_rows_after_the_first_rejection_are_never_read(sv, op):
    target, draft, tokens, kw, stop = LAZY_CASES[op.name](sv)
    expected = op.call(sv, target, draft, tokens, **kw)
    assert expected[0] == stop
    for poison in op.unreadable:  # reading any of the poisoned rows would raise
        t2, d2 = target.clone(), draft.clone()
        t2[stop + 1:] = poison
        d2[stop + 1:] = poison
        for impl in (sv, sv.reference):  # the reference path is lazy too
            assert op.call(impl, t2, d2, tokens, **kw) == expected, (impl.__name__, poison)


@ALL
def test_batched_never_reads_past_draft_length(sv, op):
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(1), k=3, vocab=50, batch=2)
    counts = torch.tensor([1, 0])
    uniforms = torch.rand(2, 4, dtype=F64)
    expected = op.call_batched(sv, target, draft, tokens, counts, uniforms=uniforms)
    for poison in op.unreadable:
        t2, d2, tok2 = target.clone(), draft.clone(), tokens.clone()
        t2[0, 2:] = poison
        t2[1, 1:] = poison
        d2[0, 1:] = poison
        d2[1, :] = poison
        tok2[0, 1:] = 10**6  # out-of-range ids past k_b are never read either
        tok2[1, :] = -5
        for impl in (sv, sv.reference):
            got = op.call_batched(impl, t2, d2, tok2, counts, uniforms=uniforms)
            assert _lists(got) == _lists(expected), (impl.__name__, poison)


# ----------------------------------------------------------------------------
# Determinism and the source of randomness
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@ALL
def test_same_seed_same_result_any_thread_count(sv, op, threads):
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(3), k=4, vocab=3000, batch=16)
    counts = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(4))

    def run(count):
        with torch_threads(count):
            return _lists(op.call_batched(sv, target, draft, tokens, counts,
                                          generator=torch.Generator().manual_seed(5)))

    base = run(1)
    assert run(threads) == base
    if op.random:  # the generator's draws are torch.rand's: the same result from explicit uniforms
        u = torch.rand(16, 5, dtype=F64, generator=torch.Generator().manual_seed(5))
        assert _lists(op.call_batched(sv, target, draft, tokens, counts, uniforms=u)) == base


@RANDOM
def test_generator_draws_match_torch_rand(sv, op):
    # The op draws K+1 uniforms exactly as torch.rand(K+1, float64) would.
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(1), k=4, vocab=3000)
    for seed in range(40):
        u = torch.rand(5, dtype=F64, generator=torch.Generator().manual_seed(seed))
        via_generator = op.call(sv, target, draft, tokens, generator=torch.Generator().manual_seed(seed))
        assert via_generator == op.call(sv, target, draft, tokens, uniforms=u)
    # And it advances the generator by exactly those draws.
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    op.call(sv, target, draft, tokens, generator=g1)
    torch.rand(5, dtype=F64, generator=g2)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


@RANDOM
def test_default_generator_is_used_when_none_given(sv, op):
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(2), k=4, vocab=3000)
    torch.manual_seed(123)
    first = [op.call(sv, target, draft, tokens) for _ in range(20)]
    torch.manual_seed(123)
    assert [op.call(sv, target, draft, tokens) for _ in range(20)] == first
    assert len(set(first)) > 1  # the draws vary from call to call


def test_sample_draft_draws_one_uniform_per_row(sv):
    # sample_draft's N rows take the draws of torch.rand(N, float64), row-major, and no more.
    draft = torch.randn(3, 2, 500, generator=torch.Generator().manual_seed(6)) * 2
    warp = OPS["logits"].warp
    g1, g2 = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    via_generator = sv.sample_draft(draft, generator=g1, **warp)
    u = torch.rand(6, dtype=F64, generator=g2)
    assert torch.equal(via_generator, sv.sample_draft(draft, uniforms=u.reshape(3, 2), **warp))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_temperature_zero_draws_nothing(sv):
    gen = torch.Generator().manual_seed(11)
    target, draft = logits_pair(gen, 50, 3)
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


# ----------------------------------------------------------------------------
# Zero mass is never emitted, whatever the uniforms and the rounding
# ----------------------------------------------------------------------------

EDGE_UNIFORMS = [0.0, 2.0**-53, 0.5, 1.0 - 2.0**-53, 1.0 - 2.0**-40]


def _zero_mass_probs(sv, op, gen, vocab, trial):
    """Probability rows with many exact zeros (the last id always), and the weights decided on."""
    target = torch.rand(3, vocab, generator=gen)
    target[torch.rand(3, vocab, generator=gen) < 0.7] = 0.0
    target[:, -1] = 0.0  # the last id, where a sloppy fallback would land
    target[:, vocab // 2] += 1e-30  # tiny but positive mass
    target[:, 0] += 1e-3
    draft = target[:2].clone()
    draft[:, 1:] += torch.rand(2, vocab - 1, generator=gen) * (trial % 3)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    return target, draft, tokens, target, draft


def _zero_mass_logits(sv, op, gen, vocab, trial):
    """Logits with many -inf entries (the last id always), cut further by the op's warping."""
    target = torch.randn(3, vocab, generator=gen) * 2
    target[torch.rand(3, vocab, generator=gen) < 0.7] = -float("inf")
    target[:, -1] = -float("inf")
    target[:, 0] = 0.0
    draft = target[:2] + torch.randn(2, vocab, generator=gen) * (trial % 3)
    tokens = sv.sample_draft(draft, generator=gen, **op.warp)
    weights = sv.reference.warp_weights
    return target, draft, tokens, weights(target, *op.warp_args), weights(draft, *op.warp_args)


ZERO_MASS_CASES = {"sampled": _zero_mass_probs, "block": _zero_mass_probs, "logits": _zero_mass_logits}


@RANDOM
def test_zero_mass_tokens_never_emitted(sv, op):
    gen = torch.Generator().manual_seed(11)
    for vocab in [2, 17, 989, 5000]:
        for trial in range(40 if op.rows == "probs" else 12):
            target, draft, tokens, p, q = ZERO_MASS_CASES[op.name](sv, op, gen, vocab, trial)
            for u_last in EDGE_UNIFORMS:
                for u_test in [0.0, 0.999999]:
                    uniforms = torch.tensor([u_test, u_test, u_last], dtype=F64)
                    n, token = op.call(sv, target, draft, tokens, uniforms=uniforms)
                    # (block's residual at n > 0 is weighted by p_n: only p > 0 is checked there)
                    if n < 2 and (op.name != "block" or n == 0):
                        t64, d64 = p[n].double(), q[n].double()
                        residual = t64 * d64.sum() - d64 * t64.sum()
                        assert residual[token] > 0 or bool((residual <= 0).all()), (vocab, trial, n, token)
                    assert p[n, token] > 0, f"emitted zero-mass token {token} at row {n}"


@RANDOM
def test_edge_uniforms_pick_first_and_last_positive(sv, op):
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0, 1.0, 0.0]])
    target = probs if op.rows == "probs" else probs.log()  # logits: -inf where the mass is 0
    draft = torch.empty(0, 6)
    tokens = torch.empty(0, dtype=torch.long)

    def at(u):
        return op.call(sv, target, draft, tokens, uniforms=torch.tensor([u], dtype=F64))

    assert at(0.0) == (0, 2) and at(1 - 2**-53) == (0, 4)
    # threshold 0.5 * 2 = 1.0 exactly; "exceeds" is strict, so id 2 (cumulative 1.0) loses.
    assert at(0.5) == (0, 4)


# ----------------------------------------------------------------------------
# Batched, ragged
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@ALL
def test_batched_equals_single(sv, op, dtype):
    gen = torch.Generator().manual_seed(6)
    batch, k, vocab = 9, 5, 333
    target, draft, tokens = op.case(sv, gen, k, vocab, batch=batch, dtype=dtype)
    counts = torch.randint(0, k + 1, (batch,), generator=gen)
    uniforms = torch.rand(batch, k + 1, dtype=F64, generator=gen)

    n, nxt = op.call_batched(sv, target, draft, tokens, counts, uniforms=uniforms)
    n_ref, nxt_ref = op.call_batched(sv.reference, target, draft, tokens, counts, uniforms=uniforms)
    assert n.tolist() == n_ref.tolist() and nxt.tolist() == nxt_ref.tolist()
    for b in range(batch):
        kb = int(counts[b])
        single = op.call(sv, target[b, : kb + 1], draft[b, :kb], tokens[b, :kb],
                         uniforms=uniforms[b, : kb + 1].contiguous())
        assert (int(n[b]), int(nxt[b])) == single, f"sequence {b}"


@ALL
def test_batched_result_independent_of_batch_makeup(sv, op):
    # A sequence's result depends only on its own rows and uniforms.
    gen = torch.Generator().manual_seed(7)
    batch, k, vocab = 6, 4, 500
    target, draft, tokens = op.case(sv, gen, k, vocab, batch=batch)
    uniforms = torch.rand(batch, k + 1, dtype=F64, generator=gen)
    full = op.call_batched(sv, target, draft, tokens, uniforms=uniforms)
    order = torch.randperm(batch, generator=gen)
    permuted = op.call_batched(sv, target[order], draft[order], tokens[order], uniforms=uniforms[order])
    assert permuted[0].tolist() == full[0][order].tolist()
    assert permuted[1].tolist() == full[1][order].tolist()


# ----------------------------------------------------------------------------
# No O(V) temporary per call
# ----------------------------------------------------------------------------


def _bytes_allocated_by(fn, prefix):
    """Bytes the CPU allocator handed to ops whose name starts with prefix."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(e.cpu_memory_usage for e in prof.events() if e.name.startswith(prefix) and e.cpu_memory_usage > 0)


@pytest.mark.parametrize("vocab", [1000, 128256])
def test_no_vocab_sized_allocation(sv, vocab):
    target = torch.rand(3, 5, vocab)
    draft = torch.rand(3, 4, vocab)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1).reshape(3, 4)
    namespace = sv.ops.__name__.split(".")[-1]

    def all_ops():
        sv.ops.verify_greedy(target[0], tokens[0])
        sv.ops.verify_sampled(target[0], draft[0], tokens[0], None, None)
        sv.ops.verify_greedy_batched(target, tokens, None)
        sv.ops.verify_sampled_batched(target, draft, tokens, None, None, None)

    # Only the outputs: 2 x 8 bytes per single op, 2 x 3 x 8 per batched op
    # (and > 0: the profiler did attribute the ops' own allocations).
    allocated = _bytes_allocated_by(all_ops, namespace)
    assert 0 < allocated <= 2 * 16 + 2 * 48, f"{allocated} bytes allocated at V = {vocab}"
    # Control: the instrument does see an O(V) allocation made inside an op.
    assert _bytes_allocated_by(lambda: target[0].contiguous(memory_format=torch.preserve_format).clone(), "aten::") >= 4 * vocab


# ----------------------------------------------------------------------------
# The accept test's strict side, the residual draw exactly, one-hot drafts,
# uniforms 1e-12 apart, inputs re-read (ported from vLLM / FlashInfer / SGLang
# verification tests)
# ----------------------------------------------------------------------------

PATHS = pytest.mark.parametrize("path", ["kernel", "reference"])


def _impl(sv, path):
    return sv if path == "kernel" else sv.reference


@PATHS
def test_accept_test_is_strict(sv, path):
    impl = _impl(sv, path)
    # Masses 1 exactly: accept iff u * q(t) < p(t).
    target = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    draft = torch.tensor([[0.5, 0.5]])
    t0 = torch.tensor([0])
    at = lambda u: impl.verify_sampled(target, draft, t0, uniforms=torch.tensor([u, 0.1], dtype=F64))  # noqa: E731
    assert at(0.5)[0] == 0  # u * q = p exactly: rejected
    assert at(0.5 - 2**-53)[0] == 1  # just below: accepted
    # p(t) = 0 is rejected even at u = 0.
    zero_p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    assert impl.verify_sampled(zero_p, draft, t0, uniforms=torch.tensor([0.0, 0.1], dtype=F64)) == (0, 1)


@PATHS
def test_residual_draw_is_exact_across_many_blocks(sv, path):
    # V = 8192 spans many float64 summation blocks. Uniforms at the midpoint
    # of a token's residual interval must draw exactly that token, computed
    # here independently from the definition (numpy-free float64 torch cumsum
    # of max(0, p*Q - q*P); midpoints are far from any rounding).
    impl = _impl(sv, path)
    gen = torch.Generator().manual_seed(11)
    vocab = 8192
    target = torch.rand(2, vocab, generator=gen)
    draft = torch.rand(1, vocab, generator=gen)
    token = int(torch.argmax(draft[0] - target[0]))  # q(t) > p(t): rejectable
    p, q = target[0].double(), draft[0].double()
    res = (p * q.sum() - q * p.sum()).clamp_min(0)
    cum = torch.cumsum(res, 0)
    total = float(cum[-1])
    picks = torch.nonzero(res > 0).flatten()
    picks = picks[torch.randperm(len(picks), generator=gen)[:40]]
    blocks = set()
    for x in picks.tolist():
        u = (float(cum[x]) - 0.5 * float(res[x])) / total
        uniforms = torch.tensor([1 - 2**-53, u], dtype=F64)  # reject at 0, then draw
        assert impl.verify_sampled(target, draft, torch.tensor([token]), uniforms=uniforms) == (0, x)
        blocks.add(x // 512)
    assert len(blocks) >= 8


@pytest.mark.parametrize("family", ["sampled", "logits"])
def test_one_hot_draft_rows_never_re_emit_the_rejected_token(sv, family):
    # n-gram drafts: q is a point mass at t. The residual at t is max(0, p(t) - 1) = 0.
    gen = torch.Generator().manual_seed(12)
    vocab, rejections = 50, 0
    for trial in range(200):
        token = int(torch.randint(vocab, (1,), generator=gen))
        u = torch.rand(2, dtype=F64, generator=gen)
        if family == "sampled":
            target = torch.rand(2, vocab, generator=gen)
            draft = torch.zeros(1, vocab)
            draft[0, token] = 1.0
            n, nxt = sv.verify_sampled(target, draft, torch.tensor([token]), uniforms=u)
        else:
            target = torch.randn(2, vocab, generator=gen)
            draft = torch.full((1, vocab), -math.inf)
            draft[0, token] = 0.0
            n, nxt = sv.verify_logits(target, draft, torch.tensor([token]), uniforms=u)
        if n == 0:
            rejections += 1
            assert nxt != token, f"trial {trial}"
    assert rejections > 50  # the property was exercised


@PATHS
def test_uniforms_1e12_apart_pick_different_tokens(sv, path):
    impl = _impl(sv, path)
    target = torch.tensor([[0.5, 0.5]])
    below, above = 0.5 - 5e-13, 0.5 + 5e-13
    assert impl.verify_sampled(target, target[:0], torch.tensor([], dtype=torch.long),
                               uniforms=torch.tensor([below], dtype=F64)) == (0, 0)
    assert impl.verify_sampled(target, target[:0], torch.tensor([], dtype=torch.long),
                               uniforms=torch.tensor([above], dtype=F64)) == (0, 1)


@ALL
def test_inputs_changed_in_place_are_re_read(sv, op):
    gen = torch.Generator().manual_seed(13)
    target, draft, tokens = op.case(sv, gen, 2, 40)
    u = torch.tensor([0.0, 0.0, 0.5], dtype=F64)
    first = op.call(sv, target, draft, tokens, uniforms=u)
    # Make row 0's argmax (and, sampled, its only mass) a token other than t_0.
    other = (int(tokens[0]) + 1) % 40
    target[0] = -math.inf if op.rows == "logits" else 0.0
    target[0, other] = 5.0
    second = op.call(sv, target, draft, tokens, uniforms=u)
    assert second[0] == 0 and first != second
    tokens[0] = other  # now t_0 is the target's argmax
    if op.rows == "logits":
        draft[0] = -math.inf
        draft[0, other] = 0.0
    elif op.random:
        draft[0, other] = 1.0
    assert op.call(sv, target, draft, tokens, uniforms=u)[0] >= 1
    u[0] = 0.999999  # the uniforms too: a certain accept stays (p = 1), rejections follow u
    assert op.call(sv, target, draft, tokens, uniforms=u)[0] >= 1


@ALL
def test_odd_batch_sizes_equal_single(sv, op):
    gen = torch.Generator().manual_seed(14)
    for batch in range(1, 32):
        k, vocab = 3, 19
        target, draft, tokens = op.case(sv, gen, k, vocab, batch=batch)
        counts = torch.randint(0, k + 1, (batch,), generator=gen)
        uniforms = torch.rand(batch, k + 1, dtype=F64, generator=gen)
        n, nxt = op.call_batched(sv, target, draft, tokens, counts, uniforms=uniforms)
        for b in range(batch):
            kb = int(counts[b])
            single = op.call(sv, target[b, : kb + 1], draft[b, :kb], tokens[b, :kb],
                             uniforms=uniforms[b, : kb + 1].contiguous())
            assert (int(n[b]), int(nxt[b])) == single, f"batch {batch}, sequence {b}"
