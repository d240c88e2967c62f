"""``verify_hidden_batched``: B sequences of ragged draft lengths, one pass over the head for all.

The claim (DESIGN.md, Note [LM head logits]): sequence ``b``'s result is
exactly ``verify_hidden(hidden[b, :k_b+1], head, draft_tokens[b, :k_b], ...,
uniforms=uniforms[b, :k_b+1])``, greedy and sampled, counts 0..K, on both
the one-pass C++ op (within the kept-logits budget and above it) and the
reference path (draft logits, top-k, block); and, independently of that op,
``hidden_reference``'s decisions on the pure-torch logits. Padding rows and
ids past ``k_b`` are never read (filled with NaN and out-of-range ids here).
Bad input is named alike on the wrapper, the reference and the raw op.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.test_hidden import budget_head, mod, q8_0_blocks

F64 = torch.float64


def batch_case(sv, gen, head, batch, k, counts=None):
    """hidden [B, K+1, d], draft tokens [B, K] (mostly each row's argmax), counts [B] with 0 and K among
    them; padding rows NaN and padding ids out of range, so a read of either fails loudly."""
    lm = mod(sv, "lm_head")
    if counts is None:
        counts = torch.randint(0, k + 1, (batch,), generator=gen)
        counts[0], counts[-1] = 0, k
    hidden = torch.randn(batch, k + 1, head.dim, generator=gen) * 3
    best = lm.reference_logits(head, hidden.flatten(0, 1)).reshape(batch, k + 1, -1)[:, :k].argmax(-1)
    noise = torch.randint(0, head.vocab, (batch, k), generator=gen)
    tokens = torch.where(torch.rand(batch, k, generator=gen) < 0.75, best, noise)
    for b, k_b in enumerate(counts.tolist()):
        hidden[b, k_b + 1:] = float("nan")
        tokens[b, k_b:] = head.vocab + 7
    return hidden, tokens, counts


def per_sequence(verify, hidden, head, tokens, counts, uniforms=None, draft_logits=None, **kw):
    out = []
    for b, k_b in enumerate(counts.tolist()):
        out.append(verify(hidden[b, : k_b + 1], head, tokens[b, :k_b],
                          None if draft_logits is None else draft_logits[b, :k_b],
                          uniforms=None if uniforms is None else uniforms[b, : k_b + 1], **kw))
    return out


def pairs(result):
    accepted, next_tokens = result
    return list(zip(accepted.tolist(), next_tokens.tolist()))


# (format, B, K): f32 d = 64 keeps 8 rows, so B = 2, K = 2 (<= 6 rows) keeps and B = 4, K = 4 (up to 20
# rows) does not; Q8_0 d = 640 keeps 21 rows: B = 3, K = 4 keeps, B = 6, K = 5 (up to 36) does not.
# The largest runs natively only: ~6 s here, minutes under qemu, and f32 B = 4 covers the path above the
# budget emulated.
CASES = [pytest.param(f, b, k, id=f"{f}-B{b}-K{k}", marks=[pytest.mark.native_only] if (f, b) == ("q8", 6) else [])
         for f, b, k in [("f32", 2, 2), ("f32", 4, 4), ("bf16", 3, 3), ("q8", 3, 4), ("q8", 6, 5)]]


@pytest.mark.parametrize("fmt,batch,k", CASES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_each_sequence_is_verify_hidden_on_its_rows(sv, monkeypatch, fmt, batch, k, temperature):
    hr = mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(batch * 10 + k + int(temperature * 10) + len(fmt))
    head = budget_head(sv, fmt, gen)
    seen = set()
    for trial in range(4):
        hidden, tokens, counts = batch_case(sv, gen, head, batch, k)
        for _ in range(3):
            u = torch.rand(batch, k + 1, dtype=F64, generator=gen)
            u[:, 0] = torch.where(torch.rand(batch, generator=gen) < 0.3, 1 - 1e-9, u[:, 0])  # more rejections at 0
            kw = dict(temperature=temperature, uniforms=u)
            got = pairs(sv.verify_hidden_batched(hidden, head, tokens, counts, **kw))
            assert got == per_sequence(sv.verify_hidden, hidden, head, tokens, counts, u, temperature=temperature)
            # Independently of the C++ ops: the reference's loop on the pure-torch logits.
            assert got == per_sequence(hr.verify_hidden, hidden, head, tokens, counts, u, temperature=temperature)
            assert got == pairs(hr.verify_hidden_batched(hidden, head, tokens, counts, **kw))
            with monkeypatch.context() as m:
                m.setenv("SPEC_VERIFY_HIDDEN_TWO_PASS", "1")
                assert pairs(sv.verify_hidden_batched(hidden, head, tokens, counts, **kw)) == got
            seen |= {(a, a == k_b) for (a, _), k_b in zip(got, counts.tolist())}
    assert {a for a, _ in seen} >= {0, 1} and (True in {full for _, full in seen})  # rejections and bonus tokens


def test_reference_calls_are_per_sequence_verify_hidden(sv):
    """Draft logits, top-k and block verification run the reference per sequence: the same results."""
    lm = mod(sv, "lm_head")
    gen = torch.Generator().manual_seed(3)
    head = budget_head(sv, "bf16", gen, vocab=700)
    batch, k = 3, 3
    for trial in range(3):
        hidden, _, counts = batch_case(sv, gen, head, batch, k)
        draft = lm.reference_logits(head, torch.nan_to_num(hidden[:, :k]).flatten(0, 1)).reshape(batch, k, -1)
        draft = draft + torch.randn(draft.shape, generator=gen)
        for kw in ({"temperature": 0.9, "top_k": 40}, {"temperature": 1.1, "method": "block"}):
            warp = {name: kw[name] for name in kw if name != "method"}
            tokens = sv.sample_draft(draft.flatten(0, 1), generator=gen, **warp).reshape(batch, k)
            u = torch.rand(batch, k + 1, dtype=F64, generator=gen)
            got = pairs(sv.verify_hidden_batched(hidden, head, tokens, counts, draft, uniforms=u, **kw))
            assert got == per_sequence(sv.verify_hidden, hidden, head, tokens, counts, u, draft, **kw)
            # Point masses with top-k (not the one-pass op's either).
            if "top_k" in kw:
                got = pairs(sv.verify_hidden_batched(hidden, head, tokens, counts, uniforms=u, **kw))
                assert got == per_sequence(sv.verify_hidden, hidden, head, tokens, counts, u, **kw)


def test_generator_draws_the_batched_layout(sv):
    """generator=g draws torch.rand(B, K+1) from g, as verify_logits_batched does (none when greedy)."""
    gen = torch.Generator().manual_seed(4)
    head = budget_head(sv, "q8", gen, vocab=900)
    hidden, tokens, counts = batch_case(sv, gen, head, 4, 3)
    for path in (sv, mod(sv, "hidden_reference")):
        u = torch.rand(4, 4, dtype=F64, generator=torch.Generator().manual_seed(9))
        g = torch.Generator().manual_seed(9)
        assert pairs(path.verify_hidden_batched(hidden, head, tokens, counts, temperature=0.8, generator=g)) == \
            pairs(path.verify_hidden_batched(hidden, head, tokens, counts, temperature=0.8, uniforms=u))
        g = torch.Generator().manual_seed(9)
        path.verify_hidden_batched(hidden, head, tokens, counts, temperature=0.0, generator=g)
        assert torch.equal(torch.rand(4, 4, dtype=F64, generator=g), u)  # greedy drew nothing


def test_all_counts_default_to_k_and_empty_batches(sv):
    gen = torch.Generator().manual_seed(5)
    head = budget_head(sv, "f32", gen, vocab=600)
    hidden, tokens, _ = batch_case(sv, gen, head, 3, 2, counts=torch.tensor([2, 2, 2]))
    u = torch.rand(3, 3, dtype=F64, generator=gen)
    assert pairs(sv.verify_hidden_batched(hidden, head, tokens, uniforms=u)) == \
        pairs(sv.verify_hidden_batched(hidden, head, tokens, torch.tensor([2, 2, 2]), uniforms=u))
    for path in (sv, mod(sv, "hidden_reference")):
        a, x = path.verify_hidden_batched(torch.empty(0, 3, 64), head, torch.empty(0, 2, dtype=torch.int64))
        assert a.shape == x.shape == (0,) and a.dtype == x.dtype == torch.int64


@pytest.mark.parametrize("path", ["fast", "reference", "raw"])
def test_rows_after_a_rejection_are_never_read_and_errors_name_the_sequence(sv, path):
    hr = mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(6)
    head = sv.LMHead(torch.randn(600, 32, generator=gen))
    if path == "raw":
        def verify(h, tok, counts, **kw):
            return sv.ops.verify_hidden_batched(h, head.weight, None, tok, counts, 0, 32, kw["temperature"],
                                                kw.get("uniforms"), None)
    else:
        fn = sv.verify_hidden_batched if path == "fast" else hr.verify_hidden_batched

        def verify(h, tok, counts, **kw):
            return fn(h, head, tok, counts, **kw)
    h = torch.randn(3, 4, 32, generator=gen)
    best = mod(sv, "lm_head").reference_logits(head, h[:, 0]).argmax(-1)
    toks = torch.stack([(best + 1) % 600, best, best], 1)  # every sequence rejected at 0 when greedy
    h[:, 1:] = float("nan")
    counts = torch.tensor([3, 1, 2])
    assert verify(h, toks, counts, temperature=0.0)[0].tolist() == [0, 0, 0]
    u = torch.full((3, 4), 0.5, dtype=F64)
    u[:, 0] = 0.999  # rejects each token 0 (its probability is far below)
    assert verify(h, toks, counts, temperature=1.0, uniforms=u)[0].tolist() == [0, 0, 0]
    toks[2, 0] = best[2]  # sequence 2 accepts at 0 and reads its row 1
    with pytest.raises(ValueError, match=re.escape("logits[2, 1, 0] is NaN")):
        verify(h, toks, counts, temperature=0.0)
    u[2, 0] = 0.0
    with pytest.raises(ValueError, match=re.escape("logits[2, 1, 0] is ") + "-?nan: logits must be finite"):
        verify(h, toks, counts, temperature=1.0, uniforms=u)


def _raises(exc, *words):
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(w)})" for w in words))


@pytest.mark.parametrize("path", ["fast", "reference", "raw"])
def test_bad_input_is_named(sv, path):
    hr = mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(50, 32, generator=gen)
    head = sv.LMHead(w)
    if path == "raw":
        def verify(h, tok, counts=None, draft=None, *, temperature=1.0, uniforms=None, **kw):
            return sv.ops.verify_hidden_batched(h, head.weight, None, tok, counts, 0, 32, temperature, uniforms, None)
    else:
        fn = sv.verify_hidden_batched if path == "fast" else hr.verify_hidden_batched

        def verify(h, tok, counts=None, draft=None, **kw):
            return fn(h, head, tok, counts, draft, **kw)
    h, toks, counts = torch.randn(3, 3, 32, generator=gen), torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([2, 0, 1])
    with _raises(TypeError, "hidden must be float32"):
        verify(h.double(), toks, counts)
    with _raises(ValueError, "hidden must have 3 dimensions"):
        verify(h[0], toks, counts)
    with _raises(ValueError, "hidden must be [B, K+1, d]"):
        verify(h[:, :2], toks, counts)
    with _raises(ValueError, "hidden must be [B, K+1, d]"):
        verify(h[:2], toks, counts)
    with _raises(ValueError, "hidden must be [B, K+1, d]"):
        verify(torch.randn(3, 3, 31), toks, counts)
    with _raises(TypeError, "draft_tokens must be int64 or int32"):
        verify(h, toks.float(), counts)
    with _raises(ValueError, "draft_tokens must have 2 dimension"):
        verify(h, toks[0], counts)
    with _raises(ValueError, "num_draft_tokens[1] is 3", "outside [0, K]"):
        verify(h, toks, torch.tensor([2, 3, 0]))
    with _raises(ValueError, "num_draft_tokens[0] is -1", "outside [0, K]"):
        verify(h, toks, torch.tensor([-1, 0, 0]))
    with _raises(ValueError, "num_draft_tokens must have B = 3 entries"):
        verify(h, toks, torch.tensor([1, 1]))
    with _raises(TypeError, "num_draft_tokens must be int64 or int32"):
        verify(h, toks, counts.float())
    bad = toks.clone()
    bad[2, 0] = 50
    with _raises(IndexError, "draft_tokens", "holds token id 50", "outside [0, V) with V = 50"):
        verify(h, bad, counts)
    bad[2, 0], bad[1, 0] = 5, -1  # sequence 1 has no draft tokens: its ids are padding, never read
    verify(h, bad, counts, temperature=0.0)
    with _raises(ValueError, "temperature must be"):
        verify(h, toks, counts, temperature=-1.0)
    with _raises(ValueError, "uniforms must have shape [3, 3]", "B rows of one per draft token"):
        verify(h, toks, counts, uniforms=torch.rand(3, 2, dtype=F64))
    with _raises(ValueError, "uniforms must lie in [0, 1)"):
        verify(h, toks, counts, uniforms=torch.full((3, 3), 1.0, dtype=F64))
    with _raises(TypeError, "uniforms must be float64"):
        verify(h, toks, counts, uniforms=torch.rand(3, 3))
    if path == "raw":
        return
    with _raises(TypeError, "head must be a spec_verify.LMHead"):
        (sv.verify_hidden_batched if path == "fast" else hr.verify_hidden_batched)(h, w, toks, counts)
    with _raises(ValueError, "draft_logits must be [B, K, V] = [3, 2, 50]"):
        verify(h, toks, counts, torch.randn(3, 2, 49))
    with _raises(ValueError, "draft_logits must have 3 dimensions"):
        verify(h, toks, counts, torch.randn(2, 50))
    with _raises(ValueError, 'method must be "token" or "block"'):
        verify(h, toks, counts, method="tree")
    with _raises(TypeError, "temperature"):
        verify(h, toks, counts, temperature="hot")


def test_raw_op_q8_0_head_and_threads(sv):
    """The raw op on a Q8_0 head at 1 and 2 threads: the same decisions as the wrapper's per-sequence ones."""
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(3001, 64, generator=gen) * 0.3
    head = sv.LMHead.q8_0(q8_0_blocks(w), 64)
    hidden, tokens, counts = batch_case(sv, gen, head, 5, 3)
    u = torch.rand(5, 4, dtype=F64, generator=gen)
    want = per_sequence(sv.verify_hidden, hidden, head, tokens, counts, u, temperature=0.7)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = sv.ops.verify_hidden_batched(hidden, head.weight, None, tokens.int(), counts.int(), 1, 64, 0.7, u,
                                               None)
            assert pairs(got) == want
    finally:
        torch.set_num_threads(threads)
