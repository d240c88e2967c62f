"""``integrations/transformers/custom_generate/lean_llama.py``: the draft's lean runtime computes transformers' Llama forward.

Oracles: the shipped models' own transformers forward, (1) over the whole
sequence at once, against the lean forward run the way one-sequence decoding
runs it -- a prefill, one-token steps, a multi-token step, a crop and a
re-feed; (2) through the kernel's batched adapter (``HFBatchedCausalLM``),
the same ragged rounds driven on both -- left-padded prompts, rejected slots
masked out as holes, per-row positions, a row leaving the batch. The logits
must match to float32 rounding (``ATOL``; the differences come from summation
order only). Controls must fail the same comparisons: rotary tables
disturbed, and the batched mask ignored. Bad calls raise errors that name the
rule.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
from examples import e2e
from integrations.transformers.custom_generate import lean_llama
from integrations.transformers.custom_generate.lean_llama import LeanCache, LeanLlama, lean_for

# Logits are O(10); float32 reordering moves them by ~1e-5 at most here
# (measured max 6e-6 on both models).
ATOL = 1e-4


# `pair` (the shipped models) and `one_thread` come from conftest.py.
pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 4096, (1, n), generator=torch.Generator().manual_seed(seed))


def _lean_logits_as_decoding_runs_it(lean: LeanLlama, ids: torch.Tensor) -> torch.Tensor:
    """Logits for every position of ``ids`` [1, 40], fed in the pieces a decode feeds."""
    out = lean(ids[:, :24])                                       # prefill
    cache, rows = out.past_key_values, [out.logits]
    for i in range(24, 27):                                       # one-token steps
        out = lean(ids[:, i : i + 1], past_key_values=cache)
        rows.append(out.logits)
    out = lean(ids[:, 27:33], past_key_values=cache)              # a (k+1)-token step
    rows.append(out.logits[:, :3])                                # keep 27..29
    cache.crop(-3)                                                # reject 30..32
    assert cache.get_seq_length() == 30
    out = lean(ids[:, 30:40], past_key_values=cache)              # re-feed after the crop
    rows.append(out.logits)
    return torch.cat(rows, dim=1)


@pytest.mark.transformers
@pytest.mark.parametrize("name", ["draft", "target"])
def test_logits_match_transformers(pair, name):
    _, draft, target = pair
    model = draft if name == "draft" else target
    ids = _tokens(40)
    with torch.inference_mode():
        expected = model(ids).logits
        got = _lean_logits_as_decoding_runs_it(LeanLlama(model), ids)
    diff = float((got - expected).abs().max())
    assert got.shape == expected.shape
    assert diff < ATOL, f"{name}: lean logits differ from transformers' by {diff:.3g} (tolerance {ATOL})"
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.transformers
def test_disturbed_rotary_fails_the_comparison(pair):
    # Negative control: positions off by one in the rotary tables.
    _, draft, _ = pair
    lean = LeanLlama(draft)
    lean.cos, lean.sin = lean.cos.roll(1, 0), lean.sin.roll(1, 0)
    ids = _tokens(40)
    with torch.inference_mode():
        diff = float((_lean_logits_as_decoding_runs_it(lean, ids) - draft(ids).logits).abs().max())
    assert diff > 100 * ATOL, f"a disturbed rotary table stayed within {diff:.3g}"


@pytest.mark.transformers
def test_grouped_query_attention_matches_transformers():
    # The shipped models have as many kv heads as heads; the GQA branch is
    # checked on a small random model with 4 heads sharing 2 kv heads.
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    ids = _tokens(40, seed=1)
    with torch.inference_mode():
        diff = float((_lean_logits_as_decoding_runs_it(LeanLlama(model), ids) - model(ids).logits).abs().max())
    assert diff < ATOL, diff


def _ragged_rounds(sv, model, rounds: int = 6) -> list:
    """The draft's rows over ragged rounds of a batch of 3, as ``HFBatchedCausalLM`` feeds ``model``.

    Teacher-forced, so both runtimes see the same prefixes whatever they
    propose: left-padded prompts of 7, 3 and 12 tokens; each round every row
    accepts a different number of its 4 proposals (holes in the cache) and
    gets one token more; after round 3 the middle row leaves the batch.
    """
    g = torch.Generator().manual_seed(5)
    prefixes = [torch.randint(1, 4096, (n,), generator=g) for n in (7, 3, 12)]
    rows = [0, 1, 2]
    adapter = sv.HFBatchedCausalLM(model, temperature=1.0, generator=torch.Generator().manual_seed(1))
    got = []
    for r in range(rounds):
        proposed, logits = adapter.draft_step(prefixes, 4, rows)
        got.append(logits)
        prefixes = [torch.cat([p, proposed[b, : (r + b) % 5], torch.randint(1, 4096, (1,), generator=g)])
                    for b, p in enumerate(prefixes)]
        if r == 3:
            prefixes, rows = [prefixes[0], prefixes[2]], [0, 2]
    assert adapter.holes > 0  # the scheme's masked slots were exercised
    return got


@pytest.mark.transformers
@pytest.mark.parametrize("name", ["draft", "target"])
def test_batched_rounds_with_holes_match_transformers(sv, pair, name):
    _, draft, target = pair
    model = draft if name == "draft" else target
    expected, got = _ragged_rounds(sv, model), _ragged_rounds(sv, LeanLlama(model))
    diff = max(float((a - b).abs().max()) for a, b in zip(expected, got))
    assert diff < ATOL, f"{name}: batched lean logits differ from transformers' by {diff:.3g}"


@pytest.mark.transformers
def test_ignoring_the_mask_fails_the_batched_comparison(sv, pair, monkeypatch):
    # Negative control: a lean forward that attends to holes (the mask dropped).
    _, draft, _ = pair
    expected = _ragged_rounds(sv, draft)
    real = lean_llama._attention_mask
    monkeypatch.setattr(lean_llama, "_attention_mask", lambda mask, width, start, end: real(None, width, start, end))
    got = _ragged_rounds(sv, LeanLlama(draft))
    diff = max(float((a - b).abs().max()) for a, b in zip(expected, got))
    assert diff > 100 * ATOL, f"a lean forward blind to holes stayed within {diff:.3g}"


@pytest.mark.transformers
def test_lean_for_is_made_again_when_the_weights_change():
    # One copy per model while its weights stand; a weight written in place
    # (training, a LoRA merge) makes a new copy that computes the new function.
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=48, max_position_embeddings=64)).eval()
    first = lean_for(model)
    assert lean_for(model) is first
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    second = lean_for(model)
    assert second is not first
    ids = _tokens(5)
    with torch.inference_mode():
        assert float((second(ids).logits - model(ids).logits).abs().max()) < ATOL


@pytest.mark.transformers
def test_drives_speculative_greedy_to_the_plain_text(sv, pair):
    # The draft runtime the demo uses, through the kernel's decoder: the text
    # is the target's plain greedy text, and the draft is accepted.
    tokenizer, draft, target = pair
    prompt = tokenizer("def parse(text):\n", return_tensors="pt").input_ids[0]
    plain = e2e.plain_decode(target, prompt, 40)
    spec, stats = e2e.speculative_decode(sv, LeanLlama(draft), target, prompt, 40, 4, greedy=True)
    assert torch.equal(spec, plain)
    assert stats.accepted > 0


# ============================================================================
# Bad calls
# ============================================================================


@pytest.mark.transformers
def test_positions_beyond_the_table_are_refused(pair):
    lean = LeanLlama(pair[1])
    cache = lean(_tokens(lean.max_len - 2)).past_key_values
    with pytest.raises(ValueError, match="exceed max_position_embeddings"):
        lean(_tokens(3), past_key_values=cache)
    assert cache.get_seq_length() == lean.max_len - 2  # the refused call changed nothing


@pytest.mark.transformers
def test_foreign_cache_is_refused(pair):
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="past_key_values must be a LeanCache"):
        LeanLlama(pair[1])(_tokens(2), past_key_values=DynamicCache())


@pytest.mark.transformers
def test_bad_shapes_are_refused(pair):
    lean = LeanLlama(pair[1])
    cache = lean(_tokens(4).repeat(2, 1)).past_key_values  # 2 rows, 4 slots
    ids = _tokens(2).repeat(2, 1)
    with pytest.raises(ValueError, match=r"input_ids must be a \[n, W\] tensor"):
        lean(_tokens(8)[0])
    with pytest.raises(ValueError, match=r"input_ids has 1 rows and the cache 2"):
        lean(_tokens(2), past_key_values=cache)
    with pytest.raises(ValueError, match=r"attention_mask must be \[n, cache \+ W\] = \[2, 6\], got \(2, 5\)"):
        lean(ids, attention_mask=torch.ones(2, 5, dtype=torch.int64), past_key_values=cache)
    with pytest.raises(ValueError, match=r"position_ids must be \[n, W\] = \[2, 2\], got \(2, 3\)"):
        lean(ids, position_ids=torch.zeros(2, 3, dtype=torch.int64), past_key_values=cache)
    with pytest.raises(ValueError, match=r"position_ids outside \[0, max_position_embeddings"):
        lean(ids, position_ids=torch.full((2, 2), lean.max_len), past_key_values=cache)
    with pytest.raises(IndexError, match=r"batch_select_indices: rows \[2\] outside \[0, 2\)"):
        cache.batch_select_indices([2])
    assert cache.get_seq_length() == 4 and cache.batch == 2  # the refused calls changed nothing


@pytest.mark.parametrize("n", [-6, 6])
def test_crop_outside_the_cache_is_refused(n):
    cache = LeanCache(layers=1, batch=1, kv_heads=1, capacity=8, head_dim=2)
    cache.length = 5
    with pytest.raises(ValueError, match=r"keep must lie in \[0, 5\]"):
        cache.crop(n)
    cache.crop(-2)
    assert cache.get_seq_length() == 3
    cache.crop(1)
    assert cache.get_seq_length() == 1


@pytest.mark.transformers
def test_non_llama_model_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(ValueError, match="LeanLlama runs Llama models"):
        LeanLlama(model)
