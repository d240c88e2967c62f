"""The warping: its definition, and the pure-torch implementation of it.

``verify_logits``, ``sample_draft`` and ``warp_probs`` take raw logits and
apply one warping, identically to the draft and to the target, inside the op:
a caller cannot verify against a distribution the draft did not sample from.
This module is the definition; the C++ kernel (``csrc/warp.cpp``,
``csrc/cpu/warp_impl.h``) computes the same weights bit for bit, and
``reference.py`` decides on them exactly as the C++ does.

The warping of one row of logits ``x`` (read as float32)
--------------------------------------------------------

1. **Temperature** ``T > 0``: ``z = (x - max(x)) * s`` in float32, with
   ``s = float32(1 / T)`` (clamped to ``[FLT_MIN, FLT_MAX]``), and the
   weight ``w = exp_sv(z)``: a float32 exponential defined by its operations
   (below), ``w = 1`` exactly at the maximum, ``w = 0`` where ``z < -86``
   (relative weights below ``e^-86`` are flushed) and for ``-inf`` logits.
2. **Top-k** (``0 < top_k < V``; ``0`` or ``>= V``: off): keep the tokens whose
   logit is ``>=`` the ``top_k``-th largest logit. Every token tied with it is
   kept, so a tie at the cut-off keeps more than ``top_k`` tokens
   (transformers' ``TopKLogitsWarper`` does the same).
3. **Top-p** (``top_p < 1``; ``1``: off): rank the top-k set by logit,
   descending, ties by ascending id; ``tau = top_p * M`` with ``M`` the
   float64 running sum of its weights in that order. Keep every token whose
   logit is ``>=`` the logit of the last rank whose preceding running sum is
   ``< tau``: the smallest head of the ranking whose mass reaches ``tau``,
   extended to every token tied with its last logit. A cut never splits a
   group of equal logits, so the rule does not depend on ids or on sort
   stability (transformers' ``TopPLogitsWarper`` splits such a group in
   whatever order its unstable sort leaves it). The top token always stays.
4. **Min-p** (``min_p > 0``; ``0``: off): keep the tokens with
   ``w >= min_p`` (compared as float64); since the top weight is exactly 1
   this is ``p(x) >= min_p * max p``, as transformers' ``MinPLogitsWarper``,
   and renormalizing after the earlier steps does not change it.

The warped weights are ``w`` on the kept tokens and 0 elsewhere; the warped
distribution is ``w / sum(w)`` (``warp_probs``). ``verify_logits`` is then
exactly ``verify_sampled`` on the warped target and draft weights, and
``sample_draft`` draws from the very same weights.

**Temperature 0** is greedy: each warped row is the point mass on its argmax
(lowest id on ties), so ``verify_logits`` is ``verify_greedy`` on the raw
target logits, and a draft token that is not the argmax of its draft row is
refused. No uniform is used and the generator is not advanced.

exp_sv
------
``zc = max(z, -87); n = rint(zc * log2e); r = (zc - n * ln2_hi) - n * ln2_lo;
y = ((((c5 r + c4) r + c3) r + c2) r + c1) r + c0; y = (y * (r * r) + r) + 1;
exp_sv(z) = y * 2^n`` (0 if ``z < -86``), every operation a separate float32
operation (Cephes' ``expf`` polynomial, about 1 ulp from ``exp``). Only IEEE
add, multiply, round-to-even and compare appear, so this file and every
SIMD build of the kernel produce identical bits; ``torch.exp`` cannot promise
that (its value depends on which of its own SIMD kernels runs).

Where the kernel may differ from this reference
-----------------------------------------------
The weights and the top-k set are bit-identical. Top-p after a top-k that
keeps at most 4096 tokens is bit-identical too (the same float64 running
sum, in the same order). Otherwise the kernel locates the top-p boundary
with a histogram, whose float64 sums run in another order, and, as in
``verify_sampled``, row masses are summed in another order: a decision can
then differ only when ``tau`` or a uniform lands within float64 rounding
(~1e-16 relative) of a boundary.
"""

from __future__ import annotations

import math

import torch

from typing import NamedTuple

from ._checks import (
    check_has_values, check_rows_tensor, check_vocab, check_warp_values, checked_argmax, warp_scalars, where,
)

__all__ = ["exp_sv", "Warp", "check_warp", "warp_row", "warp_weights"]

_FLT_MAX = float(torch.finfo(torch.float32).max)
_FLT_MIN = float(torch.finfo(torch.float32).tiny)

# exp_sv's constants: the float32 bits of csrc/kernel_table.h, in hex on both sides.
_LOG2E = float.fromhex("0x1.715476p+0")
_LN2_HI = float.fromhex("0x1.63p-1")
_LN2_LO = -float.fromhex("0x1.bd0106p-13")
_C5 = float.fromhex("0x1.a0d2cep-13")
_C4 = float.fromhex("0x1.6e879cp-10")
_C3 = float.fromhex("0x1.11121p-7")
_C2 = float.fromhex("0x1.555382p-5")
_C1 = float.fromhex("0x1.555554p-3")
_C0 = 0.5
_EXP_FLOOR = -86.0
_EXP_CLAMP = -87.0


# ----------------------------------------------------------------------------
# exp_sv
# ----------------------------------------------------------------------------


