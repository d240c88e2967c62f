"""The decoder loop and the Hugging Face adapter, through the loaded kernel.

What is shown, and against which independent oracle:

* greedy speculative decoding with real transformers models (built offline
  from small configs) is token-identical to ``target.generate(do_sample=False)``;
* sampled speculative decoding over explicit probability tables matches the
  target's exact sequence law (enumerated) by chi-square, and two broken
  decoders fail the same test (negative controls);
* the same law through the logits path (``warping=``: callbacks return
  logits, the draft draws with ``sample_draft``, the decoder verifies with
  ``verify_logits``), against the warped law computed here independently
  (softmax, top-k, top-p in float64), also through ``hf_step_pair`` on toy
  models; verifying under another warping than the draft's fails it;
* the decoder takes the kind of rows from ``warping=`` or the callbacks'
  ``warping`` attributes, and refuses a mix that would read logits as
  probabilities, or disagreeing warpings, in sampled mode;
* every malformed callback result or argument raises a clear error;
* ``max_new`` / eos rules and the statistics' internal consistency, checked
  against what the callbacks observed;
* the adapter's KV cache costs exactly k one-token draft forwards and one
  (k+1)-token target forward per round, counted by wrapping ``forward``;
  an adapter that forgets to crop its cache fails the greedy-equality test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pathlib

import pytest
import torch

from tests.decode_tables import ALPHA, TABLE_V, LogitTables, Tables, merge_small_cells

REPO = pathlib.Path(__file__).resolve().parents[1]


def _sequence_pvalue(decoder, tables: Tables, prompt: list, length: int, runs: int):
    """Chi-square p-value of ``runs`` decoded continuations against the exact law.

    Also returns the accepted and drafted totals over all runs.
    """
    from scipy import stats

    law = tables.sequence_law(prompt, length)
    counts = dict.fromkeys(law, 0)
    prompt_t = torch.tensor(prompt)
    accepted = drafted = 0
    for _ in range(runs):
        out = decoder.generate(prompt_t, max_new=length)
        counts[tuple(out[len(prompt) :].tolist())] += 1
        accepted += decoder.stats.accepted
        drafted += decoder.stats.drafted
    observed, expected = merge_small_cells(
        [counts[s] for s in law], [runs * law[s] for s in law]
    )
    return float(stats.chisquare(observed, expected).pvalue), accepted, drafted


# ============================================================================
# (b) Sampled decoding preserves the target's sequence law
# ============================================================================

SAMPLED_RUNS = 4000
PROMPT = [0]
LENGTH = 3  # 27 sequences over V = 3


def _sampled_decoder(sv, tables, k=2, seed=1234, cls=None, eos_token_id=None):
    cls = cls or sv.SpeculativeDecoder
    return cls(
        tables.draft_step,
        tables.target_step,
        k=k,
        greedy=False,
        eos_token_id=eos_token_id,
        generator=torch.Generator().manual_seed(seed),
    )


# (k, new tokens): a round drafts min(k, left - 1), so k = 3 needs 4 new
# tokens (81 sequences) to ever draft 3.
@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("k, length", [(1, LENGTH), (2, LENGTH), (3, 4)])
def test_sampled_sequences_follow_the_target_law(sv, k, length):
    tables = Tables()
    decoder = _sampled_decoder(sv, tables, k=k)
    pvalue, accepted, drafted = _sequence_pvalue(decoder, tables, PROMPT, length, SAMPLED_RUNS)
    print(
        f"\nsampled k={k}, {length} new tokens: chi-square p = {pvalue:.4f} over {SAMPLED_RUNS} runs "
        f"(alpha {ALPHA}), acceptance {accepted}/{drafted}"
    )
    # Both outcomes of verification must have occurred, or the test is vacuous.
    assert 0 < accepted < drafted
    assert pvalue > ALPHA


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
def test_block_sampled_sequences_follow_the_target_law(sv):
    """method="block": the same law (the exact proof is tests/test_law.py's enumeration)."""
    tables = Tables()
    decoder = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=3, greedy=False,
                                    generator=torch.Generator().manual_seed(99), method="block")
    pvalue, accepted, drafted = _sequence_pvalue(decoder, tables, PROMPT, 4, SAMPLED_RUNS)
    print(f"\nblock k=3, 4 new tokens: chi-square p = {pvalue:.4f} (alpha {ALPHA}), acceptance {accepted}/{drafted}")
    assert 0 < accepted < drafted
    assert pvalue > ALPHA


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
def test_block_logits_sequences_follow_the_warped_target_law(sv):
    tables = LogitTables(sv, _warping(0.8, 0, 1.0))
    decoder = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=2, greedy=False,
                                    generator=torch.Generator().manual_seed(7), method="block",
                                    warping=_warping(0.8, 0, 1.0))
    pvalue, accepted, drafted = _sequence_pvalue(decoder, tables, PROMPT, LENGTH, SAMPLED_RUNS)
    assert 0 < accepted < drafted
    assert pvalue > ALPHA


def test_block_method_is_named(sv):
    tables = Tables()
    with pytest.raises(ValueError, match="method must be"):
        sv.SpeculativeDecoder(tables.draft_step, tables.target_step, method="blocks")


def _keeps_rejected_token(sv):
    class KeepsRejectedToken(sv.SpeculativeDecoder):
        """Broken: on a rejection keeps the rejected draft token instead of the correction."""

        def _verify(self, target_probs, draft_tokens, draft_probs):
            n, next_token = super()._verify(target_probs, draft_tokens, draft_probs)
            if n < len(draft_tokens):
                return n, int(draft_tokens[n])
            return n, next_token

    return KeepsRejectedToken


def _resamples_from_target(sv):
    class ResamplesFromTarget(sv.SpeculativeDecoder):
        """Broken (subtly): on a rejection draws from the target row, not the residual."""

        def _verify(self, target_probs, draft_tokens, draft_probs):
            n, next_token = super()._verify(target_probs, draft_tokens, draft_probs)
            if n < len(draft_tokens):
                row = target_probs[n].double()
                next_token = int(torch.multinomial(row, 1, generator=self.generator))
            return n, next_token

    return ResamplesFromTarget


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("broken", [_keeps_rejected_token, _resamples_from_target])
def test_negative_control_broken_decoders_fail(sv, broken):
    tables = Tables()
    decoder = _sampled_decoder(sv, tables, k=2, cls=broken(sv))
    pvalue, _, _ = _sequence_pvalue(decoder, tables, PROMPT, LENGTH, SAMPLED_RUNS)
    print(f"\nnegative control {broken.__name__}: chi-square p = {pvalue:.2e} (must be < {ALPHA})")
    assert pvalue < ALPHA


