"""``PromptLookupDraft`` and short drafts in the decoders.

Shown here, against independent oracles:

* the lookup proposes what a brute-force scan written here (plain Python
  lists, no torch) finds: the longest suffix n-gram in
  ``[min_ngram, max_ngram]`` with an earlier occurrence, its latest such
  occurrence, up to ``k`` tokens after it -- over random prefixes drawn from
  a small alphabet, so matches of every length occur;
* the same with token ids whose bytes repeat across token boundaries, and
  with strided (non-contiguous) prefixes: the lookup searches the prefix's
  bytes, and must still match whole tokens;
* the batched form equals the single form sequence by sequence;
* a draft that returns fewer than ``k`` tokens (or none) gets exactly those
  verified: the target sees them, a round with none is a plain step, and
  greedy output equals plain greedy decoding of the target (single and
  batched, with the lookup draft and with a draft of random lengths);
* bad arguments raise named errors.
"""

from __future__ import annotations

import random
import struct

import pytest
import torch

from tests.decode_tables import TABLE_V, Tables


def _brute_force(prefix: list, k: int, max_ngram: int, min_ngram: int) -> list:
    """The lookup's rule written out by scanning every earlier start, latest first."""
    return _brute_force_match(prefix, k, max_ngram, min_ngram)[0]


def _brute_force_match(prefix: list, k: int, max_ngram: int, min_ngram: int, loops: bool = True) -> tuple:
    """``(proposal, context)``: the context is the match length (the n-gram grown back while the
    tokens before it and before the suffix agree, at most 8), bucketed 1, 2, 3, 4 (4-7), 8 (8+).
    ``loops=False``: the proposal always cut at the end of the prefix (the rule before loops)."""
    length = len(prefix)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= length:
            continue
        suffix = prefix[length - n:]
        for start in range(length - n - 1, -1, -1):  # every start but the suffix's own, latest first
            if prefix[start: start + n] == suffix:
                grown = n
                while grown < 8 and start - (grown - n) - 1 >= 0 and \
                        prefix[start - (grown - n) - 1] == prefix[length - grown - 1]:
                    grown += 1
                proposal = prefix[start + n: start + n + k]
                period = length - (start + n)  # the match this far back: the cut leaves at most this many
                if loops and len(proposal) < k and 2 * period <= length and \
                        prefix[length - 2 * period: length - period] == prefix[length - period:]:
                    proposal = [prefix[length - period + i % period] for i in range(k)]  # a loop, continued
                return proposal, {4: 4, 5: 4, 6: 4, 7: 4}.get(grown, min(grown, 8))
    return [], 0


@pytest.mark.parametrize("max_ngram, min_ngram", [(3, 1), (2, 2), (4, 2), (1, 1)])
def test_lookup_matches_a_brute_force_scan(sv, max_ngram, min_ngram):
    rng = random.Random(max_ngram * 10 + min_ngram)
    draft = sv.PromptLookupDraft(max_ngram=max_ngram, min_ngram=min_ngram)
    found = empty = loops = 0
    contexts = set()
    for trial in range(400):
        prefix = [rng.randrange(4 if trial % 2 else 12) for _ in range(rng.randrange(1, 40))]
        if trial % 5 == 0:  # a copy in progress: the prefix's own first tokens repeated after it
            prefix += prefix[: rng.randrange(len(prefix) + 1)]
        elif trial % 5 == 1:  # a loop: a short block repeated, then some of it (continued, or not yet a loop)
            block = [rng.randrange(12) for _ in range(rng.randrange(1, 5))]
            prefix += block * rng.randrange(1, 4) + block[: rng.randrange(len(block))]
        k = rng.randrange(0, 7)
        tokens, rows = draft(torch.tensor(prefix), k)
        expected, context = _brute_force_match(prefix, k, max_ngram, min_ngram)
        assert rows is None
        assert tokens.dtype == torch.int64 and tokens.tolist() == expected, (prefix, k)
        assert draft.context == (context if k else 0), (prefix, k)  # k = 0 looks nothing up
        found += bool(expected)
        empty += not expected
        contexts.add(draft.context)
        loops += expected != _brute_force_match(prefix, k, max_ngram, min_ngram, loops=False)[0]
    assert found > 50 and empty > 20 and loops > 20  # every outcome exercised, or the test is vacuous
    assert {0, min_ngram} <= contexts and (max_ngram < 3 or {4, 8} <= contexts)  # short and long matches seen