def exp_sv(z: torch.Tensor) -> torch.Tensor:
    """The shared float32 exponential of the warping (see the module docstring).

    ``z`` is a float32 tensor of values ``<= 0`` (``-inf`` allowed). Returns
    float32 ``exp_sv(z)``: ``exp(0) == 1`` exactly, 0 below ``z = -86``.
    """
    if z.dtype != torch.float32:
        raise TypeError(f"exp_sv takes float32, got {z.dtype}")

    def c(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float32, device=z.device)

    zc = torch.clamp_min(z, _EXP_CLAMP)
    n = torch.round(torch.mul(zc, c(_LOG2E)))  # round half to even, as the kernel
    r = torch.sub(zc, torch.mul(n, c(_LN2_HI)))
    r = torch.sub(r, torch.mul(n, c(_LN2_LO)))
    y = torch.full_like(z, _C5)
    for coefficient in (_C4, _C3, _C2, _C1, _C0):
        y = torch.add(torch.mul(y, r), c(coefficient))  # two roundings: no FMA
    y = torch.mul(y, torch.mul(r, r))
    y = torch.add(y, r)
    y = torch.add(y, c(1.0))
    # 2^n from its bits: (n + 127) << 23, formed exactly in float32.
    biased = torch.mul(torch.add(n, c(127.0)), c(8388608.0))
    two_n = biased.to(torch.int32).view(torch.float32)
    w = torch.mul(y, two_n)
    return torch.where(z >= _EXP_FLOOR, w, torch.zeros_like(w))


# ----------------------------------------------------------------------------
# The warping arguments (the same rules and wording as csrc/warp.cpp)
# ----------------------------------------------------------------------------


class Warp(NamedTuple):
    """The warping arguments, checked, in the form the row pass uses."""

    greedy: bool       # temperature == 0: every warped row is the point mass on its argmax
    scale: float       # float32(1 / temperature), clamped to [FLT_MIN, FLT_MAX]
    min_weight: float  # the smallest float32 >= min_p: min-p as a float32 compare
    top_k: int         # 0: off
    top_p: float       # 1: off


def check_warp(temperature, top_k, top_p, min_p) -> Warp:
    """Validate the warping arguments (the C++ rules and wording)."""
    temperature, top_k, top_p, min_p = warp_scalars(temperature, top_k, top_p, min_p)
    check_warp_values(temperature, top_k, top_p, min_p)
    greedy = temperature == 0
    scale = 0.0
    if not greedy:
        inverse = 1.0 / float(temperature)
        # Clamped so that (x - max) * scale is never NaN (0 * inf) nor 0 for x < max.
        if inverse > _FLT_MAX:
            scale = _FLT_MAX
        else:
            scale = max(torch.tensor(inverse, dtype=torch.float32).item(), _FLT_MIN)
    # The smallest float32 >= min_p: min-p as a float32 compare.
    mw = torch.tensor(float(min_p), dtype=torch.float32)
    if mw.item() < min_p:
        mw = torch.nextafter(mw, torch.tensor(math.inf, dtype=torch.float32))
    return Warp(greedy, scale, mw.item(), int(top_k), float(top_p))


# ----------------------------------------------------------------------------
# Warping
# ----------------------------------------------------------------------------


def warp_row(row: torch.Tensor, warp: Warp, name: str = "logits", index: tuple = ()) -> torch.Tensor:
    """The warped float32 weights of one row of logits (see the module docstring).

    ``warp.greedy`` must be False (temperature 0 has no weights but a point mass).
    """
    scale, top_k, top_p, min_weight = warp.scale, warp.top_k, warp.top_p, warp.min_weight
    x = row.float()
    bad = torch.isnan(x) | (x == math.inf)
    if bool(bad.any()):
        col = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}[{where((*index, col))}] is {x[col].item()}: logits must be finite or -inf")
    row_max = x.max()
    if row_max.item() == -math.inf:
        raise ValueError(
            f"{name}[{where(index)}] is -inf everywhere: a warped row needs at least one finite logit"
        )
    vocab = x.numel()
    scale_t = torch.tensor(scale, dtype=torch.float32, device=x.device)
    weights = exp_sv(torch.mul(torch.sub(x, row_max), scale_t))
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k).values[-1]
        keep &= x >= kth  # every tie with the k-th largest logit stays
    if top_p < 1.0:
        # Rank by logit descending, ties by ascending id (a stable sort).
        order = torch.sort(x, descending=True, stable=True).indices
        ranked = torch.where(keep, weights, torch.zeros_like(weights)).double()[order]
        running = torch.cumsum(ranked, 0)  # float64, sequential, in rank order
        before = torch.cat([running.new_zeros(1), running[:-1]])
        tau = top_p * running[-1].item()
        last = int((before < tau).sum()) - 1  # before[0] = 0 < tau: last >= 0
        keep &= x >= x[order[last]]  # the cut is a logit: ties with it stay
    keep &= weights >= torch.tensor(min_weight, dtype=torch.float32, device=x.device)
    return torch.where(keep, weights, torch.zeros_like(weights))


def warp_weights(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """Reference warped weights ``[..., V]`` float32 (unnormalized; 0 off the support).

    ``verify_logits(t, d, x, ...) == verify_sampled(warp_weights(t, ...),
    warp_weights(d, ...), x)`` for the same uniforms. At temperature 0 the
    row is the point mass on the argmax (1.0 there, 0 elsewhere).
    """
    warp = check_warp(temperature, top_k, top_p, min_p)
    check_rows_tensor("logits", logits, None)
    check_vocab("logits", logits.shape[-1] if logits.dim() >= 1 else 0)
    check_has_values(logits=logits)
    rows = logits.reshape(-1, logits.shape[-1])
    out = torch.zeros(rows.shape, dtype=torch.float32, device=logits.device)
    for j in range(rows.shape[0]):
        if warp.greedy:
            out[j, checked_argmax(rows[j], "logits", (j,))] = 1.0
        else:
            out[j] = warp_row(rows[j], warp, "logits", (j,))
    return out.reshape(logits.shape)