def test_sampled_runs_are_reproducible(sv):
    outputs = []
    for decoder_seed in (7, 7, 8):
        tables = Tables(draft_seed=3)
        decoder = _sampled_decoder(sv, tables, k=3, seed=decoder_seed)
        outputs.append([decoder.generate(torch.tensor([0, 1]), max_new=12).tolist() for _ in range(5)])
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_zero_mass_target_tokens_are_never_emitted(sv):
    tables = Tables(target_zeros=True)
    decoder = _sampled_decoder(sv, tables, k=3)
    for _ in range(200):
        out = decoder.generate(torch.tensor([1]), max_new=6).tolist()
        for i in range(1, len(out)):
            assert float(tables.target_row(out[:i])[out[i]]) > 0.0, out


# ============================================================================
# The logits path: callbacks return logits, verify_logits decides
# ============================================================================

# (temperature, top_k, top_p): plain, a top-k cut (V = 3: one token dropped), a top-p cut.
LOGITS_WARPINGS = [(1.0, 0, 1.0), (0.7, 2, 1.0), (1.3, 0, 0.8)]


def _warping(temperature, top_k, top_p) -> dict:
    return dict(temperature=temperature, top_k=top_k, top_p=top_p)


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("temperature, top_k, top_p", LOGITS_WARPINGS)
@pytest.mark.parametrize("k", [1, 2])
def test_sampled_logits_sequences_follow_the_warped_target_law(sv, k, temperature, top_k, top_p):
    warping = _warping(temperature, top_k, top_p)
    tables = LogitTables(sv, warping)
    decoder = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=k, greedy=False,
                                    generator=torch.Generator().manual_seed(1234), warping=warping)
    assert decoder.warping == sv.LogitsWarping(**warping)
    pvalue, accepted, drafted = _sequence_pvalue(decoder, tables, PROMPT, LENGTH, SAMPLED_RUNS)
    print(f"\nlogits k={k} {decoder.warping}: chi-square p = {pvalue:.4f}, acceptance {accepted}/{drafted}")
    assert 0 < accepted < drafted
    assert pvalue > ALPHA
    assert decoder.stats.mode.startswith("sampled from logits")


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
def test_negative_control_verifying_under_another_warping_fails(sv):
    # The draft draws at temperature 0.7 with top-k 2; the decoder is told
    # temperature 1.0, no cut: verify_logits then warps both sides by the
    # wrong rule, and the output no longer follows the warped target law.
    tables = LogitTables(sv, _warping(0.7, 2, 1.0))
    decoder = sv.SpeculativeDecoder(tables.draft_step, tables.target_step, k=2, greedy=False,
                                    generator=torch.Generator().manual_seed(1234), warping=dict(temperature=1.0))
    pvalue, _, _ = _sequence_pvalue(decoder, tables, PROMPT, LENGTH, SAMPLED_RUNS)
    print(f"\nnegative control, another warping: chi-square p = {pvalue:.2e} (must be < {ALPHA})")
    assert pvalue < ALPHA


class ToyLM:
    """A duck-typed causal LM over a table: logits = log of the table's row after
    the whole history, so a stale KV cache would change them."""

    class Cache:
        def __init__(self):
            self.tokens = []

        def crop(self, n):
            assert n < 0, n
            del self.tokens[n:]

        def get_seq_length(self):
            return len(self.tokens)

    def __init__(self, row_logits):
        self.row_logits = row_logits

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        import types

        cache = past_key_values if past_key_values is not None else ToyLM.Cache()
        start = len(cache.tokens)
        cache.tokens += input_ids[0].tolist()
        rows = [self.row_logits(cache.tokens[: start + j + 1]) for j in range(input_ids.shape[1])]
        return types.SimpleNamespace(logits=torch.stack(rows)[None], past_key_values=cache)


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("temperature, top_k, top_p", LOGITS_WARPINGS[1:])
def test_hf_step_pair_sampled_follows_the_warped_target_law(sv, temperature, top_k, top_p):
    # The README form: hf_step_pair(...) then SpeculativeDecoder(..., greedy=False),
    # with no warping passed to the decoder: it reads the adapters' own.
    warping = _warping(temperature, top_k, top_p)
    tables = LogitTables(sv, warping)
    draft_step, target_step = sv.hf_step_pair(
        ToyLM(tables.draft_logits), ToyLM(tables.target_logits), generator=torch.Generator().manual_seed(5),
        **warping,
    )
    decoder = sv.SpeculativeDecoder(draft_step, target_step, k=2, greedy=False,
                                    generator=torch.Generator().manual_seed(6))
    assert decoder.warping == sv.LogitsWarping(**warping)
    pvalue, accepted, drafted = _sequence_pvalue(decoder, tables, PROMPT, LENGTH, SAMPLED_RUNS)
    print(f"\nhf_step_pair {decoder.warping}: chi-square p = {pvalue:.4f}, acceptance {accepted}/{drafted}")
    assert 0 < accepted < drafted
    assert pvalue > ALPHA
    assert target_step.__self__.cache_rebuilds == 0


# -- which rows: declared by warping= or carried by the callbacks ----------------


def _logits_pair(draft_warping=None, target_warping=None, v=TABLE_V):
    """Callbacks returning uniform logits rows, carrying the given warpings as attributes."""

    def draft_step(prefix, k):
        return torch.zeros(k, dtype=torch.int64), torch.zeros(k, v)

    def target_step(prefix, proposed):
        return torch.zeros(len(proposed) + 1, v)

    draft_step.warping, target_step.warping = draft_warping, target_warping
    return draft_step, target_step


