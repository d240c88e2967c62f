"""Sliding-window caches (Gemma 3's local layers) roll back exactly and in O(k) per round in the HF adapters.

A tiny random Gemma 3 (window 8, local and global layers alternating, built
here, no download) decodes well past its window through ``HFCausalLMStep``
and ``HFBatchedCausalLM`` with a draft that proposes a mix of right and wrong
tokens; the output must be plain greedy ``generate()``'s token for token, no
cache may be rebuilt, and the target must be fed only each prompt once and
then ``k + 1`` tokens per round. Negative controls: a crop that removes one
token too few, and the old adapter behaviour (no past recording: the window
cannot roll back and is rebuilt), must each fail those checks.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.transformers, pytest.mark.usefixtures("one_thread")]

V = 61
WINDOW = 8
K = 4


def tiny_gemma3(seed: int = 0, window: int = WINDOW, layers: int = 4):
    transformers = pytest.importorskip("transformers")  # absent in the aarch64 emulated run
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=window,
        sliding_window_pattern=2,  # local, global, local, global
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.Gemma3ForCausalLM(config).eval()
    # Every weight random (N(0, 0.6^2)), and the head untied: a random model with tied embeddings
    # repeats its last token forever, whatever the context, and would hide a wrong window.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.6)
    assert "sliding_attention" in config.layer_types and "full_attention" in config.layer_types
    return model


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3()


def plain_greedy(model, prompt: list, max_new: int) -> list:
    ids = torch.tensor([prompt])
    return model.generate(ids, max_new_tokens=max_new, do_sample=False, min_new_tokens=max_new)[0].tolist()


_WRONG = torch.rand(4096, generator=torch.Generator().manual_seed(1)) < 0.3


def wrong_at(position: int) -> bool:
    """Where the mixed draft proposes a wrong token: a fixed random 30 % of positions."""
    return bool(_WRONG[position])


class MixedDraft:
    """Proposes the reference continuation with a wrong token at ``wrong_at`` positions (greedy: no rows)."""

    def __init__(self, references: list):
        self.references = references

    def tokens(self, b: int, start: int, k: int) -> list:
        ref = self.references[b]
        out = []
        for j in range(start, start + k):
            right = ref[j] if j < len(ref) else 0
            out.append((right + 1) % V if wrong_at(j) else right)
        return out

    def single(self, prefix, k):
        return torch.tensor(self.tokens(0, len(prefix), k), dtype=torch.int64), None

    def batched(self, prefixes, k, rows):
        return torch.tensor([self.tokens(r, len(p), k) for p, r in zip(prefixes, rows)], dtype=torch.int64), None


PROMPT = [5, 17, 3, 9, 9, 1, 2, 3, 40, 41, 7]  # longer than the window: the prefill itself is cut
MAX_NEW = 48  # ~7 windows past it


def run_single(sv, model, prompt=PROMPT, max_new=MAX_NEW, k=K):
    reference = plain_greedy(model, prompt, max_new)
    target = sv.HFCausalLMStep(model, temperature=0)
    decoder = sv.SpeculativeDecoder(MixedDraft([reference]).single, target.target_step, k=k)
    out = decoder.generate(torch.tensor(prompt), max_new=max_new).tolist()
    return out, reference, target, decoder.stats


def single_checks(out, reference, target, stats, prompt=PROMPT) -> list:
    """The failed checks, by name (empty: all hold)."""
    failed = []
    if out != reference:
        failed.append("output")
    if target.cache_rebuilds != 0:
        failed.append("rebuilds")
    # Each prompt once, then k + 1 per round (the first round's k + 1 include the prompt's last token).
    if target.tokens_fed != len(prompt) - 1 + stats.drafted + stats.rounds:
        failed.append("tokens_fed")
    return failed


def test_single_adapter_rolls_back_the_window_exactly_in_o_k(sv, gemma):
    out, reference, target, stats = run_single(sv, gemma)
    assert 0 < stats.accepted < stats.drafted  # the draft was right and wrong
    assert stats.histogram[0] > 0 and stats.histogram[-1] > 0  # full rejections and full acceptances
    assert single_checks(out, reference, target, stats) == []
    # The local layers stay bounded: window - 1 past positions plus at most a round's tokens.
    held = [layer.keys.shape[-2] for layer in sv.hf_adapter.sliding_layers(target._cache)]
    assert held and max(held) <= WINDOW - 1 + K + 1


@pytest.mark.parametrize("prompt", [[5], [5, 17, 3, 9, 9, 1, 2], list(range(1, 9)), list(range(1, 21))])
def test_single_adapter_prompts_around_the_window(sv, gemma, prompt):
    # Prompts shorter than, just under, at and far past the window.
    out, reference, target, stats = run_single(sv, gemma, prompt=prompt, max_new=30)
    assert single_checks(out, reference, target, stats, prompt=prompt) == []


def short_crop(real):
    """A crop that removes one token too few, and says it succeeded."""

    def crop(cache, held, keep):
        if keep + 1 < held:
            real(cache, held, keep + 1)
        return True

    return crop


def test_negative_control_a_crop_one_token_short_fails(sv, gemma, monkeypatch):
    monkeypatch.setattr(sv.hf_adapter, "crop_cache", short_crop(sv.hf_adapter.crop_cache))
    out, reference, target, stats = run_single(sv, gemma)
    assert "output" in single_checks(out, reference, target, stats)


def test_negative_control_without_past_recording_the_window_is_rebuilt(sv, gemma, monkeypatch):
    # The old behaviour: the cache's past is not recorded, so a crop past the window raises and
    # the adapter rebuilds, re-running the prefix: exact, but not O(k).
    monkeypatch.setattr(sv.hf_adapter, "record_past", lambda cache: False)
    out, reference, target, stats = run_single(sv, gemma)
    assert out == reference
    assert set(single_checks(out, reference, target, stats)) == {"rebuilds", "tokens_fed"}


def test_a_crop_reaching_back_past_the_window_rebuilds(sv, gemma):
    # A caller going back into an older prefix than the window holds: detected, rebuilt, still exact.
    target = sv.HFCausalLMStep(gemma, temperature=0)
    seq = torch.tensor(plain_greedy(gemma, PROMPT, 30))
    rows = target.target_step(seq[:-3], seq[-3:])
    again = target.target_step(seq[:5], seq[5:9])
    with torch.no_grad():
        full = gemma(seq.view(1, -1)).logits[0]
    torch.testing.assert_close(rows, full[-4:], rtol=0, atol=1e-4)
    torch.testing.assert_close(again, full[4:9], rtol=0, atol=1e-4)
    assert target.cache_rebuilds == 1


# ----------------------------------------------------------------------------
# The batched adapter: holes in the cache, windows counted per row
# ----------------------------------------------------------------------------

BATCH_PROMPTS = [PROMPT, [5], [3, 3, 3, 4, 4, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]


def run_batched(sv, model, prompts=BATCH_PROMPTS, max_new=MAX_NEW, k=K):
    references = [plain_greedy(model, p, max_new) for p in prompts]
    target = sv.HFBatchedCausalLM(model, temperature=0)
    calls = []

    def counted_target(prefixes, proposed, rows):
        calls.append((len(rows), proposed.shape[1]))
        return target.target_step(prefixes, proposed, rows)

    decoder = sv.BatchedSpeculativeDecoder(MixedDraft(references).batched, counted_target, k=k)
    outs = [o.tolist() for o in decoder.generate([torch.tensor(p) for p in prompts], max_new=max_new)]
    return outs, references, target, decoder.stats, calls


def batched_checks(outs, references, target, calls, prompts=BATCH_PROMPTS) -> list:
    failed = []
    if outs != references:
        failed.append("output")
    if target.cache_rebuilds != 0:
        failed.append("rebuilds")
    # Each prompt once, then per sequence and round the last committed token and the k proposals.
    (n_first, k_first), later = calls[0], calls[1:]
    if target.tokens_fed != sum(map(len, prompts)) + n_first * k_first + sum(n * (k + 1) for n, k in later):
        failed.append("tokens_fed")
    return failed


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_batched_adapter_counts_windows_per_row_exactly(sv, attn):
    model = tiny_gemma3()
    model.config._attn_implementation = attn
    outs, references, target, stats, calls = run_batched(sv, model)
    assert 0 < stats.accepted < stats.drafted
    assert target.holes > 0 or stats.histogram[0] > 0  # rows went out of step: holes were made
    assert batched_checks(outs, references, target, calls) == []


def test_negative_control_batched_windows_over_slots_fail(sv, gemma, monkeypatch):
    # Windows kept whole, but the model's own masks: windows counted over slots, holes included.
    monkeypatch.setattr(sv.hf_batched.HFBatchedCausalLM, "_window_masks", lambda self, mask, positions: mask)
    outs, references, target, stats, calls = run_batched(sv, gemma)
    assert batched_checks(outs, references, target, calls) == ["output"]


def test_negative_control_batched_old_behaviour_rebuilds(sv, gemma, monkeypatch):
    # The old adapter: the model's windows, which cannot crop back: rebuilt every round, not O(k).
    monkeypatch.setattr(sv.hf_batched.HFBatchedCausalLM, "_unbound_windows", lambda self: None)
    monkeypatch.setattr(sv.hf_batched.HFBatchedCausalLM, "_window_masks", lambda self, mask, positions: mask)
    outs, references, target, stats, calls = run_batched(sv, gemma)
    assert {"rebuilds", "tokens_fed"} <= set(batched_checks(outs, references, target, calls))


def test_negative_control_batched_crop_one_short_fails(sv, gemma, monkeypatch):
    monkeypatch.setattr(sv.hf_batched, "crop_cache", short_crop(sv.hf_batched.crop_cache))
    try:
        outs, references, target, stats, calls = run_batched(sv, gemma)
    except RuntimeError as error:  # the masks no longer fit the cache: caught loudly, also a failure
        assert "size" in str(error)
        return
    assert "output" in batched_checks(outs, references, target, calls)
