"""Every misuse gets a clear error naming the argument and the rule, in both op
families (probability rows in; logits in), on the C++ path and on the
reference path alike; nothing crashes or reads out of bounds (the C++ checks
run before any row is read)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from tests.op_families import NAN, OPS, RANDOM_OPS

F64 = torch.float64
ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
RANDOM = pytest.mark.parametrize("op", [OPS[name] for name in RANDOM_OPS], ids=RANDOM_OPS)


def _ok(sv, op, vocab=10, k=3):
    """Valid inputs for `op`: target [K+1, V], draft [K, V], tokens [K]."""
    return op.case(sv, torch.Generator().manual_seed(0), k, vocab)


@pytest.fixture(params=["cpp", "reference"])
def path(request, sv):
    """Both implementations of the ops, under one interface."""
    return sv if request.param == "cpp" else sv.reference


def _raises(exc, *words):
    """pytest.raises that also requires every word in the message."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(w)})" for w in words))


# ----------------------------------------------------------------------------
# Shapes, ranks, dtypes
# ----------------------------------------------------------------------------


@ALL
def test_wrong_rank(sv, path, op):
    target, draft, tokens = _ok(sv, op)
    with _raises(ValueError, op.target, "dimensions"):
        op.call(path, target[0], draft, tokens)
    with _raises(ValueError, "draft_tokens", "dimension"):
        op.call(path, target, draft, tokens[None])
    if op.random:
        with _raises(ValueError, op.draft, "dimensions"):
            op.call(path, target, draft[0], tokens)


@ALL
def test_shapes_that_disagree(sv, path, op):
    target, draft, tokens = _ok(sv, op)
    with _raises(ValueError, f"{op.target} must have K+1"):
        op.call(path, target[:3], draft, tokens)
    with _raises(ValueError, f"{op.target} must have K+1"):
        op.call(path, target, draft, tokens[:2])
    if op.random:
        with _raises(ValueError, f"{op.draft} must have shape"):
            op.call(path, target, draft[:, :5], tokens)
        with _raises(ValueError, f"{op.draft} must have shape"):
            op.call(path, target, draft[:2], tokens)
    with _raises(ValueError, "V >= 1"):
        op.call(path, torch.empty(1, 0), torch.empty(0, 0), torch.empty(0, dtype=torch.long))


@ALL
def test_unsupported_dtypes(sv, path, op):
    target, draft, tokens = _ok(sv, op)
    with _raises(TypeError, f"{op.target} must be float32"):
        op.call(path, target.double(), draft, tokens)
    with _raises(TypeError, f"{op.target} must be float32"):
        op.call(path, target.to(torch.int64), draft, tokens)
    with _raises(TypeError, "draft_tokens", "int64"):
        op.call(path, target, draft, tokens.float())
    if op.random:
        with _raises(TypeError, f"{op.draft} must have the dtype"):
            op.call(path, target, draft.half(), tokens)
        with _raises(TypeError, "uniforms", "float64"):
            op.call(path, target, draft, tokens, uniforms=torch.rand(4))


# ----------------------------------------------------------------------------
# Token ids
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [-1, 10, 2**40])
@ALL
def test_token_out_of_range(sv, path, op, bad_id):
    target, draft, tokens = _ok(sv, op)
    tokens = tokens.clone()
    tokens[2] = bad_id
    with _raises(IndexError, "draft_tokens", "outside [0, V)", str(bad_id)):
        op.call(path, target, draft, tokens)


@ALL
def test_int32_token_out_of_range(sv, path, op):
    target, draft, _ = _ok(sv, op)
    with _raises(IndexError, "draft_tokens"):
        op.call(path, target, draft, torch.tensor([0, 1, 10], dtype=torch.int32))


