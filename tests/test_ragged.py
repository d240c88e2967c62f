"""The ragged entry points (vLLM's flattened layout, DESIGN.md "Ragged layout").

``verify_greedy_ragged`` and ``verify_sampled_ragged`` read B sequences laid
out flat -- ``draft_tokens [T]``, ``cu_num_draft_tokens [B]`` (inclusive
cumulative sum), target rows ``[T+B, V]`` or ``[T, V]`` with ``bonus_tokens``,
draft rows ``[T, V]`` or none (a point-mass draft), uniforms ``[T+B]``. What
is checked, none of it read off the code under test:

* entry b == the single op (``verify_greedy`` / ``verify_sampled``) on
  sequence b's own slice with its own uniforms, C++ and reference, over random
  layouts (k_b = 0 included), odd V, three dtypes, int32 / int64 ids and
  counts, given bonus tokens, and point-mass drafts (against a one-hot draft row);
* C++ ragged == reference ragged, token for token;
* the point-mass sampled ragged verifier's output law, by exact enumeration
  of the kernel's own decision intervals (rationals), equals sampling from a
  prefix-dependent target -- and a wrong residual fails the same check;
* thread-count independence, generator draws, in-place strided rows, laziness.

Bad input is in test_bad_input.py and test_hostile_input.py; opcheck, fakes
and torch.compile in test_registration.py.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
import torch

F64 = torch.float64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KINDS = ["greedy", "sampled", "point_mass"]


# ----------------------------------------------------------------------------
# Random ragged batches, and the per-sequence truth from the single ops
# ----------------------------------------------------------------------------


def _batch(gen, counts, vocab, dtype):
    """Per-sequence ``(target [k+1, V], draft [k, V], tokens [k])``; every other
    sequence's tokens follow the target's argmax (long acceptance runs)."""
    seqs = []
    for b, k in enumerate(counts):
        target = torch.rand(k + 1, vocab, generator=gen) + 0.01
        draft = target[:k] + 0.3 * torch.rand(k, vocab, generator=gen)
        if b % 2:
            tokens = target[:k].argmax(-1)
        else:
            tokens = torch.multinomial(draft, 1, generator=gen).flatten() if k else torch.zeros(0, dtype=torch.long)
        seqs.append((target.to(dtype), draft.to(dtype), tokens))
    return seqs


def _flat(seqs, counts, bonus: bool, token_dtype, cu_dtype):
    """The flat tensors vLLM would hand over: target rows [T+B, V] (or [T, V] with bonus), draft [T, V], ids [T]."""
    target = torch.cat([t[: k if bonus else k + 1] for (t, _, _), k in zip(seqs, counts)])
    draft = torch.cat([d for _, d, _ in seqs])
    tokens = torch.cat([x for _, _, x in seqs]).to(token_dtype)
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(cu_dtype)
    return target, draft, tokens, cu


def _single(impl, kind, target, draft, tokens, u):
    if kind == "greedy":
        return impl.verify_greedy(target, tokens)
    if kind == "point_mass":  # the point mass as a one-hot draft row, exactly
        draft = torch.nn.functional.one_hot(tokens.long(), target.shape[-1]).to(target.dtype)
    return impl.verify_sampled(target, draft, tokens, uniforms=u)


def _ragged(impl, kind, target, draft, tokens, cu, bonus, u):
    if kind == "greedy":
        return impl.verify_greedy_ragged(target, tokens, cu, bonus)
    return impl.verify_sampled_ragged(target, None if kind == "point_mass" else draft, tokens, cu, bonus, uniforms=u)


def _expected(impl, kind, seqs, counts, bonus, u):
    """Entry b: the single op on sequence b's slice and uniforms; the given bonus after a full acceptance."""
    out, start = [], 0
    for b, ((target, draft, tokens), k) in enumerate(zip(seqs, counts)):
        n, nxt = _single(impl, kind, target, draft, tokens, u[start:start + k + 1])
        if bonus is not None and n == k:
            nxt = int(bonus[b])
        out.append((n, nxt))
        start += k + 1
    return out


def _pairs(result):
    n, nxt = result
    assert n.dtype == torch.int64 and nxt.dtype == torch.int64
    return list(zip(n.tolist(), nxt.tolist()))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bonus", [False, True], ids=["bonus-row", "bonus-given"])
