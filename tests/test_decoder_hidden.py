"""The decoders with ``head=``: target_step returns hidden states, verification runs ``verify_hidden``.

The claims (DESIGN.md, "Hidden states in the decoder"):

* greedy: the output equals plain greedy decoding on the same head, token
  for token -- the plain decoding here is written out independently: the
  argmax of ``lm_head.reference_logits`` (the torch reference of the head's
  logits), one token at a time;
* sampled: a run with ``head=`` is the same run as the decoder over the
  head's logits rows (``reference_logits``, verified by ``verify_logits``):
  the same uniforms, the same tokens. That decoder's law is proven by exact
  enumeration elsewhere (test_point_mass_law.py, test_law.py), so this one
  follows it;
* the batched decoder: each sequence as the batched decoder over logits rows;
* misuse is named.

The toy target's hidden states depend on the whole prefix (a hash of it
seeds each row), so a decoder that verified the wrong position, or dropped a
rollback, would emit other tokens.
"""

from __future__ import annotations

import importlib

import pytest
import torch

V, D = 37, 32


def lm_head_module(sv):
    return importlib.import_module(sv.__name__ + ".lm_head")


def make_head(sv, fmt: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(V, D, generator=gen)
    if fmt == "bf16":
        return sv.LMHead(w.to(torch.bfloat16))
    return sv.LMHead(w)


def hidden_at(seq: list) -> torch.Tensor:
    """The toy target's last hidden state after ``seq``: a function of the whole prefix."""
    seed = 0
    for t in seq:
        seed = (seed * 1000003 + t + 1) % (2**31)
    return torch.randn(D, generator=torch.Generator().manual_seed(seed)) * 0.6


def hidden_target(prefix, proposed):
    seq = prefix.tolist() + proposed.tolist()
    n = len(prefix)
    return torch.stack([hidden_at(seq[: n + i]) for i in range(len(proposed) + 1)])


def logits_target(sv, head):
    ref = lm_head_module(sv).reference_logits
    return lambda prefix, proposed: ref(head, hidden_target(prefix, proposed))


def batched(single):
    """A batched target from a single-sequence one: ``[n, k + 1, *]``."""
    return lambda prefixes, proposed, rows: torch.stack([single(p, t) for p, t in zip(prefixes, proposed)])


def guess_draft(prefix, k):
    """A point-mass draft whose proposal depends on the history: right sometimes, 0..k tokens."""
    seq = prefix.tolist()
    m = min(k, (sum(seq) + len(seq)) % (k + 1))
    return torch.tensor([(seq[-1] * 7 + i + len(seq)) % V for i in range(m)], dtype=torch.int64), None


def plain_greedy(sv, head, prompt: list, max_new: int) -> list:
    ref = lm_head_module(sv).reference_logits
    seq = list(prompt)
    for _ in range(max_new):
        seq.append(int(torch.argmax(ref(head, hidden_at(seq)[None])[0])))
    return seq


@pytest.mark.parametrize("fmt", ["f32", "bf16"])
@pytest.mark.parametrize("k", [0, 1, 3, "auto"])
def test_greedy_with_head_equals_plain_greedy_on_the_head(sv, fmt, k):
    head = make_head(sv, fmt)
    prompt = [3, 1, 4]
    # The draft: the target's own greedy path half of the time, so rounds accept and reject.
    truth = plain_greedy(sv, head, prompt, 40)

    def draft(prefix, k_round):
        n = len(prefix)
        tokens = [truth[n + i] if (n + i) % 3 else (truth[n + i] + 1) % V for i in range(k_round)]
        return torch.tensor(tokens[: max(0, min(k_round, len(truth) - n))], dtype=torch.int64), None

    dec = sv.SpeculativeDecoder(draft, hidden_target, k=k, head=head)
    out = dec.generate(torch.tensor(prompt), max_new=32).tolist()
    assert out == truth[: len(prompt) + 32]
    if k == 3:
        assert dec.stats.accepted > 0 and dec.stats.rounds < 32  # speculation happened
    assert dec.head is head


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("draft_kind", ["point-mass", "logits"])
def test_sampled_with_head_is_the_logits_decoders_run(sv, method, draft_kind):
    head = make_head(sv, "f32", seed=1)
    warping = sv.LogitsWarping(temperature=0.8)
    ref = lm_head_module(sv).reference_logits
    if draft_kind == "point-mass":
        # The target's own greedy path as point masses, 0..k tokens by the history: often accepted.
        def draft(prefix, k_round):
            seq = prefix.tolist()
            for _ in range(min(k_round, sum(seq) % (k_round + 1))):
                seq.append(int(torch.argmax(ref(head, hidden_at(seq)[None])[0])))
            return torch.tensor(seq[len(prefix):], dtype=torch.int64), None
    else:
        # A draft with its own logits (the head's logits of a perturbed state), drawn by sample_draft.
        def draft(prefix, k_round, gen=torch.Generator().manual_seed(5)):
            seq, tokens, rows = prefix.tolist(), [], []
            for _ in range(k_round):
                row = ref(head, (hidden_at(seq) * 0.7)[None])[0]
                t = int(sv.sample_draft(row, generator=gen, **warping.kwargs()))
                tokens.append(t)
                rows.append(row)
                seq.append(t)
            return torch.tensor(tokens, dtype=torch.int64), torch.stack(rows) if rows else torch.empty(0, V)
    outs = []
    for target, kw in ((hidden_target, dict(head=head)), (logits_target(sv, head), {})):
        if draft_kind == "logits":
            draft.__defaults__ = (torch.Generator().manual_seed(5),)
        dec = sv.SpeculativeDecoder(draft, target, k=3, greedy=False, generator=torch.Generator().manual_seed(11),
                                    warping=warping, method=method, **kw)
        outs.append([dec.generate(torch.tensor([2, 7]), max_new=30).tolist() for _ in range(4)])
        assert dec.stats.corrections > 0 and dec.stats.accepted > 0
    assert outs[0] == outs[1]


def test_batched_with_head_is_the_batched_logits_decoders_run(sv):
    head = make_head(sv, "f32", seed=2)
    warping = sv.LogitsWarping(temperature=1.0)

    def draft(prefixes, k, rows):
        got = [guess_draft(p, k)[0] for p in prefixes]
        m = max(len(g) for g in got)
        tokens = torch.zeros(len(got), m, dtype=torch.int64)
        for b, g in enumerate(got):
            tokens[b, : len(g)] = g
        return tokens, None, torch.tensor([len(g) for g in got])

    prompts = [torch.tensor([1]), torch.tensor([5, 6, 7]), torch.tensor([9, 9])]
    runs = []
    for target, kw in ((batched(hidden_target), dict(head=head)), (batched(logits_target(sv, head)), {})):
        for greedy in (True, False):
            dec = sv.BatchedSpeculativeDecoder(draft, target, k=4, greedy=greedy, warping=warping,
                                               generator=torch.Generator().manual_seed(3), **kw)
            runs.append([o.tolist() for o in dec.generate(prompts, max_new=25)])
    assert runs[0] == runs[2]  # greedy
    assert runs[1] == runs[3]  # sampled
    assert runs[0] != runs[1]


@pytest.mark.parametrize("draft_kind", ["point-mass", "logits"])
def test_batched_sampled_head_rounds_are_per_sequence_verify_hidden(sv, draft_kind):
    """Every sampled head round of the batched decoder (one verify_hidden_batched call) equals
    verify_hidden on each sequence's own rows with its uniforms u[b, :k_b+1] (the round's draws,
    captured where the decoder's randomness enters)."""
    head = make_head(sv, "bf16", seed=4)
    ref = lm_head_module(sv).reference_logits
    warping = sv.LogitsWarping(temperature=0.8)

    def draft(prefixes, k, rows, gen=torch.Generator().manual_seed(6)):
        got = [guess_draft(p, k)[0] for p in prefixes]
        m = max(len(g) for g in got)
        tokens = torch.zeros(len(got), m, dtype=torch.int64)
        logits = ref(head, torch.randn(len(got) * m, D, generator=gen)).reshape(len(got), m, V)
        for b, g in enumerate(got):
            tokens[b, : len(g)] = g
            if draft_kind == "logits" and len(g):
                tokens[b, : len(g)] = sv.sample_draft(logits[b, : len(g)], generator=gen, **warping.kwargs())
        return tokens, logits if draft_kind == "logits" else None, torch.tensor([len(g) for g in got])

    dec = sv.BatchedSpeculativeDecoder(draft, batched(hidden_target), k=4, greedy=False, warping=warping,
                                       generator=torch.Generator().manual_seed(8), head=head)
    drawn, rounds, outcomes = [], [0], set()
    uniforms, verify_round = dec._uniforms, dec._verify_hidden_round

    def record(shape):
        drawn.append(uniforms(shape))
        return drawn[-1]

    def checked(hidden, draft_tokens, draft_rows, budgets):
        got = verify_round(hidden, draft_tokens, draft_rows, budgets)
        u = drawn[-1]
        want = [sv.verify_hidden(hidden[b, : k + 1], head, draft_tokens[b, :k],
                                 None if draft_rows is None else draft_rows[b, :k], uniforms=u[b, : k + 1],
                                 **warping.kwargs()) for b, k in enumerate(budgets)]
        assert list(zip(*got)) == want
        rounds[0] += 1
        outcomes.update((a < k, k) for a, k in zip(got[0], budgets))
        return got

    dec._uniforms, dec._verify_hidden_round = record, checked
    dec.generate([torch.tensor([1]), torch.tensor([5, 6, 7]), torch.tensor([9, 9]), torch.tensor([4])], max_new=20)
    assert rounds[0] >= 5 and {True, False} <= {r for r, _ in outcomes}  # rounds with rejections and full accepts
    assert 0 in {k for _, k in outcomes} and max(k for _, k in outcomes) >= 2  # ragged budgets, 0 among them


def test_head_is_read_from_the_target_callbacks_object(sv):
    head = make_head(sv, "f32")

    class Step:
        def __init__(self):
            self.head = head

        def target_step(self, prefix, proposed):
            return hidden_target(prefix, proposed)

    dec = sv.SpeculativeDecoder(guess_draft, Step().target_step, k=2)
    assert dec.head is head
    assert dec.generate(torch.tensor([3, 1, 4]), max_new=12).tolist() == plain_greedy(sv, head, [3, 1, 4], 12)


def test_misuse_is_named(sv):
    head = make_head(sv, "f32")
    with pytest.raises(TypeError, match="head must be an LMHead"):
        sv.SpeculativeDecoder(guess_draft, hidden_target, head=torch.zeros(V, D))
    with pytest.raises(ValueError, match="sampled mode needs the warping"):
        sv.SpeculativeDecoder(guess_draft, hidden_target, greedy=False, head=head)

    class Bad:
        head = "not a head"

        def target_step(self, prefix, proposed):
            return hidden_target(prefix, proposed)

    with pytest.raises(TypeError, match="target_step.head must be an LMHead"):
        sv.SpeculativeDecoder(guess_draft, Bad().target_step)
    # Logits rows where hidden states are expected: d does not match.
    dec = sv.SpeculativeDecoder(guess_draft, logits_target(sv, head), k=2, head=head)
    with pytest.raises(ValueError, match="takes d = 32"):
        dec.generate(torch.tensor([1, 2]), max_new=4)
    dec = sv.SpeculativeDecoder(guess_draft, lambda p, t: hidden_target(p, t)[:1], k=2, head=head)
    with pytest.raises(ValueError, match="target_hidden of shape"):
        dec.generate(torch.tensor([1, 2, 3]), max_new=6)
    dec = sv.BatchedSpeculativeDecoder(lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), None),
                                       batched(lambda p, t: hidden_target(p, t).double()), k=2, head=head)
    with pytest.raises(TypeError, match="target_hidden of dtype"):
        dec.generate([torch.tensor([1])], max_new=4)


