"""Checks of the decoders' arguments and of what their callbacks return.

Every malformed argument or callback result raises ``TypeError`` /
``ValueError`` naming the argument or the callback, what it returned and the
rule it broke, before any op reads it. One set of checks serves both
decoders: a single sequence's results have a leading shape ``(k,)``
(``SpeculativeDecoder``), a batch's ``(n, k)`` (``BatchedSpeculativeDecoder``).

Only the Python standard library and torch are imported here.
"""

from __future__ import annotations

import numbers
from typing import Iterable

import torch

_ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------


def check_int(name: str, value, minimum: int) -> int:
    # bool is an int subclass, but k=True is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _integer_tensor(value, name: str, shape: str) -> torch.Tensor:
    """``value`` (a tensor or a list of ints) as an integer tensor, or a TypeError naming ``name``."""
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value, dtype=torch.int64)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a {shape} integer tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {value.dtype}")
    return value


def check_prompt(prompt_ids, name: str = "prompt_ids") -> torch.Tensor:
    """The prompt as a fresh 1-D int64 CPU tensor."""
    prompt_ids = _integer_tensor(prompt_ids, name, "1-D")
    # Accept transformers' [1, n] input_ids too: a batch of one is a sequence.
    if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
        prompt_ids = prompt_ids[0]
    if prompt_ids.dim() != 1:
        raise ValueError(f"{name} must be 1-D [n] (or [1, n]), got shape {tuple(prompt_ids.shape)}")
    if prompt_ids.numel() == 0:
        raise ValueError(f"{name} is empty: the target needs at least one token to condition on")
    return prompt_ids.to(device="cpu", dtype=torch.int64).clone()


def check_prompts(prompts, attention_mask=None) -> list:
    """A batch of prompts as a list of fresh 1-D int64 CPU tensors.

    ``prompts`` is a list of 1-D prompts (any lengths), or a ``[B, n]``
    tensor; with ``attention_mask`` ``[B, n]`` (1 = token, 0 = padding) each
    row's tokens are its unmasked ones, which must come last (left padding,
    as transformers pads decoder-only batches).
    """
    if isinstance(prompts, torch.Tensor) or attention_mask is not None:
        ids = _integer_tensor(prompts, "prompts", "[B, n]")
        if ids.dim() != 2 or ids.shape[0] == 0:
            raise ValueError(f"prompts must be a non-empty [B, n] tensor or a list of 1-D prompts, "
                             f"got shape {tuple(ids.shape)}")
        if attention_mask is None:
            return [check_prompt(row, f"prompts[{b}]") for b, row in enumerate(ids)]
        return [check_prompt(row[keep], f"prompts[{b}]")
                for b, (row, keep) in enumerate(zip(ids, _left_padding_mask(attention_mask, ids.shape)))]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of 1-D prompts or a [B, n] tensor, "
                        f"got {type(prompts).__name__}" + (" (empty)" if isinstance(prompts, (list, tuple)) else ""))
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        raise TypeError("prompts is a list of ints: wrap a single prompt in a list ([prompt]) or use "
                        "SpeculativeDecoder")
    return [check_prompt(prompt, f"prompts[{b}]") for b, prompt in enumerate(prompts)]


def _left_padding_mask(attention_mask, shape) -> torch.Tensor:
    """``attention_mask`` as a bool ``[B, n]`` CPU tensor of the shape of the ids, left padding only."""
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a [B, n] tensor, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, but the prompts (input_ids) "
                         f"have shape {tuple(shape)}: one mask entry per token")
    mask = attention_mask.to("cpu")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    mask = mask.bool()
    # Left padding: once a row's tokens start, they run to the end.
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(dim=1).nonzero()
    if len(bad):
        b = int(bad[0, 0])
        raise ValueError(
            f"attention_mask[{b}] = {mask[b].int().tolist()} is not left padding (zeros, then ones): pad "
            f"decoder-only batches on the left (tokenizer.padding_side = 'left'), so that every prompt ends "
            f"where the new tokens begin"
        )
    return mask


def eos_set(eos_token_id) -> frozenset:
    # None: no end-of-sequence stop. An int or an iterable of ints (as in
    # transformers' generation_config.eos_token_id) are both accepted.
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool):
        return frozenset([eos_token_id])
    if isinstance(eos_token_id, Iterable):
        ids = list(eos_token_id)
        if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return frozenset(ids)
    raise TypeError(f"eos_token_id must be None, an int or a list of ints, got {eos_token_id!r}")


# ----------------------------------------------------------------------------
# Callback results; ``lead`` is (k,) for one sequence, (n, k) for a batch
# ----------------------------------------------------------------------------


