"""``target.generate(..., custom_generate="integrations/transformers")`` on the shipped pair.

What is shown, and against which oracle:

* greedy, for batches of 1, 3 and 8 left-padded prompts of different
  lengths: every row equals that prompt's own unbatched
  ``target.generate(do_sample=False)`` (transformers' greedy search), or,
  where it differs, the first differing position is a near-tie of the target
  there (top-2 logits within ``NEAR_TIE``), asserted and counted; both
  accepted and rejected draft tokens occur; sampled rows fail that check
  (negative control); small GPT-2, Qwen2 and Mistral pairs batch exactly too;
* rows that stop at an eos are padded with ``pad_token_id`` after it, and the
  output is ``[B, T + longest]``, as ``generate()`` returns it;
* sampled runs follow torch's seed and stay inside the warped support;
* a streamer gets the prompt, then the new tokens; ``return_dict_in_generate``
  wraps the same sequences;
* the draft's lean runtime (the default for a Llama draft) proposes what the
  draft's own transformers forward proposes: the same tokens, acceptance and
  output, greedy and sampled, on a ragged batch;
* bad input -- a missing or mismatched assistant, other tokenizers, a mask
  that does not fit the batch, right padding, unsupported generation options
  -- raises a ``ValueError`` naming it, before anything is decoded;
* the bench's novel prompts occur nowhere in the pair's training corpus.
"""

from __future__ import annotations

import types

import pytest
import torch

from examples import e2e, hf_generate

pytestmark = [pytest.mark.transformers, pytest.mark.usefixtures("one_thread")]

NEAR_TIE = 1e-4  # top-2 logit gap under which batched numerics may pick the other token
MAX_NEW = 24
PROMPTS = hf_generate.NOVEL_PROMPTS + e2e.BENCH_PROMPTS  # 11 prompts, 5 to 17 tokens


@pytest.fixture(scope="module")
def hf(pair):
    """``(tokenizer, draft, target)`` with left padding, the kernel resolved to ``build/``."""
    hf_generate.use_local_kernel()
    tokenizer, draft, target = pair
    tokenizer.padding_side = "left"
    return tokenizer, draft, target


def ours(target, draft, batch, **kwargs):
    return target.generate(**batch, assistant_model=draft, custom_generate=hf_generate.INTEGRATION,
                           trust_remote_code=True, **kwargs)


# ============================================================================
# Greedy: each row is its prompt's own generate(), up to near-ties
# ============================================================================

_REFERENCES: dict = {}


def _reference(target, tokenizer, text: str, **kwargs) -> list:
    """The prompt's unbatched greedy continuation by transformers (eos kept, nothing after)."""
    key = (text, tuple(sorted(kwargs.items())))
    if key not in _REFERENCES:
        ids = tokenizer(text, return_tensors="pt").input_ids
        out = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, **kwargs)
        _REFERENCES[key] = out[0, ids.shape[1] :].tolist()
    return _REFERENCES[key]


@torch.no_grad()
def _near_tie(target, prefix: list) -> bool:
    """Whether the target's top-2 logits after ``prefix`` are within NEAR_TIE."""
    logits = target(torch.tensor([prefix])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1]) < NEAR_TIE


def _check_rows(target, tokenizer, texts, out, prompt_width, pad, **kwargs) -> int:
    """Assert every row against its reference (near-ties allowed); return how many rows hit one."""
    ties = 0
    for text, row in zip(texts, out.tolist()):
        expected, new = _reference(target, tokenizer, text, **kwargs), row[prompt_width:]
        got = new[: len(expected)]
        if got != expected:
            at = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            prompt = tokenizer(text).input_ids
            assert _near_tie(target, prompt + expected[:at]), f"{text!r}: differs at new token {at}, not a near-tie"
            ties += 1
            continue
        assert all(t == pad for t in new[len(expected) :]), f"{text!r}: not padded after its eos"
    return ties