def test_batched_greedy_head_rounds_never_read_rows_past_a_rejection(sv):
    """A hidden row after the first rejected draft token is never read (as ``verify_hidden``): NaN there
    does not raise, and the output is plain greedy's; NaN in a row that is read names the round."""
    head = make_head(sv, "f32", seed=5)

    def wrong_draft(prefixes, k, rows):  # proposes k tokens, the first never the argmax
        tokens = torch.stack([torch.tensor([(int(p[-1]) * 7 + i + len(p)) % V for i in range(k)]) for p in prefixes])
        return tokens, None

    def target_nan_after_first(prefixes, proposed, rows):
        hidden = batched(hidden_target)(prefixes, proposed, rows)
        hidden[:, 1:] = float("nan")  # every row after position 0
        return hidden

    ref = lm_head_module(sv).reference_logits
    prompts = [[1], [5, 6, 7]]
    # The draft is rejected at position 0 whenever its token is not the argmax; where it is (rarely),
    # row 1 is read and its NaN must raise: choose prompts where every first proposal misses.
    for p in prompts:
        seq = list(p)
        for _ in range(12):
            argmax = int(torch.argmax(ref(head, hidden_at(seq)[None])[0]))
            assert (seq[-1] * 7 + len(seq)) % V != argmax, "the test's draft must miss at position 0"
            seq.append(argmax)
    dec = sv.BatchedSpeculativeDecoder(wrong_draft, target_nan_after_first, k=3, head=head)
    outs = dec.generate([torch.tensor(p) for p in prompts], max_new=12)
    assert [o.tolist() for o in outs] == [plain_greedy(sv, head, p, 12) for p in prompts]
    assert dec.stats.accepted == 0 and dec.stats.drafted > 0

    def target_nan_first(prefixes, proposed, rows):
        hidden = batched(hidden_target)(prefixes, proposed, rows)
        hidden[:, 0] = float("nan")
        return hidden

    with pytest.raises(ValueError, match="round 0"):
        sv.BatchedSpeculativeDecoder(wrong_draft, target_nan_first, k=3, head=head).generate(
            [torch.tensor(p) for p in prompts], max_new=4)