# ----------------------------------------------------------------------------
# Probability values in rows that are read (probability rows in)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", ["target_probs", "draft_probs"])
def test_bad_probability_in_read_row(sv, path, value, which):
    target, draft, tokens = _ok(sv, OPS["sampled"], vocab=1000)
    uniforms = torch.zeros(4, dtype=F64)  # accept everything: every row is read
    rows = {"target_probs": target, "draft_probs": draft}
    rows[which][0, 777] = value
    with _raises(ValueError, which, "777", "finite and non-negative"):
        path.verify_sampled(target, draft, tokens, uniforms=uniforms)


def test_negative_zero_is_a_valid_zero(sv, path):
    target, draft, tokens = _ok(sv, OPS["sampled"])
    target[:, 5] = -0.0
    path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


def test_nan_in_greedy_row(sv, path):
    target, _, tokens = _ok(sv, OPS["greedy"], vocab=100)
    target[0, 42] = float("nan")
    with _raises(ValueError, "target_probs", "42", "NaN"):
        path.verify_greedy(target, tokens)


@pytest.mark.parametrize("which", ["target_probs", "draft_probs"])
def test_row_summing_to_zero(sv, path, which):
    target, draft, tokens = _ok(sv, OPS["sampled"])
    rows = {"target_probs": target, "draft_probs": draft}
    rows[which][0] = 0.0
    draft[0, tokens[0]] = 0.5 if which == "target_probs" else 0.0
    with _raises(ValueError, which, "sums to zero"):
        path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


def test_draft_token_with_zero_draft_mass(sv, path):
    target, draft, tokens = _ok(sv, OPS["sampled"])
    draft[1, tokens[1]] = 0.0
    with _raises(ValueError, "draft_probs", "cannot have sampled", str(int(tokens[1]))):
        path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


# ----------------------------------------------------------------------------
# Logits and warping arguments (logits in)
# ----------------------------------------------------------------------------


def test_tokens_outside_the_warped_draft_support_are_refused(path):
    target = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0]])
    draft = torch.tensor([[1.0, 2.0, 0.0, -1.0]])
    u = torch.tensor([0.5, 0.5], dtype=F64)
    for bad_token, warp in [(2, dict(top_k=2)), (3, dict(top_p=0.7)), (3, dict(min_p=0.2)),
                            (0, dict(temperature=0.0))]:
        with pytest.raises(ValueError, match=r"draft_tokens\[0\] = \d is outside the support"):
            path.verify_logits(target, draft, torch.tensor([bad_token]), uniforms=u, **warp)
    # -inf logits have no mass at any warping.
    draft_inf = draft.clone()
    draft_inf[0, 3] = -math.inf
    with pytest.raises(ValueError, match="outside the support"):
        path.verify_logits(target, draft_inf, torch.tensor([3]), uniforms=u)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(min_p=float("nan")), "min_p"),
    ],
)
def test_bad_warping_arguments(path, kwargs, pattern):
    target = torch.zeros(2, 5)
    draft = torch.zeros(1, 5)
    with pytest.raises(ValueError, match=pattern):
        path.verify_logits(target, draft, torch.tensor([1]), **kwargs)
    with pytest.raises(ValueError, match=pattern):
        path.sample_draft(draft, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        path.warp_probs(draft, **kwargs)


def test_warping_argument_types(sv):
    target, draft, tokens = torch.zeros(3, 5), torch.zeros(2, 5), torch.tensor([0, 1])
    with pytest.raises(TypeError, match="top_k must be an int"):
        sv.verify_logits(target, draft, tokens, top_k=2.5)
    with pytest.raises(TypeError, match="temperature must be a real number"):
        sv.sample_draft(draft, temperature="hot")


@pytest.mark.parametrize("value, name", [(float("nan"), "nan"), (float("inf"), "inf")])
@pytest.mark.parametrize("which", ["target_logits", "draft_logits"])
def test_nan_and_pos_inf_logits_in_a_read_row(path, value, name, which):
    target = torch.zeros(2, 37)
    draft = torch.zeros(1, 37)
    (target if which == "target_logits" else draft)[0, 33] = value
    with pytest.raises(ValueError, match=rf"{which}\[0, 33\] is {name}: logits must be finite or -inf"):
        path.verify_logits(target, draft, torch.tensor([1]))
    everywhere = torch.full((2, 37), -math.inf)
    with pytest.raises(ValueError, match="-inf everywhere"):
        path.verify_logits(everywhere, draft, torch.tensor([1]))


def test_sample_draft_uniforms_wrong_length(path):
    with _raises(ValueError, "uniforms must have shape"):
        path.sample_draft(torch.zeros(2, 5), uniforms=torch.tensor([0.1], dtype=F64))


# ----------------------------------------------------------------------------
# Uniforms
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, -1e-9, float("nan"), 2.0])
@RANDOM
def test_uniforms_outside_unit_interval(sv, path, op, bad):
    target, draft, tokens = _ok(sv, op)
    uniforms = torch.full((4,), 0.5, dtype=F64)
    uniforms[2] = bad
    with _raises(ValueError, "uniforms must lie in", "[0, 1)"):
        op.call(path, target, draft, tokens, uniforms=uniforms)


