"""The batched decoder and the batched Hugging Face adapter, through the loaded kernel.

What is shown, and against which independent oracle:

* every sequence of a batch follows the target's exact sequence law (token-wise
  and block verification)
  (enumerated over tiny prefix-dependent tables, ``decode_tables.py``) while
  the sequences of one round accept different numbers of draft tokens (ragged
  ``num_draft_tokens`` and accepted lengths, asserted to occur): with
  probability rows through the decoder, and with logits rows through
  ``HFBatchedCausalLM`` over a duck-typed model that honours the attention
  mask and the per-row positions (``ToyBatchedLM``); chi-square per sequence,
  Bonferroni over the sequences at family-wise ``ALPHA``;
* negative control: an adapter that leaves one sequence's rejected tokens
  visible in the cache (not masked out) fails that sequence's law;
* greedy batched decoding equals each prompt's own plain greedy chain, and
  costs exactly one target forward and ``K`` draft forwards per batch round,
  the target fed every position once (no prefix re-run), sequences that
  stop leaving the batch's forwards;
* a batch of one is ``SpeculativeDecoder``: same tokens, same statistics;
* bad prompts, masks and callback results raise errors naming them.
"""

from __future__ import annotations

import types

import pytest
import torch

from tests.decode_tables import ALPHA, TABLE_V, LogitTables, Tables, merge_small_cells

# One torch thread: the results do not depend on it, and on a shared 2-core
# machine a batched op's second thread can cost milliseconds to wake.
pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[0], [1, 2], [2, 0, 1]]  # different lengths: left padding inside the adapter
LENGTH = 3  # new tokens: 27 continuations per sequence
K = 2
RUNS = 2500


# ============================================================================
# Batched callbacks over the tables, and a duck-typed batched model
# ============================================================================