def test_carried_warpings_are_read_and_must_agree(sv):
    w8, w9 = sv.LogitsWarping(0.8), sv.LogitsWarping(0.9)
    decoder = sv.SpeculativeDecoder(*_logits_pair(w8, sv.LogitsWarping(temperature=0.8)), k=2, greedy=False)
    assert decoder.warping == w8
    assert len(decoder.generate(torch.tensor([0]), max_new=5)) == 6
    assert "sampled from logits (temperature 0.8)" in str(decoder.stats)
    with pytest.raises(ValueError, match=r"draft_step carries the warping \(temperature 0.8\) and target_step "
                                         r"\(temperature 0.9\)"):
        sv.SpeculativeDecoder(*_logits_pair(w8, w9), greedy=False)
    with pytest.raises(ValueError, match=r"target_step carries the warping \(temperature 0.9\), but "
                                         r"warping=\(temperature 0.8\)"):
        sv.SpeculativeDecoder(*_logits_pair(None, w9), greedy=False, warping=w8)
    # Declared for both, carried by one: agree, fine.
    assert sv.SpeculativeDecoder(*_logits_pair(w8, None), greedy=False, warping=dict(temperature=0.8)).warping == w8
    # Greedy reads only the target's argmax: the warpings are not compared.
    assert sv.SpeculativeDecoder(*_logits_pair(w8, w9), greedy=True).warping == w9


def test_logits_are_never_read_as_probabilities(sv):
    # An adapter's draft (logits rows) with a probability-row target: refused
    # at construction in sampled mode, whichever side carries the warping.
    w = sv.LogitsWarping(0.8, top_p=0.95)
    probs_draft, probs_target = _good_pair()
    for draft_step, target_step, has, lacks in [
        (_logits_pair(w)[0], probs_target, "draft_step", "target_step"),
        (probs_draft, _logits_pair(None, w)[1], "target_step", "draft_step"),
    ]:
        with pytest.raises(ValueError, match=rf"{has} returns logits rows \(it carries the warping "
                                             rf"\(temperature 0.8, top-p 0.95\)\), but {lacks} carries none"):
            sv.SpeculativeDecoder(draft_step, target_step, k=2, greedy=False)
        assert sv.SpeculativeDecoder(draft_step, target_step, greedy=True).warping == w


def test_bad_warpings_are_named(sv):
    draft_step, target_step = _good_pair()
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
        sv.SpeculativeDecoder(draft_step, target_step, greedy=False, warping=dict(top_p=0.0))
    with pytest.raises(ValueError, match=r"min_p must lie in \[0, 1\)"):
        sv.LogitsWarping(min_p=1.0)
    with pytest.raises(TypeError, match=r"warping got unknown keys \['top_q'\]"):
        sv.SpeculativeDecoder(draft_step, target_step, warping=dict(top_q=0.9))
    with pytest.raises(TypeError, match=r"warping must be None, a LogitsWarping or a dict"):
        sv.SpeculativeDecoder(draft_step, target_step, warping=0.8)
    draft_step.warping = 0.8
    with pytest.raises(TypeError, match=r"draft_step.warping must be a LogitsWarping"):
        sv.SpeculativeDecoder(draft_step, target_step)


def test_bad_logits_draft_results_are_named(sv):
    w = dict(temperature=1.0, top_k=1)  # top-k 1: only the argmax is in the warped support
    _, target_step = _good_pair()
    # logits=None is a point-mass draft now (DESIGN.md, "Prompt lookup"), not an error: at top-k 1 the
    # warped target is its argmax, so the run must equal greedy decoding of the target's logits.
    def favours_next(prefix, proposed):  # logits favouring (last token + 1) % V: one argmax per row
        seq = torch.cat([prefix, proposed])
        rows = torch.zeros(len(proposed) + 1, TABLE_V)
        rows[torch.arange(len(proposed) + 1), (seq[len(prefix) - 1:] + 1) % TABLE_V] = 2.0
        return rows

    none_rows = lambda prefix, k: (torch.zeros(k, dtype=torch.int64), None)  # noqa: E731
    decoder = sv.SpeculativeDecoder(none_rows, favours_next, k=2, greedy=False, warping=w)
    greedy = sv.SpeculativeDecoder(none_rows, favours_next, k=2, greedy=True)
    assert decoder.generate(torch.tensor([0]), max_new=5).tolist() == greedy.generate(torch.tensor([0]), 5).tolist()
    assert decoder.stats.drafted > 0
    outside = lambda prefix, k: (torch.ones(k, dtype=torch.int64), torch.tensor([[2.0, 1.0, 0.0]] * k))  # noqa: E731
    decoder = sv.SpeculativeDecoder(outside, target_step, k=2, greedy=False, warping=w)
    with pytest.raises(ValueError, match=r"verification of round 0 .*draft_logits.*outside the support of "
                                         r"the warped draft distribution"):
        decoder.generate(torch.tensor([0]), max_new=5)


def test_sampling_at_temperature_0_is_greedy(sv):
    # A warping of temperature 0 is greedy (as verify_logits): the decoder
    # verifies with verify_greedy, and the draft's rows may be None.
    tables = Tables()
    perfect_draft = lambda prefix, k: (torch.tensor(tables.greedy_chain(prefix.tolist(), k)[len(prefix):]), None)  # noqa: E731
    logits_target = lambda prefix, proposed: tables.target_step(prefix, proposed).log()  # noqa: E731
    decoder = sv.SpeculativeDecoder(perfect_draft, logits_target, k=3, greedy=False, warping=dict(temperature=0))
    out = decoder.generate(torch.tensor([0]), max_new=10)
    assert out.tolist() == tables.greedy_chain([0], 10)
    assert decoder.stats.accepted == decoder.stats.drafted > 0


# ============================================================================
# Greedy decoding with tables: equals the plain greedy chain
# ============================================================================


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("max_new", [1, 4, 9])
def test_greedy_tables_equal_plain_greedy(sv, k, max_new):
    # A draft that agrees with the target about half the time: with a
    # 50% chance it proposes the target's argmax, else its own sample.
    tables = Tables()
    coin = torch.Generator().manual_seed(k * 100 + max_new)

    def draft_step(prefix, kk):
        seq, tokens = prefix.tolist(), []
        for _ in range(kk):
            if float(torch.rand(1, generator=coin)) < 0.5:
                token = int(torch.argmax(tables.target_row(seq).float()))
            else:
                token = int(torch.randint(TABLE_V, (1,), generator=coin))
            tokens.append(token)
            seq.append(token)
        return torch.tensor(tokens), None

    decoder = sv.SpeculativeDecoder(draft_step, tables.target_step, k=k, greedy=True)
    for prompt in ([0], [2, 1], [1, 1, 0, 2]):
        out = decoder.generate(torch.tensor(prompt), max_new=max_new)
        assert out.tolist() == tables.greedy_chain(prompt, max_new)


# ============================================================================
# (c) Bad input: clear errors naming the callback or argument
# ============================================================================