@RANDOM
def test_uniforms_wrong_length(sv, path, op):
    target, draft, tokens = _ok(sv, op)
    with _raises(ValueError, "uniforms must have shape"):
        op.call(path, target, draft, tokens, uniforms=torch.rand(3, dtype=F64))


# ----------------------------------------------------------------------------
# Batched arguments
# ----------------------------------------------------------------------------


@ALL
def test_batched_bad_input(sv, path, op):
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(0), k=3, vocab=20, batch=3)
    with _raises(ValueError, "num_draft_tokens", "[0, K]"):
        op.call_batched(path, target, draft, tokens, torch.tensor([1, 4, 0]))
    with _raises(ValueError, "num_draft_tokens", "entries"):
        op.call_batched(path, target, draft, tokens, torch.tensor([1, 2]))
    with _raises(ValueError, op.target, "[B, K+1, V]"):
        op.call_batched(path, target[:2], draft, tokens)
    bad_tokens = tokens.clone()
    bad_tokens[1, 0] = 20
    with _raises(IndexError, "draft_tokens", "outside [0, V)"):
        op.call_batched(path, target, draft, bad_tokens)
    if op.random:
        with _raises(ValueError, "uniforms", "shape"):
            op.call_batched(path, target, draft, tokens, uniforms=torch.rand(3, 3, dtype=F64))
        with _raises(ValueError, op.draft, "shape"):
            op.call_batched(path, target, draft[:, :2], tokens)


@RANDOM
def test_batched_error_names_the_sequence(sv, path, op):
    target, draft, tokens = op.case(sv, torch.Generator().manual_seed(0), k=2, vocab=20, batch=3)
    target[2, 0, 7] = -3.0 if op.rows == "probs" else NAN  # a value the rows may not hold
    with _raises(ValueError, f"{op.target}[2, 0, 7]"):
        op.call_batched(path, target, draft, tokens, uniforms=torch.zeros(3, 3, dtype=F64))


# ----------------------------------------------------------------------------
# Devices and non-tensors
# ----------------------------------------------------------------------------


@ALL
def test_non_tensor_argument(sv, op):
    _, draft, tokens = _ok(sv, op)
    with _raises(TypeError, op.target):
        op.call(sv, [[0.1, 0.9]] * 4, draft, tokens)


NONE_CASES = [(name, which) for name, op in OPS.items()
              for which in (("target", "draft", "tokens") if op.random else ("target", "tokens"))]