def test_ragged_equals_the_single_op_per_sequence(sv, kind, dtype, bonus):
    gen = torch.Generator().manual_seed(hash((kind, str(dtype), bonus)) % 2**31)
    for trial in range(8):
        vocab = [2, 7, 33, 257, 1031, 5][trial % 6]
        batch = 1 + trial % 9
        counts = torch.randint(0, 5, (batch,), generator=gen).tolist()
        counts[trial % batch] = 0  # k_b = 0 in every batch
        seqs = _batch(gen, counts, vocab, dtype)
        token_dtype, cu_dtype = [(torch.int64, torch.int32), (torch.int32, torch.int64)][trial % 2]
        target, draft, tokens, cu = _flat(seqs, counts, bonus, token_dtype, cu_dtype)
        u = torch.rand(sum(counts) + batch, dtype=F64, generator=gen)
        given = torch.randint(0, vocab, (batch,), generator=gen).to(cu_dtype) if bonus else None
        want = _expected(sv, kind, seqs, counts, given, u)
        assert _pairs(_ragged(sv, kind, target, draft, tokens, cu, given, u)) == want, (counts, vocab)
        # The reference: its ragged form against its own single op, and against the kernel.
        assert _expected(sv.reference, kind, seqs, counts, given, u) == want
        assert _pairs(_ragged(sv.reference, kind, target, draft, tokens, cu, given, u)) == want


def test_every_outcome_is_reached(sv):
    # The comparison above must span rejections, full acceptances and the given
    # bonus; otherwise it could pass on a layout that is never exercised.
    gen = torch.Generator().manual_seed(5)
    counts = [3, 0, 2, 4, 1, 3, 2, 0, 4]
    seqs = _batch(gen, counts, 7, torch.float32)
    target, draft, tokens, cu = _flat(seqs, counts, True, torch.int64, torch.int64)
    seen = set()
    for _ in range(20):
        u = torch.rand(sum(counts) + len(counts), dtype=F64, generator=gen)
        for kind in ("sampled", "point_mass"):
            n, nxt = _ragged(sv, kind, target, draft, tokens, cu, torch.full((9,), 6), u)
            for b, k in enumerate(counts):
                seen.add("full" if n[b] == k else "rejected")
                seen.add("bonus" if (n[b] == k and nxt[b] == 6) else "other")
    assert seen == {"full", "rejected", "bonus", "other"}


def test_point_mass_accepts_iff_u_below_p_of_t_and_never_re_emits_t(sv):
    # Worked by hand: p = (1, 3, 0, 4) / 8, draft token 1: accept iff u < 3/8; a
    # rejection draws from (1, 0, 0, 4) / 5.
    target = torch.tensor([[1.0, 3.0, 0.0, 4.0], [0.0, 0.0, 1.0, 0.0]])
    one = torch.tensor([1])
    for impl in (sv, sv.reference):
        def run(u0, u1):
            n, nxt = impl.verify_sampled_ragged(target, None, one, one, uniforms=torch.tensor([u0, u1], dtype=F64))
            return int(n[0]), int(nxt[0])

        assert run(0.374, 0.9) == (1, 2)  # accepted; the bonus row is a point mass on 2
        assert run(0.375, 0.0) == (0, 0)  # 3/8 is not below 3/8: rejected; 0 < 1/5
        assert run(0.9, 0.19) == (0, 0)
        assert run(0.9, 0.21) == (0, 3)  # never token 1, whatever u
        assert run(0.9, 0.999) == (0, 3)


# ----------------------------------------------------------------------------
# Layout details
# ----------------------------------------------------------------------------


def test_rows_are_read_in_place_from_strided_views(sv):
    gen = torch.Generator().manual_seed(3)
    counts = [2, 0, 3]
    seqs = _batch(gen, counts, 33, torch.float32)
    target, draft, tokens, cu = _flat(seqs, counts, False, torch.int64, torch.int64)
    u = torch.rand(sum(counts) + 3, dtype=F64, generator=gen)
    want = _pairs(sv.verify_sampled_ragged(target, draft, tokens, cu, uniforms=u))
    wide = torch.zeros(target.shape[0], 50)
    wide[:, 5:38] = target  # a column slice: rows strided, each row contiguous
    transposed = draft.t().contiguous().t()  # each row strided: copied
    assert _pairs(sv.verify_sampled_ragged(wide[:, 5:38], transposed, tokens, cu, uniforms=u)) == want
    assert _pairs(sv.verify_sampled_ragged(target, draft, tokens[None].expand(2, -1)[1], cu, uniforms=u)) == want