def _good_pair(v=TABLE_V):
    def draft_step(prefix, k):
        return torch.zeros(k, dtype=torch.int64), torch.full((k, v), 1.0 / v)

    def target_step(prefix, proposed):
        return torch.full((len(proposed) + 1, v), 1.0 / v)

    return draft_step, target_step


def _draft_returning(make):
    """A draft_step whose result is make(k)."""
    return lambda prefix, k: make(k)


BAD_DRAFTS = [
    # (draft result for k, error type, message pattern)
    (lambda k: torch.zeros(k, dtype=torch.int64), TypeError, r"draft_step.*pair \(tokens, probs\)"),
    (lambda k: (torch.zeros(k + 1, dtype=torch.int64), torch.full((k + 1, 3), 0.3)), ValueError,
     r"draft_step\(prefix, k=2\) returned tokens of shape \(3,\), expected \[m\] with m <= 2"),
    (lambda k: (torch.zeros(1, k, dtype=torch.int64), torch.full((k, 3), 0.3)), ValueError,
     r"draft_step.*tokens of shape \(1, 2\)"),
    (lambda k: (torch.zeros(k), torch.full((k, 3), 0.3)), TypeError, r"draft_step.*tokens of dtype torch.float32"),
    (lambda k: (torch.zeros(k, dtype=torch.int64), torch.full((k + 1, 3), 0.3)), ValueError,
     r"draft_step.*probs of shape \(3, 3\): expected 2 rows"),
    (lambda k: (torch.zeros(k, dtype=torch.int64), torch.full((k,), 0.3)), ValueError,
     r"draft_step.*returned probs of shape \(2,\), expected 2-D"),
    (lambda k: (torch.zeros(k, dtype=torch.int64), torch.full((k, 4), 0.25)), ValueError,
     r"draft_step.*probs over V = 4.*target_step returned V = 3"),
    (lambda k: (torch.tensor([0, 1]), torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])), ValueError,
     r"draft_step.*tokens\[1\] = 1 with probs\[1, 1\] = 0.0"),
    (lambda k: (torch.tensor([0, 3]), torch.full((k, 3), 0.3)), ValueError,
     r"draft_step.*token 3, outside the target's vocabulary \[0, 3\)"),
    (lambda k: (torch.zeros(k, dtype=torch.int64), torch.full((k, 3), 0.3, dtype=torch.float64)), TypeError,
     r"draft_step.*returned probs of dtype torch.float64"),
    (lambda k: (torch.zeros(k, dtype=torch.int64), torch.tensor([[0.5, -0.1, 0.6], [0.3, 0.3, 0.4]])), ValueError,
     r"verification of round 0.*draft_probs\[0, 1\]"),
]


@pytest.mark.parametrize("make, error, pattern", BAD_DRAFTS)
def test_bad_draft_step_results_are_named(sv, make, error, pattern):
    _, target_step = _good_pair()
    decoder = sv.SpeculativeDecoder(_draft_returning(make), target_step, k=2, greedy=False)
    with pytest.raises(error, match=pattern):
        decoder.generate(torch.tensor([0]), max_new=5)


def test_bad_target_step_results_are_named(sv):
    draft_step, _ = _good_pair()
    cases = [
        (lambda prefix, proposed: torch.full((len(proposed), 3), 0.3), ValueError,
         r"target_step\(prefix, proposed\) with 2 proposed tokens returned target_probs of shape \(2, 3\): expected \[3, V\]"),
        (lambda prefix, proposed: torch.full((len(proposed) + 1,), 0.3), ValueError,
         r"target_step.*returned target_probs of shape \(3,\), expected 2-D"),
        (lambda prefix, proposed: [[0.3] * 3] * 3, TypeError, r"target_step.*returned target_probs of type list"),
        (lambda prefix, proposed: torch.full((len(proposed) + 1, 4), 0.25), ValueError,
         r"draft_step.*probs over V = 3.*target_step returned V = 4"),
        (lambda prefix, proposed: torch.zeros(len(proposed) + 1, 3), ValueError,
         r"verification of round 0.*target_probs\[0\] sums to zero"),
    ]
    for target_step, error, pattern in cases:
        decoder = sv.SpeculativeDecoder(draft_step, target_step, k=2, greedy=False)
        with pytest.raises(error, match=pattern):
            decoder.generate(torch.tensor([0]), max_new=5)


def test_target_vocabulary_must_not_change_between_rounds(sv):
    calls = []

    def target_step(prefix, proposed):
        calls.append(1)
        v = 3 if len(calls) == 1 else 5
        return torch.rand(len(proposed) + 1, v)

    decoder = sv.SpeculativeDecoder(lambda prefix, k: (torch.zeros(k, dtype=torch.int64), None), target_step, k=2)
    with pytest.raises(ValueError, match=r"target_step.*target_probs over V = 5 tokens, but an earlier round returned V = 3"):
        decoder.generate(torch.tensor([0]), max_new=8)


def test_bad_arguments_are_named(sv):
    draft_step, target_step = _good_pair()
    with pytest.raises(ValueError, match=r"prompt_ids is empty"):
        sv.SpeculativeDecoder(draft_step, target_step).generate(torch.tensor([], dtype=torch.int64))
    with pytest.raises(TypeError, match=r"prompt_ids must hold integer token ids"):
        sv.SpeculativeDecoder(draft_step, target_step).generate(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"prompt_ids must be 1-D"):
        sv.SpeculativeDecoder(draft_step, target_step).generate(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"k must be >= 0, got -1"):
        sv.SpeculativeDecoder(draft_step, target_step, k=-1)
    with pytest.raises(TypeError, match=r"k must be an int, got float"):
        sv.SpeculativeDecoder(draft_step, target_step, k=2.0)
    with pytest.raises(ValueError, match=r'k must be an int >= 0 or "auto", got \'Auto\''):
        sv.SpeculativeDecoder(draft_step, target_step, k="Auto")
    with pytest.raises(ValueError, match=r'k_max applies only to k="auto", got k=3 and k_max=5'):
        sv.SpeculativeDecoder(draft_step, target_step, k=3, k_max=5)
    with pytest.raises(ValueError, match=r"k_max must be >= 1, got 0"):
        sv.SpeculativeDecoder(draft_step, target_step, k="auto", k_max=0)
    with pytest.raises(TypeError, match=r"k_max must be an int, got float"):
        sv.BatchedSpeculativeDecoder(draft_step, target_step, k="auto", k_max=4.0)
    with pytest.raises(ValueError, match=r"max_new must be >= 0, got -1"):
        sv.SpeculativeDecoder(draft_step, target_step).generate(torch.tensor([0]), max_new=-1)
    with pytest.raises(TypeError, match=r"draft_step must be callable"):
        sv.SpeculativeDecoder(None, target_step)
    with pytest.raises(TypeError, match=r"eos_token_id"):
        sv.SpeculativeDecoder(draft_step, target_step, eos_token_id="2")