@pytest.mark.parametrize("size", [1, 3, 8])
def test_greedy_rows_equal_their_own_unbatched_generate(hf, size):
    tokenizer, draft, target = hf
    texts = PROMPTS[:size] if size < 8 else PROMPTS[3 : 3 + size]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    stats = []
    out = ours(target, draft, batch, max_new_tokens=MAX_NEW, do_sample=False, decode_stats=stats)
    assert out.shape == (size, batch.input_ids.shape[1] + MAX_NEW)
    assert torch.equal(out[:, : batch.input_ids.shape[1]], batch.input_ids)
    ties = _check_rows(target, tokenizer, texts, out, batch.input_ids.shape[1], target.generation_config.pad_token_id)
    print(f"\nB={size}: {ties} of {size} rows differ from their own generate() at a near-tie; {stats[0].accepted} "
          f"of {stats[0].drafted} draft tokens accepted")
    assert 0 < stats[0].accepted < stats[0].drafted  # both branches of verification ran


def test_negative_control_sampled_rows_fail_the_greedy_check(hf):
    # The near-tie allowance is narrow: rows sampled at temperature 1 differ
    # from greedy where the target is far from a tie, and the check says so.
    tokenizer, draft, target = hf
    texts = PROMPTS[:3]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = ours(target, draft, batch, max_new_tokens=MAX_NEW, do_sample=True, temperature=1.0, top_k=0)
    with pytest.raises(AssertionError, match="not a near-tie"):
        _check_rows(target, tokenizer, texts, out, batch.input_ids.shape[1], target.generation_config.pad_token_id)


def test_rows_stopping_at_eos_are_padded_after_it(hf):
    tokenizer, draft, target = hf
    texts = PROMPTS[:4]
    eos = _reference(target, tokenizer, texts[0])[2]  # the first row stops within 3 tokens, others later
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    out = ours(target, draft, batch, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=7)
    width = batch.input_ids.shape[1]
    lengths = [row.index(eos) + 1 if eos in row else MAX_NEW for row in out[:, width:].tolist()]
    assert out.shape[1] == width + max(lengths) and min(lengths) <= 3 < max(lengths)
    _check_rows(target, tokenizer, texts, out, width, 7, eos_token_id=eos, pad_token_id=7)


def _tiny(kind: str, layers: int):
    """A small random causal LM of another architecture (no eos: rows run to max_new_tokens)."""
    import transformers

    torch.manual_seed(layers)
    common = dict(vocab_size=97, num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=256)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=layers, n_head=4, n_positions=256)
    else:
        config = getattr(transformers, f"{kind}Config")(hidden_size=32, intermediate_size=64, num_key_value_heads=2,
                                                         **common)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model


@pytest.mark.parametrize("kind", ["gpt2", "Qwen2", "Mistral"])
def test_other_architectures_batch_greedy_exactly(hf, kind):
    # Learnt positions (GPT-2), rotary with grouped-query attention (Qwen2,
    # Mistral): the per-row position ids and masked slots hold for them too.
    target, draft = _tiny(kind, 2), _tiny(kind, 1)
    prompts = [[5, 6, 7, 8, 9], [3], [10, 11, 12]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    out = ours(target, draft, dict(input_ids=ids, attention_mask=(ids != 0).long()),  # no prompt holds id 0
               max_new_tokens=16, do_sample=False)
    for b, prompt in enumerate(prompts):
        alone = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
        assert out[b, width:].tolist() == alone.tolist(), (kind, prompt)


# ============================================================================
# Sampling, streaming, the output type
# ============================================================================


@torch.no_grad()
def test_sampled_runs_follow_the_seed_and_the_warped_support(hf):
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:3], return_tensors="pt", padding=True)
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(ours(target, draft, batch, max_new_tokens=16, do_sample=True, temperature=0.8, top_k=3))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    width, mask = batch.input_ids.shape[1], batch.attention_mask.bool()
    for b, row in enumerate(outs[0]):
        seq = row[:width][mask[b]].tolist() + row[width:].tolist()
        start = int(mask[b].sum())
        logits = target(torch.tensor([seq])).logits[0]
        for i in range(start, len(seq)):
            assert seq[i] in torch.topk(logits[i - 1], 3).indices.tolist(), (b, i)