def test_unread_rows_are_never_read(sv):
    # Sequence b's rows after its first rejection, and other sequences' rows
    # past their own k_b + 1, are poisoned: no error, same result.
    target = torch.tensor([[0.1, 0.9], [0.5, 0.5], [0.5, 0.5], [0.8, 0.2], [0.3, 0.7]])
    tokens = torch.tensor([0, 1, 1])  # sequence 0 (k = 3): token 0 is not argmax(row 0) = 1
    cu = torch.tensor([3, 3])
    poisoned = target.clone()
    poisoned[1:4] = float("nan")
    for impl in (sv, sv.reference):
        assert _pairs(impl.verify_greedy_ragged(poisoned, tokens, cu)) == [(0, 1), (0, 1)]
        u = torch.tensor([0.99, 0.0, 0.0, 0.5, 0.5], dtype=F64)  # 0.99 * P > p(0) = 0.1: rejected
        assert _pairs(impl.verify_sampled_ragged(poisoned, None, tokens, cu, uniforms=u)) == [(0, 1), (0, 1)]


def test_generator_draws_are_torch_rand_of_t_plus_b(sv):
    gen = torch.Generator().manual_seed(11)
    counts = [3, 1, 0, 2]
    seqs = _batch(gen, counts, 17, torch.float32)
    target, draft, tokens, cu = _flat(seqs, counts, False, torch.int64, torch.int64)
    for impl in (sv, sv.reference):
        for pm in (False, True):
            d = None if pm else draft
            drawn = impl.verify_sampled_ragged(target, d, tokens, cu, generator=torch.Generator().manual_seed(4))
            u = torch.rand(sum(counts) + 4, dtype=F64, generator=torch.Generator().manual_seed(4))
            assert _pairs(drawn) == _pairs(impl.verify_sampled_ragged(target, d, tokens, cu, uniforms=u))


def test_empty_batch(sv):
    for impl in (sv, sv.reference):
        n, nxt = impl.verify_sampled_ragged(torch.rand(0, 5), None, torch.zeros(0, dtype=torch.long),
                                            torch.zeros(0, dtype=torch.long))
        assert n.shape == (0,) and nxt.shape == (0,)


def test_results_do_not_depend_on_the_thread_count(sv):
    gen = torch.Generator().manual_seed(8)
    counts = torch.randint(0, 6, (48,), generator=gen).tolist()
    seqs = _batch(gen, counts, 257, torch.float32)
    target, draft, tokens, cu = _flat(seqs, counts, False, torch.int64, torch.int64)
    u = torch.rand(sum(counts) + 48, dtype=F64, generator=gen)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append([_pairs(_ragged(sv, kind, target, draft, tokens, cu, None, u)) for kind in KINDS])
    finally:
        torch.set_num_threads(before)
    assert results[0] == results[1] == results[2]


# ----------------------------------------------------------------------------
# The law, exactly: a point-mass draft over prefix-dependent rows
# ----------------------------------------------------------------------------
#
# The kernel's decisions are step functions of each uniform; their breakpoints
# are found by bisection (the kernel is not told where they are), and every
# piece's width is a rational with a small denominator (the rows are small
# integer weights), recovered exactly with limit_denominator. Whole decoded
# sequences of N tokens, round after round through the ragged op (the real
# sequence sits between two filler sequences, so its rows, ids and uniforms
# are found by their flat offsets), must follow the target's law exactly.

_ONE_MINUS = 1.0 - 2.0**-53


def _steps(f, lo=0.0, hi=_ONE_MINUS, f_lo=None, f_hi=None, tol=1e-14):
    """Pieces ``(lo, hi, value, at)`` of a step function of one uniform, by bisection."""
    f_lo = f(lo) if f_lo is None else f_lo
    f_hi = f(hi) if f_hi is None else f_hi
    if f_lo == f_hi:
        return [(lo, hi, f_lo, 0.5 * (lo + hi))]
    if hi - lo <= tol:
        return [(lo, hi, f_hi, hi)]
    mid = 0.5 * (lo + hi)
    f_mid = f(mid)
    out = []  # neighbouring pieces of equal value joined (the widest one's `at` kept)
    for piece in _steps(f, lo, mid, f_lo, f_mid, tol) + _steps(f, mid, hi, f_mid, f_hi, tol):
        if out and out[-1][2] == piece[2]:
            p_lo, p_hi, value, p_at = out[-1]
            at = piece[3] if piece[1] - piece[0] > p_hi - p_lo else p_at
            out[-1] = (p_lo, piece[1], value, at)
        else:
            out.append(piece)
    return out