@pytest.mark.parametrize("name, which", NONE_CASES, ids=[f"{n}-{w}" for n, w in NONE_CASES])
def test_none_for_a_required_tensor(sv, path, name, which):
    """None where a tensor is required: the same named TypeError on both paths, single and batched."""
    op = OPS[name]
    target, draft, tokens = _ok(sv, op)
    single = {"target": target, "draft": draft, "tokens": tokens, which: None}
    batched = {"target": target[None], "draft": draft[None], "tokens": tokens[None], which: None}
    arg = {"target": op.target, "draft": op.draft, "tokens": "draft_tokens"}[which]
    with _raises(TypeError, arg, "must be a torch.Tensor", "NoneType"):
        op.call(path, single["target"], single["draft"], single["tokens"])
    with _raises(TypeError, arg, "must be a torch.Tensor", "NoneType"):
        op.call_batched(path, batched["target"], batched["draft"], batched["tokens"])


@ALL
def test_meta_tensors_go_to_reference_and_are_refused_there(sv, op):
    # Tensors on another device take the reference path; mixing devices is refused.
    target, draft, tokens = _ok(sv, op)
    with _raises(ValueError, "one device"):
        op.call(sv, target.to("meta"), draft, tokens)


# ----------------------------------------------------------------------------
# The hardening issue's reproducers (each was a crash, a wrong exception type
# or a message naming no argument); both paths, same type and wording
# ----------------------------------------------------------------------------

LOGIT_OPS = ["verify_logits", "sample_draft", "warp_probs"]


def _logits_call(path, name, **kw):
    target, draft, tokens = torch.zeros(3, 5), torch.zeros(2, 5), torch.tensor([0, 1])
    if name == "verify_logits":
        return path.verify_logits(target, draft, tokens, **kw)
    return getattr(path, name)(draft, **kw)


@pytest.mark.parametrize("name", LOGIT_OPS)
@pytest.mark.parametrize("arg", ["temperature", "top_p", "min_p"])
@pytest.mark.parametrize("huge", [10**400, -10**400])
def test_ints_beyond_float_range_are_named_value_errors(path, name, arg, huge):
    with _raises(ValueError, arg):
        _logits_call(path, name, **{arg: huge})


@pytest.mark.parametrize("name", LOGIT_OPS)
def test_top_k_beyond_int64_is_off(sv, path, name):
    # top_k >= V is off; so is any top_k beyond int64 (the schema's own range).
    gen = torch.Generator().manual_seed(3)
    target, draft = torch.randn(3, 9, generator=gen), torch.randn(2, 9, generator=gen)
    tokens, u = torch.tensor([1, 2]), torch.tensor([0.3, 0.6, 0.9], dtype=F64)
    for top_k in (2**63 - 1, 2**63, 2**100):
        if name == "verify_logits":
            got = path.verify_logits(target, draft, tokens, top_k=top_k, uniforms=u)
            assert got == sv.reference.verify_logits(target, draft, tokens, top_k=0, uniforms=u)
        elif name == "sample_draft":
            got = path.sample_draft(draft, top_k=top_k, uniforms=u[:2])
            assert torch.equal(got, sv.reference.sample_draft(draft, top_k=0, uniforms=u[:2]))
        else:
            assert torch.equal(path.warp_probs(draft, top_k=top_k), sv.reference.warp_probs(draft, top_k=0))
    with _raises(ValueError, "top_k", ">= 0"):
        _logits_call(path, name, top_k=-2**70)


@pytest.mark.parametrize("name", ["sample_draft", "warp_probs"])
def test_zero_vocabulary_rows(path, name):
    arg = "draft_logits" if name == "sample_draft" else "logits"
    for shape in [(0,), (2, 0), (3, 0, 0)]:
        with _raises(ValueError, arg, "V >= 1"):
            getattr(path, name)(torch.zeros(shape))


def _every_op_call(path, t, d, ids):
    """Each public op once on (target, draft, tokens) of a single sequence."""
    return [
        lambda: path.verify_greedy(t, ids),
        lambda: path.verify_sampled(t, d, ids),
        lambda: path.verify_greedy_batched(t[None], ids[None]),
        lambda: path.verify_sampled_batched(t[None], d[None], ids[None]),
        lambda: path.verify_logits(t, d, ids),
        lambda: path.verify_logits_batched(t[None], d[None], ids[None]),
        lambda: path.sample_draft(d),
        lambda: path.warp_probs(d),
    ]