def as_tokens(value, where: str) -> torch.Tensor:
    """Callback tokens as an int64 CPU tensor, or a clear error."""
    if type(value) is torch.Tensor and value.dtype is torch.int64 and value.is_cpu:
        return value  # the usual case, without a torch call (the loop's own cost: check_draft_ids)
    if isinstance(value, (list, tuple)):
        # Checked element by element: torch.tensor(..., dtype=int64) would
        # silently truncate a float (1.7 -> 1) and wrap nothing else.
        flat = [v for row in value for v in (row if isinstance(row, (list, tuple)) else [row])]
        bad = [v for v in flat if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
        if bad:
            raise TypeError(f"{where} returned tokens that are not integers: {bad[0]!r}")
        try:
            value = torch.tensor(value, dtype=torch.int64)
        except (TypeError, ValueError, OverflowError, RuntimeError) as err:
            raise TypeError(f"{where} returned tokens that are not int64 token ids: {err}") from None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} returned tokens of type {type(value).__name__}, expected an int tensor")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{where} returned tokens of dtype {value.dtype}, expected int64 or int32")
    _check_has_values(value, where, "tokens")
    return value.to(device="cpu", dtype=torch.int64)


def _check_has_values(value: torch.Tensor, where: str, what: str) -> None:
    # A meta tensor holds a shape but no values: nothing to decode with.
    if value.is_meta:
        raise ValueError(f"{where} returned {what} as a meta tensor, which holds no values")


def usual_rows(value, lead: tuple) -> bool:
    """``check_rows``'s usual case, in one test: a plain float32/16/bf16 tensor ``[*lead, V]`` with values.

    The target's rows are checked right after its eval has evicted the caches, where each tensor
    attribute read costs microseconds (~8 us saved a round on Zen 2; DESIGN.md, "k = auto": the
    loop's own cost), and a caller that tests this first builds no error message it will not use.
    Anything else, subclasses included, takes ``check_rows``'s checks, which name what is wrong.
    """
    return type(value) is torch.Tensor and value.dtype in _ROW_DTYPES and value.shape[:-1] == lead \
        and not value.is_meta


def check_rows(value, where: str, what: str, lead: tuple, expected: str) -> torch.Tensor:
    """A callback's float rows ``[*lead, V]``, or an error naming the callback and ``what``."""
    if usual_rows(value, lead):
        return value
    layout = "[rows, V]" if len(lead) == 1 else "[sequences, rows, V]"
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} returned {what} of type {type(value).__name__}, expected a {layout} float tensor")
    if value.dtype not in _ROW_DTYPES:
        raise TypeError(f"{where} returned {what} of dtype {value.dtype}, expected float32, float16 or bfloat16")
    if value.dim() != len(lead) + 1:
        raise ValueError(f"{where} returned {what} of shape {tuple(value.shape)}, expected "
                         f"{len(lead) + 1}-D {layout}")
    if tuple(value.shape[:-1]) != tuple(lead):
        raise ValueError(f"{where} returned {what} of shape {tuple(value.shape)}: expected {expected}")
    _check_has_values(value, where, what)
    return value


def check_draft_result(result, where: str, lead: tuple, rows_name: str):
    """``draft_step``'s result, checked: ``(tokens, rows or None, counts or None)``.

    ``lead`` is the most it may return: ``(k,)`` for one sequence, ``(n, k)``
    for a batch. A draft may propose fewer tokens (DESIGN.md, "Short drafts"):
    one sequence's ``tokens`` is ``[m]``, ``m <= k``; a batch's ``[n, m]``,
    optionally with a third element ``num_tokens [n]`` (each in ``[0, m]``)
    when its sequences proposed different counts. ``rows`` None is a
    point-mass draft (greedy never reads rows anyway).
    """
    batched = len(lead) == 2
    arity = "(tokens, rows) or (tokens, rows, num_tokens)" if batched else f"(tokens, {rows_name})"
    if not isinstance(result, (tuple, list)) or len(result) not in ((2, 3) if batched else (2,)):
        raise TypeError(
            f"{where} must return {'a pair' if not batched else 'a pair or a triple'} {arity}, "
            f"got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
        )
    tokens = as_tokens(result[0], where)
    k = lead[-1]
    if tokens.dim() != len(lead) or tuple(tokens.shape[:-1]) != tuple(lead[:-1]) or tokens.shape[-1] > k:
        most = f"[m] with m <= {k}" if not batched else f"[{lead[0]}, m] with m <= {k}"
        raise ValueError(f"{where} returned tokens of shape {tuple(tokens.shape)}, expected {most} "
                         f"(at most k tokens)")
    counts = _check_counts(result[2], tokens.shape, where) if len(result) == 3 else None
    rows = result[1]
    if rows is None:
        return tokens, None, counts
    got = tuple(tokens.shape)
    expected = (f"{got[0]} rows, one per token" if not batched
                else f"[{got[0]}, {got[1]}, V], one row per token")
    return tokens, check_rows(rows, where, rows_name, got, expected), counts


