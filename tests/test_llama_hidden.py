"""The llama.cpp target with the head in the op: ``LlamaCppStep(llama, hidden=True)``.

* The hidden states it returns, through the file's own head
  (``ops.hidden_logits``, ``lm_head.reference_logits`` bit for bit), are llama.cpp's logits: to float32
  rounding on the shipped f32 GGUF; on Gemma 3 270M's Q8_0 head within
  llama.cpp's own activation quantization (it rounds each hidden row to
  Q8_0 blocks before its int8 dot), with the same argmax wherever llama.cpp's
  top-2 gap exceeds that difference.
* Ending the graph at the final norm keeps the batch in the KV cache: a
  context that stops there and one that observes the norm and computes on
  (the head included) see bit-identical hidden states over a sequence of
  evals, rollbacks and re-evals.
* Greedy prompt-lookup decoding with ``head=`` (fixed k, ``k="auto"``)
  equals plain greedy decoding on the same head (``sample_hidden``, one
  token per eval) token for token on the shipped pair; a target whose hidden
  rows are shifted by one position is the negative control.
* Misuse is named.

Marked ``llama_cpp``; the Gemma tests also ``native_only`` (the emulated root stages no models/).
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.llama_cpp

PROMPT = ("def total_price(items, tax_rate):\n    total = 0\n    for item in items:\n"
          "        total = total + item.price * item.quantity\n    return round(total, 2)\n\n\n"
          "def order_total(items, tax_rate):\n")


def _gemma_path():
    from tools import real_models

    path = real_models.model_path("gemma3-270m")
    if not path.is_file():
        pytest.fail(f"{path} missing: run `make real-models` (make test does)")
    return path


def _shipped_path():
    from integrations.llama_cpp.pair import ensure_gguf

    return ensure_gguf() / "target.gguf"


def _steps(sv, path):
    from integrations.llama_cpp.pair import open_llama
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    llama = open_llama(path)
    return llama, LlamaCppStep(llama, temperature=0.0, sv=sv), LlamaCppStep(llama, temperature=0.0, sv=sv,
                                                                             hidden=True)


def _head_logits(sv, head, hidden):
    # The C++ op's logits: lm_head.reference_logits bit for bit (test_hidden.py), without the
    # reference's float64 FMA emulation, which takes minutes over a 262k-row head.
    return importlib.import_module(sv.__name__ + ".hidden")._cpp_logits(head)(hidden)


def _compare_with_llamas_logits(sv, path, tol_rel):
    llama, lstep, hstep = _steps(sv, path)
    ids = llama.tokenize(PROMPT.encode(), add_bos=True)
    logits = lstep._feed(ids, rows=len(ids) // 2).clone()
    hidden = hstep._feed(ids, rows=len(ids) // 2)
    assert hidden.shape == (len(ids) // 2, hstep.head.dim) and hidden.dtype == torch.float32
    ours = _head_logits(sv, hstep.head, hidden)
    gap = (ours - logits).abs().max().item()
    assert gap <= tol_rel * logits.std().item(), (gap, logits.std().item())
    top2 = logits.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * gap
    assert clear.sum() >= len(clear) // 2  # the comparison below is not vacuous
    assert torch.equal(ours.argmax(1)[clear], logits.argmax(1)[clear])
    return gap


def test_hidden_rows_make_llamas_logits_on_the_f32_pair(sv):
    # An F32 head: llama.cpp's f32 matmul against ours, rounding apart only.
    _compare_with_llamas_logits(sv, _shipped_path(), tol_rel=1e-4)


@pytest.mark.native_only
def test_hidden_rows_make_llamas_logits_on_gemmas_q8_0_head(sv):
    # llama.cpp quantizes each hidden row to Q8_0 for its int8 dot: ~1-5% of a logit's spread.
    _compare_with_llamas_logits(sv, _gemma_path(), tol_rel=0.1)


def test_stopping_at_the_norm_keeps_the_batch_in_the_cache(sv):
    from integrations.llama_cpp.pair import open_llama
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    path = _shipped_path()
    stops = LlamaCppStep(open_llama(path), temperature=0.0, sv=sv, hidden=True)
    runs_on = LlamaCppStep(open_llama(path), temperature=0.0, sv=sv, hidden=True)
    runs_on._capture.stop = False  # observes the norm, computes the head too
    ids = stops.llama.tokenize(PROMPT.encode(), add_bos=True)
    n = len(ids) - 12
    # evals of several sizes, rollbacks into them, re-evals: what a decoding loop does
    script = [(ids[:n], 1), (ids[: n + 4], 5), (ids[: n + 2], 3), (ids[: n + 7], 4), (ids[: n + 5], 1),
              (ids[: n + 12], 8)]
    for seq, rows in script:
        a, b = stops._logits_for_last_rows(seq, rows), runs_on._logits_for_last_rows(seq, rows)
        assert torch.equal(a, b), (len(seq), rows)
    assert stops.rollbacks >= 2 and stops.decode_calls == runs_on.decode_calls


def _plain_on_head(sv, step, prompt, max_new):
    step.reset()
    seq = list(prompt)
    for _ in range(max_new):
        h = step._logits_for_last_rows(seq, rows=1)
        seq.append(int(sv.sample_hidden(h, step.head, temperature=0.0)[0]))
    return seq[len(prompt):]


@pytest.mark.parametrize("k", [2, "auto"])
def test_greedy_lookup_with_head_equals_plain_greedy_on_the_head(sv, k):
    llama, _, hstep = _steps(sv, _shipped_path())
    prompt = llama.tokenize(PROMPT.encode(), add_bos=False)
    plain = _plain_on_head(sv, hstep, prompt, 40)
    hstep.reset()
    dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), hstep.target_step, k=k)
    assert dec.head is hstep.head
    out = dec.generate(torch.tensor(prompt), max_new=40).tolist()[len(prompt):]
    assert out == plain
    if k == 2:
        assert dec.stats.accepted > 0  # rounds accepted: not a vacuous comparison

    # Negative control: hidden rows shifted by one position.
    def shifted(prefix, proposed):
        rows = hstep.target_step(prefix, proposed)
        return torch.cat([rows[1:], rows[-1:]]) if len(rows) > 1 else rows

    hstep.reset()
    bad = sv.SpeculativeDecoder(sv.PromptLookupDraft(), shifted, k=4, head=hstep.head)
    assert bad.generate(torch.tensor(prompt), max_new=40).tolist()[len(prompt):] != plain


def test_misuse_is_named(sv):
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    llama, lstep, hstep = _steps(sv, _shipped_path())
    with pytest.raises(ValueError, match="is a target"):
        hstep.draft_step(torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="head= is for hidden=True"):
        LlamaCppStep(llama, sv=sv, head=hstep.head)
    with pytest.raises(TypeError, match="head must be an sv.LMHead"):
        LlamaCppStep(llama, sv=sv, hidden=True, head="output.weight")
    # A graph that never shows result_norm (here: the callback looks for another name) is refused by name.
    from integrations.llama_cpp import spec_verify_llama as adapter

    blind = LlamaCppStep(llama, sv=sv, hidden=True, head=hstep.head)
    real_name, adapter._RESULT_NORM = adapter._RESULT_NORM, b"no_such_tensor\0"
    try:
        with pytest.raises(RuntimeError, match="no tensor named result_norm"):
            blind.target_step(torch.tensor([1, 2, 3]), torch.tensor([4]))
    finally:
        adapter._RESULT_NORM = real_name
    wrong = sv.LMHead(torch.zeros(hstep.head.vocab, hstep.head.dim + 1))
    with pytest.raises(ValueError, match="does not match the model"):
        LlamaCppStep(llama, sv=sv, hidden=True, head=wrong)