# ============================================================================
# (d) max_new, eos and the statistics
# ============================================================================


@pytest.mark.parametrize("max_new", range(0, 8))
def test_max_new_is_exact_and_never_overdrafted(sv, max_new):
    tables = Tables()
    decoder = _sampled_decoder(sv, tables, k=3)
    out = decoder.generate(torch.tensor([2, 0]), max_new=max_new)
    assert out.dtype == torch.int64 and out.dim() == 1
    assert out[:2].tolist() == [2, 0]
    assert len(out) == 2 + max_new
    # Each draft request fits in what was left (so no round could overshoot).
    emitted = 0
    for requested, (drafted, accepted) in zip(tables.draft_requests, decoder.stats.per_round):
        assert requested <= max_new - emitted - 1
        emitted += accepted + 1
    assert tables.target_calls == [d for d, _ in decoder.stats.per_round]
    assert decoder.stats.rounds == len(tables.target_calls)


def test_eos_stops_and_truncates_greedy(sv):
    tables = Tables()
    chain = tables.greedy_chain([0], 12)
    eos = chain[4]  # the 4th new token; it may also occur earlier
    expected = tables.greedy_chain([0], 12, eos=eos)
    assert len(expected) < 13  # the eos is hit within max_new
    perfect_draft = lambda prefix, k: (torch.tensor(tables.greedy_chain(prefix.tolist(), k)[len(prefix) :]), None)
    decoder = sv.SpeculativeDecoder(perfect_draft, tables.target_step, k=4, eos_token_id=eos)
    out = decoder.generate(torch.tensor([0]), max_new=12).tolist()
    assert out == expected
    assert decoder.stats.stopped_by == "eos"


def test_eos_in_sampled_runs_is_last_and_only(sv):
    tables = Tables()
    eos = 2
    decoder = _sampled_decoder(sv, tables, k=3, eos_token_id=eos)
    stopped = 0
    for _ in range(50):
        new = decoder.generate(torch.tensor([0]), max_new=8).tolist()[1:]
        if eos in new:
            assert new.index(eos) == len(new) - 1
            stopped += 1
        else:
            assert len(new) == 8
    assert stopped > 0


def test_statistics_are_consistent(sv):
    tables = Tables()
    decoder = _sampled_decoder(sv, tables, k=3)
    out = decoder.generate(torch.tensor([1]), max_new=40)
    s = decoder.stats
    assert s.rounds == len(tables.target_calls)
    assert s.drafted == sum(tables.draft_requests)
    assert sum(s.histogram) == s.rounds
    assert sum(j * c for j, c in enumerate(s.histogram)) == s.accepted
    assert 0 < s.accepted <= s.drafted
    assert s.new_tokens == len(out) - 1 == s.accepted + s.rounds  # no eos: every round emits a+1
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.tokens_per_round == pytest.approx(s.new_tokens / s.rounds)
    assert 0 <= s.draft_seconds + s.target_seconds + s.verify_seconds <= s.total_seconds
    text = str(s)
    assert f"{s.rounds} rounds" in text and f"accepted {s.accepted}" in text
    # A second call starts fresh statistics.
    decoder.generate(torch.tensor([1]), max_new=0)
    assert decoder.stats.rounds == 0 and decoder.stats.new_tokens == 0


# ============================================================================
# (a), (e) Real transformers models, built offline
# ============================================================================

HF_V = 96


def _llama(layers: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=HF_V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # Large init: peaked logits, so greedy argmaxes are far from ties.
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_pair():
    """A 2-layer target and a 1-layer draft sharing its embedding, first layer and head.

    The target's second layer is damped, so the draft (the target without it)
    agrees often but not always: both accepts and rejects happen.
    """
    pytest.importorskip("transformers")
    target = _llama(layers=2, seed=0)
    with torch.no_grad():
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.3)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.3)
    draft = _llama(layers=1, seed=1)
    shared = target.state_dict()
    draft.load_state_dict({name: shared[name].clone() for name in draft.state_dict()})
    return draft, target


def _target_greedy(target, prompt: list, max_new: int) -> list:
    ids = torch.tensor([prompt])
    return target.generate(ids, max_new_tokens=max_new, do_sample=False)[0].tolist()


HF_PROMPTS = [[5, 17, 3], [1], [40, 41, 42, 43, 44, 45]]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.transformers
def test_hf_greedy_equals_target_generate(sv, hf_pair, k):
    draft, target = hf_pair
    totals = sv.DecodeStats(k=k, greedy=True)
    for prompt in HF_PROMPTS:
        for max_new in (1, 7, 30):
            draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0)
            decoder = sv.SpeculativeDecoder(draft_step, target_step, k=k)
            out = decoder.generate(torch.tensor(prompt), max_new=max_new)
            assert out.tolist() == _target_greedy(target, prompt, max_new), (prompt, max_new)
            totals.accepted += decoder.stats.accepted
            totals.drafted += decoder.stats.drafted
    # Both branches of verification were exercised.
    assert 0 < totals.accepted < totals.drafted


@pytest.mark.transformers
def test_hf_greedy_run_statistics(sv, hf_pair):
    draft, target = hf_pair
    draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0)
    decoder = sv.SpeculativeDecoder(draft_step, target_step, k=4)
    prompt = [5, 17, 3]
    out = decoder.generate(torch.tensor(prompt), max_new=64)
    assert out.tolist() == _target_greedy(target, prompt, 64)
    print("\n" + str(decoder.stats))
    assert decoder.stats.histogram[0] > 0 and decoder.stats.histogram[4] > 0


def _count_forward_lengths(model) -> list:
    """Wrap model.forward to record each call's input length (instance attribute)."""
    lengths = []
    original = model.forward

    def forward(input_ids=None, *args, **kwargs):
        lengths.append(int(input_ids.shape[-1]))
        return original(input_ids, *args, **kwargs)

    model.forward = forward
    return lengths