def _width(lo, hi) -> Fraction:
    return Fraction(hi - lo).limit_denominator(10**4)


def _table(salt: int, vocab: int):
    """``row(prefix) -> integer weights``: a fixed, prefix-dependent target (zeros included)."""
    memo = {}

    def row(prefix):
        if prefix not in memo:
            rng = random.Random(hash((salt, vocab) + prefix))
            w = [rng.choice([0, 1, 2, 3, 5]) for _ in range(vocab)]
            if sum(w) == 0:
                w[rng.randrange(vocab)] = 1
            memo[prefix] = w
        return memo[prefix]

    return row


def _round_law(verify, target, draft_token, prefix, k, vocab):
    """``{emitted tokens: probability}`` of one round through the ragged op, by interval enumeration."""
    tokens, rows = [], []
    for i in range(k):  # the point-mass draft: one token per prefix
        rows.append(target(prefix + tuple(tokens)))
        tokens.append(draft_token(prefix + tuple(tokens)))
    rows.append(target(prefix + tuple(tokens)))
    # Filler sequences around the real one: k = 1 before, k = 2 after.
    flat = torch.tensor([[1.0] * vocab] * 2 + rows + [[1.0] * vocab] * 3, dtype=torch.float32)
    ids = torch.tensor([0] + tokens + [0, 0], dtype=torch.int64)
    cu = torch.tensor([1, 1 + k, 3 + k])
    law = {}

    def call(decided, u_last):
        u = [0.5, 0.5] + decided + [0.0] * (k - len(decided)) + [u_last] + [0.5] * 3
        n, nxt = verify(flat, None, ids, cu, uniforms=torch.tensor(u, dtype=F64))
        return int(n[1]), int(nxt[1])

    def final(i, decided, weight):
        def emitted(u):
            n, nxt = call(decided, u)
            return nxt if n == i else -1

        for lo, hi, x, _ in _steps(emitted):
            assert x >= 0
            seq = tuple(tokens[:i]) + (x,)
            law[seq] = law.get(seq, Fraction(0)) + weight * _width(lo, hi)

    def explore(i, decided, weight):
        if i == k:
            final(k, decided, weight)
            return
        for lo, hi, rejected, mid in _steps(lambda u: call(decided + [u], 0.0)[0] == i):
            if rejected:
                final(i, decided + [mid], weight * _width(lo, hi))
            else:
                explore(i + 1, decided + [mid], weight * _width(lo, hi))

    explore(0, [], Fraction(1))
    return law


def _decoded_law(verify, target, draft_token, k, vocab, length):
    out = {}

    def go(prefix, prob):
        if len(prefix) >= length:
            key = prefix[:length]
            out[key] = out.get(key, Fraction(0)) + prob
            return
        for emitted, p in _round_law(verify, target, draft_token, prefix, k, vocab).items():
            go(prefix + emitted, prob * p)

    go((), Fraction(1))
    return {s: p for s, p in out.items() if p}


def _target_law(target, vocab, length):
    law = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob = Fraction(1)
        for i, x in enumerate(seq):
            w = target(seq[:i])
            prob *= Fraction(w[x], sum(w))
        if prob:
            law[seq] = prob
    return law


def _draft_token(salt, vocab):
    return lambda prefix: random.Random(hash((salt, "draft") + prefix)).randrange(vocab)


@pytest.mark.parametrize("path", ["kernel", "reference"])
# V = 3 costs seconds natively (minutes under emulation): native_only; V = 2 runs everywhere.
@pytest.mark.parametrize("vocab, k, salt", [(2, 1, 1), (2, 2, 2), pytest.param(3, 1, 3, marks=pytest.mark.native_only),
                                            pytest.param(3, 2, 4, marks=pytest.mark.native_only)])
def test_point_mass_ragged_law_equals_the_target_law_exactly(sv, path, vocab, k, salt):
    verify = (sv if path == "kernel" else sv.reference).verify_sampled_ragged
    target = _table(salt, vocab)
    measured = _decoded_law(verify, target, _draft_token(salt, vocab), k, vocab, length=3)
    assert measured == _target_law(target, vocab, 3)


