"""Fake (meta) implementations: output shapes without running the kernel.

They let the ops trace under torch.compile / torch.export and pass
torch.library.opcheck. The traceable ops return int64
tensors whose shapes depend only on the input shapes. The `*_ints` ops (two
data-dependent Python ints, for eager calls) have no fake implementation on
purpose: the wrappers never trace them (see `__init__._eager`).
"""

from __future__ import annotations

import torch

from ._ops import add_op_namespace_prefix


@torch.library.register_fake(add_op_namespace_prefix("verify_greedy"))
def _verify_greedy_fake(target_probs, draft_tokens):
    return target_probs.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_sampled"))
def _verify_sampled_fake(target_probs, draft_probs, draft_tokens, uniforms=None, generator=None):
    return target_probs.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_greedy_batched"))
def _verify_greedy_batched_fake(target_probs, draft_tokens, num_draft_tokens=None):
    batch = draft_tokens.shape[0]
    return (
        target_probs.new_empty((batch,), dtype=torch.int64),
        target_probs.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.register_fake(add_op_namespace_prefix("verify_sampled_batched"))
def _verify_sampled_batched_fake(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, uniforms=None, generator=None
):
    batch = draft_tokens.shape[0]
    return (
        target_probs.new_empty((batch,), dtype=torch.int64),
        target_probs.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.register_fake(add_op_namespace_prefix("verify_block"))
def _verify_block_fake(target_probs, draft_probs, draft_tokens, uniforms=None, generator=None):
    return target_probs.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_block_batched"))
def _verify_block_batched_fake(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, uniforms=None, generator=None
):
    batch = draft_tokens.shape[0]
    return (
        target_probs.new_empty((batch,), dtype=torch.int64),
        target_probs.new_empty((batch,), dtype=torch.int64),
    )


# ----------------------------------------------------------------------------
# Logits in (csrc/logits_ops.cpp). verify_logits_ints, like the other *_ints
# ops, has no fake on purpose.
# ----------------------------------------------------------------------------


@torch.library.register_fake(add_op_namespace_prefix("verify_logits"))
def _verify_logits_fake(
    target_logits, draft_logits, draft_tokens, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
    uniforms=None, generator=None, block=False,
):
    return target_logits.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("verify_logits_batched"))
def _verify_logits_batched_fake(
    target_logits, draft_logits, draft_tokens, num_draft_tokens=None, temperature=1.0, top_k=0,
    top_p=1.0, min_p=0.0, uniforms=None, generator=None, block=False,
):
    batch = draft_tokens.shape[0]
    return (
        target_logits.new_empty((batch,), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.register_fake(add_op_namespace_prefix("sample_draft"))
def _sample_draft_fake(
    draft_logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, uniforms=None, generator=None
):
    return draft_logits.new_empty((draft_logits.shape[0],), dtype=torch.int64)


@torch.library.register_fake(add_op_namespace_prefix("warp_probs"))
def _warp_probs_fake(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, normalize=True):
    return logits.new_empty(logits.shape, dtype=torch.float32)