def test_meta_tensors_are_refused_by_name(sv, path):
    t, d, ids = torch.rand(3, 6).to("meta"), torch.rand(2, 6).to("meta"), torch.tensor([1, 2]).to("meta")
    for call in _every_op_call(path, t, d, ids):
        with _raises(ValueError, "meta tensor"):
            call()
    for law in (lambda: sv.acceptance_rates(t, d), lambda: sv.emitted_token_law(t, d),
                lambda: sv.joint_law(t, d), lambda: sv.accepted_length_pmf(torch.rand(2).to("meta")),
                lambda: sv.expected_accepted(torch.rand(2).to("meta"))):
        with pytest.raises(ValueError, match="is a meta tensor"):
            law()


@pytest.mark.parametrize("uniforms", [None, torch.tensor([0.5, 0.5, 0.5], dtype=F64)], ids=["drawn", "given"])
@pytest.mark.parametrize("bad", [3, "seed", torch.tensor(1)])
def test_generator_of_the_wrong_type(path, bad, uniforms):
    t, d, ids = torch.rand(3, 6), torch.rand(2, 6), torch.tensor([1, 2])
    for call in (lambda: path.verify_sampled(t, d, ids, generator=bad, uniforms=uniforms),
                 lambda: path.verify_logits(t, d, ids, generator=bad, uniforms=uniforms),
                 lambda: path.sample_draft(d, generator=bad)):
        with _raises(TypeError, "generator must be a torch.Generator"):
            call()


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_normalize_of_the_wrong_type(path, bad):
    with _raises(TypeError, "normalize must be a bool"):
        path.warp_probs(torch.zeros(2, 5), normalize=bad)


@pytest.mark.parametrize("arg", ["temperature", "top_p", "min_p"])
def test_bool_warping_argument_is_a_type_error_on_both_paths(path, arg):
    for name in LOGIT_OPS:
        with _raises(TypeError, arg, "real number"):
            _logits_call(path, name, **{arg: True})


def test_huge_stride_0_batch_with_a_bad_count_is_refused_before_allocating(path):
    # 2^40 sequences as stride-0 views: the bad count is found without a B-sized allocation.
    batch = 2**40
    target = torch.rand(1, 3, 4).expand(batch, 3, 4)
    tokens = torch.zeros(1, 2, dtype=torch.long).expand(batch, 2)
    with _raises(ValueError, "num_draft_tokens[0]", "outside [0, K]"):
        path.verify_greedy_batched(target, tokens, torch.tensor([3]).expand(batch))
    late = torch.zeros(1 << 17, dtype=torch.long)
    late[-1] = -1  # the first bad entry past the reference's first chunk
    with _raises(ValueError, f"num_draft_tokens[{(1 << 17) - 1}]"):
        path.verify_greedy_batched(target[: 1 << 17], tokens[: 1 << 17], late)


# ----------------------------------------------------------------------------
# V >= 2^31: refused (token ids are 32-bit in the logits code)
# ----------------------------------------------------------------------------


def test_vocabulary_of_2_31_is_refused(path):
    # Expanded stride-0 views: a [rows, 2^31] tensor that uses one element of memory.
    vocab = 2**31
    t, d = torch.rand(1, 1).expand(3, vocab), torch.rand(1, 1).expand(2, vocab)
    ids = torch.tensor([0, 1])
    for call in _every_op_call(path, t, d, ids):
        with _raises(ValueError, "V = 2147483648", "2^31 - 1"):
            call()


# ----------------------------------------------------------------------------
# The ragged forms (vLLM's flattened layout): every misuse, both paths alike
# ----------------------------------------------------------------------------