class BatchedTables:
    """Batched probability-row callbacks: sequence ``b``'s rows are the tables' rows after its prefix."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def draft_step(self, prefixes, k, rows):
        drafts = [self.tables.draft_step(prefix, k) for prefix in prefixes]
        return torch.stack([t for t, _ in drafts]), torch.stack([r for _, r in drafts])

    def target_step(self, prefixes, proposed, rows):
        return torch.stack([self.tables.target_step(p, t) for p, t in zip(prefixes, proposed)])


class ToyBatchedLM:
    """A duck-typed causal LM over a logits table, for a batch with one cache.

    The logits at a column are the table's row after the tokens that column
    may see -- the slots up to it that its row's attention mask keeps -- so
    a rejected token left unmasked changes them. A column whose position id
    is not its row's count of visible tokens before it reads another row of
    the table (as a wrong rotary position would silently change a real
    model's output). Counts each call's ``(rows, width)``.
    """

    class Cache:
        def __init__(self, rows: int) -> None:
            self.tokens = torch.empty((rows, 0), dtype=torch.int64)

        def get_seq_length(self) -> int:
            return self.tokens.shape[1]

        def crop(self, n: int) -> None:
            assert n < 0, n
            self.tokens = self.tokens[:, :n]

        def batch_select_indices(self, index) -> None:
            self.tokens = self.tokens[index]

    def __init__(self, row_logits) -> None:
        self.row_logits = row_logits
        self.calls: list = []

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        n, width = input_ids.shape
        cache = past_key_values if past_key_values is not None else ToyBatchedLM.Cache(n)
        start = cache.get_seq_length()
        cache.tokens = torch.cat([cache.tokens, input_ids], dim=1)
        if attention_mask is None:  # the adapter's dense case: every slot visible, positions from the slots
            attention_mask = torch.ones_like(cache.tokens)
            position_ids = start + torch.arange(width).expand(n, width)
        assert tuple(attention_mask.shape) == tuple(cache.tokens.shape)
        self.calls.append((n, width))
        logits = torch.zeros(n, width, TABLE_V)
        masks, tokens, positions = attention_mask.tolist(), cache.tokens.tolist(), position_ids.tolist()
        for b in range(n):
            seen = [t for t, keep in zip(tokens[b][:start], masks[b][:start]) if keep]
            for j in range(width):
                if not masks[b][start + j]:
                    continue  # a hole: its output is never read
                seen.append(tokens[b][start + j])
                position = positions[b][j]
                logits[b, j] = self.row_logits(seen if position == len(seen) - 1 else seen + [position % TABLE_V])
        return types.SimpleNamespace(logits=logits, past_key_values=cache)


def _run_law(decoder, tables: Tables, runs: int = RUNS):
    """Per sequence: the chi-square p-value of its continuations against its exact law.

    Also returns the number of batch rounds whose sequences emitted
    different numbers of tokens (the raggedness the test needs).
    """
    from scipy import stats

    laws = [tables.sequence_law(prompt, LENGTH) for prompt in PROMPTS]
    counts = [dict.fromkeys(law, 0) for law in laws]
    ragged = 0
    prompts = [torch.tensor(p) for p in PROMPTS]
    for _ in range(runs):
        emitted: dict = {}
        outs = decoder.generate(prompts, LENGTH, on_commit=lambda b, new: emitted.setdefault(b, []).append(len(new)))
        for b, out in enumerate(outs):
            counts[b][tuple(out[len(PROMPTS[b]) :].tolist())] += 1
        first_round = {lengths[0] for lengths in emitted.values()}
        ragged += len(first_round) > 1
    pvalues = []
    for law, count in zip(laws, counts):
        observed, expected = merge_small_cells([count[s] for s in law], [runs * law[s] for s in law])
        pvalues.append(float(stats.chisquare(observed, expected).pvalue))
    return pvalues, ragged


# ============================================================================
# The law, per sequence of a ragged batch
# ============================================================================


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("method", ["token", "block"])
def test_every_sequence_of_a_batch_follows_the_target_law(sv, method):
    tables = Tables()
    batched = BatchedTables(tables)
    decoder = sv.BatchedSpeculativeDecoder(batched.draft_step, batched.target_step, k=K, greedy=False,
                                           generator=torch.Generator().manual_seed(1234), method=method)
    pvalues, ragged = _run_law(decoder, tables)
    print(f"\nbatched, probability rows, {method}: p per sequence {[f'{p:.3f}' for p in pvalues]}, "
          f"{ragged}/{RUNS} runs ragged in their first round")
    assert ragged > RUNS // 10  # sequences of one round accepted different counts
    assert all(p > ALPHA / len(PROMPTS) for p in pvalues)


def _adapter_decoder(sv, tables, adapter=None):
    adapter = adapter or sv.HFBatchedCausalLM
    warping = tables.draw_warping
    draft = adapter(ToyBatchedLM(tables.draft_logits), generator=torch.Generator().manual_seed(5), **warping)
    target = adapter(ToyBatchedLM(tables.target_logits), **warping)
    return sv.BatchedSpeculativeDecoder(draft.draft_step, target.target_step, k=K, greedy=False,
                                        generator=torch.Generator().manual_seed(6))


# The adapter is pure Python over the same ops: emulated, these would take minutes and test no more NEON.
@pytest.mark.native_only
def test_hf_batched_adapter_follows_the_warped_target_law(sv):
    warping = dict(temperature=0.7, top_k=2)  # V = 3: the top-k cut drops a token
    tables = LogitTables(sv, warping)
    decoder = _adapter_decoder(sv, tables)
    assert decoder.warping == sv.LogitsWarping(**warping)  # read from the adapters
    pvalues, ragged = _run_law(decoder, tables)
    print(f"\nbatched adapter, logits rows ({decoder.warping}): p per sequence {[f'{p:.3f}' for p in pvalues]}, "
          f"{ragged}/{RUNS} runs ragged")
    assert ragged > RUNS // 10
    assert all(p > ALPHA / len(PROMPTS) for p in pvalues)
    assert decoder.target_step.__self__.cache_rebuilds == 0


@pytest.mark.native_only
def test_negative_control_one_sequence_left_unmasked_fails_its_law(sv):
    class KeepsRow1Visible(sv.HFBatchedCausalLM):
        """Broken: rolls sequence 1 back in its books but leaves the rejected slots visible."""

        def _rollback(self, b, keep):
            if self._ids[b] == 1 and keep < self._rows[b].length:  # sequence 1, wherever it sits in the cache
                row = self._rows[b]
                del row.slots[keep:]
                row.length = keep
                return
            super()._rollback(b, keep)

    tables = LogitTables(sv, dict(temperature=0.7, top_k=2))
    pvalues, _ = _run_law(_adapter_decoder(sv, tables, KeepsRow1Visible), tables, runs=RUNS // 2)
    print(f"\nnegative control, sequence 1 unmasked: p per sequence {[f'{p:.2e}' for p in pvalues]}")
    assert pvalues[1] < ALPHA / len(PROMPTS)
    # The others keep their own rows of the cache, and their law.
    assert pvalues[0] > ALPHA / len(PROMPTS) and pvalues[2] > ALPHA / len(PROMPTS)


# ============================================================================
# Greedy: each sequence is its own plain greedy chain; the cost of a round
# ============================================================================


def _noisy_draft_logits(tables):
    """Logits of a draft that agrees with the target's argmax only partly."""
    return lambda seen: tables.target_logits(seen) + 1.5 * torch.sin(torch.arange(TABLE_V) * 2.1 + 0.9 * len(seen))


def test_greedy_batch_equals_plain_greedy_and_costs_one_target_forward_per_round(sv):
    tables = LogitTables(sv, dict(temperature=1.0))
    eos = 2
    prompts = [[0], [1, 2, 0, 1], [2, 1], [1, 1, 0]]
    draft_model, target_model = ToyBatchedLM(_noisy_draft_logits(tables)), ToyBatchedLM(tables.target_logits)
    draft_step, target_step = sv.hf_batched_step_pair(draft_model, target_model, temperature=0)
    draft_ks, target_calls = [], []

    def counted_draft(prefixes, k, rows):
        draft_ks.append(k)
        return draft_step(prefixes, k, rows)

    def counted_target(prefixes, proposed, rows):
        target_calls.append((len(rows), proposed.shape[1]))
        return target_step(prefixes, proposed, rows)

    decoder = sv.BatchedSpeculativeDecoder(counted_draft, counted_target, k=3, eos_token_id=eos)
    outs = decoder.generate([torch.tensor(p) for p in prompts], max_new=12)
    for prompt, out in zip(prompts, outs):
        assert out.tolist() == tables.greedy_chain(prompt, 12, eos=eos), prompt
    stats = decoder.stats
    assert 0 < stats.accepted < stats.drafted
    assert "eos" in stats.stopped_by_row  # some sequences stopped early and left the batch
    assert min(n for n, _ in target_calls) < len(prompts)
    assert [n for n, _ in target_model.calls] == [n for n, _ in target_calls]  # the model saw only those rows
    draft, target = draft_step.__self__, target_step.__self__
    # One target forward per batch round, K draft forwards, nothing rebuilt.
    assert target.forward_calls == stats.batch_rounds == len(target_calls)
    assert draft.forward_calls == sum(draft_ks)
    assert draft.cache_rebuilds == target.cache_rebuilds == 0
    # The target is fed each prompt once, then per sequence and round the last
    # committed token and the K proposals: no prefix is ever run again.
    (n_first, k_first), later = target_calls[0], target_calls[1:]
    assert target.tokens_fed == sum(map(len, prompts)) + n_first * k_first + sum(n * (k + 1) for n, k in later)


def test_a_batch_of_one_is_the_single_sequence_decoder(sv):
    tables = Tables()
    outs, stats = [], []
    for make in ("single", "batched"):
        tables.draft_gen.manual_seed(3)
        generator = torch.Generator().manual_seed(9)
        if make == "single":
            decoder = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=3, greedy=False,
                                            generator=generator)
            outs.append([decoder.generate(torch.tensor([1, 0]), 10).tolist() for _ in range(20)])
        else:
            batched = BatchedTables(tables)
            decoder = sv.BatchedSpeculativeDecoder(batched.draft_step, batched.target_step, k=3, greedy=False,
                                                   generator=generator)
            outs.append([decoder.generate([torch.tensor([1, 0])], 10)[0].tolist() for _ in range(20)])
        stats.append((decoder.stats.rounds, decoder.stats.histogram, decoder.stats.per_round))
    assert outs[0] == outs[1]
    assert stats[0] == stats[1]


