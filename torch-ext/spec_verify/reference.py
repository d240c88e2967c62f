"""Pure-torch reference path: the contract every fast path is tested against.

It implements DESIGN §2 with plain torch ops, one row at a time, so that a
reader can check it against the paper in a minute. It also serves tensors on
devices the C++ kernel does not (CUDA, MPS): the wrappers in ``__init__``
route anything that is not on the CPU here.

The arithmetic is written in the same order as the C++ kernel (float64, no
fused multiply-add), so that for the same uniforms both paths emit the same
tokens; the only place they may differ is the order of float64 additions
inside a row sum, which moves a decision only when a uniform lands within
~1e-16 of a boundary.
"""

from __future__ import annotations

import torch

__all__ = [
    "verify_greedy",
    "verify_sampled",
    "verify_greedy_batched",
    "verify_sampled_batched",
    "inverse_cdf",
]

_PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TOKEN_DTYPES = (torch.int64, torch.int32)


# ----------------------------------------------------------------------------
# Argument checks (the same rules and wording as the C++ TORCH_CHECKs)
# ----------------------------------------------------------------------------


def _check_probs_tensor(name: str, t: torch.Tensor, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _PROB_DTYPES:
        raise TypeError(
            f"{name} must be float32, float16 or bfloat16, got {t.dtype}"
        )
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def _check_tokens_tensor(name: str, t: torch.Tensor, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _TOKEN_DTYPES:
        raise TypeError(f"{name} must be int64 or int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def _check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def _check_token_range(draft_tokens: torch.Tensor, vocab: int, name: str = "draft_tokens") -> None:
    if draft_tokens.numel() == 0:
        return
    lo, hi = int(draft_tokens.min()), int(draft_tokens.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise IndexError(f"{name} holds token id {bad}, outside [0, V) with V = {vocab}")


def _check_rows_for_tokens(name: str, rows: torch.Tensor, k: int) -> int:
    """rows must be [K+1, V] with V >= 1 for K draft tokens; returns V."""
    if rows.shape[0] != k + 1:
        raise ValueError(
            f"{name} must have K+1 = {k + 1} rows for K = {k} draft_tokens, got shape {tuple(rows.shape)}"
        )
    vocab = rows.shape[1]
    if vocab < 1:
        raise ValueError(f"{name} must have a vocabulary of at least one token (V >= 1)")
    return vocab


def _check_uniforms(uniforms: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"uniforms must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype != torch.float64:
        raise TypeError(f"uniforms must be float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != shape:
        raise ValueError(
            f"uniforms must have shape {list(shape)} (one per draft token plus one "
            f"for the final draw), got {list(uniforms.shape)}"
        )
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        bad = uniforms[~((uniforms >= 0) & (uniforms < 1))].flatten()[0].item()
        raise ValueError(f"uniforms must lie in [0, 1), got {bad}")


def _check_prob_row(row64: torch.Tensor, name: str, index: tuple[int, ...]) -> float:
    """Validate one read row (float64) and return its mass."""
    bad = ~(torch.isfinite(row64) & (row64 >= 0))
    if bool(bad.any()):
        col = int(bad.nonzero()[0, 0])
        where = ", ".join(str(i) for i in (*index, col))
        raise ValueError(
            f"{name}[{where}] is {row64[col].item()}: probabilities must be finite and non-negative"
        )
    mass = float(row64.sum())
    if mass <= 0.0:
        where = ", ".join(str(i) for i in index)
        raise ValueError(f"{name}[{where}] sums to zero: every read row needs positive mass")
    return mass


# ----------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------


def _argmax_row(row: torch.Tensor, name: str, index: tuple[int, ...]) -> int:
    row32 = row.float()
    nan = torch.isnan(row32)
    if bool(nan.any()):
        where = ", ".join(str(i) for i in (*index, int(nan.nonzero()[0, 0])))
        raise ValueError(f"{name}[{where}] is NaN: argmax is undefined")
    # torch.argmax returns the first maximal index: ties go to the lowest id.
    return int(torch.argmax(row32))


def inverse_cdf(weights64: torch.Tensor, uniform: float) -> int:
    """The smallest id whose cumulative weight exceeds ``uniform * total``.

    ``weights64`` is a non-negative float64 row with a positive total. A
    token of zero weight is never returned: the cumulative sum only grows at
    positive weights, and if rounding leaves no cumulative value above the
    threshold (``uniform`` within an ulp of 1) the last positive-weight id is
    returned instead.
    """
    total = weights64.sum()
    threshold = uniform * total
    cumulative = torch.cumsum(weights64, 0)
    idx = int(torch.searchsorted(cumulative, threshold.reshape(1), right=True))
    if idx >= weights64.numel():
        # Fallback: rounding kept every cumulative value <= threshold.
        idx = int((weights64 > 0).nonzero()[-1, 0])
    return idx


def _draw_uniforms(count: int, generator: torch.Generator | None, device) -> torch.Tensor:
    # The one place randomness enters: count float64 uniforms in [0, 1), drawn
    # in order from the generator (the default CPU generator when None).
    return torch.rand(count, dtype=torch.float64, generator=generator).to(device)


# ----------------------------------------------------------------------------
# Single sequence
# ----------------------------------------------------------------------------


def verify_greedy(target_probs: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """Reference greedy verification; see ``spec_verify.verify_greedy``."""
    _check_probs_tensor("target_probs", target_probs, 2)
    _check_tokens_tensor("draft_tokens", draft_tokens, 1)
    _check_same_device(target_probs=target_probs, draft_tokens=draft_tokens)
    k = draft_tokens.shape[0]
    vocab = _check_rows_for_tokens("target_probs", target_probs, k)
    _check_token_range(draft_tokens, vocab)
    tokens = draft_tokens.tolist()
    for i in range(k):
        best = _argmax_row(target_probs[i], "target_probs", (i,))
        if tokens[i] != best:
            return i, best
    return k, _argmax_row(target_probs[k], "target_probs", (k,))


def _check_sampled_shapes(target_probs, draft_probs, draft_tokens) -> tuple[int, int]:
    _check_probs_tensor("target_probs", target_probs, 2)
    _check_probs_tensor("draft_probs", draft_probs, 2)
    _check_tokens_tensor("draft_tokens", draft_tokens, 1)
    if draft_probs.dtype != target_probs.dtype:
        raise TypeError(
            f"draft_probs must have the dtype of target_probs ({target_probs.dtype}), "
            f"got {draft_probs.dtype}"
        )
    k = draft_tokens.shape[0]
    vocab = _check_rows_for_tokens("target_probs", target_probs, k)
    if tuple(draft_probs.shape) != (k, vocab):
        raise ValueError(
            f"draft_probs must have shape [K, V] = [{k}, {vocab}], got {tuple(draft_probs.shape)}"
        )
    return k, vocab


def _verify_sampled_rows(target_probs, draft_probs, tokens, u, index_prefix=()) -> tuple[int, int]:
    """The rejection-sampling loop over already-checked shapes."""
    k = len(tokens)
    u_final = float(u[k])
    for i in range(k):
        idx = (*index_prefix, i)
        p = target_probs[i].double()
        q = draft_probs[i].double()
        p_mass = _check_prob_row(p, "target_probs", idx)
        q_mass = _check_prob_row(q, "draft_probs", idx)
        t = tokens[i]
        p_t, q_t = float(p[t]), float(q[t])
        if q_t == 0.0:
            where = ", ".join(str(j) for j in (*idx, t))
            raise ValueError(
                f"draft_probs[{where}] is zero: the draft cannot have sampled token {t}"
            )
        # Accept iff u * q(t)/Q < p(t)/P, multiplied out (no division).
        if float(u[i]) * q_t * p_mass < p_t * q_mass:
            continue
        residual = torch.clamp(p * q_mass - q * p_mass, min=0.0)
        if float(residual.sum()) > 0.0:
            return i, inverse_cdf(residual, u_final)
        # Fallback: the residual rounded to zero everywhere (p and q equal to
        # within rounding); the target row itself is then the residual's law.
        return i, inverse_cdf(p, u_final)
    p = target_probs[k].double()
    _check_prob_row(p, "target_probs", (*index_prefix, k))
    return k, inverse_cdf(p, u_final)


def verify_sampled(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Reference speculative sampling; see ``spec_verify.verify_sampled``."""
    k, vocab = _check_sampled_shapes(target_probs, draft_probs, draft_tokens)
    _check_same_device(target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens)
    _check_token_range(draft_tokens, vocab)
    if uniforms is None:
        uniforms = _draw_uniforms(k + 1, generator, "cpu")
    else:
        _check_uniforms(uniforms, (k + 1,))
    return _verify_sampled_rows(
        target_probs, draft_probs, draft_tokens.tolist(), uniforms.double().cpu().tolist()
    )


# ----------------------------------------------------------------------------
# Batched, ragged
# ----------------------------------------------------------------------------


def _check_num_draft(num_draft_tokens, batch: int, k_max: int) -> list[int]:
    if num_draft_tokens is None:
        return [k_max] * batch
    _check_tokens_tensor("num_draft_tokens", num_draft_tokens, 1)
    if num_draft_tokens.shape[0] != batch:
        raise ValueError(
            f"num_draft_tokens must have B = {batch} entries, got shape {tuple(num_draft_tokens.shape)}"
        )
    counts = num_draft_tokens.tolist()
    for b, c in enumerate(counts):
        if c < 0 or c > k_max:
            raise ValueError(f"num_draft_tokens[{b}] is {c}, outside [0, K] with K = {k_max}")
    return counts


def verify_greedy_batched(target_probs, draft_tokens, num_draft_tokens=None):
    """Reference batched greedy verification; see ``spec_verify.verify_greedy_batched``."""
    _check_probs_tensor("target_probs", target_probs, 3)
    _check_tokens_tensor("draft_tokens", draft_tokens, 2)
    batch, k = draft_tokens.shape
    if tuple(target_probs.shape[:2]) != (batch, k + 1):
        raise ValueError(
            f"target_probs must have shape [B, K+1, V] = [{batch}, {k + 1}, V], "
            f"got {tuple(target_probs.shape)}"
        )
    counts = _check_num_draft(num_draft_tokens, batch, k)
    n_acc = torch.empty(batch, dtype=torch.int64)
    nxt = torch.empty(batch, dtype=torch.int64)
    for b in range(batch):
        kb = counts[b]
        n_acc[b], nxt[b] = verify_greedy(target_probs[b, : kb + 1], draft_tokens[b, :kb])
    return n_acc, nxt


def verify_sampled_batched(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, *, generator=None, uniforms=None
):
    """Reference batched speculative sampling; see ``spec_verify.verify_sampled_batched``."""
    _check_probs_tensor("target_probs", target_probs, 3)
    _check_probs_tensor("draft_probs", draft_probs, 3)
    _check_tokens_tensor("draft_tokens", draft_tokens, 2)
    batch, k = draft_tokens.shape
    if tuple(target_probs.shape[:2]) != (batch, k + 1):
        raise ValueError(
            f"target_probs must have shape [B, K+1, V] = [{batch}, {k + 1}, V], "
            f"got {tuple(target_probs.shape)}"
        )
    counts = _check_num_draft(num_draft_tokens, batch, k)
    if uniforms is None:
        uniforms = _draw_uniforms(batch * (k + 1), generator, "cpu").reshape(batch, k + 1)
    else:
        _check_uniforms(uniforms, (batch, k + 1))
    n_acc = torch.empty(batch, dtype=torch.int64)
    nxt = torch.empty(batch, dtype=torch.int64)
    for b in range(batch):
        kb = counts[b]
        # Sequence b uses uniforms[b, :kb] for its tests and uniforms[b, kb]
        # for its final draw, exactly as the single-sequence op would.
        n_acc[b], nxt[b] = verify_sampled(
            target_probs[b, : kb + 1],
            draft_probs[b, :kb],
            draft_tokens[b, :kb],
            uniforms=uniforms[b, : kb + 1].contiguous(),
        )
    return n_acc, nxt