RAGGED_KINDS = ["greedy", "sampled", "point_mass"]


def _ragged_ok():
    """Three sequences (k = 2, 0, 3), V = 10: target [T+B, V], draft [T, V], ids [T], cu [B], u [T+B]."""
    gen = torch.Generator().manual_seed(2)
    target, draft = torch.rand(8, 10, generator=gen) + 0.01, torch.rand(5, 10, generator=gen) + 0.01
    return target, draft, torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 2, 5]), torch.full((8,), 0.5, dtype=F64)


def _ragged_call(path, kind, target, draft, tokens, cu, bonus=None, **kw):
    if kind == "greedy":
        return path.verify_greedy_ragged(target, tokens, cu, bonus)
    return path.verify_sampled_ragged(target, None if kind == "point_mass" else draft, tokens, cu, bonus, **kw)


@pytest.mark.parametrize("kind", RAGGED_KINDS)
def test_ragged_bad_layouts(path, kind):
    target, draft, tokens, cu, _ = _ragged_ok()
    call = lambda *a, **kw: _ragged_call(path, kind, *a, **kw)  # noqa: E731
    call(target, draft, tokens, cu)  # valid
    with _raises(ValueError, "target_probs", "dimensions"):
        call(target[0], draft, tokens, cu)
    with _raises(ValueError, "draft_tokens", "dimension"):
        call(target, draft, tokens[None], cu)
    with _raises(ValueError, "cu_num_draft_tokens", "dimension"):
        call(target, draft, tokens, cu[None])
    with _raises(TypeError, "target_probs", "float32"):
        call(target.double(), draft, tokens, cu)
    with _raises(TypeError, "cu_num_draft_tokens", "int64 or int32"):
        call(target, draft, tokens, cu.float())
    with _raises(TypeError, "cu_num_draft_tokens", "torch.Tensor"):
        call(target, draft, tokens, [2, 2, 5])
    with _raises(ValueError, "cu_num_draft_tokens[1]", "nondecreasing"):
        call(target, draft, tokens, torch.tensor([3, 2, 5]))
    with _raises(ValueError, "cu_num_draft_tokens[0]", "non-negative"):
        call(target[:7], draft, tokens, torch.tensor([-1, 1]))
    with _raises(ValueError, "cu_num_draft_tokens must end at T = 5"):
        call(target[:7], draft, tokens, torch.tensor([2, 4]))
    with _raises(ValueError, "cu_num_draft_tokens must end at T = 5"):
        call(target[:5], draft, tokens, torch.zeros(0, dtype=torch.long))
    with _raises(ValueError, "target_probs must have T+B = 8 rows"):
        call(target[:7], draft, tokens, cu)
    with _raises(IndexError, "draft_tokens", "outside [0, V)"):
        call(target, draft, torch.tensor([1, 2, 3, 4, 10]), cu)
    with _raises(IndexError, "draft_tokens", "outside [0, V)"):
        call(target, draft, torch.tensor([1, -1, 3, 4, 5], dtype=torch.int32), cu)


@pytest.mark.parametrize("kind", RAGGED_KINDS)
def test_ragged_bad_bonus_tokens(path, kind):
    target, draft, tokens, cu, _ = _ragged_ok()
    call = lambda *a, **kw: _ragged_call(path, kind, *a, **kw)  # noqa: E731
    bonus = torch.tensor([0, 9, 3])
    call(target[:5], draft, tokens, cu, bonus)  # valid: T rows with the bonus given
    with _raises(ValueError, "target_probs must have T = 5 rows", "bonus_tokens given"):
        call(target, draft, tokens, cu, bonus)
    with _raises(ValueError, "bonus_tokens must have B = 3"):
        call(target[:5], draft, tokens, cu, bonus[:2])
    with _raises(ValueError, "bonus_tokens", "dimension"):
        call(target[:5], draft, tokens, cu, bonus[None])
    with _raises(TypeError, "bonus_tokens", "int64 or int32"):
        call(target[:5], draft, tokens, cu, bonus.float())
    for bad in (10, -1):
        with _raises(IndexError, "bonus_tokens[1]", "outside [0, V)"):
            call(target[:5], draft, tokens, cu, torch.tensor([0, bad, 3], dtype=torch.int32))


