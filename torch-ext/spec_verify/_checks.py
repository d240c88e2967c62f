"""Argument checks of the pure-torch reference: the rules and wording of the C++
checks (``csrc/checks.*``), so that both paths refuse a bad call alike.

Every check runs before any row is read; messages name the argument, the
index and the broken rule (DESIGN.md, "Bad input").
"""

from __future__ import annotations

import math
import numbers
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
    """One device for every tensor given (None: absent)."""
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


# Token ids are held as 32-bit in the logits code (and a row of 2^31 float32
# is 8 GiB): V >= 2^31 is refused, with the rule, on both paths (csrc/checks.cpp).
MAX_VOCAB = 2**31 - 1


def check_vocab(name: str, vocab: int) -> int:
    if vocab < 1:
        raise ValueError(f"{name} must have a vocabulary of at least one token (V >= 1)")
    if vocab > MAX_VOCAB:
        raise ValueError(f"{name} has V = {vocab}: at most 2^31 - 1 token ids are supported (ids are 32-bit)")
    return vocab


def check_has_values(**tensors) -> None:
    """Refuse meta tensors before any value is read: they hold shapes, not values."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_meta:
            raise ValueError(f"{name} is a meta tensor: it has no values to read")


# ----------------------------------------------------------------------------
# Scalar arguments: one rule for the wrappers, the reference and the fakes
# ----------------------------------------------------------------------------


def _real(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond float range: out of every range below
        return math.inf if value > 0 else -math.inf


def warp_scalars(temperature, top_k, top_p, min_p) -> tuple[float, int, float, float]:
    """The warping arguments' types, as the op schema takes them (float, int64).

    Values are checked by ``check_warp_values`` (and the C++ ``check_warp``).
    Why: the dispatcher would raise RuntimeError / OverflowError for a bool, a
    string or an int beyond int64 / float range; here each gets a named error.
    ``top_k`` beyond int64 is "off" like any ``top_k >= V``, so it is clamped.
    """
    temperature, top_p, min_p = _real("temperature", temperature), _real("top_p", top_p), _real("min_p", min_p)
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    top_k = int(top_k)
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    return temperature, min(top_k, 2**63 - 1), top_p, min_p


def check_warp_values(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    """The value rules of csrc/warp.cpp's check_warp, same wording."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature!r}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1] (1 = off), got {top_p!r}")
    if not 0.0 <= min_p < 1.0:
        raise ValueError(f"min_p must lie in [0, 1) (0 = off), got {min_p!r}")


def check_generator(generator) -> None:
    """None or a torch.Generator, checked even when uniforms are given (both paths alike)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_uniforms_shape(uniforms, shape: tuple[int, ...],
                         what: str = "one per draft token plus one for the final draw") -> None:
    """float64 uniforms of exactly ``shape``; no value read (the fakes stop here)."""
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"uniforms must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype != torch.float64:
        raise TypeError(f"uniforms must be float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != tuple(shape):
        raise ValueError(f"uniforms must have shape {list(shape)} ({what}), got {list(uniforms.shape)}")


def check_uniforms(uniforms, shape: tuple[int, ...],
                   what: str = "one per draft token plus one for the final draw") -> None:
    check_uniforms_shape(uniforms, shape, what)
    check_has_values(uniforms=uniforms)
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        bad = uniforms[~((uniforms >= 0) & (uniforms < 1))].flatten()[0].item()
        raise ValueError(f"uniforms must lie in [0, 1), got {bad}")


def check_num_draft_shape(num_draft_tokens, batch: int) -> None:
    """``num_draft_tokens``: ``[B]`` int64 / int32 ids (or None); no value read."""
    if num_draft_tokens is None:
        return
    check_tokens_tensor("num_draft_tokens", num_draft_tokens, 1)
    if num_draft_tokens.shape[0] != batch:
        raise ValueError(
            f"num_draft_tokens must have B = {batch} entries, got shape {tuple(num_draft_tokens.shape)}"
        )


def check_num_draft(num_draft_tokens, batch: int, k_max: int) -> list[int]:
    """Draft lengths per sequence: ``num_draft_tokens[b]`` in ``[0, K]``, or K for all."""
    if num_draft_tokens is None:
        return [k_max] * batch
    check_num_draft_shape(num_draft_tokens, batch)
    # In chunks: the first bad entry is found without materializing a huge
    # (e.g. stride-0) batch; the list of counts is built only once all are valid.
    for start in range(0, batch, _CHUNK):
        chunk = num_draft_tokens[start:start + _CHUNK]
        bad = ((chunk < 0) | (chunk > k_max)).nonzero()
        if bad.numel():
            b = start + int(bad[0, 0])
            raise ValueError(f"num_draft_tokens[{b}] is {int(num_draft_tokens[b])}, outside [0, K] with K = {k_max}")
    return num_draft_tokens.tolist()


_CHUNK = 1 << 16


class Shape(NamedTuple):
    """What ``check_sequences`` found: B sequences of up to K draft tokens over V ids."""

    batch: int
    k: int
    vocab: int
    counts: list[int]  # k_b per sequence (all K for a single sequence)


def check_sequences(target, draft, draft_tokens, num_draft_tokens=None, *, batched: bool,
                    target_name: str, draft_name: str | None, read_values: bool = True) -> Shape:
    """The checks every verify op shares: ranks, dtypes, ``[.., K+1, V]`` target
    rows, ``[.., K, V]`` draft rows (if any), ids in ``[0, V)``, one device.

    ``batched``: ``[B, K+1, V]`` / ``[B, K]`` (with ``num_draft_tokens``);
    else ``[K+1, V]`` / ``[K]``. ``draft_name`` None: no draft rows (greedy).
    ``read_values`` False (the fakes): ranks, dtypes, shapes and devices only.
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
    tensors = {target_name: target, "draft_tokens": draft_tokens,
               **({draft_name: draft} if draft_name is not None else {})}
    if batched:
        check_num_draft_shape(num_draft_tokens, batch)
        tensors["num_draft_tokens"] = num_draft_tokens
    # Devices before any value is read (a meta tensor has none to read).
    check_same_device(**tensors)
    if not read_values:
        return Shape(batch, k, vocab, [])
    check_has_values(**tensors)
    counts = check_num_draft(num_draft_tokens, batch, k) if batched else [k]
    if batched:
        for b in range(batch):
            check_token_range(draft_tokens[b, : counts[b]], vocab)
    else:
        check_token_range(draft_tokens, vocab)
    return Shape(batch, k, vocab, counts)


