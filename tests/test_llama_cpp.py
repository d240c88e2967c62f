"""The llama.cpp integration (integrations/llama_cpp/): GGUF conversion, the
``Llama`` adapter's KV rollback, greedy equality with llama.cpp's own greedy
decoding, and the law of sampled decoding through the adapter.

Marked ``llama_cpp``: the aarch64 emulated run deselects them (no llama.cpp
build there). Natively they need llama-cpp-python and gguf, which
`make test` installs (integrations/llama_cpp/requirements.txt): a missing package is an import error in a fixture,
so these tests fail -- they never skip.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.llama_cpp

REPO = pathlib.Path(__file__).resolve().parents[1]

# Prompts for tokenization and greedy equality: the demo's and the bench's,
# and some that are not from the training corpus (prose, odd bytes, unicode).
EXTRA_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. It's 3.14 o'clock!\n",
    "SELECT name, count(*) FROM users WHERE id > 10 GROUP BY name;\n",
    "Grüße aus Köln — naïve café ☕ 日本語\n\t\ttabs   and  spaces\r\n",
    "fn main() { println!(\"{}\", 1 + 2); }\n",
]


def _prompts():
    from examples.e2e import BENCH_PROMPTS, DEMO_PROMPT

    return [DEMO_PROMPT, *BENCH_PROMPTS, *EXTRA_PROMPTS]


@pytest.fixture(scope="module")
def gguf_dir():
    from integrations.llama_cpp.pair import ensure_gguf

    return ensure_gguf()


@pytest.fixture(scope="module")
def llamas(gguf_dir):
    """``(draft, target_for_spec, target_for_plain)``: separate contexts, one thread each."""
    from integrations.llama_cpp.pair import open_llama

    return (open_llama(gguf_dir / "draft.gguf"), open_llama(gguf_dir / "target.gguf"),
            open_llama(gguf_dir / "target.gguf"))


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(REPO / "models" / "tokenizer")


# ----------------------------------------------------------------------------
# Tokenization
# ----------------------------------------------------------------------------


@pytest.mark.transformers
def test_tokenization_equals_hf(llamas, hf_tokenizer):
    _, target, _ = llamas
    for text in _prompts():
        hf = hf_tokenizer(text).input_ids
        ll = target.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert ll == hf, text
        assert target.detokenize(ll).decode("utf-8") == text
    assert target.n_vocab() == len(hf_tokenizer) == 4096


# ----------------------------------------------------------------------------
# Greedy: the speculative stream equals llama.cpp's plain greedy stream
# ----------------------------------------------------------------------------


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.transformers
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_greedy_equals_llama_cpp_greedy(sv, llamas, hf_tokenizer, k):
    from integrations.llama_cpp.pair import generate_plain
    from integrations.llama_cpp.spec_verify_llama import llama_step_pair

    draft_llama, target_llama, plain_llama = llamas
    draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=0, sv=sv)
    max_new = 48
    near_ties = []
    for text in _prompts():
        prompt = hf_tokenizer(text).input_ids
        plain = generate_plain(plain_llama, prompt, max_new)
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=True)
        spec = dec.generate(torch.tensor(prompt), max_new).tolist()[len(prompt):]
        i = _first_difference(plain, spec)
        if i is None:
            assert plain == spec
            continue
        # The only allowed difference: a near-tie of the target's top-2 logits
        # (batched and one-token evals may round differently), at the plain run's step i.
        row = torch.from_numpy(plain_llama.scores[len(prompt) + i - 1].copy())
        top2 = torch.topk(row, 2).values
        gap = float(top2[0] - top2[1])
        assert gap < 1e-4, f"prompt {text!r}, k={k}: streams differ at new token {i} with a top-2 gap of {gap}"
        near_ties.append((text, i, gap))
    print(f"k={k}: near-ties {near_ties}")
    assert len(near_ties) <= 1, near_ties


@pytest.mark.transformers
def test_a_greedy_draft_proposes_llama_cpps_own_greedy_continuation(sv, llamas, hf_tokenizer):
    # The adapter's greedy draft pick is llama.cpp's own greedy token, tie for tie: its K proposed
    # tokens are Llama.generate's first K. (No other test fails if the pick is wrong: a bad draft
    # only lowers acceptance, and greedy output stays the target's.)
    from integrations.llama_cpp.pair import generate_plain
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    draft_llama = llamas[0]
    for text in _prompts():
        prompt = hf_tokenizer(text).input_ids
        plain = generate_plain(draft_llama, prompt, 8)  # resets the context first
        step = LlamaCppStep(draft_llama, temperature=0, sv=sv)  # a fresh adapter: its cache is empty
        tokens, rows = step.draft_step(torch.tensor(prompt), 8)
        assert rows is None and tokens.tolist() == plain, text


def test_logits_views_follow_llama_cpps_output_buffer(sv, llamas, monkeypatch):
    """The adapter keeps one zero-copy view per row count while llama.cpp's output buffer stays put, and
    makes new ones when the buffer moves: here two stand-in buffers, swapped under it."""
    import ctypes

    import integrations.llama_cpp.spec_verify_llama as adapter

    step = adapter.LlamaCppStep(llamas[1], temperature=0, sv=sv)
    V = step.n_vocab
    buffers = [(ctypes.c_float * (3 * V))(*([float(i)] * (3 * V))) for i in (1, 2)]
    current = [0]
    monkeypatch.setattr(adapter.llama_cpp, "llama_get_logits",
                        lambda ctx: ctypes.cast(buffers[current[0]], ctypes.POINTER(ctypes.c_float)))
    first = step._logits_view(2)
    assert first.shape == (2, V) and bool((first == 1.0).all())
    assert step._logits_view(2) is first  # the same buffer: the view is kept
    assert step._logits_view(3).shape == (3, V)
    current[0] = 1  # llama.cpp grew its outputs into a new buffer
    moved = step._logits_view(2)
    assert moved is not first and bool((moved == 2.0).all())


# ----------------------------------------------------------------------------
# KV rollback: llama.cpp's sequence removal, never a re-run of the prefix
# ----------------------------------------------------------------------------


def _seq_pos_max(step):
    import llama_cpp

    if hasattr(llama_cpp, "llama_memory_seq_pos_max"):
        return llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(step.ctx), 0)
    return llama_cpp.llama_kv_self_seq_pos_max(step.ctx, 0)


class _Recorder:
    """Wraps the callbacks to record each round's proposal and outcome."""

    def __init__(self, draft_step, target_step):
        self.draft_step_inner, self.target_step_inner = draft_step, target_step
        self.warping = draft_step.__self__.warping
        self.rounds = []  # (len(prefix), k_round)

    def draft_step(self, prefix, k):
        return self.draft_step_inner(prefix, k)

    def target_step(self, prefix, proposed):
        self.rounds.append((len(prefix), len(proposed)))
        return self.target_step_inner(prefix, proposed)