def _straddles(prefix: list, n: int) -> bool:
    """Do the last ``n`` tokens' little-endian int64 bytes occur in the earlier tokens' bytes at an offset
    that is not a token boundary? (Computed here with ``struct``, independent of the lookup.)"""
    data = struct.pack(f"<{len(prefix)}q", *prefix)
    pattern, end = data[8 * (len(prefix) - n):], 8 * (len(prefix) - 1)
    return any(data[at: at + 8 * n] == pattern for at in range(end - 8 * n + 1) if at % 8)


def test_lookup_reads_token_ids_not_their_bytes(sv):
    """Ids whose bytes repeat across token boundaries (0, 256, 2**16, 2**40 + 1, ...), and prefixes
    that are strided views: the proposals are still the brute-force scan's, token by token."""
    rng = random.Random(7)
    ids = [0, 1, 256, 257, 65536, 2**32, 2**40 + 1, 2**62, 3 * 2**48]
    draft = sv.PromptLookupDraft(max_ngram=3, min_ngram=1)
    straddled = strided = 0
    for trial in range(600):
        prefix = [rng.choice(ids) for _ in range(rng.randrange(2, 30))]
        k = rng.randrange(1, 6)
        straddled += any(_straddles(prefix, n) for n in (1, 2, 3) if n < len(prefix))
        if trial % 3 == 0:  # every other element of a longer tensor: not contiguous
            wide = torch.zeros(2 * len(prefix), dtype=torch.int64)
            wide[::2] = torch.tensor(prefix)
            view = wide[::2]
            strided += not view.is_contiguous()
        else:
            view = torch.tensor(prefix)
        expected, context = _brute_force_match(prefix, k, 3, 1)
        assert draft(view, k)[0].tolist() == expected, (prefix, k)
        assert draft.context == context, (prefix, k)
    assert straddled > 50 and strided > 100  # both traps exercised, or the test is vacuous


def test_lookup_prefers_the_longest_ngram_and_the_latest_occurrence(sv):
    draft = sv.PromptLookupDraft(max_ngram=3, min_ngram=1)
    # "1 2 3" occurs at 0 (-> 4 5) and "2 3" later at 6 (-> 9); the 3-gram wins.
    assert draft(torch.tensor([1, 2, 3, 4, 5, 0, 2, 3, 9, 1, 2, 3]), 2)[0].tolist() == [4, 5]
    # Two occurrences of the 2-gram "7 8": the latest (-> 2) wins over the first (-> 1).
    assert draft(torch.tensor([7, 8, 1, 7, 8, 2, 7, 8]), 3)[0].tolist() == [2, 7, 8]
    # The tokens after the match, cut at the end of the prefix ("1 2" is 3 tokens back) ...
    assert draft(torch.tensor([1, 2, 7, 1, 2]), 5)[0].tolist() == [7, 1, 2]
    # ... unless the prefix ends in a loop (the last d tokens repeat the d before them): continued, up to k.
    assert draft(torch.tensor([5, 5, 5, 5]), 4)[0].tolist() == [5, 5, 5, 5]
    assert draft(torch.tensor([9, 1, 2, 3, 1, 2, 3]), 8)[0].tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    # One lap is not a loop: "1 2 3" is 4 tokens back, and "7 1 2 3" follows "9 1 2 3", not itself.
    assert draft(torch.tensor([9, 1, 2, 3, 7, 1, 2, 3]), 8)[0].tolist() == [7, 1, 2, 3]
    assert draft(torch.tensor([5]), 4)[0].tolist() == []
    assert (draft.calls, draft.empty, draft.proposed) == (7, 1, 24)