@torch.no_grad()
def test_block_verification_is_the_decoders_block_method(hf, sv):
    # Oracle: the kernel's batched decoder run directly (its block law is
    # tested in test_batched_decoder.py); same seed, same draws, same tokens.
    # The token-wise run under the same seed differs, so the option is not ignored.
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:3], return_tensors="pt", padding=True)
    warping = dict(temperature=0.8, top_k=8, top_p=1.0, min_p=0.0)
    width = batch.input_ids.shape[1]
    torch.manual_seed(11)
    out = ours(target, draft, batch, max_new_tokens=24, do_sample=True, temperature=0.8, top_k=8,
               num_assistant_tokens=3, verification="block")
    direct = {}
    for method in ("block", "token"):
        torch.manual_seed(11)
        steps = sv.hf_batched_step_pair(draft, target, **warping, pad_token_id=tokenizer.pad_token_id or 0)
        decoder = sv.BatchedSpeculativeDecoder(*steps, k=3, greedy=False, method=method)
        rows = decoder.generate(batch.input_ids, 24, attention_mask=batch.attention_mask)
        direct[method] = [row[int(m.sum()):].tolist() for row, m in zip(rows, batch.attention_mask)]
    for b in range(3):
        assert out[b, width:width + len(direct["block"][b])].tolist() == direct["block"][b], b
    assert direct["block"] != direct["token"]
    with pytest.raises(ValueError, match=r'verification must be "token" or "block", got \'tree\''):
        ours(target, draft, batch, max_new_tokens=4, verification="tree")


def test_streamer_and_return_dict(hf):
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:1], return_tensors="pt")
    puts, ends = [], []
    streamer = types.SimpleNamespace(put=lambda value: puts.append(value.clone()), end=lambda: ends.append(1))
    out = ours(target, draft, batch, max_new_tokens=MAX_NEW, do_sample=False, streamer=streamer,
               return_dict_in_generate=True)
    assert torch.equal(puts[0], batch.input_ids) and ends == [1]
    assert torch.cat([p.view(-1) for p in puts[1:]]).tolist() == out.sequences[0, batch.input_ids.shape[1] :].tolist()
    assert len(puts) > 2  # streamed round by round, several tokens at a time
    two = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match=r"streamer with a batch of 2"):
        ours(target, draft, two, max_new_tokens=4, streamer=streamer)


@pytest.mark.parametrize("sampling", [dict(do_sample=False), dict(do_sample=True, temperature=0.8, top_k=0)],
                         ids=["greedy", "sampled"])
def test_lean_draft_proposes_what_the_transformers_draft_proposes(hf, sampling):
    # The draft runtime decides speed only: the lean forward computes the
    # draft's own function (to float32 rounding, tests/test_lean_llama.py), so
    # a run on it proposes, accepts and outputs what a run on the draft's
    # transformers forward does. (A proposal could flip only where two draft
    # logits, or a uniform and a CDF step, lie within that rounding.)
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:3], return_tensors="pt", padding=True)
    outs, stats = {}, {}
    for runtime in ("transformers", "lean"):
        found = []
        torch.manual_seed(3)
        outs[runtime] = ours(target, draft, batch, max_new_tokens=MAX_NEW, decode_stats=found,
                             draft_runtime=runtime, **sampling)
        stats[runtime] = (found[0].drafted, found[0].accepted, found[0].rounds)
    assert torch.equal(outs["lean"], outs["transformers"])
    assert stats["lean"] == stats["transformers"]
    assert 0 < stats["lean"][1] < stats["lean"][0]


def test_draft_length_is_num_assistant_tokens(hf):
    # The call's value, else the assistant's generation config, else 5 greedy / 3 sampling.
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:1], return_tensors="pt")
    ks = []
    for kwargs in (dict(do_sample=False), dict(do_sample=True), dict(do_sample=False, num_assistant_tokens=2)):
        stats = []
        ours(target, draft, batch, max_new_tokens=8, decode_stats=stats, **kwargs)
        ks.append(stats[0].k)
    saved, draft.generation_config.num_assistant_tokens = draft.generation_config.num_assistant_tokens, 4
    try:
        stats = []
        ours(target, draft, batch, max_new_tokens=8, decode_stats=stats, do_sample=False)
        ks.append(stats[0].k)
    finally:
        draft.generation_config.num_assistant_tokens = saved
    assert ks == [5, 3, 2, 4]


def test_num_assistant_tokens_auto_is_the_kernels_k_auto(hf):
    # num_assistant_tokens="auto": k chosen each round (the kernel's k="auto"): the first rounds measure plain
    # steps, which a fixed k never does; greedy rows stay their own generate()'s.
    tokenizer, draft, target = hf
    batch = tokenizer(PROMPTS[:3], return_tensors="pt", padding=True)
    stats = []
    out = ours(target, draft, batch, max_new_tokens=MAX_NEW, decode_stats=stats, do_sample=False,
               num_assistant_tokens="auto")
    _check_rows(target, tokenizer, PROMPTS[:3], out, batch.input_ids.shape[1], target.generation_config.pad_token_id)
    chosen = stats[0].k_per_round
    print(f"\nk per round: {chosen}")
    assert chosen[:3] == [0, 0, 0] and stats[0].predicted_seconds > 0  # measured c(1), then chose from the curve