def _expected_forward_lengths(per_round, prompt_len):
    """Draft and target input lengths implied by the adapter's cost contract."""
    draft, target = [], []
    for r, (drafted, accepted) in enumerate(per_round):
        target.append(prompt_len + drafted if r == 0 else drafted + 1)
        if drafted == 0:
            continue  # the last round may draft nothing
        if r == 0:
            first = prompt_len  # prefill
        else:
            prev_drafted, prev_accepted = per_round[r - 1]
            # After a fully accepted round the draft also feeds its last token.
            first = 2 if prev_accepted == prev_drafted else 1
        draft += [first] + [1] * (drafted - 1)
    return draft, target


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.transformers
def test_hf_kv_cache_costs_k_draft_and_one_target_forward(sv, hf_pair, k):
    draft, target = hf_pair
    draft_lengths = _count_forward_lengths(draft)
    target_lengths = _count_forward_lengths(target)
    try:
        draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0)
        decoder = sv.SpeculativeDecoder(draft_step, target_step, k=k)
        prompt = [40, 41, 42, 43, 44, 45]
        out = decoder.generate(torch.tensor(prompt), max_new=25)
    finally:
        del draft.forward, target.forward
    assert out.tolist() == _target_greedy(target, prompt, 25)
    expected_draft, expected_target = _expected_forward_lengths(decoder.stats.per_round, len(prompt))
    assert target_lengths == expected_target
    assert draft_lengths == expected_draft
    # Never a re-run of the prefix: the target was fed each position at most
    # once per round it was verified in.
    assert sum(target_lengths) == len(prompt) + decoder.stats.drafted + decoder.stats.rounds - 1
    assert draft_step.__self__.cache_rebuilds == 0 and target_step.__self__.cache_rebuilds == 0


@pytest.mark.transformers
def test_hf_negative_control_adapter_without_rollback_diverges(sv, hf_pair):
    class ForgetsToCrop(sv.HFCausalLMStep):
        """Broken: believes it cropped, but leaves the stale K/V in the cache."""

        def _rollback(self, keep):
            self._cached = self._cached[:keep]

    draft, target = hf_pair
    prompt = [40, 41, 42, 43, 44, 45]
    decoder = sv.SpeculativeDecoder(
        ForgetsToCrop(draft, temperature=0).draft_step,
        ForgetsToCrop(target, temperature=0).target_step,
        k=4,
    )
    out = decoder.generate(torch.tensor(prompt), max_new=30)
    assert out.tolist() != _target_greedy(target, prompt, 30)


@pytest.mark.transformers
def test_hf_sampled_with_top_k_1_is_greedy(sv, hf_pair):
    # top_k=1 makes every warped row one-hot at the argmax, so sampled
    # speculative decoding must reproduce greedy decoding exactly.
    draft, target = hf_pair
    gen = torch.Generator().manual_seed(0)
    draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0.7, top_k=1, generator=gen)
    decoder = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=False, generator=gen)
    prompt = [5, 17, 3]
    out = decoder.generate(torch.tensor(prompt), max_new=20)
    assert out.tolist() == _target_greedy(target, prompt, 20)
    assert 0 < decoder.stats.accepted < decoder.stats.drafted


@pytest.mark.transformers
def test_hf_sampled_is_reproducible_and_uses_warped_support(sv, hf_pair):
    draft, target = hf_pair
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(11)
        target_adapter = sv.HFCausalLMStep(target, temperature=0.9, top_k=5, top_p=0.9)
        draft_step, _ = sv.hf_step_pair(draft, target, temperature=0.9, top_k=5, top_p=0.9, generator=gen)
        decoder = sv.SpeculativeDecoder(draft_step, target_adapter.target_step, k=3, greedy=False, generator=gen)
        runs.append(decoder.generate(torch.tensor([5, 17, 3]), max_new=20).tolist())
    assert runs[0] == runs[1]
    # Every emitted token lies in the target's warped support (top-5 at least).
    out = runs[0]
    for i in range(3, len(out)):
        with torch.no_grad():
            logits = target(torch.tensor([out[:i]])).logits[0, -1]
        assert out[i] in torch.topk(logits, 5).indices.tolist()


@pytest.mark.transformers
def test_hf_adapter_rows_are_logits_and_draft_draws_with_sample_draft(sv, hf_pair):
    # Oracle: the models' own forward over the whole sequence, and
    # sample_draft replayed on the returned rows with the same generator seed.
    draft, target = hf_pair
    warping = dict(temperature=0.9, top_k=7, top_p=0.9, min_p=0.05)
    draft_step, target_step = sv.hf_step_pair(draft, target, generator=torch.Generator().manual_seed(3), **warping)
    assert draft_step.__self__.warping == target_step.__self__.warping == sv.LogitsWarping(**warping)
    assert draft_step.__self__.min_p == 0.05
    prompt = torch.tensor([5, 17, 3])
    tokens, rows = draft_step(prompt, 4)
    seq = torch.cat([prompt, tokens]).view(1, -1)
    with torch.no_grad():
        draft_logits = draft(seq).logits[0, len(prompt) - 1 : -1]
        target_logits = target(seq).logits[0, len(prompt) - 1 :]
    assert rows.dtype == torch.float32 and rows.shape == (4, HF_V)
    torch.testing.assert_close(rows, draft_logits, rtol=0, atol=1e-4)
    replay = torch.Generator().manual_seed(3)
    assert tokens.tolist() == [int(sv.sample_draft(rows[i], generator=replay, **warping)) for i in range(4)]
    torch.testing.assert_close(target_step(prompt, tokens), target_logits, rtol=0, atol=1e-4)


@pytest.mark.transformers
def test_hf_sampled_at_temperature_0_is_greedy(sv, hf_pair):
    # hf_step_pair(temperature=0) with greedy=False: sampling at temperature 0
    # is greedy decoding, token for token.
    draft, target = hf_pair
    draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0)
    decoder = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=False)
    out = decoder.generate(torch.tensor([5, 17, 3]), max_new=20)
    assert out.tolist() == _target_greedy(target, [5, 17, 3], 20)
    assert 0 < decoder.stats.accepted < decoder.stats.drafted


