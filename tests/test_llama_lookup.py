"""Prompt lookup on llama.cpp's forwards: ``sv.PromptLookupDraft()`` as the draft,
``LlamaCppStep(...).target_step`` as the target, on the shipped f32 GGUF pair (``make gguf``).

* ``target_step`` with 0 proposed tokens is a plain step: one row, the
  one-token eval's row, handed over as a view of llama.cpp's own logits
  buffer (no copy hides in the adapter's timing);
* greedy prompt-lookup decoding (fixed k, ``k="auto"``, ``k=0``) equals
  llama.cpp's own plain greedy decoding (``Llama.generate``) token for
  token, on prompts where lookup both proposes (rounds of several tokens,
  some rejected) and finds nothing (rounds of 0 proposals);
* negative control: a target whose rows are shifted by one position
  makes the same comparison fail.

Marked ``llama_cpp`` (the emulated aarch64 run builds no llama.cpp).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

pytestmark = pytest.mark.llama_cpp

# Code that repeats itself (lookup proposes long runs) and code that does not
# (rounds with no match: plain steps), in the shipped tokenizer's language.
PROMPTS = [
    "def total_price(items, tax_rate):\n    total = 0\n    for item in items:\n"
    "        if item.quantity > 0:\n            total = total + item.price * item.quantity\n"
    "    return round(total, 2)\n\n\ndef order_total(items, tax_rate):\n",
    "class Queue:\n    def __init__(self, maxsize=0):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
]
MAX_NEW = 48


@pytest.fixture(scope="module")
def llamas():
    """``(target for ours, target for llama.cpp's own plain decoding)``: two contexts on the f32 target."""
    from integrations.llama_cpp.pair import ensure_gguf, open_llama

    gg = ensure_gguf()
    return open_llama(gg / "target.gguf"), open_llama(gg / "target.gguf")


@pytest.fixture(scope="module")
def prompts(llamas):
    target, _ = llamas
    return [target.tokenize(t.encode(), add_bos=False, special=False) for t in PROMPTS]


@pytest.fixture(scope="module")
def plain(llamas, prompts):
    """llama.cpp's own greedy decoding of each prompt (``Llama.generate``, its sampler chain)."""
    from integrations.llama_cpp.pair import generate_plain

    return [generate_plain(llamas[1], p, MAX_NEW) for p in prompts]


def _step(sv, llama):
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    return LlamaCppStep(llama, temperature=0, sv=sv)


def test_zero_proposed_is_a_plain_step_and_no_copy(sv, llamas, prompts):
    import llama_cpp

    target, _ = llamas
    step = _step(sv, target)
    prompt = torch.tensor(prompts[0])
    step._feed(prompts[0][:-1], rows=1)  # the cache holds the prefix: the plain step feeds one token
    calls, fed = step.decode_calls, step.tokens_fed
    rows = step.target_step(prompt, torch.empty(0, dtype=torch.int64))
    assert rows.shape == (1, step.n_vocab) and rows.dtype == torch.float32
    assert (step.decode_calls, step.tokens_fed) == (calls + 1, fed + 1)
    # A view of llama.cpp's logits buffer: the verifier reads what llama_decode wrote.
    assert rows.data_ptr() == ctypes.addressof(llama_cpp.llama_get_logits(step.ctx).contents)
    got = rows[0].clone()
    # The same one-token eval again after a rollback: the same row, bit for bit.
    step._rollback(len(prompts[0]) - 1)
    ref = step._feed(prompts[0][-1:], rows=1)[0]
    assert torch.equal(got, ref)
    # With 3 proposals: 4 rows from ONE eval of 4 tokens (the last committed one and the proposals).
    calls = step.decode_calls
    four = step.target_step(prompt, torch.tensor([5, 6, 7]))
    assert four.shape == (4, step.n_vocab) and step.decode_calls == calls + 1
    assert torch.allclose(four[0], got, atol=1e-3)  # the shipped f32 pair: batch-invariant to 1e-3


@pytest.mark.parametrize("k", [0, 1, 4, 8, "auto"])
def test_greedy_lookup_equals_llama_cpp_greedy(sv, llamas, prompts, plain, k):
    target, _ = llamas
    step = _step(sv, target)
    rounds_empty = rounds_long = rejected = 0
    for prompt, ref in zip(prompts, plain):
        kw = dict(k_max=8) if k == "auto" else {}
        dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), step.target_step, k=k, greedy=True, **kw)
        out = dec.generate(torch.tensor(prompt), MAX_NEW).tolist()[len(prompt):]
        assert out == ref, f"k={k}: differs from llama.cpp's greedy at {next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)}"
        per_round = dec.stats.per_round
        rounds_empty += sum(1 for d, _ in per_round if d == 0)
        rounds_long += sum(1 for d, _ in per_round if d >= 2)
        rejected += sum(1 for d, a in per_round if a < d)
    assert rounds_empty > 0  # rounds with no match ran as plain steps
    if k == 0:
        assert rounds_long == 0 and step.decode_calls > 0
    elif k != 1:
        # Not vacuous: lookup proposed runs of several tokens, and some were rejected.
        assert rounds_long > 0 and rejected > 0


def test_greedy_lookup_negative_control(sv, llamas, prompts, plain):
    """A target whose rows are off by one position: the comparison above must catch it."""
    target, _ = llamas
    step = _step(sv, target)

    def shifted(prefix, proposed):
        rows = step.target_step(prefix[:-1], torch.cat([prefix[-1:], proposed])[:-1]) if len(prefix) > 1 else None
        return rows if rows is not None else step.target_step(prefix, proposed)

    dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), shifted, k=4, greedy=True)
    outs = [dec.generate(torch.tensor(p), MAX_NEW).tolist()[len(p):] for p in prompts]
    assert outs != plain


# ----------------------------------------------------------------------------
# The batch-invariance check (integrations/llama_cpp/invariance.py)
# ----------------------------------------------------------------------------


def test_invariance_check_counts_every_difference(sv, llamas, prompts):
    """On the f32 pair: batched and one-token logits agree to 1e-2 and greedy lookup never leaves the
    plain stream. Negative control: a target whose multi-row evals favour another token at their
    second row is caught at every such position, with gaps no small deviation explains."""
    from integrations.llama_cpp import invariance

    target, _ = llamas
    step = _step(sv, target)
    plain, gaps = invariance.plain_greedy(step, prompts[0], 24)
    d = invariance.deviation(step, prompts[0], plain, n=5)
    dev = d["max"]
    assert 0 <= d["gap_max"] <= 2 * dev < 2e-2 and d["std"] > 0.1 and d["positions"] == 20
    assert invariance.differences(sv, step, prompts[0], plain, gaps, 4) == []

    class Skewed:
        """``step`` with row 1 of every eval of 2+ positions pushed to one token (what lookup proposes loses)."""

        def __init__(self, step):
            self.step = step

        def target_step(self, prefix, proposed):
            rows = step.target_step(prefix, proposed)
            if len(proposed) >= 1:
                rows = rows.clone()
                rows[1, 3] = rows[1].max() + 50.0
            return rows

    found = invariance.differences(sv, Skewed(step), prompts[0], plain, gaps, 4)
    assert found, "a skewed target must leave the plain stream"
    assert all(0 <= pos < len(plain) for pos, _ in found)
    assert any(gap > 2 * dev for _, gap in found)  # flagged: not explained by the measured deviation