@pytest.mark.transformers
def test_kv_rollback_removes_and_never_reruns(sv, llamas, hf_tokenizer):
    from integrations.llama_cpp.spec_verify_llama import llama_step_pair

    draft_llama, target_llama, plain_llama = llamas
    draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=0, sv=sv)
    draft, target = draft_step.__self__, target_step.__self__
    draft.reset()
    target.reset()
    rec = _Recorder(draft_step, target_step)
    prompt = hf_tokenizer(_prompts()[0]).input_ids
    max_new = 64
    dec = sv.SpeculativeDecoder(rec.draft_step, rec.target_step, k=6, greedy=True)
    out = dec.generate(torch.tensor(prompt), max_new).tolist()
    assert dec.stats.rounds == len(rec.rounds) > 3
    # Round r feeds its k_r proposals and the last committed token; the first
    # feeds the whole prompt. Nothing else is ever fed: no prefix re-run.
    expected_fed = len(prompt) - 1 + sum(k + 1 for _, k in rec.rounds)
    assert target.tokens_fed == expected_fed
    assert target.decode_calls == len(rec.rounds)
    # Every rejected proposal is removed from llama.cpp's cache, by position:
    # round r's cache ends at len(prefix_r) + k_r; round r+1 keeps len(prefix_{r+1}) - 1.
    removed = sum(p + k - (p_next - 1) for (p, k), (p_next, _) in zip(rec.rounds, rec.rounds[1:]))
    assert removed > 0 and target.positions_removed == removed
    # llama.cpp's own memory holds exactly the adapter's record, and the record is the output.
    assert _seq_pos_max(target) == len(target._cached) - 1
    assert target._cached.tolist() == out[: len(target._cached)]
    # The draft's cache too: it never holds more than it was told, and it was rolled back.
    assert _seq_pos_max(draft) == len(draft._cached) - 1 and draft.positions_removed > 0
    # And the cache's state is the truth: the next rows from the rolled-back
    # cache equal a fresh eval of the whole sequence on another context.
    probe = out[-1:]
    rows = target.target_step(torch.tensor(out[:-1]), torch.tensor(probe)).clone()
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    fresh = LlamaCppStep(plain_llama, temperature=0, sv=sv)
    fresh_rows = fresh._feed(out, rows=2).clone()
    assert fresh.tokens_fed == len(out)
    torch.testing.assert_close(rows, fresh_rows, rtol=1e-4, atol=1e-4)
    plain_llama.reset()