@pytest.mark.transformers
def test_hf_sliding_window_cache_rolls_back_or_falls_back_to_rebuilding(sv, monkeypatch):
    pytest.importorskip("transformers")  # absent in the aarch64 emulated run
    # transformers 5's sliding-window layers, past their window, crop back
    # only when they record their past: the adapter turns that on and rolls
    # back without a rebuild (tests/test_sliding_window.py: Gemma 3, O(k)).
    # Without it (as in transformers 4.x) they refuse to crop, and the
    # adapter must rebuild the cache, and stay exact.
    from transformers import MistralConfig, MistralForCausalLM

    def mistral(layers, seed):
        torch.manual_seed(seed)
        config = MistralConfig(
            vocab_size=HF_V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            initializer_range=0.2, sliding_window=6, bos_token_id=None, eos_token_id=None,
            pad_token_id=None,
        )
        return MistralForCausalLM(config).eval()

    target, draft = mistral(2, 0), mistral(1, 1)
    with torch.no_grad():
        target.model.layers[1].mlp.down_proj.weight.mul_(0.3)
    draft.load_state_dict({name: target.state_dict()[name].clone() for name in draft.state_dict()})
    prompt = [5, 17, 3, 9, 9, 1, 2, 3]
    for recorded in (True, False):
        if not recorded:
            monkeypatch.setattr(sv.hf_adapter, "record_past", lambda cache: False)
        draft_step, target_step = sv.hf_step_pair(draft, target, temperature=0)
        decoder = sv.SpeculativeDecoder(draft_step, target_step, k=3)
        out = decoder.generate(torch.tensor(prompt), max_new=20)
        assert out.tolist() == _target_greedy(target, prompt, 20)
        assert 0 < decoder.stats.accepted < decoder.stats.drafted
        if recorded:
            assert target_step.__self__.cache_rebuilds == 0
        else:
            assert target_step.__self__.cache_rebuilds > 0  # the fallback really ran