def test_law_check_catches_a_wrong_residual(sv):
    """Negative control: on rejection, drawing from p itself (t's weight kept) breaks the law."""

    def wrong(flat, draft, ids, cu, uniforms):
        n, nxt = sv.verify_sampled_ragged(flat, draft, ids, cu, uniforms=uniforms)
        start, k = 1 + 1, int(cu[1] - cu[0])  # the real sequence's first row and count
        if n[1] < k:
            nxt = nxt.clone()
            nxt[1] = sv.reference.inverse_cdf(flat[start + n[1]].double(), float(uniforms[2 + k]))
        return n, nxt

    target = _table(3, 3)
    measured = _decoded_law(wrong, target, _draft_token(3, 3), 1, 3, length=2)
    assert measured != _target_law(target, 3, 2)
    assert sum(measured.values()) == 1  # the enumeration itself still covers all mass


# ----------------------------------------------------------------------------
# Logits in, each sequence its own warping
# ----------------------------------------------------------------------------

_WARPS = [(0.8, 40, 0.9, 0.01), (0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (1.3, 5, 1.0, 0.0), (0.5, 0, 0.95, 0.05)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bonus", [False, True], ids=["bonus-row", "bonus-given"])
def test_logits_ragged_equals_verify_logits_per_sequence(sv, dtype, bonus):
    gen = torch.Generator().manual_seed(hash((str(dtype), bonus)) % 2**31)
    for trial in range(4):
        vocab = [7, 129, 1031, 2][trial]
        batch = [1, 5, 9, 3][trial]
        counts = torch.randint(0, 4, (batch,), generator=gen).tolist()
        counts[0] = 0
        warps = [_WARPS[(trial + b) % len(_WARPS)] for b in range(batch)]
        seqs = []
        for k, (temperature, top_k, top_p, min_p) in zip(counts, warps):
            target = (torch.randn(k + 1, vocab, generator=gen) * 2).to(dtype)
            draft = (target[:k].float() + torch.randn(k, vocab, generator=gen)).to(dtype)
            tokens = sv.sample_draft(draft, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                     generator=gen)
            seqs.append((target, draft, tokens))
        target, draft, tokens, cu = _flat(seqs, counts, bonus, torch.int64, torch.int32)
        u = torch.rand(sum(counts) + batch, dtype=F64, generator=gen)
        given = torch.randint(0, vocab, (batch,), generator=gen) if bonus else None
        per_seq = dict(zip(("temperature", "top_k", "top_p", "min_p"), (torch.tensor(c) for c in zip(*warps))))
        want, start = [], 0
        for b, ((t, d, x), k) in enumerate(zip(seqs, counts)):
            kw = dict(zip(("temperature", "top_k", "top_p", "min_p"), warps[b]))
            n, nxt = sv.verify_logits(t, d, x, uniforms=u[start:start + k + 1], **kw)
            assert (n, nxt) == sv.reference.verify_logits(t, d, x, uniforms=u[start:start + k + 1], **kw)
            want.append((n, int(given[b]) if bonus and n == k else nxt))
            start += k + 1
        for impl in (sv, sv.reference):
            assert _pairs(impl.verify_logits_ragged(target, draft, tokens, cu, given, uniforms=u, **per_seq)) == want
        # One warping for all, as scalars: the first sequence's.
        if all(w == warps[0] for w in warps):
            continue
        same = dict(zip(("temperature", "top_k", "top_p", "min_p"), (1.0, 0, 1.0, 0.0)))
        ours = sv.verify_logits_ragged(target, draft, tokens, cu, given, uniforms=u, **same)
        assert _pairs(ours) == _pairs(sv.reference.verify_logits_ragged(target, draft, tokens, cu, given,
                                                                        uniforms=u, **same))


def test_logits_ragged_greedy_sequences_draw_nothing(sv):
    target = torch.tensor([[0.0, 2.0], [1.0, 0.0], [3.0, 1.0]])
    draft = torch.tensor([[0.0, 1.0]])
    for impl in (sv, sv.reference):
        gen = torch.Generator().manual_seed(9)
        state = gen.get_state()
        n, nxt = impl.verify_logits_ragged(target, draft, torch.tensor([1]), torch.tensor([1, 1]), temperature=0.0,
                                           generator=gen)
        assert (n.tolist(), nxt.tolist()) == ([1, 0], [0, 0])
        assert torch.equal(gen.get_state(), state)
        with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
            impl.verify_logits_ragged(target, draft, torch.tensor([1]), torch.tensor([1, 1]),
                                      temperature=torch.tensor([0.5, -1.0]))
