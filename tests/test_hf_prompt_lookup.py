"""``generate(..., custom_generate=..., prompt_lookup_num_tokens=k)``: prompt lookup for batches.

transformers' own prompt lookup refuses ``B > 1``; this method drafts with the
kernel's ``PromptLookupDraft`` (no draft model) and verifies on the batched
adapter. Shown, against which oracle:

* greedy, on batches of input-grounded prompts of different lengths (the
  shipped target; a tiny random Gemma 3 whose sliding window, 8, the run goes
  far past): every row is its prompt's own unbatched ``generate()``
  (near-ties allowed and counted, as in ``tests/test_hf_generate.py``; none
  for Gemma), and lookup both hits and misses;
* transformers' own prompt lookup raises on the same batch;
* sampled runs follow the seed and stay in the warped support;
* bad input (both an assistant and prompt lookup, k < 1, an n-gram size < 1)
  raises a ``ValueError`` naming it.
"""

from __future__ import annotations

import pytest
import torch

from examples import e2e, hf_generate
from tests.test_hf_generate import MAX_NEW, _check_rows

pytestmark = [pytest.mark.transformers, pytest.mark.usefixtures("one_thread")]

# Code that repeats itself, a prompt that restates its own start, and one with little to copy.
GROUNDED = [
    e2e.BENCH_PROMPTS[0] + "\n\n" + e2e.BENCH_PROMPTS[0],
    hf_generate.NOVEL_PROMPTS[0] + "\n" + hf_generate.NOVEL_PROMPTS[0],
    e2e.BENCH_PROMPTS[1],
]


@pytest.fixture(scope="module")
def hf(pair):
    hf_generate.use_local_kernel()
    tokenizer, _, target = pair
    tokenizer.padding_side = "left"
    return tokenizer, target


def lookup(target, batch, **kwargs):
    return target.generate(**batch, custom_generate=hf_generate.INTEGRATION, trust_remote_code=True, **kwargs)


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_rows_equal_their_own_generate(hf, k):
    tokenizer, target = hf
    batch = tokenizer(GROUNDED, return_tensors="pt", padding=True)
    stats = []
    out = lookup(target, batch, max_new_tokens=MAX_NEW, do_sample=False, prompt_lookup_num_tokens=k,
                 decode_stats=stats)
    assert out.shape == (len(GROUNDED), batch.input_ids.shape[1] + MAX_NEW)
    ties = _check_rows(target, tokenizer, GROUNDED, out, batch.input_ids.shape[1],
                       target.generation_config.pad_token_id)
    print(f"\nk={k}: {ties} near-tie rows; {stats[0].accepted} of {stats[0].drafted} proposed tokens accepted "
          f"over {stats[0].rounds} rounds")
    assert 0 < stats[0].accepted < stats[0].drafted  # lookup hit and missed
    assert stats[0].drafted < k * stats[0].rounds  # some rounds found nothing (or less than k) to propose


def test_transformers_own_prompt_lookup_refuses_the_batch(hf):
    tokenizer, target = hf
    batch = tokenizer(GROUNDED, return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="batch_size"):
        target.generate(**batch, max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=3)