@pytest.mark.transformers
def test_hf_adapter_argument_checks(sv, hf_pair):
    draft, _ = hf_pair
    with pytest.raises(ValueError, match="temperature"):
        sv.HFCausalLMStep(draft, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        sv.HFCausalLMStep(draft, top_k=-2)
    with pytest.raises(ValueError, match="top_p"):
        sv.HFCausalLMStep(draft, top_p=0.0)
    with pytest.raises(TypeError, match="model must be callable"):
        sv.HFCausalLMStep(object())


# ============================================================================
# The adapter is duck-typed: it works with transformers unimportable
# ============================================================================

_DUCK_SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import torch
    sys.modules["transformers"] = None  # any `import transformers` now fails

    package_dir, name, repo = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = importlib.util.spec_from_file_location(
        name, package_dir + "/__init__.py", submodule_search_locations=[package_dir])
    sv = importlib.util.module_from_spec(spec)
    sys.modules[name] = sv
    spec.loader.exec_module(sv)
    sys.path.insert(0, repo)
    from tests.test_decoder import ToyLM  # imports no transformers either

    V = 11
    weights = torch.randn(V, V, generator=torch.Generator().manual_seed(0))

    def logits_after(tokens):
        # Depends on the whole history: a stale cache changes the result.
        return weights[tokens[-1]] + 0.7 * weights[sum(tokens) % V]

    def noisy_logits_after(tokens):   # a draft that agrees only partly
        return logits_after(tokens) + 2.0 * torch.sin(torch.arange(V) * 1.3 + len(tokens))

    def plain_greedy(prompt, n):
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(torch.argmax(logits_after(seq))))
        return seq

    draft_step, target_step = sv.hf_step_pair(ToyLM(noisy_logits_after), ToyLM(logits_after), temperature=0)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3)
    out = dec.generate(torch.tensor([1, 2]), max_new=40).tolist()
    assert out == plain_greedy([1, 2], 40), (out, plain_greedy([1, 2], 40))
    assert 0 < dec.stats.accepted < dec.stats.drafted, dec.stats
    assert target_step.__self__.cache_rebuilds == 0

    # Sampled, the README form: the decoder reads the adapters' warping.
    gen = torch.Generator().manual_seed(0)
    pair = sv.hf_step_pair(ToyLM(noisy_logits_after), ToyLM(logits_after), temperature=0.8, top_p=0.95,
                           generator=gen)
    sampled = sv.SpeculativeDecoder(*pair, k=3, greedy=False, generator=gen)
    assert sampled.warping == sv.LogitsWarping(0.8, top_p=0.95)
    assert len(sampled.generate(torch.tensor([1, 2]), 30)) == 32

    # A cache without crop: the adapter must rebuild it, and stay exact.
    ToyLM.Cache.crop = property(lambda self: None)
    draft_step, target_step = sv.hf_step_pair(ToyLM(noisy_logits_after), ToyLM(logits_after), temperature=0)
    out = sv.SpeculativeDecoder(draft_step, target_step, k=3).generate(torch.tensor([1, 2]), 25)
    assert out.tolist() == plain_greedy([1, 2], 25)
    assert target_step.__self__.cache_rebuilds > 0
    assert "transformers" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
    print("ok", dec.stats.accepted, dec.stats.drafted)
    """
)


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
def test_adapter_is_duck_typed_without_transformers(sv):
    package_dir = os.path.dirname(sv.__file__)
    result = subprocess.run(
        [sys.executable, "-c", _DUCK_SCRIPT, package_dir, sv.__name__ + "_duck", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")


# ----------------------------------------------------------------------------
# A forward that raises part-way: the adapter rolls its cache back
# ----------------------------------------------------------------------------


class _FaultAfter:
    """A forward hook on one layer that raises once, after the layer has run
    (and so after it extended its slice of the KV cache in place)."""

    def __init__(self, layer, error):
        self.error = error
        self.handle = layer.register_forward_hook(self)

    def __call__(self, module, args, output):
        self.handle.remove()
        raise self.error


def _logits_after_fault(sv, target, layer_index, error, adapter_cls=None):
    """Logits of a call made after a faulted call, and those of a fresh adapter."""
    adapter = (adapter_cls or sv.HFCausalLMStep)(target, temperature=0)
    adapter.target_step(torch.tensor([5, 17, 3, 9]), torch.tensor([11, 12]))
    prefix, proposed = torch.tensor([5, 17, 3, 9, 11, 12, 30]), torch.tensor([31, 32, 33])
    _FaultAfter(target.model.layers[layer_index], error)
    with pytest.raises(type(error)):
        adapter.target_step(prefix, proposed)
    after = adapter.target_step(prefix, proposed)
    fresh = sv.HFCausalLMStep(target, temperature=0).target_step(prefix, proposed)
    return after, fresh


@pytest.mark.parametrize("layer_index, error", [(0, RuntimeError("injected: out of memory")),
                                                (1, KeyboardInterrupt())], ids=["middle", "last"])
@pytest.mark.transformers
def test_hf_cache_rolls_back_when_a_forward_raises(sv, hf_pair, layer_index, error):
    _, target = hf_pair  # two layers: 0 is a middle one, 1 the last
    after, fresh = _logits_after_fault(sv, target, layer_index, error)
    torch.testing.assert_close(after, fresh, rtol=1e-5, atol=1e-5)


@pytest.mark.transformers
def test_hf_negative_control_adapter_without_fault_rollback_is_wrong(sv, hf_pair):
    class KeepsTheCorruptCache(sv.HFCausalLMStep):
        """Broken: leaves the layers that ran extended after a failed forward."""

        def _restore_after_failed_forward(self):
            pass

    _, target = hf_pair
    try:
        after, fresh = _logits_after_fault(sv, target, 0, RuntimeError("injected"), KeepsTheCorruptCache)
    except RuntimeError as exc:  # attention over mismatched cache lengths: also a failure to roll back
        assert "injected" not in str(exc)
        return
    assert not torch.allclose(after, fresh, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Hostile callbacks and arguments (the hardening issue, item 10)
# ----------------------------------------------------------------------------


def _argmax_2_target(calls):
    def target_step(prefix, proposed):
        calls.append(len(proposed))
        rows = torch.zeros(len(proposed) + 1, 3)
        rows[:, 2] = 1.0
        return rows
    return target_step


def test_out_of_range_draft_ids_never_reach_the_target(sv):
    calls = []
    rounds = iter([[2, 2], [0, 7]])  # round 2 proposes id 7 with V = 3 known from round 1
    decoder = sv.SpeculativeDecoder(lambda prefix, k: (torch.tensor(next(rounds)[:k]), None),
                                    _argmax_2_target(calls), k=2)
    with pytest.raises(ValueError, match=r"draft_step.*returned token 7, outside the target's vocabulary \[0, 3\)"):
        decoder.generate(torch.tensor([0]), max_new=8)
    assert calls == [2]  # the target ran for round 1 only


def test_float_token_lists_are_refused_not_truncated(sv):
    decoder = sv.SpeculativeDecoder(lambda prefix, k: ([1.7] * k, None), _argmax_2_target([]), k=2)
    with pytest.raises(TypeError, match=r"draft_step.*tokens that are not integers: 1.7"):
        decoder.generate(torch.tensor([0]), max_new=4)


def test_huge_k_and_max_new_allocate_by_what_the_run_uses(sv):
    draft = lambda prefix, k: (torch.full((k,), 2, dtype=torch.int64), None)  # noqa: E731
    decoder = sv.SpeculativeDecoder(draft, _argmax_2_target([]), k=10**7)
    out = decoder.generate(torch.tensor([0]), max_new=5)
    assert out.tolist() == [0, 2, 2, 2, 2, 2] and len(decoder.stats.histogram) == 5
    # max_new = 2^62 ends at the end-of-sequence id, with no 2^62-slot buffer.
    decoder = sv.SpeculativeDecoder(draft, _argmax_2_target([]), k=3, eos_token_id=2)
    assert decoder.generate(torch.tensor([0]), max_new=2**62).tolist() == [0, 2]
    # ... and a long run past the buffer's first allocation grows it.
    long = sv.SpeculativeDecoder(draft, _argmax_2_target([]), k=7).generate(torch.tensor([0]), max_new=3000)
    assert long.tolist() == [0] + [2] * 3000


@pytest.mark.parametrize("batched", [False, True])
def test_callbacks_see_the_committed_tokens_across_the_buffers_growth(sv, batched):
    """Every prefix a callback sees is prompt + the tokens committed so far, past the output buffer's first
    allocation (1,024 slots: it is regrown twice here), and a prefix a callback kept from round 1 still
    holds its tokens at the end. The oracle is a Python list of the toy target's greedy chain."""
    vocab, prompt = 97, [5, 11]
    successor = lambda t: (7 * t + 3) % vocab  # noqa: E731  -- the target's argmax after token t
    chain = list(prompt)
    while len(chain) < len(prompt) + 3000:
        chain.append(successor(chain[-1]))
    seen, kept = [], []

    def rows_after(tokens):
        rows = torch.zeros(len(tokens), vocab)
        rows[torch.arange(len(tokens)), torch.tensor([successor(t) for t in tokens])] = 1.0
        return rows

    def draft(prefix, k):  # right twice, then wrong: rounds of 3 tokens (2 accepted, the correction)
        seen.append(prefix.tolist())
        if not kept:
            kept.append(prefix)
        last, out = int(prefix[-1]), []
        for i in range(k):
            last = successor(last) if i < 2 else (last + 1) % vocab
            out.append(last)
        return torch.tensor(out, dtype=torch.int64), None

    def target(prefix, proposed):
        seen.append(prefix.tolist())
        return rows_after([int(prefix[-1])] + proposed.tolist())

    if batched:
        decoder = sv.BatchedSpeculativeDecoder(
            lambda prefixes, k, rows: (torch.stack([draft(p, k)[0] for p in prefixes]), None),
            lambda prefixes, proposed, rows: torch.stack([target(p, q) for p, q in zip(prefixes, proposed)]), k=4)
        out = decoder.generate([torch.tensor(prompt)], max_new=3000)[0]
    else:
        out = sv.SpeculativeDecoder(draft, target, k=4).generate(torch.tensor(prompt), max_new=3000)
    assert out.tolist() == chain
    assert len(seen) >= 2000 and all(p == chain[: len(p)] for p in seen)
    assert kept[0].tolist() == prompt


def test_meta_tensors_from_callbacks_are_named(sv):
    meta_tokens = sv.SpeculativeDecoder(lambda prefix, k: (torch.zeros(k, dtype=torch.int64, device="meta"), None),
                                        _argmax_2_target([]), k=2)
    with pytest.raises(ValueError, match=r"draft_step.*returned tokens as a meta tensor"):
        meta_tokens.generate(torch.tensor([0]), max_new=4)
    meta_rows = sv.SpeculativeDecoder(lambda prefix, k: (torch.zeros(k, dtype=torch.int64), None),
                                      lambda prefix, proposed: torch.zeros(len(proposed) + 1, 3, device="meta"), k=2)
    with pytest.raises(ValueError, match=r"target_step.*returned target_probs as a meta tensor"):
        meta_rows.generate(torch.tensor([0]), max_new=4)