@pytest.mark.parametrize("kind", ["sampled", "point_mass"])
def test_ragged_bad_uniforms_and_rows(path, kind):
    target, draft, tokens, cu, u = _ragged_ok()
    call = lambda *a, **kw: _ragged_call(path, kind, *a, **kw)  # noqa: E731
    with _raises(ValueError, "uniforms must have shape [8]", "T+B"):
        call(target, draft, tokens, cu, uniforms=u[:7])
    with _raises(ValueError, "uniforms must have shape [8]"):
        call(target, draft, tokens, cu, uniforms=u[None])
    with _raises(TypeError, "uniforms must be float64"):
        call(target, draft, tokens, cu, uniforms=u.float())
    for bad in (1.0, -0.1, NAN):
        with _raises(ValueError, "uniforms must lie in [0, 1)"):
            call(target, draft, tokens, cu, uniforms=torch.cat([u[:7], torch.tensor([bad], dtype=F64)]))
    with _raises(TypeError, "generator"):
        call(target, draft, tokens, cu, generator=3)
    poisoned = target.clone()
    poisoned[3, 7] = NAN  # rows 0-2 are sequence 0's; row 3 is sequence 1's only (k = 0: its bonus row)
    with _raises(ValueError, "target_probs[1, 0, 7]"):
        call(poisoned, draft, tokens, cu, uniforms=u)
    negative = target.clone()
    negative[4, 2] = -1.0  # sequence 2's first row
    with _raises(ValueError, "target_probs[2, 0, 2]", "non-negative"):
        call(negative, draft, tokens, cu, uniforms=u)
    if kind == "sampled":
        with _raises(ValueError, "draft_probs must have shape [T, V] = [5, 10]"):
            call(target, draft[:4], tokens, cu)
        with _raises(TypeError, "draft_probs must have the dtype of target_probs"):
            call(target, draft.half(), tokens, cu)
        zero = draft.clone()
        zero[2, 3] = 0.0  # sequence 2's first draft row, at its token 3
        with _raises(ValueError, "draft_probs[2, 0, 3] is zero"):
            call(target, zero, tokens, cu, uniforms=u)


def test_ragged_greedy_nan_names_the_sequence(path):
    target, _, tokens, cu, _ = _ragged_ok()
    target[4, 6] = NAN
    with _raises(ValueError, "target_probs[2, 0, 6] is NaN"):
        path.verify_greedy_ragged(target, tokens, cu)


@pytest.mark.parametrize("kind", RAGGED_KINDS)
def test_ragged_meta_tensors_are_refused(sv, kind):
    target, draft, tokens, cu, _ = _ragged_ok()
    with _raises(ValueError, "one device"):
        _ragged_call(sv, kind, target, draft, tokens, cu.to("meta"))
    with _raises(ValueError, "meta tensor"):
        _ragged_call(sv, kind, target.to("meta"), draft.to("meta"), tokens.to("meta"), cu.to("meta"))


def test_ragged_huge_stride_0_layout_is_refused_before_allocating(path):
    batch = 2**40
    target = torch.rand(1, 4).expand(batch, 4)
    no_ids = torch.zeros(0, dtype=torch.long)
    with _raises(ValueError, "cu_num_draft_tokens[0]", "non-negative"):
        path.verify_greedy_ragged(target, no_ids, torch.tensor([-1]).expand(batch))
    with _raises(ValueError, "cu_num_draft_tokens must end at T = 0"):
        path.verify_greedy_ragged(target[:4], no_ids, torch.tensor([0, 0, 0, 1]))