def _check_counts(counts, shape: tuple, where: str) -> torch.Tensor:
    """A batched draft's ``num_tokens [n]``, each in ``[0, m]``."""
    counts = as_tokens(counts, where + " (num_tokens)")
    n, m = shape
    if tuple(counts.shape) != (n,):
        raise ValueError(f"{where} returned num_tokens of shape {tuple(counts.shape)}, expected ({n},): one count "
                         f"per sequence")
    if n and (int(counts.min()) < 0 or int(counts.max()) > m):
        bad = int(((counts < 0) | (counts > m)).nonzero()[0, 0])
        raise ValueError(f"{where} returned num_tokens[{bad}] = {int(counts[bad])}, outside [0, {m}] (the tokens' "
                         f"width)")
    return counts


def check_draft_ids(tokens: torch.Tensor, budgets: list, vocab: int, where: str) -> None:
    """The draft token ids a sequence will have read (``tokens[b, :budgets[b]]``) inside ``[0, V)``.

    In Python over one ``tolist()``: a round's draft is at most a few dozen
    ids, and after a target eval has evicted the caches one torch call costs
    more than the whole list (a tiny model's round is ~2 ms; DESIGN.md, "k =
    auto": the loop's own cost).
    """
    if max(budgets) == 0:
        return
    for row, k_b in zip(tokens.tolist(), budgets):
        ids = row[:k_b]
        if ids:
            lo, hi = min(ids), max(ids)
            if lo < 0 or hi >= vocab:
                raise ValueError(
                    f"{where} returned token {lo if lo < 0 else hi}, outside the target's vocabulary [0, {vocab})"
                )


def check_draft_against_target(tokens: torch.Tensor, budgets: list, draft_rows, vocab: int, where: str,
                               rows_name: str, sampled_probs: bool, batched: bool) -> None:
    """The draft tokens a sequence will have read (``tokens[b, :budgets[b]]``) inside the
    target's vocabulary, draft rows over it; when sampling from probability
    rows, each such token of positive draft mass.

    ``tokens`` is ``[n, K]``; a single sequence (``batched=False``) passes
    ``n = 1`` and is named without its batch index.
    """
    name = (lambda b, i: f"[{b}, {i}]") if batched else (lambda b, i: f"[{i}]")  # noqa: E731
    check_draft_ids(tokens, budgets, vocab, where)
    if draft_rows is None:
        return
    if draft_rows.shape[-1] != vocab:
        raise ValueError(
            f"{where} returned {rows_name} over V = {draft_rows.shape[-1]} tokens, but target_step "
            f"returned V = {vocab}: draft and target must share one vocabulary"
        )
    if not sampled_probs or max(budgets) == 0:
        return  # greedy never reads the draft rows; verify_logits checks the warped support itself
    k_round = tokens.shape[1]
    read = None if min(budgets) == k_round else torch.arange(k_round).view(1, -1) < torch.tensor(budgets).view(-1, 1)
    rows3 = draft_rows.view(tokens.shape[0], tokens.shape[1], -1)
    picked = rows3.gather(2, tokens.to(rows3.device).unsqueeze(-1)).squeeze(-1)
    zero = ((picked <= 0) if read is None else (picked <= 0) & read.to(picked.device)).nonzero()
    if len(zero):
        b, i = int(zero[0, 0]), int(zero[0, 1])
        token = int(tokens[b, i])
        raise ValueError(
            f"{where} returned tokens{name(b, i)} = {token} with probs{name(b, i)[:-1]}, {token}] = "
            f"{float(picked[b, i])}: probs must be the distribution the tokens were sampled from"
        )


_NO_ROWS: dict = {}  # (shape, dtype) -> an empty [..., 0, V] draft-rows tensor (nothing in it to modify)


def same_dtype(target_rows: torch.Tensor, draft_rows):
    """The sampled ops want both row tensors on one dtype and device; ``[*, K+1, V]`` target rows."""
    if draft_rows is None:
        # Only when nothing was drafted (a plain step): the op wants [..., 0, V]. Made once per shape: a
        # sampled plain step runs right after an eval has evicted the caches, where a torch call is dear.
        shape = (*target_rows.shape[:-2], 0, target_rows.shape[-1])
        if not target_rows.is_cpu:
            return target_rows, target_rows.new_empty(shape)
        key = (shape, target_rows.dtype)
        empty = _NO_ROWS.get(key)
        if empty is None:
            empty = _NO_ROWS[key] = target_rows.new_empty(shape)
        return target_rows, empty
    if draft_rows.dtype != target_rows.dtype:
        # float32 holds all three accepted dtypes exactly: nothing is lost.
        target_rows, draft_rows = target_rows.float(), draft_rows.float()
    return target_rows, draft_rows.to(target_rows.device)