# ============================================================================
# Bad input
# ============================================================================


def _tiny_llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config).eval()


BAD_CALLS = [
    # (keyword arguments to generate(), message pattern)
    (dict(num_beams=2), r"does not support these generation options: num_beams=2"),
    (dict(output_scores=True, return_dict_in_generate=True), r"output_scores=True"),
    (dict(repetition_penalty=1.3, no_repeat_ngram_size=3), r"repetition_penalty=1.3, no_repeat_ngram_size=3"),
    (dict(num_return_sequences=2, do_sample=True), r"num_return_sequences=2"),
    (dict(prefix_allowed_tokens_fn=lambda b, ids: [1]), r"prefix_allowed_tokens_fn"),
    (dict(num_assistant_tokens_schedule="heuristic"), r"num_assistant_tokens_schedule='heuristic'"),
    (dict(foo=1), r"model keyword arguments: foo"),
    (dict(num_assistant_tokens=0), r"num_assistant_tokens must be an int >= 1"),
    (dict(num_assistant_tokens="fastest"), r'num_assistant_tokens must be an int >= 1 .* or "auto", got \'fastest\''),
    (dict(assistant_model=None), r"assistant_model is required"),
    (dict(attention_mask=torch.ones(2, 3, dtype=torch.int64)), r"attention_mask has shape \(2, 3\), but input_ids"),
    (dict(attention_mask="right"), r"attention_mask\[\d\] = \[1, .*0\] is not left padding"),
    (dict(assistant_model="tiny"), r"assistant_model has a vocabulary of 96 tokens and the model 4096"),
    (dict(assistant_tokenizer="other"), r"assistant_tokenizer differs from tokenizer"),
    (dict(draft_runtime="fast"), r"draft_runtime must be 'auto', 'lean' or 'transformers', got 'fast'"),
    (dict(draft_runtime="lean", assistant_model="gpt2"), r"LeanLlama runs Llama models, got model_type 'gpt2'"),
]


@pytest.mark.parametrize("kwargs, pattern", BAD_CALLS, ids=[p.split(":")[0][:40] for _, p in BAD_CALLS])
def test_bad_input_is_named(hf, kwargs, pattern):
    tokenizer, draft, target = hf
    batch = dict(tokenizer(PROMPTS[:2], return_tensors="pt", padding=True))
    kwargs = dict(kwargs)
    if kwargs.get("attention_mask") == "right":  # the same batch, padded on the other side
        tokenizer.padding_side = "right"
        try:
            batch = dict(tokenizer(PROMPTS[:2], return_tensors="pt", padding=True))
        finally:
            tokenizer.padding_side = "left"
        del kwargs["attention_mask"]
    if kwargs.get("assistant_model") == "tiny":
        kwargs["assistant_model"] = _tiny_llama(96)
    if kwargs.get("assistant_model") == "gpt2":  # the shipped vocabulary, another architecture
        from transformers import GPT2Config, GPT2LMHeadModel

        kwargs["assistant_model"] = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=4096,
                                                               n_positions=64)).eval()
    if kwargs.get("assistant_tokenizer") == "other":
        kwargs.update(tokenizer=tokenizer, assistant_tokenizer=types.SimpleNamespace(get_vocab=lambda: {"a": 0}))
    call = dict(batch, assistant_model=draft, custom_generate=hf_generate.INTEGRATION, trust_remote_code=True,
                max_new_tokens=4)
    call.update(kwargs)
    with pytest.raises(ValueError, match=pattern):
        target.generate(**call)


# ============================================================================
# The bench's prompts
# ============================================================================


def test_novel_prompts_are_not_in_the_training_corpus():
    from examples import train_pair

    train, val, _ = train_pair.corpus_files()
    for path in train + val:
        text = train_pair.read_text(path)
        found = [p for p in hf_generate.NOVEL_PROMPTS if p in text]
        assert not found, f"{found} occur in {path}"
