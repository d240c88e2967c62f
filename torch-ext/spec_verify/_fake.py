"""Fake (meta) implementations: output shapes without running the kernel.

They let the ops trace under torch.compile / torch.export and pass
torch.library.opcheck. The traceable ops return int64
tensors whose shapes depend only on the input shapes. The `*_ints` ops (two
data-dependent Python ints, for eager calls) have no fake implementation on
purpose: the wrappers never trace them (see `__init__._eager`).

Each fake validates what it can without values -- ranks, dtypes, shapes,
the warping arguments, one device for every tensor -- with the reference's
checks (`_checks.py`, the C++ wording). Why: a raw op called with a meta
tensor among CPU tensors runs its fake, which would otherwise return an
uninitialized CPU tensor as if it were a result.
"""

from __future__ import annotations

import torch

from ._checks import (
    RAGGED_UNIFORMS,
    WARP_NAMES,
    check_num_draft_shape,
    check_ragged,
    check_rows_tensor,
    check_same_device,
    check_sequences,
    check_tokens_tensor,
    check_uniforms_shape,
    check_vocab,
    check_warp_values,
)
from ._ops import add_op_namespace_prefix

_BATCHED_WHAT = "B rows of one per draft token plus one for the final draw"


def _check(target, draft, draft_tokens, num_draft_tokens=None, uniforms=None, *, batched, rows, what=None):
    # Shapes, dtypes and devices of a verify op's tensors (no value is read).
    shape = check_sequences(target, draft, draft_tokens, num_draft_tokens, batched=batched,
                            target_name=f"target_{rows}", draft_name=None if draft is None else f"draft_{rows}",
                            read_values=False)
    if uniforms is not None:
        u_shape = (shape.batch, shape.k + 1) if batched else (shape.k + 1,)
        check_uniforms_shape(uniforms, u_shape, what or (_BATCHED_WHAT if batched else
                                                         "one per draft token plus one for the final draw"))
        check_same_device(**{f"target_{rows}": target, "uniforms": uniforms})
    return shape