# ============================================================================
# Bad input
# ============================================================================


def _uniform_pair(v=TABLE_V):
    def draft_step(prefixes, k, rows):
        return torch.zeros(len(prefixes), k, dtype=torch.int64), torch.full((len(prefixes), k, v), 1.0 / v)

    def target_step(prefixes, proposed, rows):
        return torch.full((len(prefixes), proposed.shape[1] + 1, v), 1.0 / v)

    return draft_step, target_step


def test_bad_prompts_and_masks_are_named(sv):
    decoder = sv.BatchedSpeculativeDecoder(*_uniform_pair())
    ids = torch.tensor([[0, 0, 1], [0, 2, 1]])
    with pytest.raises(TypeError, match=r"prompts must be a non-empty list"):
        decoder.generate([])
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        decoder.generate([torch.tensor([1]), torch.tensor([], dtype=torch.int64)])
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 2\), but the prompts \(input_ids\) have "
                                         r"shape \(2, 3\)"):
        decoder.generate(ids, attention_mask=torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"attention_mask\[0\] = \[1, 1, 0\] is not left padding"):
        decoder.generate(ids, attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
        decoder.generate(ids, attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]]))
    with pytest.raises(TypeError, match=r"prompts must hold integer token ids"):
        decoder.generate(ids.float())
    # Left padding is stripped: each prompt is its unmasked tokens.
    outs = decoder.generate(ids, max_new=2, attention_mask=torch.tensor([[0, 0, 1], [0, 1, 1]]))
    assert [o[: len(o) - 2].tolist() for o in outs] == [[1], [2, 1]]


