"""Hostile arguments to every public op: no crash, only the three named
exception types, the argument named, and both paths (the C++ kernel through
``sv.<op>`` and the pure-torch reference ``sv.reference.<op>``) agreeing on
the exception type, or on the result when both succeed.

Each case starts from valid arguments for one op (random B, K, V, row dtype,
warping) and replaces up to three of them with hostile values: wrong dtypes
and ranks, meta tensors, non-tensors, strided / expanded / flipped views,
NaN / +-inf / denormals / negative entries, ids -1 / V / 2^31 / +-2^63, bad
uniforms and draft counts, generators of the wrong type, warping arguments
beyond float and int64 range. A crash (a segfault, an abort) fails the run.

Bounded for ``make test`` (``SV_HOSTILE_EXAMPLES`` examples per op, default
60, derandomized so the run is reproducible); a long run:
``SV_HOSTILE_EXAMPLES=20000 pytest tests/test_hostile_input.py`` (random
seeds). The number of cases run is printed (``-s`` shows it).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_hidden import mod

EXAMPLES = int(os.environ.get("SV_HOSTILE_EXAMPLES", "60"))
LONG_RUN = "SV_HOSTILE_EXAMPLES" in os.environ
NAMED = (ValueError, TypeError, IndexError)
F64 = torch.float64

# op -> (its arguments in call order, which take keywords only, row-argument prefix)
SIGNATURES = {
    "verify_greedy": (["target_probs", "draft_tokens"], []),
    "verify_sampled": (["target_probs", "draft_probs", "draft_tokens"], ["generator", "uniforms"]),
    "verify_greedy_batched": (["target_probs", "draft_tokens", "num_draft_tokens"], []),
    "verify_sampled_batched": (["target_probs", "draft_probs", "draft_tokens", "num_draft_tokens"],
                               ["generator", "uniforms"]),
    "verify_logits": (["target_logits", "draft_logits", "draft_tokens"],
                      ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    "verify_logits_batched": (["target_logits", "draft_logits", "draft_tokens", "num_draft_tokens"],
                              ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    # Block verification takes verify_sampled's arguments under the same rules.
    "verify_block": (["target_probs", "draft_probs", "draft_tokens"], ["generator", "uniforms"]),
    "verify_block_batched": (["target_probs", "draft_probs", "draft_tokens", "num_draft_tokens"],
                             ["generator", "uniforms"]),
    # The ragged forms (vLLM's flat layout); draft_probs None is a point-mass draft.
    "verify_greedy_ragged": (["target_probs", "draft_tokens", "cu_num_draft_tokens", "bonus_tokens"], []),
    "verify_sampled_ragged": (["target_probs", "draft_probs", "draft_tokens", "cu_num_draft_tokens", "bonus_tokens"],
                              ["generator", "uniforms"]),
    "verify_logits_ragged": (["target_logits", "draft_logits", "draft_tokens", "cu_num_draft_tokens", "bonus_tokens"],
                             ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    "sample_draft": (["draft_logits"], ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    "warp_probs": (["logits"], ["temperature", "top_k", "top_p", "min_p", "normalize"]),
    # Hidden states in: the LM head inside the op; the reference is hidden_reference's (pure torch).
    "verify_hidden": (["hidden", "head", "draft_tokens", "draft_logits"],
                      ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    "verify_hidden_batched": (["hidden", "head", "draft_tokens", "num_draft_tokens", "draft_logits"],
                              ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
    "sample_hidden": (["hidden", "head"], ["temperature", "top_k", "top_p", "min_p", "generator", "uniforms"]),
}
HIDDEN_OPS = ("verify_hidden", "verify_hidden_batched", "sample_hidden")
COUNTS = {"cases": 0, "raised": 0, "agreed_results": 0}

# ----------------------------------------------------------------------------
# Hostile values, per kind of argument
# ----------------------------------------------------------------------------

BAD_DTYPES = [torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]
SCALARS = [10**400, -10**400, True, False, math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-30, 1e30, 0.5,
           "x", None, [0.5], 2**63, -2**63]
TOP_KS = [2**63, 2**64, 2**63 - 1, -1, -2**70, 1.5, True, 0, 1, 3, None, "3", 10**400]


def _tensor_mutations(t: torch.Tensor) -> list:
    out = [t.to("meta"), t.tolist() if t.numel() < 50 else 3, None, "tensor", t[None], t.reshape(-1)]
    out += [t.to(d) for d in BAD_DTYPES]
    if t.dim() >= 1 and t.shape[-1] > 1:
        out += [t.flip(-1), t.narrow(-1, 0, t.shape[-1] - 1)]
        wide = torch.cat([t, t], -1)
        out.append(wide[..., ::2])  # strided elements: copied, same values
    if t.dim() >= 1:
        out.append(t[..., :1].expand(t.shape))  # stride-0 rows
        out.append(t.narrow(0, 0, max(t.shape[0] - 1, 0)))
    return out


def _poisoned_rows(t: torch.Tensor, draw) -> torch.Tensor:
    if t.numel() == 0:
        return t
    t = t.clone()
    flat = t.view(-1)
    value = draw(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-40, -0.0, 65504.0, 1e38]))
    index = draw(st.integers(0, flat.numel() - 1))
    if draw(st.booleans()):
        flat[:] = value  # a whole tensor of it (all zero, all -inf, ...)
    else:
        flat[index] = value
    return t


def _bad_ids(t: torch.Tensor, vocab: int, draw) -> torch.Tensor:
    if t.numel() == 0:
        return t
    t = t.clone().long()
    bad = draw(st.sampled_from([-1, vocab, 2**31, 2**31 - 1, 2**63 - 1, -2**63, 2**40]))
    t.view(-1)[draw(st.integers(0, t.numel() - 1))] = bad
    return t


def _hostile(name: str, value, shape, draw):
    """One hostile replacement for argument ``name`` (valid value ``value``)."""
    batch, k, vocab = shape
    if name in ("temperature", "top_p", "min_p", "top_k") and batch and draw(st.booleans()):
        # The ragged logits op's per-sequence form: [B] tensors, bad lengths, dtypes or values.
        integral = name == "top_k"
        base = torch.full((batch,), 3 if integral else 0.5, dtype=torch.int64 if integral else torch.float64)
        bad = base.clone()
        bad[draw(st.integers(0, batch - 1))] = draw(st.sampled_from([-1, 0, 2**40] if integral else
                                                                    [-1.0, math.nan, math.inf, 0.0, 1.0]))
        return draw(st.sampled_from([bad] + _tensor_mutations(base)))
    if name in ("temperature", "top_p", "min_p"):
        return draw(st.sampled_from(SCALARS))
    if name == "top_k":
        return draw(st.sampled_from(TOP_KS))
    if name == "head":
        return draw(st.sampled_from(["head", None, 3, torch.randn(vocab, 4), [[0.5]]]))
    if name == "generator":
        return draw(st.sampled_from([3, "gen", object(), torch.Generator().manual_seed(1), torch.tensor(1.0)]))
    if name == "normalize":
        return draw(st.sampled_from(["yes", 1, None, 0.0, torch.tensor(True)]))
    if name == "uniforms":
        base = value if value is not None else torch.full((batch, k + 1) if batch else (k + 1,), 0.5,
                                                          dtype=torch.float64)
        choice = draw(st.sampled_from(["value", "mutate"]))
        if choice == "value" and base.numel():
            u = base.clone()
            u.view(-1)[draw(st.integers(0, u.numel() - 1))] = draw(st.sampled_from(
                [1.0, -1e-300, math.nan, math.inf, -0.0, 1 - 2**-53, 5e-324, 2.0]))
            return u
        return draw(st.sampled_from(_tensor_mutations(base)))
    if name == "num_draft_tokens":
        counts = value if value is not None else torch.full((batch,), k, dtype=torch.long)
        choice = draw(st.sampled_from(["value", "mutate"]))
        if choice == "value" and counts.numel():
            c = counts.clone()
            c[draw(st.integers(0, c.numel() - 1))] = draw(st.sampled_from([-1, k + 1, 2**40, -2**63]))
            return c
        return draw(st.sampled_from(_tensor_mutations(counts)))
    if name == "draft_tokens":
        if draw(st.booleans()):
            return _bad_ids(value, vocab, draw)
        return draw(st.sampled_from(_tensor_mutations(value)))
    if name == "cu_num_draft_tokens":
        if draw(st.booleans()) and value.numel():
            c = value.clone()
            c[draw(st.integers(0, c.numel() - 1))] += draw(st.sampled_from([-1, 1, -2**40, 2**40]))
            return c
        return draw(st.sampled_from(_tensor_mutations(value)))
    if name == "bonus_tokens":
        ids = value if value is not None else torch.zeros(batch, dtype=torch.long)
        if draw(st.booleans()):
            return _bad_ids(ids, vocab, draw)
        return draw(st.sampled_from(_tensor_mutations(ids)))
    if value is None:  # the point-mass draft's absent rows
        return draw(st.sampled_from([torch.rand(k, vocab), torch.rand(3, vocab), [[0.5]], "rows"]))
    # rows: target_*, draft_*, logits
    if draw(st.booleans()):
        return _poisoned_rows(value, draw)
    return draw(st.sampled_from(_tensor_mutations(value)))


# ----------------------------------------------------------------------------
# Valid arguments, then the hostile case
# ----------------------------------------------------------------------------


def _valid(sv, op: str, draw, gen):
    batch = draw(st.integers(1, 4)) if op.endswith("batched") else 0
    k = draw(st.integers(0, 4))
    vocab = draw(st.sampled_from([1, 2, 3, 7, 17, 64, 513]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    lead = (batch,) if batch else ()
    logits = "logits" in op or op in ("sample_draft", "warp_probs")
    warp = dict(temperature=draw(st.sampled_from([1.0, 0.7, 0.0, 2.0])), top_k=draw(st.sampled_from([0, 1, 5])),
                top_p=draw(st.sampled_from([1.0, 0.9, 0.3])), min_p=draw(st.sampled_from([0.0, 0.05])))
    if logits:
        target = (torch.randn(*lead, k + 1, vocab, generator=gen) * 3).to(dtype)
        draft = (target[..., :k, :].float() + torch.randn(*lead, k, vocab, generator=gen)).to(dtype)
        tokens = sv.reference.sample_draft(draft, generator=gen, **warp) if k else torch.zeros(*lead, 0).long()
        if k and warp["temperature"] == 0:
            tokens = draft.float().argmax(-1)
    else:
        target = (torch.rand(*lead, k + 1, vocab, generator=gen) + 0.01).to(dtype)
        draft = (torch.rand(*lead, k, vocab, generator=gen) + 0.01).to(dtype)
        tokens = torch.randint(0, vocab, (*lead, k), generator=gen)
    uniforms = torch.rand(*lead, k + 1, generator=gen, dtype=torch.float64)
    rows = "logits" if logits else "probs"
    pool = {f"target_{rows}": target, f"draft_{rows}": draft, "draft_tokens": tokens,
            "num_draft_tokens": torch.randint(0, k + 1, (batch,), generator=gen) if batch else None,
            "uniforms": uniforms if draw(st.booleans()) else None, "generator": None,
            "draft_logits": draft if op != "sample_draft" else target.reshape(-1, vocab),
            "logits": target, "normalize": draw(st.booleans()), **warp}
    if op.endswith("ragged"):
        batch = draw(st.integers(0, 4))
        _ragged_pool(pool, draw, gen, vocab, dtype, batch=batch, k=k, logits=logits)
    if op in HIDDEN_OPS:
        _hidden_pool(sv, pool, op, draw, gen, vocab, dtype, lead, k)
    if op == "sample_draft" and pool["uniforms"] is not None:
        pool["uniforms"] = torch.rand(target.reshape(-1, vocab).shape[0], generator=gen, dtype=torch.float64)
    positional, keywords = SIGNATURES[op]
    args = {name: pool[name] for name in positional + keywords}
    return args, (batch, k, vocab)


def _hidden_pool(sv, pool, op, draw, gen, vocab, dtype, lead, k):
    # A dense head [V, d] (float32 / bf16 / f16, a bias at times), hidden rows [*lead, K+1, d]
    # ([n, d] for sample_hidden), draft logits [*lead, K, V] or None (point masses), and draft
    # tokens each draft row's argmax (in every warped support).
    dim = draw(st.sampled_from([1, 5, 16, 40]))
    weight = (torch.randn(vocab, dim, generator=gen) * 0.5).to(draw(st.sampled_from(
        [torch.float32, torch.bfloat16, torch.float16])))
    bias = torch.randn(vocab, generator=gen) if draw(st.booleans()) else None
    rows = (draw(st.integers(1, 4)),) if op == "sample_hidden" else (*lead, k + 1)
    draft = (torch.randn(*lead, k, vocab, generator=gen) * 3).to(dtype) if draw(st.booleans()) else None
    pool.update({
        "head": sv.LMHead(weight, bias=bias),
        "hidden": torch.randn(*rows, dim, generator=gen).to(dtype),
        "draft_logits": draft,
        "draft_tokens": draft.float().argmax(-1) if draft is not None else torch.randint(0, vocab, (*lead, k),
                                                                                          generator=gen),
    })
    if pool["uniforms"] is not None:
        pool["uniforms"] = torch.rand(*rows, generator=gen, dtype=F64)  # one per row: the ops' own layout


def _ragged_pool(pool, draw, gen, vocab, dtype, batch, k, logits=False):
    # B sequences of 0..k draft tokens, flat: target [T+B, V] (or [T, V] with
    # bonus_tokens), draft [T, V] or None (a point-mass draft), ids [T], uniforms [T+B].
    # Logits: each sequence its own warping (scalars or [B] tensors).
    counts = torch.randint(0, k + 1, (batch,), generator=gen)
    total = int(counts.sum())
    bonus = torch.randint(0, vocab, (batch,), generator=gen) if draw(st.booleans()) else None
    rows = total if bonus is not None else total + batch
    if logits:
        target = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
        draft = (torch.randn(total, vocab, generator=gen) * 3).to(dtype)
        temperature = torch.tensor([draw(st.sampled_from([0.0, 0.7, 1.0])) for _ in range(batch)], dtype=F64)
        top_k = torch.tensor([draw(st.sampled_from([0, 1, 5])) for _ in range(batch)], dtype=torch.int64)
        # Tokens each sequence's warped draft can have drawn: its argmax (in every support).
        pool.update({"target_logits": target, "draft_logits": draft, "draft_tokens": draft.float().argmax(-1),
                     "cu_num_draft_tokens": counts.cumsum(0), "bonus_tokens": bonus,
                     "uniforms": torch.rand(total + batch, generator=gen, dtype=F64) if draw(st.booleans()) else None,
                     "temperature": temperature if draw(st.booleans()) else pool["temperature"], "top_k": top_k})
        return
    pool.update({
        "target_probs": (torch.rand(rows, vocab, generator=gen) + 0.01).to(dtype),
        "draft_probs": (torch.rand(total, vocab, generator=gen) + 0.01).to(dtype) if draw(st.booleans()) else None,
        "draft_tokens": torch.randint(0, vocab, (total,), generator=gen).to(draw(st.sampled_from([torch.int64,
                                                                                                  torch.int32]))),
        "cu_num_draft_tokens": counts.cumsum(0).to(draw(st.sampled_from([torch.int64, torch.int32]))),
        "bonus_tokens": bonus,
        "uniforms": torch.rand(total + batch, generator=gen, dtype=torch.float64) if draw(st.booleans()) else None,
    })


def _run(fn, args, op, seed):
    positional, keywords = SIGNATURES[op]
    kw = {name: args[name] for name in keywords}
    if isinstance(kw.get("generator"), torch.Generator):
        kw["generator"] = torch.Generator().manual_seed(seed)  # each path its own, same state
    torch.manual_seed(seed)  # generator=None: the default generator, in the same state for both paths
    try:
        return fn(*[args[name] for name in positional], **kw), None
    except Exception as exc:  # noqa: BLE001 -- the test is which exceptions come out
        return None, exc


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(
            torch.equal(a.cpu(), b.cpu()))
    return a == b


def _check_case(sv, op, args):
    COUNTS["cases"] += 1
    names = SIGNATURES[op][0] + SIGNATURES[op][1]
    if op in HIDDEN_OPS:
        names = names + ["logits["]  # the head's logits of `hidden`, named as verify_logits names its rows
    reference = mod(sv, "hidden_reference") if op in HIDDEN_OPS else sv.reference
    ours, our_exc = _run(getattr(sv, op), args, op, seed=7)
    ref, ref_exc = _run(getattr(reference, op), args, op, seed=7)
    for path, exc in (("kernel", our_exc), ("reference", ref_exc)):
        if exc is None:
            continue
        assert isinstance(exc, NAMED), f"{path}: {type(exc).__name__}: {exc}"
        assert any(n in str(exc) for n in names), f"{path}: the message names no argument: {exc}"
    assert type(our_exc) is type(ref_exc), f"kernel {our_exc!r} but reference {ref_exc!r}"
    if our_exc is not None:
        COUNTS["raised"] += 1
        return
    assert _same(ours, ref), f"kernel {ours} but reference {ref}"
    COUNTS["agreed_results"] += 1


def _settings():
    return settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG_RUN, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("op", list(SIGNATURES))
def test_hostile_arguments(sv, op):
    @_settings()
    @given(st.data())
    def run(data):
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
        args, shape = _valid(sv, op, data.draw, gen)
        for name in data.draw(st.lists(st.sampled_from(list(args)), max_size=3, unique=True)):
            args[name] = _hostile(name, args[name], shape, data.draw)
        _check_case(sv, op, args)

    before = COUNTS["cases"]
    run()
    print(f"\n{op}: {COUNTS['cases'] - before} hostile cases; running total {COUNTS}")


def test_negative_control_a_disagreeing_path_is_caught(sv):
    """The checker itself must fail when the paths disagree: a reference that
    raises ValueError where the kernel raises TypeError is reported."""

    class Disagreeing:
        reference = None

    args = {"target_probs": torch.rand(2, 5), "draft_tokens": torch.tensor([1.5])}  # float ids: TypeError

    class Ref:
        @staticmethod
        def verify_greedy(*a, **k):
            raise ValueError("target_probs is fine; I disagree")

    fake = Disagreeing()
    fake.verify_greedy = sv.verify_greedy
    fake.reference = Ref
    with pytest.raises(AssertionError, match="kernel .* but reference"):
        _check_case(fake, "verify_greedy", args)


def test_negative_control_an_unnamed_error_is_caught(sv):
    class Both:
        @staticmethod
        def warp_probs(*a, **k):
            raise ValueError("something went wrong")

    Both.reference = Both
    with pytest.raises(AssertionError, match="names no argument"):
        _check_case(Both, "warp_probs", {"logits": torch.zeros(1, 2), "temperature": 1.0, "top_k": 0,
                                         "top_p": 1.0, "min_p": 0.0, "normalize": True})
