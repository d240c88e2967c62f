"""Every misuse gets a clear error naming the argument and the rule, on the
C++ path and on the reference path alike; nothing crashes or reads out of
bounds (the C++ checks run before any row is read)."""

from __future__ import annotations

import re

import pytest
import torch

F64 = torch.float64


def _ok_sampled(vocab=10, k=3):
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(k + 1, vocab, generator=gen) + 0.01
    draft = torch.rand(k, vocab, generator=gen) + 0.01
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    return target, draft, tokens


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


def test_wrong_rank(path):
    target, draft, tokens = _ok_sampled()
    with _raises(ValueError, "target_probs", "dimensions"):
        path.verify_greedy(target[0], tokens)
    with _raises(ValueError, "draft_tokens", "dimension"):
        path.verify_greedy(target, tokens[None])
    with _raises(ValueError, "draft_probs", "dimensions"):
        path.verify_sampled(target, draft[0], tokens)


def test_shapes_that_disagree(path):
    target, draft, tokens = _ok_sampled()
    with _raises(ValueError, "target_probs", "K+1"):
        path.verify_greedy(target[:3], tokens)
    with _raises(ValueError, "target_probs", "K+1"):
        path.verify_sampled(target, draft, tokens[:2])
    with _raises(ValueError, "draft_probs", "shape"):
        path.verify_sampled(target, draft[:, :5], tokens)
    with _raises(ValueError, "draft_probs", "shape"):
        path.verify_sampled(target, draft[:2], tokens)
    with _raises(ValueError, "V >= 1"):
        path.verify_greedy(torch.empty(1, 0), torch.empty(0, dtype=torch.long))


def test_unsupported_dtypes(path):
    target, draft, tokens = _ok_sampled()
    with _raises(TypeError, "target_probs", "float32"):
        path.verify_greedy(target.double(), tokens)
    with _raises(TypeError, "target_probs", "float32"):
        path.verify_greedy(target.to(torch.int64), tokens)
    with _raises(TypeError, "draft_tokens", "int64"):
        path.verify_greedy(target, tokens.float())
    with _raises(TypeError, "draft_probs", "dtype"):
        path.verify_sampled(target, draft.half(), tokens)
    with _raises(TypeError, "uniforms", "float64"):
        path.verify_sampled(target, draft, tokens, uniforms=torch.rand(4))


# ----------------------------------------------------------------------------
# Token ids
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [-1, 10, 2**40])
def test_token_out_of_range(path, bad_id):
    target, draft, tokens = _ok_sampled()
    tokens = tokens.clone()
    tokens[2] = bad_id
    with _raises(IndexError, "draft_tokens", "outside [0, V)", str(bad_id)):
        path.verify_greedy(target, tokens)
    with _raises(IndexError, "draft_tokens", "outside [0, V)"):
        path.verify_sampled(target, draft, tokens)


def test_int32_token_out_of_range(path):
    target, draft, tokens = _ok_sampled()
    with _raises(IndexError, "draft_tokens"):
        path.verify_greedy(target, torch.tensor([0, 1, 10], dtype=torch.int32))


# ----------------------------------------------------------------------------
# Probability values in rows that are read
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", ["target_probs", "draft_probs"])
def test_bad_probability_in_read_row(path, value, which):
    target, draft, tokens = _ok_sampled(vocab=1000)
    uniforms = torch.zeros(4, dtype=F64)  # accept everything: every row is read
    rows = {"target_probs": target, "draft_probs": draft}
    rows[which][0, 777] = value
    with _raises(ValueError, which, "777", "finite and non-negative"):
        path.verify_sampled(target, draft, tokens, uniforms=uniforms)


def test_negative_zero_is_a_valid_zero(path):
    target, draft, tokens = _ok_sampled()
    target[:, 5] = -0.0
    path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