def test_bad_batched_callback_results_are_named(sv):
    draft_step, target_step = _uniform_pair()
    prompts = [torch.tensor([0]), torch.tensor([1, 2])]
    cases = [
        (lambda p, k, r: (torch.zeros(len(p), k + 1, dtype=torch.int64), None), target_step, ValueError,
         r"draft_step\(prefixes, k=2, rows\) for 2 sequences returned tokens of shape \(2, 3\), expected "
         r"\[2, m\] with m <= 2"),
        (lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), None, torch.tensor([1, 3])), target_step,
         ValueError, r"returned num_tokens\[1\] = 3, outside \[0, 2\]"),
        (lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), None, torch.tensor([1])), target_step,
         ValueError, r"returned num_tokens of shape \(1,\), expected \(2,\)"),
        (lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), None, torch.tensor([1.0, 1.0])), target_step,
         TypeError, r"\(num_tokens\) returned tokens of dtype torch.float32"),
        (lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), None, None, None), target_step,
         TypeError, r"must return a pair or a triple \(tokens, rows\) or \(tokens, rows, num_tokens\), got tuple "
         r"of length 4"),
        (lambda p, k, r: (torch.zeros(len(p), k, dtype=torch.int64), torch.full((len(p), k, 4), 0.25)), target_step,
         ValueError, r"draft_step.*probs over V = 4 tokens, but target_step returned V = 3"),
        (draft_step, lambda p, t, r: torch.full((len(p), t.shape[1], 3), 0.3), ValueError,
         r"target_step\(prefixes, proposed, rows\) with proposed of shape \(2, 2\) returned target_probs of "
         r"shape \(2, 2, 3\): expected \[2, 3, V\]"),
        (lambda p, k, r: (torch.full((len(p), k), 3), torch.full((len(p), k, 3), 0.3)), target_step, ValueError,
         r"returned token 3, outside the target's vocabulary \[0, 3\)"),
        (lambda p, k, r: (torch.tensor([[0, 0], [0, 1]]), torch.tensor([[[1.0, 0, 0]] * 2, [[1.0, 0, 0]] * 2])),
         target_step, ValueError, r"tokens\[1, 1\] = 1 with probs\[1, 1, 1\] = 0.0"),
    ]
    for draft, target, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            sv.BatchedSpeculativeDecoder(draft, target, k=2, greedy=False).generate(prompts, max_new=5)


def test_adapter_pair_refuses_different_vocabularies(sv):
    draft, target = ToyBatchedLM(None), ToyBatchedLM(None)
    draft.config, target.config = types.SimpleNamespace(vocab_size=3), types.SimpleNamespace(vocab_size=5)
    with pytest.raises(ValueError, match=r"draft_model has a vocabulary of 3 tokens and target_model of 5"):
        sv.hf_batched_step_pair(draft, target)
    with pytest.raises(ValueError, match=r"pad_token_id must be an int >= 0"):
        sv.HFBatchedCausalLM(target, pad_token_id=-1)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("with_eos", [False, True])
def test_a_plain_step_alone_is_the_batched_loops_plain_step(sv, greedy, with_eos):
    """``SpeculativeDecoder._plain_round`` writes the loop's plain step out for a batch of one (the Python
    it saves after each eval): at ``k = 0`` it must emit what the batched loop emits for that sequence,
    greedy and sampled (the same generator: one uniform a step either way), stopping at the same
    end-of-sequence id (greedy: the chain's 10th new token), with the same statistics."""
    tables = Tables()
    batched = BatchedTables(tables)
    prompt = torch.tensor([1, 2])
    eos = tables.greedy_chain([1, 2], 40)[2 + 9] if with_eos else None
    alone = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=0, greedy=greedy, eos_token_id=eos,
                                  generator=torch.Generator().manual_seed(7))
    batch = sv.BatchedSpeculativeDecoder(batched.draft_step, batched.target_step, k=0, greedy=greedy,
                                         eos_token_id=eos, generator=torch.Generator().manual_seed(7))
    out = alone.generate(prompt, max_new=40)
    assert out.tolist() == batch.generate([prompt], max_new=40)[0].tolist()
    fields = ("rounds", "batch_rounds", "drafted", "accepted", "histogram", "per_round", "k_per_round",
              "new_tokens", "stopped_by")
    assert {f: getattr(alone.stats, f) for f in fields} == {f: getattr(batch.stats, f) for f in fields}
    if greedy:
        assert alone.stats.stopped_by == ("eos" if with_eos else "max_new")