def test_sliding_window_model_batches_exactly(sv):
    from tests.test_sliding_window import plain_greedy, tiny_gemma3

    model = tiny_gemma3()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    base = [5, 17, 3, 9, 9, 1, 2, 3, 40, 41]
    prompts = [base + base, [7, 8, 7, 8, 7], base[:4] + [22, 23] + base[:4]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # no prompt holds id 0
    stats = []
    out = model.generate(input_ids=ids, attention_mask=(ids != 0).long(), custom_generate=hf_generate.INTEGRATION,
                         trust_remote_code=True, max_new_tokens=40, do_sample=False, prompt_lookup_num_tokens=4,
                         decode_stats=stats)
    for b, prompt in enumerate(prompts):
        assert out[b, width:].tolist() == plain_greedy(model, prompt, 40)[len(prompt) :], b
    assert 0 < stats[0].accepted < stats[0].drafted


@torch.no_grad()
def test_sampled_runs_follow_the_seed_and_the_warped_support(hf):
    tokenizer, target = hf
    batch = tokenizer(GROUNDED, return_tensors="pt", padding=True)
    outs, stats = [], []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outs.append(lookup(target, batch, max_new_tokens=16, do_sample=True, temperature=0.8, top_k=3,
                           prompt_lookup_num_tokens=3, decode_stats=stats))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    assert stats[0].drafted > 0
    width, mask = batch.input_ids.shape[1], batch.attention_mask.bool()
    for b, row in enumerate(outs[0]):
        seq = row[:width][mask[b]].tolist() + row[width:].tolist()
        start = int(mask[b].sum())
        logits = target(torch.tensor([seq])).logits[0]
        for i in range(start, len(seq)):
            assert seq[i] in torch.topk(logits[i - 1], 3).indices.tolist(), (b, i)


def test_auto_k_measures_then_speculates_and_the_next_call_starts_from_the_curve(hf):
    # prompt_lookup_num_tokens="auto": the kernel's k="auto". A fixed k drafts from the first round; auto first
    # measures plain steps (c(1), 3 samples, no prediction), then chooses. The curve is the model's and kept: a
    # later call predicts from its first round. (max_matching_ngram_size=4: an AutoCost no other test uses.)
    # Greedy output is each row's own generate()'s either way.
    tokenizer, target = hf
    batch = tokenizer(GROUNDED, return_tensors="pt", padding=True)
    stats = []
    short = [lookup(target, batch, max_new_tokens=3, do_sample=False, prompt_lookup_num_tokens="auto",
                    max_matching_ngram_size=4, decode_stats=stats) for _ in range(2)]
    out = lookup(target, batch, max_new_tokens=MAX_NEW, do_sample=False, prompt_lookup_num_tokens="auto",
                 max_matching_ngram_size=4, decode_stats=stats)
    print(f"\nk per round: {[s.k_per_round for s in stats]}")
    assert stats[0].k_per_round == [0, 0, 0] and stats[0].predicted_seconds == 0.0  # cold: measuring c(1)
    assert stats[1].predicted_seconds > 0.0  # warm: its first round already chosen from the curve
    _check_rows(target, tokenizer, GROUNDED, out, batch.input_ids.shape[1], target.generation_config.pad_token_id)
    assert torch.equal(short[0], short[1]) and torch.equal(short[0], out[:, : short[0].shape[1]])


def test_auto_matches_up_to_three_tokens_a_fixed_k_two_unless_told(hf):
    # "auto" drafts with the kernel's PromptLookupDraft default (3-token n-grams: its figures are measured so);
    # a fixed k keeps transformers' max_matching_ngram_size default of 2; a value given always wins.
    from integrations.transformers.custom_generate.generation_options import resolve

    tokenizer, target = hf
    ids = tokenizer(GROUNDED[:1], return_tensors="pt").input_ids

    def ngram(**kwargs):
        return resolve(target, None, ids, None, None, {}, dict(do_sample=False, max_new_tokens=4, **kwargs)).max_ngram

    assert ngram(prompt_lookup_num_tokens="auto") == 3
    assert ngram(prompt_lookup_num_tokens=5) == 2
    assert ngram(prompt_lookup_num_tokens="auto", max_matching_ngram_size=2) == 2
    assert ngram(prompt_lookup_num_tokens=5, max_matching_ngram_size=4) == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens must be an int >= 1"),
    (dict(prompt_lookup_num_tokens="fast"), 'prompt_lookup_num_tokens must be an int >= 1 .* or "auto"'),
    (dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=0), "max_matching_ngram_size must be an int >= 1"),
    (dict(), "assistant_model is required"),
])
def test_bad_lookup_options_are_named(hf, kwargs, match):
    tokenizer, target = hf
    batch = tokenizer(GROUNDED[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match=match):
        lookup(target, batch, max_new_tokens=4, do_sample=False, **kwargs)


def test_an_assistant_and_prompt_lookup_together_are_refused(hf, pair):
    tokenizer, target = hf
    batch = tokenizer(GROUNDED[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="not both"):
        lookup(target, batch, assistant_model=pair[1], max_new_tokens=4, do_sample=False,
               prompt_lookup_num_tokens=3)