def test_the_context_is_the_match_length_bucketed(sv):
    """Hand-made prefixes: the n-gram size below max_ngram; at it, how far back the match reaches."""
    draft = sv.PromptLookupDraft(max_ngram=3, min_ngram=1)
    cases = [
        ([4, 1, 9, 1], 1),                                    # only "1" recurs
        ([4, 1, 2, 9, 1, 2], 2),                              # "1 2", and 4 != 9 before it
        ([4, 1, 2, 3, 9, 1, 2, 3], 3),                        # a 3-gram that reaches no further
        ([5, 1, 2, 3, 7, 5, 1, 2, 3], 4),                     # 4 tokens agree ("5 1 2 3")
        ([8, 6, 5, 1, 2, 3, 7, 0, 6, 5, 1, 2, 3], 4),         # 5 tokens
        (list(range(10, 22)) + [0] + list(range(10, 22)), 8),  # a 12-token copy in progress: 8+
        ([1, 2, 3], 0),                                       # no earlier occurrence
    ]
    for prefix, context in cases:
        draft(torch.tensor(prefix), 2)
        assert draft.context == context, prefix
    draft.batched([torch.tensor(p) for p, _ in cases], 2)
    assert draft.context == [c for _, c in cases]


def test_batched_lookup_equals_the_single_lookup(sv):
    rng = random.Random(3)
    draft = sv.PromptLookupDraft()
    prefixes = [torch.tensor([rng.randrange(5) for _ in range(rng.randrange(1, 30))]) for _ in range(9)]
    tokens, rows, counts = draft.batched(prefixes, 4, list(range(9)))
    assert rows is None and tokens.shape == (9, int(counts.max()))
    for b, prefix in enumerate(prefixes):
        single = draft(prefix, 4)[0]
        assert int(counts[b]) == len(single) and tokens[b, : len(single)].tolist() == single.tolist()
    assert 0 in counts.tolist() and max(counts.tolist()) == 4


