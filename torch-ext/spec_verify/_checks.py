"""Argument checks of the pure-torch reference: the rules and wording of the C++
checks (``csrc/checks.*``), so that both paths refuse a bad call alike.

Every check runs before any row is read; messages name the argument, the
index and the broken rule (DESIGN.md, "Bad input").
"""

from __future__ import annotations

from typing import NamedTuple

import torch

ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOKEN_DTYPES = (torch.int64, torch.int32)


def where(index) -> str:
    """``(b, i, x)`` -> ``"b, i, x"``: the index part of a message."""
    return ", ".join(str(i) for i in index)


def checked_argmax(row: torch.Tensor, name: str, index: tuple[int, ...]) -> int:
    """``argmax`` of one row compared in float32, refusing a NaN with its position.

    Ties go to the lowest id, as ``torch.argmax`` (it returns the first maximum).
    """
    row32 = row.float()
    nan = torch.isnan(row32)
    if bool(nan.any()):
        raise ValueError(f"{name}[{where((*index, int(nan.nonzero()[0, 0])))}] is NaN: argmax is undefined")
    return int(torch.argmax(row32))


def check_rows_tensor(name: str, t, ndim: int | None) -> None:
    """float32 / float16 / bfloat16 rows of rank ``ndim`` (any rank if None)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in ROW_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def check_tokens_tensor(name: str, t, ndim: int) -> None:
    """int64 / int32 ids of rank ``ndim``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in TOKEN_DTYPES:
        raise TypeError(f"{name} must be int64 or int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_token_range(draft_tokens: torch.Tensor, vocab: int, name: str = "draft_tokens") -> None:
    if draft_tokens.numel() == 0:
        return
    lo, hi = int(draft_tokens.min()), int(draft_tokens.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise IndexError(f"{name} holds token id {bad}, outside [0, V) with V = {vocab}")


def check_vocab(name: str, vocab: int) -> int:
    if vocab < 1:
        raise ValueError(f"{name} must have a vocabulary of at least one token (V >= 1)")
    return vocab


def check_uniforms(uniforms, shape: tuple[int, ...],
                   what: str = "one per draft token plus one for the final draw") -> None:
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"uniforms must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype != torch.float64:
        raise TypeError(f"uniforms must be float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != shape:
        raise ValueError(f"uniforms must have shape {list(shape)} ({what}), got {list(uniforms.shape)}")
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        bad = uniforms[~((uniforms >= 0) & (uniforms < 1))].flatten()[0].item()
        raise ValueError(f"uniforms must lie in [0, 1), got {bad}")


def check_num_draft(num_draft_tokens, batch: int, k_max: int) -> list[int]:
    """Draft lengths per sequence: ``num_draft_tokens[b]`` in ``[0, K]``, or K for all."""
    if num_draft_tokens is None:
        return [k_max] * batch
    check_tokens_tensor("num_draft_tokens", num_draft_tokens, 1)
    if num_draft_tokens.shape[0] != batch:
        raise ValueError(
            f"num_draft_tokens must have B = {batch} entries, got shape {tuple(num_draft_tokens.shape)}"
        )
    counts = num_draft_tokens.tolist()
    for b, c in enumerate(counts):
        if c < 0 or c > k_max:
            raise ValueError(f"num_draft_tokens[{b}] is {c}, outside [0, K] with K = {k_max}")
    return counts


class Shape(NamedTuple):
    """What ``check_sequences`` found: B sequences of up to K draft tokens over V ids."""

    batch: int
    k: int
    vocab: int
    counts: list[int]  # k_b per sequence (all K for a single sequence)


def check_sequences(target, draft, draft_tokens, num_draft_tokens=None, *, batched: bool,
                    target_name: str, draft_name: str | None) -> Shape:
    """The checks every verify op shares: ranks, dtypes, ``[.., K+1, V]`` target
    rows, ``[.., K, V]`` draft rows (if any), ids in ``[0, V)``, one device.

    ``batched``: ``[B, K+1, V]`` / ``[B, K]`` (with ``num_draft_tokens``);
    else ``[K+1, V]`` / ``[K]``. ``draft_name`` None: no draft rows (greedy).
    """
    lead = 1 if batched else 0
    check_rows_tensor(target_name, target, 2 + lead)
    if draft_name is not None:
        check_rows_tensor(draft_name, draft, 2 + lead)
    check_tokens_tensor("draft_tokens", draft_tokens, 1 + lead)
    if batched:
        batch, k = draft_tokens.shape
        if tuple(target.shape[:2]) != (batch, k + 1):
            raise ValueError(
                f"{target_name} must have shape [B, K+1, V] = [{batch}, {k + 1}, V], got {tuple(target.shape)}"
            )
    else:
        batch, k = 1, draft_tokens.shape[0]
        if target.shape[0] != k + 1:
            raise ValueError(
                f"{target_name} must have K+1 = {k + 1} rows for K = {k} draft_tokens, "
                f"got shape {tuple(target.shape)}"
            )
    vocab = check_vocab(target_name, target.shape[-1])
    if draft_name is not None:
        if draft.dtype != target.dtype:
            raise TypeError(
                f"{draft_name} must have the dtype of {target_name} ({target.dtype}), got {draft.dtype}"
            )
        expected = (batch, k, vocab) if batched else (k, vocab)
        if tuple(draft.shape) != expected:
            form = "[B, K, V]" if batched else "[K, V]"
            raise ValueError(
                f"{draft_name} must have shape {form} = [{where(expected)}], got {tuple(draft.shape)}"
            )
    counts = check_num_draft(num_draft_tokens, batch, k) if batched else [k]
    if batched:
        for b in range(batch):
            check_token_range(draft_tokens[b, : counts[b]], vocab)
    else:
        check_token_range(draft_tokens, vocab)
    check_same_device(**{target_name: target, "draft_tokens": draft_tokens,
                         **({draft_name: draft} if draft_name is not None else {})})
    return Shape(batch, k, vocab, counts)