def _logits_ragged_ok():
    """Two sequences (k = 2, 1), V = 6, with tokens each warped draft row can have drawn."""
    gen = torch.Generator().manual_seed(4)
    target, draft = torch.randn(5, 6, generator=gen), torch.randn(3, 6, generator=gen)
    return target, draft, draft.argmax(-1), torch.tensor([2, 3]), torch.full((5,), 0.5, dtype=F64)


@pytest.mark.parametrize("arg, value, exc, words", [
    ("temperature", -0.5, ValueError, ("temperature", ">= 0")),
    ("temperature", torch.tensor([0.5, -1.0]), ValueError, ("temperature", ">= 0")),
    ("temperature", torch.tensor([0.5, NAN]), ValueError, ("temperature", ">= 0")),
    ("temperature", torch.tensor([0.5, 1.0, 1.0]), ValueError, ("temperature", "B = 2")),
    ("temperature", torch.tensor([[0.5, 1.0]]), ValueError, ("temperature", "B = 2")),
    ("temperature", torch.tensor([1, 1]), TypeError, ("temperature", "floating-point")),
    ("temperature", True, TypeError, ("temperature", "real number")),
    ("top_k", torch.tensor([1.0, 2.0]), TypeError, ("top_k", "integer")),
    ("top_k", torch.tensor([3, -1]), ValueError, ("top_k", ">= 0")),
    ("top_k", torch.tensor([3]), ValueError, ("top_k", "B = 2")),
    ("top_k", -1, ValueError, ("top_k", ">= 0")),
    ("top_p", torch.tensor([0.5, 0.0]), ValueError, ("top_p", "(0, 1]")),
    ("min_p", torch.tensor([0.5, 1.0], dtype=torch.float16), ValueError, ("min_p", "[0, 1)")),
    ("min_p", "0.1", TypeError, ("min_p", "real number")),
])
def test_logits_ragged_bad_warping(path, arg, value, exc, words):
    target, draft, tokens, cu, u = _logits_ragged_ok()
    path.verify_logits_ragged(target, draft, tokens, cu, uniforms=u, temperature=torch.tensor([0.7, 0.0]))  # valid
    with _raises(exc, *words):
        path.verify_logits_ragged(target, draft, tokens, cu, uniforms=u, **{arg: value})


def test_logits_ragged_bad_layouts(path):
    target, draft, tokens, cu, u = _logits_ragged_ok()
    with _raises(ValueError, "target_logits must have T+B = 5 rows"):
        path.verify_logits_ragged(target[:4], draft, tokens, cu)
    with _raises(ValueError, "draft_logits must have shape [T, V] = [3, 6]"):
        path.verify_logits_ragged(target, draft[:2], tokens, cu)
    with _raises(ValueError, "cu_num_draft_tokens[1]", "nondecreasing"):
        path.verify_logits_ragged(target, draft, tokens, torch.tensor([3, 2]))
    with _raises(IndexError, "bonus_tokens[0]"):
        path.verify_logits_ragged(target[:3], draft, tokens, cu, torch.tensor([6, 0]))
    with _raises(ValueError, "uniforms must have shape [5]"):
        path.verify_logits_ragged(target, draft, tokens, cu, uniforms=u[:4])
    poisoned = target.clone()
    poisoned[3, 1] = NAN  # sequence 1's first row
    with _raises(ValueError, "target_logits[1, 0, 1]"):
        path.verify_logits_ragged(poisoned, draft, tokens, cu, uniforms=u, temperature=torch.tensor([1.0, 0.0]))
    # At temperature 0 a draft token must be its draft row's argmax (sequence 1's here).
    off = tokens.clone()
    off[2] = (off[2] + 1) % 6
    with _raises(ValueError, "draft_tokens[1, 0]", "support"):
        path.verify_logits_ragged(target, draft, off, cu, uniforms=torch.zeros(5, dtype=F64),
                                  temperature=torch.tensor([1.0, 0.0]))
