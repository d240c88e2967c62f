"""transformers models with the head in the op: ``HFCausalLMStep`` / ``HFBatchedCausalLM`` with ``hidden=True``.

* ``HiddenStatesLM``'s rows through its head are the model's logits (the head's
  fixed-order float32 dot against torch's matmul: rounding apart), for the
  shipped target and a tiny random Gemma 3 with sliding-window layers;
* greedy prompt-lookup decoding with ``hidden=True`` (fixed k, ``k="auto"``)
  equals plain greedy decoding on the same head (``k=0``: one token per
  forward through ``sample_hidden``'s argmax) token for token, past the
  sliding window, single and batched (left-padded prompts); and equals the
  model's own ``generate()`` except where its top-2 logits are within the
  two functions' rounding (counted: none here);
* a target whose hidden rows are shifted by one position is the negative
  control; misuse is named.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_sliding_window import plain_greedy, tiny_gemma3

pytestmark = [pytest.mark.transformers, pytest.mark.usefixtures("one_thread")]

# Repeats (lookup proposes) and fresh stretches (it finds nothing), in the tiny vocabulary.
BASE = [5, 17, 3, 9, 9, 1, 2, 3, 40, 41]
PROMPTS = [BASE + BASE, [7, 8, 7, 8, 7], BASE[:4] + [22, 23] + BASE[:4]]
MAX_NEW = 30  # past the tiny Gemma's window of 8


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3(seed=3)


def _head_logits(sv, head, hidden):
    return sv.ops.hidden_logits(hidden, head.weight, head.bias, head.format_code, head.dim)


@pytest.mark.parametrize("which", ["gemma", "shipped"])
def test_hidden_rows_through_the_head_are_the_models_logits(sv, gemma, pair, which):
    model = gemma if which == "gemma" else pair[2]
    wrapped = sv.HiddenStatesLM(model)
    ids = torch.tensor([PROMPTS[0]]) if which == "gemma" else pair[0]("def main(argv):\n", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        hidden = wrapped(ids).logits[0].float()
    ours = _head_logits(sv, wrapped.head, hidden)
    assert ours.shape == logits.shape
    assert (ours - logits).abs().max() <= 1e-4 * logits.abs().max()
    assert torch.equal(ours.argmax(-1), logits.argmax(-1))


def _plain_on_head(sv, step, prompt, max_new):
    dec = sv.SpeculativeDecoder(lambda p, k: (torch.empty(0, dtype=torch.int64), None), step.target_step, k=0)
    return dec.generate(torch.tensor(prompt), max_new).tolist()[len(prompt):]


@pytest.mark.parametrize("k", [3, "auto"])
def test_greedy_lookup_with_hidden_equals_plain_greedy_on_the_head(sv, gemma, k):
    step = sv.HFCausalLMStep(gemma, temperature=0, hidden=True)
    for prompt in PROMPTS:
        plain = _plain_on_head(sv, step, prompt, MAX_NEW)
        dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), step.target_step, k=k)
        assert dec.head is step.head
        step.reset()  # a crop back past the window (to the prompt, from the plain run's end) would rebuild
        out = dec.generate(torch.tensor(prompt), MAX_NEW).tolist()[len(prompt):]
        assert step.cache_rebuilds == 0  # sliding layers rolled back in place, round after round
        assert out == plain, prompt
        assert out == plain_greedy(gemma, prompt, MAX_NEW)[len(prompt):]  # no near-tie here: generate() agrees
        if k == 3 and prompt == PROMPTS[0]:
            assert 0 < dec.stats.accepted < dec.stats.drafted  # lookup hit and missed

    # Negative control: hidden rows shifted by one position.
    def shifted(prefix, proposed):
        rows = step.target_step(prefix, proposed)
        return torch.cat([rows[1:], rows[-1:]]) if len(rows) > 1 else rows

    bad = sv.SpeculativeDecoder(sv.PromptLookupDraft(), shifted, k=4, head=step.head)
    assert bad.generate(torch.tensor(PROMPTS[0]), MAX_NEW).tolist()[len(PROMPTS[0]):] != \
        _plain_on_head(sv, step, PROMPTS[0], MAX_NEW)


def test_batched_lookup_with_hidden_equals_plain_greedy_on_the_head(sv, gemma):
    single = sv.HFCausalLMStep(gemma, temperature=0, hidden=True)
    plains = [_plain_on_head(sv, single, p, MAX_NEW) for p in PROMPTS]
    target = sv.HFBatchedCausalLM(gemma, temperature=0, hidden=True)
    dec = sv.BatchedSpeculativeDecoder(sv.PromptLookupDraft().batched, target.target_step, k=4)
    assert dec.head is target.head
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])  # no prompt holds id 0
    outs = dec.generate(ids, MAX_NEW, attention_mask=(ids != 0).long())
    for b, (out, prompt) in enumerate(zip(outs, PROMPTS)):
        assert out.tolist()[len(prompt):] == plains[b], b
    assert 0 < dec.stats.accepted < dec.stats.drafted


def test_misuse_is_named(sv, gemma):
    step = sv.HFCausalLMStep(gemma, temperature=0, hidden=True)
    with pytest.raises(ValueError, match="is a target"):
        step.draft_step(torch.tensor([1, 2]), 2)
    batched = sv.HFBatchedCausalLM(gemma, temperature=0, hidden=True)
    with pytest.raises(ValueError, match="is a target"):
        batched.draft_step([torch.tensor([1, 2])], 2, [0])
    with pytest.raises(ValueError, match="head= is for hidden=True"):
        sv.HFCausalLMStep(gemma, head=step.head)
    with pytest.raises(TypeError, match="head must be an LMHead"):
        sv.HFCausalLMStep(gemma, hidden=True, head=torch.zeros(3, 3))
    with pytest.raises(TypeError, match="get_decoder"):
        sv.HFCausalLMStep(lambda ids, **kw: None, hidden=True)


def test_custom_generate_with_lm_head_in_op(sv, gemma, pair):
    from examples import hf_generate
    from tests.test_hf_generate import MAX_NEW as PAIR_NEW, PROMPTS as PAIR_PROMPTS, _check_rows

    hf_generate.use_local_kernel()
    # Prompt lookup, a batch of 3 on the sliding-window model: each row is plain greedy on the head.
    single = sv.HFCausalLMStep(gemma, temperature=0, hidden=True)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    gemma.generation_config.pad_token_id, gemma.generation_config.eos_token_id = 0, None
    stats = []
    out = gemma.generate(input_ids=ids, attention_mask=(ids != 0).long(), custom_generate=hf_generate.INTEGRATION,
                         trust_remote_code=True, max_new_tokens=MAX_NEW, do_sample=False,
                         prompt_lookup_num_tokens=4, lm_head_in_op=True, decode_stats=stats)
    for b, prompt in enumerate(PROMPTS):
        assert out[b, width:].tolist() == _plain_on_head(sv, single, prompt, MAX_NEW), b
    assert 0 < stats[0].accepted < stats[0].drafted
    # The shipped pair with its draft model: each row is its own generate() up to near-ties.
    tokenizer, draft, target = pair
    tokenizer.padding_side = "left"
    batch = tokenizer(PAIR_PROMPTS[:3], return_tensors="pt", padding=True)
    out = target.generate(**batch, assistant_model=draft, custom_generate=hf_generate.INTEGRATION,
                          trust_remote_code=True, max_new_tokens=PAIR_NEW, do_sample=False, lm_head_in_op=True)
    _check_rows(target, tokenizer, PAIR_PROMPTS[:3], out, batch.input_ids.shape[1],
                target.generation_config.pad_token_id)
    with pytest.raises(TypeError, match="lm_head_in_op"):
        target.generate(**batch, assistant_model=draft, custom_generate=hf_generate.INTEGRATION,
                        trust_remote_code=True, max_new_tokens=2, lm_head_in_op="yes")