@pytest.mark.parametrize("form", ["int64", "int32", "strided"])
def test_cache_kept_only_as_far_as_the_prefix_agrees(sv, llamas, form):
    """A prefix that differs from the cache in its middle rolls back to the first difference, whatever
    the prefix's form: an int64 tensor is compared by its bytes (``_logits_after``), an int32 or a
    strided one as a list. The rows then equal a fresh eval of the whole sequence."""
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    _, target_llama, plain_llama = llamas
    step = LlamaCppStep(target_llama, temperature=0, sv=sv)

    def as_form(ids):
        t = torch.tensor(ids, dtype=torch.int64)
        if form == "int32":
            return t.to(torch.int32)
        if form == "strided":
            return torch.stack([t, t], 1)[:, 0]  # a view with stride 2
        return t

    first = [5, 9, 14, 3, 22, 7, 31, 8, 12, 40, 6, 17]
    step.target_step(as_form(first), torch.tensor([], dtype=torch.int64))
    fed = step.tokens_fed
    changed = first[:5] + [50] + first[6:]  # differs at position 5 of 12
    rows = step.target_step(as_form(changed), torch.tensor([11, 2])).clone()
    assert step.positions_removed == len(first) - 5  # kept 0..4; the rest removed
    assert step.tokens_fed - fed == len(changed) - 5 + 2  # fed from the difference on, plus the proposal
    assert step._cached.tolist() == changed + [11, 2]
    fresh = LlamaCppStep(plain_llama, temperature=0, sv=sv)
    torch.testing.assert_close(rows, fresh._feed(changed + [11, 2], rows=3), rtol=1e-4, atol=1e-4)
    # And one agreeing step more feeds one token, removing nothing.
    removed, fed = step.positions_removed, step.tokens_fed
    step.target_step(as_form(changed + [11, 2, 4]), torch.tensor([], dtype=torch.int64))
    assert (step.positions_removed, step.tokens_fed) == (removed, fed + 1)
    plain_llama.reset()
    target_llama.reset()


@pytest.mark.transformers
def test_kv_rollback_negative_control(sv, llamas, hf_tokenizer):
    """An adapter whose rollback only moves its record, leaving llama.cpp's cache, must be caught."""
    from integrations.llama_cpp.pair import generate_plain
    from integrations.llama_cpp.spec_verify_llama import llama_step_pair

    draft_llama, target_llama, plain_llama = llamas
    draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=0, sv=sv)
    target = target_step.__self__
    target._seq_rm = lambda ctx, seq, p0, p1: True  # "removed", but nothing is
    prompt = hf_tokenizer(_prompts()[0]).input_ids
    plain = generate_plain(plain_llama, prompt, 48)
    try:
        spec = sv.SpeculativeDecoder(draft_step, target_step, k=6).generate(torch.tensor(prompt), 48)
        caught = spec.tolist()[len(prompt):] != plain or _seq_pos_max(target) != len(target._cached) - 1
    except RuntimeError:  # llama.cpp refusing positions that are already in its cache
        caught = True
    assert caught
    target.reset()


# ----------------------------------------------------------------------------
# Sampled: the law of whole sequences on a tiny GGUF model pair
# ----------------------------------------------------------------------------

TINY_V = 4
# One merge: llama.cpp refuses a BPE vocabulary without merges.
TINY_TOKENIZER = dict(tokens=["a", "b", "ab", "Ċ"], types=[1, 1, 1, 1], merges=["a b"], bos=0, eos=3, pad=3)
TINY_CONFIG = dict(num_attention_heads=2, num_key_value_heads=2, hidden_size=16, head_dim=8,
                   intermediate_size=32, num_hidden_layers=1, max_position_embeddings=256,
                   rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)


def _tiny_tensors(seed: int, scale: float) -> dict:
    rng = np.random.default_rng(seed)
    c = TINY_CONFIG
    d, f = c["hidden_size"], c["intermediate_size"]

    def r(*shape, s=scale):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": r(TINY_V, d),
        p + "input_layernorm.weight": np.ones(d, np.float32),
        p + "post_attention_layernorm.weight": np.ones(d, np.float32),
        p + "self_attn.q_proj.weight": r(d, d), p + "self_attn.k_proj.weight": r(d, d),
        p + "self_attn.v_proj.weight": r(d, d), p + "self_attn.o_proj.weight": r(d, d),
        p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d), p + "mlp.down_proj.weight": r(d, f),
        # A small final norm: tied embeddings would otherwise make logits of ~4x the embedding's norm,
        # and the law too peaked to test (every 3-token sequence must have a real count).
        "model.norm.weight": np.full(d, 0.15, np.float32),
    }


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """``(draft, target)`` tiny random GGUF Llamas (V = 4, one layer), written with the gguf writer."""
    from integrations.llama_cpp.hf_to_gguf import write_gguf
    from integrations.llama_cpp.pair import open_llama

    folder = tmp_path_factory.mktemp("tiny_gguf")
    out = []
    for name, seed in (("draft", 1), ("target", 2)):
        path = folder / f"{name}.gguf"
        write_gguf(path, TINY_CONFIG, _tiny_tensors(seed, 0.5), TINY_TOKENIZER, name=f"tiny-{name}")
        out.append(open_llama(path, n_ctx=64))
    return tuple(out)