def test_nan_in_greedy_row(path):
    target, _, tokens = _ok_sampled(vocab=100)
    target[0, 42] = float("nan")
    with _raises(ValueError, "target_probs", "42", "NaN"):
        path.verify_greedy(target, tokens)


@pytest.mark.parametrize("which", ["target_probs", "draft_probs"])
def test_row_summing_to_zero(path, which):
    target, draft, tokens = _ok_sampled()
    rows = {"target_probs": target, "draft_probs": draft}
    rows[which][0] = 0.0
    draft[0, tokens[0]] = 0.5 if which == "target_probs" else 0.0
    with _raises(ValueError, which, "sums to zero"):
        path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


def test_draft_token_with_zero_draft_mass(path):
    target, draft, tokens = _ok_sampled()
    draft[1, tokens[1]] = 0.0
    with _raises(ValueError, "draft_probs", "cannot have sampled", str(int(tokens[1]))):
        path.verify_sampled(target, draft, tokens, uniforms=torch.zeros(4, dtype=F64))


# ----------------------------------------------------------------------------
# Uniforms
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, -1e-9, float("nan"), 2.0])
def test_uniforms_outside_unit_interval(path, bad):
    target, draft, tokens = _ok_sampled()
    uniforms = torch.full((4,), 0.5, dtype=F64)
    uniforms[2] = bad
    with _raises(ValueError, "uniforms", "[0, 1)"):
        path.verify_sampled(target, draft, tokens, uniforms=uniforms)


def test_uniforms_wrong_length(path):
    target, draft, tokens = _ok_sampled()
    with _raises(ValueError, "uniforms", "shape"):
        path.verify_sampled(target, draft, tokens, uniforms=torch.rand(3, dtype=F64))


# ----------------------------------------------------------------------------
# Batched arguments
# ----------------------------------------------------------------------------


def test_batched_bad_input(path):
    target = torch.rand(3, 4, 20)
    draft = torch.rand(3, 3, 20)
    tokens = torch.zeros(3, 3, dtype=torch.long)
    with _raises(ValueError, "num_draft_tokens", "[0, K]"):
        path.verify_greedy_batched(target, tokens, torch.tensor([1, 4, 0]))
    with _raises(ValueError, "num_draft_tokens", "entries"):
        path.verify_greedy_batched(target, tokens, torch.tensor([1, 2]))
    with _raises(ValueError, "target_probs", "[B, K+1, V]"):
        path.verify_greedy_batched(target[:2], tokens)
    with _raises(ValueError, "uniforms", "shape"):
        path.verify_sampled_batched(target, draft, tokens, uniforms=torch.rand(3, 3, dtype=F64))
    bad_tokens = tokens.clone()
    bad_tokens[1, 0] = 20
    with _raises(IndexError, "draft_tokens", "outside [0, V)"):
        path.verify_sampled_batched(target, draft, bad_tokens)
    with _raises(ValueError, "draft_probs", "shape"):
        path.verify_sampled_batched(target, draft[:, :2], tokens)


def test_batched_error_names_the_sequence(sv):
    target = torch.rand(3, 3, 20)
    draft = torch.rand(3, 2, 20)
    tokens = torch.zeros(3, 2, dtype=torch.long)
    target[2, 0, 7] = -3.0
    with _raises(ValueError, "target_probs[2, 0, 7]"):
        sv.verify_sampled_batched(target, draft, tokens, uniforms=torch.zeros(3, 3, dtype=F64))


# ----------------------------------------------------------------------------
# Devices and non-tensors
# ----------------------------------------------------------------------------


def test_non_tensor_argument(sv):
    with _raises(TypeError, "target_probs"):
        sv.verify_greedy([[0.1, 0.9]], torch.tensor([1]))


def test_meta_tensors_go_to_reference_and_are_refused_there(sv):
    # Tensors on another device take the reference path; mixing devices is refused.
    target = torch.rand(2, 5)
    with _raises(ValueError, "one device"):
        sv.verify_greedy(target.to("meta"), torch.tensor([1]))