def test_bad_lookup_arguments_are_named(sv):
    with pytest.raises(ValueError, match=r"max_ngram must be >= min_ngram, got max_ngram=1 < min_ngram=2"):
        sv.PromptLookupDraft(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match=r"min_ngram must be >= 1, got 0"):
        sv.PromptLookupDraft(min_ngram=0)
    with pytest.raises(TypeError, match=r"max_ngram must be an int, got float"):
        sv.PromptLookupDraft(max_ngram=2.0)
    draft = sv.PromptLookupDraft()
    with pytest.raises(TypeError, match=r"prefix must hold integer token ids"):
        draft(torch.tensor([1.0, 2.0]), 2)
    with pytest.raises(ValueError, match=r"prefix must be 1-D"):
        draft(torch.zeros(2, 2, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match=r"k must be >= 0, got -1"):
        draft(torch.tensor([1, 2]), -1)
    with pytest.raises(ValueError, match=r"prefix is a meta tensor: it has no token ids to read"):
        draft(torch.empty(4, dtype=torch.int64, device="meta"), 2)
    with pytest.raises(ValueError, match=r"prefixes\[0\] is a meta tensor"):
        draft.batched([torch.empty(4, dtype=torch.int64, device="meta")], 2)
    with pytest.raises(TypeError, match=r"prefixes must be a list of 1-D tensors"):
        draft.batched(torch.tensor([1, 2]), 2)
    with pytest.raises(TypeError, match=r"prefixes\[1\] must be a 1-D integer tensor, got list"):
        draft.batched([torch.tensor([1]), [1, 2]], 2)


# ============================================================================
# Short drafts in the decoders
# ============================================================================


class RandomLengthDraft:
    """Proposes a random number of tokens in [0, k] (a record of what it returned), rows on request."""

    def __init__(self, tables: Tables, seed: int, rows: bool):
        self.tables, self.rng, self.rows = tables, random.Random(seed), rows
        self.returned: list = []

    def __call__(self, prefix, k):
        m = self.rng.randrange(k + 1)
        self.returned.append(m)
        if m == 0:
            return torch.empty(0, dtype=torch.int64), (torch.empty(0, TABLE_V) if self.rows else None)
        tokens, rows = self.tables.draft_step(prefix, m)
        return tokens, (rows if self.rows else None)


def test_short_drafts_are_verified_as_returned(sv):
    tables = Tables()
    draft = RandomLengthDraft(tables, seed=5, rows=True)
    dec = sv.SpeculativeDecoder(draft, tables.target_step, k=4, greedy=False,
                                generator=torch.Generator().manual_seed(1))
    dec.generate(torch.tensor([0]), max_new=60)
    # The target saw exactly what the draft returned, and the stats record it.
    assert tables.target_calls == draft.returned + [0] * (len(tables.target_calls) - len(draft.returned))
    assert [d for d, _ in dec.stats.per_round] == tables.target_calls
    assert 0 in draft.returned and 4 in draft.returned
    assert dec.stats.drafted == sum(draft.returned)


@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_prompt_lookup_equals_plain_greedy(sv, k):
    tables = Tables(target_zeros=False)
    dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), tables.target_step, k=k)
    prompt = [0, 1, 2, 0, 1]
    out = dec.generate(torch.tensor(prompt), max_new=40)
    assert out.tolist() == tables.greedy_chain(prompt, 40)
    if k != "auto":  # auto drafts only where the measured costs say it pays (tests/test_auto_k.py)
        assert dec.stats.drafted > 0 and dec.stats.accepted > 0  # lookups were made and some kept


def test_batched_greedy_prompt_lookup_equals_plain_greedy(sv):
    tables = Tables(target_zeros=False)

    def target_step(prefixes, proposed, rows):
        return torch.stack([tables.target_step(p, t) for p, t in zip(prefixes, proposed)])

    prompts = [[0, 1, 2, 0, 1], [2], [1, 1, 1, 2, 1, 1]]
    dec = sv.BatchedSpeculativeDecoder(sv.PromptLookupDraft().batched, target_step, k=3)
    outs = dec.generate([torch.tensor(p) for p in prompts], max_new=30)
    assert [o.tolist() for o in outs] == [tables.greedy_chain(p, 30) for p in prompts]
    drafted = [d for d, _ in dec.stats.per_round]
    assert 0 in drafted and max(drafted) == 3  # sequences drafted different counts in one round


def test_fixed_k_0_is_plain_decoding(sv):
    tables = Tables(target_zeros=False)
    draft = RandomLengthDraft(tables, seed=0, rows=False)
    dec = sv.SpeculativeDecoder(draft, tables.target_step, k=0)
    out = dec.generate(torch.tensor([2]), max_new=12)
    assert out.tolist() == tables.greedy_chain([2], 12)
    assert draft.returned == [] and tables.target_calls == [0] * 12  # never drafted: 12 one-row evals
    assert dec.stats.k_per_round == [0] * 12 and dec.stats.tokens_per_round == 1.0


def test_vocabulary_sized_point_mass_rows_stay_within_the_target(sv):
    """A point-mass draft's ids are checked against V like any draft's, before the target sees them."""
    tables = Tables()
    calls = []

    def draft(prefix, k):
        calls.append(k)
        return torch.tensor([TABLE_V] * k if len(calls) > 1 else [0] * k), None

    dec = sv.SpeculativeDecoder(draft, tables.target_step, k=2, greedy=False)
    with pytest.raises(ValueError, match=r"returned token 3, outside the target's vocabulary \[0, 3\)"):
        dec.generate(torch.tensor([0]), max_new=10)