PROMPT = [0, 1]
CONTINUATION = 3
TEMPERATURE = 0.9
ALPHA = 1e-3


def _exact_law(sv, target_llama, warp) -> dict:
    """P(x_1 x_2 x_3 | PROMPT) under the warped target, from llama.cpp's own logits, one eval per prefix."""
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    step = LlamaCppStep(target_llama, temperature=0, sv=sv)  # only its evals are used
    law = {(): 1.0}
    for _ in range(CONTINUATION):
        nxt = {}
        for seq, p in law.items():
            step.reset()
            row = step._feed(PROMPT + list(seq), rows=1)[0].clone()
            probs = sv.warp_probs(row, **warp).double()
            probs = probs / probs.sum()
            for x in range(TINY_V):
                nxt[seq + (x,)] = p * float(probs[x])
        law = nxt
    step.reset()
    return law


def _sample_sequences(sv, tiny_pair, warp, runs, seed, broken=False):
    from integrations.llama_cpp.spec_verify_llama import llama_step_pair

    draft_llama, target_llama = tiny_pair
    g_draft = torch.Generator().manual_seed(seed)
    g_verify = torch.Generator().manual_seed(seed + 1)
    draft_step, target_step = llama_step_pair(draft_llama, target_llama, generator=g_draft, sv=sv, **warp)
    if broken:
        # Negative control: the draft draws from another warping than the one it declares (and is verified under).
        draft_step.__self__._sample_kwargs = dict(draft_step.__self__._sample_kwargs, temperature=2.5)
    counts = {}
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=2, greedy=False, generator=g_verify)
    prompt = torch.tensor(PROMPT)
    for _ in range(runs):
        seq = tuple(dec.generate(prompt, CONTINUATION).tolist()[len(PROMPT):])
        counts[seq] = counts.get(seq, 0) + 1
    draft_step.__self__.reset()
    target_step.__self__.reset()
    return counts


def _chi_square_p(counts: dict, law: dict) -> float:
    from scipy.stats import chisquare

    n = sum(counts.values())
    cells = sorted(law, key=law.get)
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for c in cells:  # pool the cells of expected count < 5
        e, o = law[c] * n, counts.get(c, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp = np.array(exp) * (sum(obs) / sum(exp))
    assert set(counts) <= set(law)
    return float(chisquare(obs, exp).pvalue)


RUNS = 12000


def test_sampled_law_through_the_adapter(sv, tiny_pair):
    warp = dict(temperature=TEMPERATURE, top_k=0, top_p=1.0, min_p=0.0)
    law = _exact_law(sv, tiny_pair[1], warp)
    assert abs(sum(law.values()) - 1) < 1e-9
    assert min(law.values()) > 2e-4  # every 3-token sequence is reachable: a real test of 64 cells
    draft_law = _exact_law(sv, tiny_pair[0], warp)
    tv = 0.5 * sum(abs(law[s] - draft_law[s]) for s in law)
    assert tv > 0.1  # the draft is far from the target: many rejections, corrections and residual draws
    counts = _sample_sequences(sv, tiny_pair, warp, RUNS, seed=7)
    p = _chi_square_p(counts, law)
    print(f"chi-square over {len(law)} sequences, {RUNS} runs, TV(draft, target) = {tv:.2f}: p = {p:.3g}")
    assert p > ALPHA, p


def test_sampled_law_negative_control(sv, tiny_pair):
    warp = dict(temperature=TEMPERATURE, top_k=0, top_p=1.0, min_p=0.0)
    law = _exact_law(sv, tiny_pair[1], warp)
    counts = _sample_sequences(sv, tiny_pair, warp, RUNS // 3, seed=8, broken=True)  # fails by far (p ~ 1e-90 at RUNS)
    p = _chi_square_p(counts, law)
    print(f"broken adapter: p = {p:.3g}")
    assert p < ALPHA, p