def _pair(like, batch):
    return like.new_empty((batch,), dtype=torch.int64), like.new_empty((batch,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_greedy"))
def _verify_greedy_fake(target_probs, draft_tokens):
    _check(target_probs, None, draft_tokens, batched=False, rows="probs")
    return target_probs.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_sampled"))
def _verify_sampled_fake(target_probs, draft_probs, draft_tokens, uniforms=None, generator=None):
    _check(target_probs, draft_probs, draft_tokens, None, uniforms, batched=False, rows="probs")
    return target_probs.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_greedy_batched"))
def _verify_greedy_batched_fake(target_probs, draft_tokens, num_draft_tokens=None):
    shape = _check(target_probs, None, draft_tokens, num_draft_tokens, batched=True, rows="probs")
    return _pair(target_probs, shape.batch)


@torch.library.register_fake(add_op_namespace_prefix("verify_sampled_batched"))
def _verify_sampled_batched_fake(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, uniforms=None, generator=None
):
    shape = _check(target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms, batched=True, rows="probs",
                   what="one per draft token plus one for the final draw")
    return _pair(target_probs, shape.batch)


# Block verification takes exactly verify_sampled's arguments: the same fakes.
torch.library.register_fake(add_op_namespace_prefix("verify_block"))(_verify_sampled_fake)
torch.library.register_fake(add_op_namespace_prefix("verify_block_batched"))(_verify_sampled_batched_fake)


# The ragged forms (vLLM's flattened layout): B = cu_num_draft_tokens.shape[0].


@torch.library.register_fake(add_op_namespace_prefix("verify_greedy_ragged"))
def _verify_greedy_ragged_fake(target_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens=None):
    shape = check_ragged(target_probs, None, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_probs", draft_name="draft_probs", read_values=False)
    return _pair(target_probs, shape.batch)


@torch.library.register_fake(add_op_namespace_prefix("verify_sampled_ragged"))
def _verify_sampled_ragged_fake(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens=None,
                                uniforms=None, generator=None):
    shape = check_ragged(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_probs", draft_name="draft_probs", read_values=False)
    if uniforms is not None:
        check_uniforms_shape(uniforms, (shape.total + shape.batch,), RAGGED_UNIFORMS)
        check_same_device(target_probs=target_probs, uniforms=uniforms)
    return _pair(target_probs, shape.batch)


# ----------------------------------------------------------------------------
# Logits in (csrc/ops_logits.cpp). verify_logits_ints, like the other *_ints
# ops, has no fake on purpose. The warping's values are checked first, as the
# C++ op checks them.
# ----------------------------------------------------------------------------


@torch.library.register_fake(add_op_namespace_prefix("verify_logits"))
def _verify_logits_fake(
    target_logits, draft_logits, draft_tokens, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
    uniforms=None, generator=None, block=False,
):
    check_warp_values(temperature, top_k, top_p, min_p)
    _check(target_logits, draft_logits, draft_tokens, None, uniforms, batched=False, rows="logits")
    return target_logits.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_logits_batched"))
def _verify_logits_batched_fake(
    target_logits, draft_logits, draft_tokens, num_draft_tokens=None, temperature=1.0, top_k=0,
    top_p=1.0, min_p=0.0, uniforms=None, generator=None, block=False,
):
    check_warp_values(temperature, top_k, top_p, min_p)
    shape = _check(target_logits, draft_logits, draft_tokens, num_draft_tokens, uniforms, batched=True,
                   rows="logits")
    return _pair(target_logits, shape.batch)


@torch.library.register_fake(add_op_namespace_prefix("verify_logits_ragged"))
def _verify_logits_ragged_fake(target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, temperature, top_k,
                               top_p, min_p, bonus_tokens=None, uniforms=None, generator=None):
    shape = check_ragged(target_logits, draft_logits, draft_tokens, cu_num_draft_tokens, bonus_tokens,
                         target_name="target_logits", draft_name="draft_logits", read_values=False)
    for name, t, dtype in zip(WARP_NAMES, (temperature, top_k, top_p, min_p),
                              (torch.float64, torch.int64, torch.float64, torch.float64)):
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} (one per sequence), got {t.dtype}")
        if tuple(t.shape) != (shape.batch,):
            raise ValueError(f"{name} must be a scalar or have B = {shape.batch} entries (one per sequence), "
                             f"got shape {tuple(t.shape)}")
        check_same_device(target_logits=target_logits, **{name: t})
    if uniforms is not None:
        check_uniforms_shape(uniforms, (shape.total + shape.batch,), RAGGED_UNIFORMS)
        check_same_device(target_logits=target_logits, uniforms=uniforms)
    return _pair(target_logits, shape.batch)


def _check_logits_rows(name, logits, uniforms=None):
    check_rows_tensor(name, logits, 2)
    check_vocab(name, logits.shape[1])
    if uniforms is not None:
        check_uniforms_shape(uniforms, (logits.shape[0],), f"one per row of {name}")
        check_same_device(**{name: logits, "uniforms": uniforms})


@torch.library.register_fake(add_op_namespace_prefix("sample_draft"))
def _sample_draft_fake(
    draft_logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, uniforms=None, generator=None
):
    check_warp_values(temperature, top_k, top_p, min_p)
    _check_logits_rows("draft_logits", draft_logits, uniforms)
    return draft_logits.new_empty((draft_logits.shape[0],), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("warp_probs"))
def _warp_probs_fake(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, normalize=True):
    check_warp_values(temperature, top_k, top_p, min_p)
    _check_logits_rows("logits", logits)
    return logits.new_empty(logits.shape, dtype=torch.float32)


# Hidden states in (csrc/ops_hidden.cpp): shapes from hidden and the head's weight.
def _check_hidden(hidden, weight, dim, **others):
    check_rows_tensor("hidden", hidden, 2)
    if hidden.shape[1] != dim:
        raise ValueError(f"hidden must be [n, d] with d = {dim} (the head's hidden size), "
                         f"got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have 2 dimensions, got shape {tuple(weight.shape)}")
    check_vocab("weight", weight.shape[0])
    check_same_device(hidden=hidden, weight=weight, **others)
    return weight.shape[0]


@torch.library.register_fake(add_op_namespace_prefix("hidden_logits"))
def _hidden_logits_fake(hidden, weight, bias, weight_format, dim):
    vocab = _check_hidden(hidden, weight, dim, bias=bias)
    return hidden.new_empty((hidden.shape[0], vocab), dtype=torch.float32)


@torch.library.register_fake(add_op_namespace_prefix("verify_hidden"))
def _verify_hidden_fake(hidden, weight, bias, draft_tokens, weight_format, dim, temperature=1.0, uniforms=None,
                        generator=None):
    check_warp_values(temperature, 0, 1.0, 0.0)
    _check_hidden(hidden, weight, dim, bias=bias, draft_tokens=draft_tokens, uniforms=uniforms)
    if draft_tokens.dim() != 1 or hidden.shape[0] != draft_tokens.shape[0] + 1:
        raise ValueError(f"hidden must be [K+1, d] with K = {draft_tokens.shape[0]} draft tokens, "
                         f"got shape {tuple(hidden.shape)}")
    if uniforms is not None:
        check_uniforms_shape(uniforms, (hidden.shape[0],), "one per draft token plus one for the final draw")
    return hidden.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_hidden_batched"))
def _verify_hidden_batched_fake(hidden, weight, bias, draft_tokens, num_draft_tokens, weight_format, dim,
                                temperature=1.0, uniforms=None, generator=None):
    check_warp_values(temperature, 0, 1.0, 0.0)
    check_rows_tensor("hidden", hidden, 3)
    check_tokens_tensor("draft_tokens", draft_tokens, 2)
    batch, k = draft_tokens.shape
    if tuple(hidden.shape) != (batch, k + 1, dim):
        raise ValueError(f"hidden must be [B, K+1, d] = [{batch}, {k + 1}, {dim}] for draft_tokens [B, K] and the "
                         f"head's d, got shape {tuple(hidden.shape)}")
    _check_hidden(hidden.flatten(0, 1), weight, dim, bias=bias, draft_tokens=draft_tokens,
                  num_draft_tokens=num_draft_tokens, uniforms=uniforms)
    check_num_draft_shape(num_draft_tokens, batch)
    if uniforms is not None:
        check_uniforms_shape(uniforms, (batch, k + 1), _BATCHED_WHAT)
    return _pair(hidden, batch)


@torch.library.register_fake(add_op_namespace_prefix("sample_hidden"))
def _sample_hidden_fake(hidden, weight, bias, weight_format, dim, temperature=1.0, uniforms=None, generator=None):
    check_warp_values(temperature, 0, 1.0, 0.0)
    _check_hidden(hidden, weight, dim, bias=bias, uniforms=uniforms)
    if uniforms is not None:
        check_uniforms_shape(uniforms, (hidden.shape[0],), "one per row of hidden")
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64)