# ----------------------------------------------------------------------------
# The ragged ops' layout (vLLM's flattened one; csrc/checks.cpp, check_ragged_args)
# ----------------------------------------------------------------------------

RAGGED_UNIFORMS = "one per draft token plus one final draw per sequence: T+B"


class RaggedShape(NamedTuple):
    """What ``check_ragged`` found: B sequences, T = sum of k_b draft tokens, V ids.

    ``starts[b]`` is sequence b's first flat draft token (``cu[b-1]``, 0 for
    b = 0); ``starts[B] = T``. Empty when no value was read (the fakes).
    """

    batch: int
    total: int
    vocab: int
    given_bonus: bool
    starts: list[int]

    def count(self, b: int) -> int:
        return self.starts[b + 1] - self.starts[b]

    def target_start(self, b: int) -> int:
        """Sequence b's first flat target row: k_b + 1 rows per sequence, or k_b with bonus_tokens."""
        return self.starts[b] + (0 if self.given_bonus else b)

    def uniform_start(self, b: int) -> int:
        """Sequence b's first uniform: always k_b + 1 per sequence."""
        return self.starts[b] + b


def check_ragged(target, draft, draft_tokens, cu_num_draft_tokens, bonus_tokens=None, *, target_name: str,
                 draft_name: str, read_values: bool = True) -> RaggedShape:
    """Every check of a ragged verify op's tensors, in the C++ order and wording.

    ``draft`` None: no draft rows (greedy, or a point-mass draft). ``read_values``
    False (the fakes): ranks, dtypes, shapes and devices only.
    """
    check_rows_tensor(target_name, target, 2)
    if draft is not None:
        check_rows_tensor(draft_name, draft, 2)
    check_tokens_tensor("draft_tokens", draft_tokens, 1)
    check_tokens_tensor("cu_num_draft_tokens", cu_num_draft_tokens, 1)
    batch, total = cu_num_draft_tokens.shape[0], draft_tokens.shape[0]
    given_bonus = bonus_tokens is not None
    if given_bonus:
        check_tokens_tensor("bonus_tokens", bonus_tokens, 1)
        if bonus_tokens.shape[0] != batch:
            raise ValueError(f"bonus_tokens must have B = {batch} entries (one per sequence), "
                             f"got shape {tuple(bonus_tokens.shape)}")
    rows = total if given_bonus else total + batch
    if target.shape[0] != rows:
        which = "T = " if given_bonus else "T+B = "
        per = " sequences with bonus_tokens given" if given_bonus else " sequences (k_b+1 per sequence)"
        raise ValueError(f"{target_name} must have {which}{rows} rows for T = {total} draft_tokens in "
                         f"B = {batch}{per}, got shape {tuple(target.shape)}")
    vocab = check_vocab(target_name, target.shape[1])
    if draft is not None:
        if draft.dtype != target.dtype:
            raise TypeError(
                f"{draft_name} must have the dtype of {target_name} ({target.dtype}), got {draft.dtype}"
            )
        if tuple(draft.shape) != (total, vocab):
            raise ValueError(f"{draft_name} must have shape [T, V] = [{total}, {vocab}], got {tuple(draft.shape)}")
    tensors = {target_name: target, "draft_tokens": draft_tokens, "cu_num_draft_tokens": cu_num_draft_tokens,
               **({draft_name: draft} if draft is not None else {}),
               **({"bonus_tokens": bonus_tokens} if given_bonus else {})}
    check_same_device(**tensors)
    if not read_values:
        return RaggedShape(batch, total, vocab, given_bonus, [])
    check_has_values(**tensors)
    # The cumulative counts: non-negative, nondecreasing, ending at T; in
    # chunks, so a bad entry of a huge (stride-0) tensor is found without
    # materializing it.
    previous = 0
    for start in range(0, batch, _CHUNK):
        chunk = cu_num_draft_tokens[start:start + _CHUNK].long().cpu()
        before = torch.cat([torch.tensor([previous], dtype=torch.int64), chunk[:-1]])
        bad = (chunk < before).nonzero()
        if bad.numel():
            b = start + int(bad[0, 0])
            raise ValueError(
                f"cu_num_draft_tokens[{b}] is {int(chunk[b - start])}, below {'0' if b == 0 else 'the entry before it'}"
                ": the inclusive cumulative sum of the draft counts must be non-negative and nondecreasing"
            )
        previous = int(chunk[-1])
    if previous != total:
        raise ValueError(f"cu_num_draft_tokens must end at T = {total} (the number of draft_tokens), got {previous}")
    check_token_range(draft_tokens, vocab)
    if given_bonus and batch:
        bad = ((bonus_tokens < 0) | (bonus_tokens >= vocab)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            raise IndexError(f"bonus_tokens[{b}] holds token id {int(bonus_tokens[b])}, "
                             f"outside [0, V) with V = {vocab}")
    return RaggedShape(batch, total, vocab, given_bonus, [0] + cu_num_draft_tokens.tolist())


# The ragged logits op's per-sequence warping: each argument a scalar (every
# sequence alike) or a [B] tensor. Types first (before the layout, like the
# scalar ops' warp_scalars); lengths and values once B is known.

WARP_NAMES = ("temperature", "top_k", "top_p", "min_p")


def ragged_warp_types(temperature, top_k, top_p, min_p) -> tuple:
    """Each warping argument as a scalar of the schema's type (``warp_scalars``'
    rules; its range is checked per sequence later) or a tensor: a floating
    tensor for temperature / top_p / min_p, an integer one for top_k."""
    values = []
    for name, value in zip(WARP_NAMES, (temperature, top_k, top_p, min_p)):
        if isinstance(value, torch.Tensor):
            integral = name == "top_k"
            ok = (not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool) \
                if integral else value.is_floating_point()
            if not ok:
                kind = "an integer" if integral else "a floating-point"
                raise TypeError(f"{name} must be a scalar or {kind} tensor (one per sequence), got {value.dtype}")
            values.append(value)
        else:
            values.append(value)
    scalars = [v if not isinstance(v, torch.Tensor) else d for v, d in zip(values, (1.0, 0, 1.0, 0.0))]
    checked = warp_scalars(*scalars)  # the scalars' types (a tensor's stand-in always passes)
    return tuple(v if isinstance(v, torch.Tensor) else c for v, c in zip(values, checked))


def ragged_warp_vectors(values: tuple, batch: int) -> tuple[torch.Tensor, ...]:
    """The four warping arguments as ``[B]`` CPU tensors (float64; top_k int64), scalars
    broadcast; a tensor of another length is refused, a meta tensor too."""
    out = []
    for name, value in zip(WARP_NAMES, values):
        dtype = torch.int64 if name == "top_k" else torch.float64
        if isinstance(value, torch.Tensor):
            if tuple(value.shape) != (batch,):
                raise ValueError(f"{name} must be a scalar or have B = {batch} entries (one per sequence), "
                                 f"got shape {tuple(value.shape)}")
            check_has_values(**{name: value})
            out.append(value.to(device="cpu", dtype=dtype))
        else:
            out.append(torch.full((batch,), value, dtype=dtype))
    return tuple(out)
