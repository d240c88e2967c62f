"""The decision ops of both families under one calling convention, for tests
parametrized over them.

* probability rows in: ``verify_greedy``, ``verify_sampled`` and their
  ``*_batched`` forms;
* logits in: ``verify_logits`` and ``verify_logits_batched``, which warp the
  draft and the target inside the op (``sample_draft`` and ``warp_probs``, the
  other two logits ops, have no draft tokens to decide on and are tested by name).

A test parametrized over ``OPS`` (or ``RANDOM_OPS``) calls each one the same way::

    op.call(impl, target, draft, tokens, uniforms=..., generator=...)
    op.call_batched(impl, target, draft, tokens, counts, uniforms=..., generator=...)

with ``impl`` the kernel (``sv``) or the pure-torch reference (``sv.reference``).
Greedy reads no draft rows and no randomness: ``call`` drops them. The logits
op is called with its family's warping (``op.warp``) unless the test passes
its own. ``op.case`` builds valid inputs.

Also shared by the logits tests: ``WARPS`` (warpings to sweep),
``logits_pair`` and ``logits_three_ways`` (kernel, reference, and
``verify_sampled`` on the reference's warped weights).
"""

from __future__ import annotations

import dataclasses
import math

import torch

NAN, INF = math.nan, math.inf


@dataclasses.dataclass(frozen=True)
class DecisionOp:
    """One decision op (single and batched forms), called the same way whatever its family."""

    name: str  # the pytest id: greedy, sampled, logits
    rows: str  # "probs" or "logits": the rows' argument names are target_<rows>, draft_<rows>
    single: str  # the op's name on sv and on sv.reference
    batched: str
    random: bool  # takes K+1 uniforms per sequence (uniforms= or generator=)
    unreadable: tuple[float, ...]  # entries a read row may not hold: each raises if read
    warp: dict = dataclasses.field(default_factory=dict)  # logits: the warping every call gets (a test may override)

    @property
    def target(self) -> str:
        return f"target_{self.rows}"

    @property
    def draft(self) -> str:
        return f"draft_{self.rows}"

    @property
    def warp_args(self) -> tuple:
        """The warping as ``(temperature, top_k, top_p, min_p)``, as ``reference.warp_weights`` takes it."""
        w = {**dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), **self.warp}
        return w["temperature"], w["top_k"], w["top_p"], w["min_p"]

    def _args(self, draft, kw):
        if self.random:
            return (draft,), {**self.warp, **kw}
        # Greedy: no draft rows, no uniforms, no generator.
        return (), {k: v for k, v in kw.items() if k not in ("uniforms", "generator")}

    def call(self, impl, target, draft, tokens, **kw):
        extra, kw = self._args(draft, kw)
        return getattr(impl, self.single)(target, *extra, tokens, **kw)

    def call_batched(self, impl, target, draft, tokens, counts=None, **kw):
        extra, kw = self._args(draft, kw)
        return getattr(impl, self.batched)(target, *extra, tokens, counts, **kw)

    def case(self, sv, gen, k, vocab, batch=None, dtype=torch.float32):
        """Valid ``(target [.., K+1, V], draft [.., K, V], tokens [.., K])``, drafts near the
        target, tokens drawn from the draft (logits: by ``sv.sample_draft`` under the op's
        warping); batched (``batch``), every other sequence's probability tokens run long."""
        lead = () if batch is None else (batch,)
        if self.rows == "probs":
            target = torch.rand(*lead, k + 1, vocab, generator=gen) + 0.01
            draft = target[..., :k, :] + 0.3 * torch.rand(*lead, k, vocab, generator=gen)
            tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(*lead, k)
            if batch is not None:
                tokens[::2] = target[::2, :k].argmax(-1)  # long greedy runs
            return target.to(dtype), draft.to(dtype), tokens
        target = (torch.randn(*lead, k + 1, vocab, generator=gen) * 2).to(dtype)
        draft = (target[..., :k, :].float() + torch.randn(*lead, k, vocab, generator=gen)).to(dtype)
        return target, draft, sv.sample_draft(draft, generator=gen, **self.warp)


OPS = {
    op.name: op
    for op in (
        DecisionOp("greedy", "probs", "verify_greedy", "verify_greedy_batched", False, (NAN,)),
        DecisionOp("sampled", "probs", "verify_sampled", "verify_sampled_batched", True, (NAN, -1.0, INF)),
        DecisionOp("block", "probs", "verify_block", "verify_block_batched", True, (NAN, -1.0, INF)),
        DecisionOp("logits", "logits", "verify_logits", "verify_logits_batched", True, (NAN, INF),
                   dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.01)),
    )
}
RANDOM_OPS = [name for name, op in OPS.items() if op.random]

# (temperature, top_k, top_p, min_p): each step alone, in pairs, all four, and edge values.
WARPS = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.3, 5, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (0.8, 0, 1.0, 0.05),
    (0.8, 50, 0.9, 0.0),
    (1.0, 20, 0.5, 0.02),
    (2.0, 3, 0.3, 0.1),
    (0.9, 1, 1.0, 0.0),
    (1.0, 5000, 0.95, 0.0),  # a top-k set too large to stay sparse
    (0.5, 0, 0.999, 0.5),
    (1e-3, 0, 1.0, 0.0),  # near-greedy: a scale of 1000
]


def logits_pair(gen, vocab, k, dtype=torch.float32, scale=2.0, neg_inf=False):
    """Target ``[K+1, V]`` and draft ``[K, V]`` logits, the draft a noisy copy of the target;
    ``neg_inf``: a banned range (``-inf``) in both."""
    target = torch.randn(k + 1, vocab, generator=gen) * scale
    draft = target[:k] + torch.randn(k, vocab, generator=gen)
    if neg_inf and vocab > 4:
        target[:, : vocab // 4] = -INF
        draft[:, : vocab // 4] = -INF
    return target.to(dtype), draft.to(dtype)


def warp_kwargs(warp) -> dict:
    """A ``WARPS`` row as keyword arguments."""
    temperature, top_k, top_p, min_p = warp
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def logits_three_ways(sv, target, draft, tokens, u, warp, method="token"):
    """``verify_logits`` (kernel), the reference ``verify_logits``, and ``verify_sampled``
    (``verify_block`` for ``method="block"``; ``verify_greedy`` at temperature 0) on the
    reference's warped weights: three results that must agree token for token."""
    kw = warp_kwargs(warp)
    ours = sv.verify_logits(target, draft, tokens, uniforms=u, method=method, **kw)
    reference = sv.reference.verify_logits(target, draft, tokens, uniforms=u, method=method, **kw)
    if kw["temperature"] == 0:
        via_sampled = sv.verify_greedy(target, tokens)
    else:
        weights = sv.reference.warp_weights
        via_sampled = (sv.verify_block if method == "block" else sv.verify_sampled)(
            weights(target, *warp), weights(draft, *warp) if len(tokens) else target[:0].float(),
            tokens, uniforms=u,
        )
    return ours, reference, via_sampled
