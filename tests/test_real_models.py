"""The real public models (``make real-models``): placed files, the loader's cache, one tokenization.

* Each GGUF in ``models/real/`` has the sha256 of ``tools/real_models.MODELS``,
  and a file with another hash is refused (negative control).
* ``examples.real_models``' cache of the dequantized model is current for the
  placed GGUF and stale once the recorded hash differs.
* llama.cpp's tokenizer (``llama_cpp.Llama(..., vocab_only=True).tokenize``)
  and the GGUF-derived HF tokenizer give the same ids on every prompt of
  ``examples/prompts.py``, each under 400 tokens.

BOS and special tokens, decided: a prompt is tokenized with the model's own
convention, the GGUF's ``tokenizer.ggml.add_bos_token`` (Gemma 3: a BOS, id 2;
SmolLM2: none), which is what llama.cpp's ``tokenize(add_bos=True)`` applies
and what the HF tokenizer's default ``add_special_tokens=True`` applies; both
engines then decode from the same ids. Special-token text inside a prompt is
not parsed as special (``special=False``; the prompts hold none). Both
conventions are compared: with the BOS rule and without any special token.

A test that needs ``models/real/`` fails when it has not been made (``make
test`` makes it first: a skip would count as a pass); the emulated aarch64
root stages no models, so those tests carry ``native_only`` or
``transformers``.
"""

from __future__ import annotations

import json

import pytest
import torch

from examples import prompts
from tools import real_models

NAMES = tuple(real_models.MODELS)
MAX_PROMPT_TOKENS = 400


def _placed(name: str):
    path = real_models.model_path(name)
    if not path.is_file():
        pytest.fail(f"{path} missing: run `make real-models` (make test does)")
    return path


@pytest.mark.native_only  # the emulated root stages no models/
@pytest.mark.parametrize("name", NAMES)
def test_placed_files_have_their_sha256(name):
    assert real_models.check(name, _placed(name)) == real_models.model_path(name)


def test_negative_control_a_file_with_another_hash_is_refused(tmp_path):
    fake = tmp_path / real_models.MODELS["smollm2-135m"][0]
    fake.write_bytes(b"GGUF but not this one")
    with pytest.raises(ValueError, match="sha256"):
        real_models.check("smollm2-135m", fake)
    with pytest.raises(ValueError, match="unknown real model"):
        real_models.model_path("llama-7b")


@pytest.mark.transformers
def test_the_loader_cache_follows_the_gguf_hash(tmp_path):
    from examples import real_models as loader

    path = _placed("smollm2-135m")
    cache = tmp_path / "smollm2-135m"
    cache.mkdir()
    st = path.stat()
    stamp = {"sha256": real_models.MODELS["smollm2-135m"][1], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    (cache / "gguf.json").write_text(json.dumps(stamp))
    assert loader._cache_is_current(cache, path)
    (cache / "gguf.json").write_text(json.dumps(dict(stamp, mtime_ns=0)))  # touched: re-hashed, still current
    assert loader._cache_is_current(cache, path)
    (cache / "gguf.json").write_text(json.dumps(dict(stamp, sha256="0" * 64, mtime_ns=0)))  # another file
    assert not loader._cache_is_current(cache, path)


def _hf_tokenizer(name: str):
    """The GGUF-derived HF tokenizer (from the loader's cache, made from the GGUF on first use)."""
    from transformers import AutoTokenizer

    from examples import real_models as loader

    _placed(name)
    cache = loader.CACHE_DIR / name
    if not loader._cache_is_current(cache, loader.gguf_path(name)):
        loader.load_hf(name)  # dequantizes once (~1 min for Gemma), then cached
    return AutoTokenizer.from_pretrained(cache)


@pytest.mark.transformers
@pytest.mark.llama_cpp
@pytest.mark.parametrize("name", NAMES)
def test_llama_cpp_and_hf_tokenize_the_prompts_alike(name):
    llama_cpp = pytest.importorskip("llama_cpp")
    vocab = llama_cpp.Llama(str(_placed(name)), vocab_only=True, verbose=False)
    tokenizer = _hf_tokenizer(name)
    add_bos = vocab.metadata.get("tokenizer.ggml.add_bos_token") == "true"
    for prompt in prompts.PROMPTS:
        text = prompt.text
        with_rule = vocab.tokenize(text.encode(), add_bos=True, special=False)
        bare = vocab.tokenize(text.encode(), add_bos=False, special=False)
        assert tokenizer(text).input_ids == with_rule, (name, prompt.name)
        assert tokenizer(text, add_special_tokens=False).input_ids == bare, (name, prompt.name)
        # The BOS rule is the GGUF's: one BOS in front, or none.
        assert with_rule == ([vocab.token_bos()] if add_bos else []) + bare, (name, prompt.name)
        assert len(with_rule) <= MAX_PROMPT_TOKENS, (name, prompt.name, len(with_rule))
    assert add_bos == (name == "gemma3-270m")  # Gemma 3 takes a BOS, SmolLM2 none: both rules are exercised


def test_the_prompt_set_has_both_kinds():
    assert {p.kind for p in prompts.PROMPTS} == set(prompts.KINDS)
    assert all(prompts.bench_prompts("real", kind) for kind in prompts.KINDS)
    with pytest.raises(ValueError, match="unknown prompt kind"):
        prompts.of_kind("poetry")


@pytest.mark.transformers
@pytest.mark.parametrize("name, max_new", [("smollm2-135m", 48), ("gemma3-270m", 32)])
def test_prompt_lookup_greedy_is_plain_greedy_on_the_real_models(sv, one_thread, name, max_new):
    # Both real models on transformers' forward (batch-invariant in float32): speculative greedy by
    # prompt lookup (k="auto", and a fixed k that rejects often) emits plain greedy's tokens; so does
    # k="auto" with the head in the op (verify_hidden's float32 logits, not torch's: equal argmaxes
    # on these prompts, where no top-2 gap is a near-tie).
    from examples import real_demo
    from examples import real_models as loader

    _placed(name)
    tokenizer, model = loader.load_hf(name, threads=None)
    ids = tokenizer(prompts.BY_NAME["rename-code"].text, return_tensors="pt").input_ids[0]
    with torch.inference_mode():
        plain = real_demo.plain_greedy(model, ids, max_new)
        head_calls = []  # the model's own head, called only when the head is not in the op
        hook = model.get_output_embeddings().register_forward_hook(lambda *_: head_calls.append(1))
        try:
            for k, hidden in (("auto", False), (3, False), ("auto", True)):
                head_calls.clear()
                out, stats = real_demo.lookup_greedy(sv, model, ids, max_new, k=k, hidden=hidden)
                assert out.tolist() == plain.tolist(), (name, k, hidden, real_demo.first_difference(plain, out))
                assert bool(head_calls) != hidden
                assert stats.drafted > 0
                if k == 3:
                    assert 0 < stats.accepted < stats.drafted
        finally:
            hook.remove()
