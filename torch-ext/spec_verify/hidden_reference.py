"""The reference of ``verify_hidden`` / ``sample_hidden``: the decisions of
``verify_logits`` / ``sample_draft`` on the logits of an ``LMHead``.

Rows are computed one at a time, when the decision loop first reads them
(``LazyLogits``: row ``i`` of ``[K+1, V]``, chunked over V), so rows after the
first rejection are never computed, warped or validated -- the laziness of
the logits ops. The decision loops are ``reference.py``'s own
(``greedy_sequence``, ``sampled_sequence``, ``block_sequence``) over a row
source (``HiddenRows``): the warped logits rows, and either the warped draft
logits or, when ``draft_logits`` is None, point-mass drafts (``q(t) = Q = 1``,
the one-hot row of ``verify_sampled_ragged`` without ``draft_probs``).
``verify_hidden_batched`` runs that loop per sequence on its rows ``0 .. k_b``
(messages name ``logits[b, i, x]``).
"""

from __future__ import annotations

import torch

from . import reference
from ._checks import (
    check_generator,
    check_has_values,
    check_num_draft,
    check_num_draft_shape,
    check_rows_tensor,
    check_same_device,
    check_token_range,
    check_tokens_tensor,
    checked_argmax,
    warp_scalars,
)
from .lm_head import LMHead, reference_logits
from .warping import check_warp, warp_row

__all__ = ["LazyLogits", "HiddenRows", "check_hidden_call", "check_hidden_batched_call", "verify_hidden",
           "verify_hidden_batched", "sample_hidden"]


class LazyLogits:
    """Row ``i`` of the head's logits of ``hidden``, computed on first read and kept.

    ``logits_fn(hidden_rows [1, d]) -> [1, V]`` computes rows: by default
    ``reference_logits`` (pure torch); the CPU wrappers pass the C++
    ``hidden_logits``, which is the same function bit for bit.
    """

    def __init__(self, head: LMHead, hidden: torch.Tensor, logits_fn=None):
        self.head, self.hidden = head, hidden
        self.logits_fn = logits_fn or (lambda h: reference_logits(head, h))
        self.rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = self.logits_fn(self.hidden[i:i + 1])[0]
        return self.rows[i]


class HiddenRows(reference.WarpedRows):
    """``WarpedRows`` over lazy logits rows; point-mass drafts when ``draft`` is None."""

    target_name = "logits"

    def __init__(self, target: LazyLogits, draft, warp, tokens: list[int], prefix: tuple[int, ...] = ()):
        super().__init__(target, draft, warp, prefix)
        self.tokens, self.vocab = tokens, target.head.vocab

    def check_draft_token(self, i: int, token: int) -> None:
        if self.draft is not None:  # temperature 0: the draft token must be its row's argmax
            super().check_draft_token(i, token)

    def draft_row(self, i: int) -> tuple[torch.Tensor, float]:
        if self.draft is not None:
            return super().draft_row(i)
        row64 = torch.zeros(self.vocab, dtype=torch.float64)
        row64[self.tokens[i]] = 1.0
        return row64, 1.0


def _check_head_and_warp(head, temperature, top_k, top_p, min_p, generator):
    """The checks both hidden ops start with: the head's type, the warping, the generator. Returns the warp."""
    if not isinstance(head, LMHead):
        raise TypeError(f"head must be a spec_verify.LMHead, got {type(head).__name__}")
    scalars = warp_scalars(temperature, top_k, top_p, min_p)
    check_generator(generator)
    return check_warp(*scalars)


def check_hidden_call(hidden, head, draft_tokens, draft_logits, temperature, top_k, top_p, min_p, generator,
                      method):
    """Every argument check of ``verify_hidden``, before anything is computed.

    Returns ``(warp, block, K)``.
    """
    warp = _check_head_and_warp(head, temperature, top_k, top_p, min_p, generator)
    block = reference._check_method(method)
    check_rows_tensor("hidden", hidden, 2)
    check_tokens_tensor("draft_tokens", draft_tokens, 1)
    check_has_values(hidden=hidden, draft_tokens=draft_tokens, draft_logits=draft_logits)
    k = draft_tokens.shape[0]
    if tuple(hidden.shape) != (k + 1, head.dim):
        raise ValueError(f"hidden must be [K+1, d] = [{k + 1}, {head.dim}] for K = {k} draft tokens and the "
                         f"head's d, got shape {tuple(hidden.shape)}")
    check_token_range(draft_tokens, head.vocab)
    if draft_logits is not None:
        check_rows_tensor("draft_logits", draft_logits, 2)
        if tuple(draft_logits.shape) != (k, head.vocab):
            raise ValueError(f"draft_logits must be [K, V] = [{k}, {head.vocab}], got shape "
                             f"{tuple(draft_logits.shape)}")
    return warp, block, k


BATCHED_UNIFORMS = "B rows of one per draft token plus one for the final draw"


def check_hidden_batched_call(hidden, head, draft_tokens, num_draft_tokens, draft_logits, temperature, top_k, top_p,
                              min_p, generator, method):
    """Every argument check of ``verify_hidden_batched``, before anything is computed.

    Returns ``(warp, block, counts)``: the draft count of each sequence.
    """
    warp = _check_head_and_warp(head, temperature, top_k, top_p, min_p, generator)
    block = reference._check_method(method)
    check_rows_tensor("hidden", hidden, 3)
    check_tokens_tensor("draft_tokens", draft_tokens, 2)
    batch, k = draft_tokens.shape
    if tuple(hidden.shape) != (batch, k + 1, head.dim):
        raise ValueError(f"hidden must be [B, K+1, d] = [{batch}, {k + 1}, {head.dim}] for draft_tokens [B, K] and "
                         f"the head's d, got shape {tuple(hidden.shape)}")
    check_num_draft_shape(num_draft_tokens, batch)
    if draft_logits is not None:
        check_rows_tensor("draft_logits", draft_logits, 3)
        if tuple(draft_logits.shape) != (batch, k, head.vocab):
            raise ValueError(f"draft_logits must be [B, K, V] = [{batch}, {k}, {head.vocab}], got shape "
                             f"{tuple(draft_logits.shape)}")
    check_same_device(hidden=hidden, draft_tokens=draft_tokens, num_draft_tokens=num_draft_tokens,
                      draft_logits=draft_logits)
    check_has_values(hidden=hidden, draft_tokens=draft_tokens, num_draft_tokens=num_draft_tokens,
                     draft_logits=draft_logits)
    counts = check_num_draft(num_draft_tokens, batch, k)
    for b in range(batch):
        check_token_range(draft_tokens[b, : counts[b]], head.vocab, f"draft_tokens[{b}]")
    return warp, block, counts


def check_sample_call(hidden, head, temperature, top_k, top_p, min_p, generator):
    """Every argument check of ``sample_hidden``. Returns the warp."""
    warp = _check_head_and_warp(head, temperature, top_k, top_p, min_p, generator)
    check_rows_tensor("hidden", hidden, 2)
    check_has_values(hidden=hidden)
    if hidden.shape[1] != head.dim:
        raise ValueError(f"hidden must be [n, d] with the head's d = {head.dim}, got shape {tuple(hidden.shape)}")
    return warp


def verify_hidden(hidden, head, draft_tokens, draft_logits=None, *, temperature=1.0, top_k=0, top_p=1.0,
                  min_p=0.0, generator=None, uniforms=None, method="token", logits_fn=None) -> tuple[int, int]:
    """Reference ``spec_verify.verify_hidden`` (``logits_fn``: see ``LazyLogits``)."""
    warp, block, k = check_hidden_call(hidden, head, draft_tokens, draft_logits, temperature, top_k, top_p,
                                       min_p, generator, method)
    u = reference._take_uniforms(uniforms, generator, (k + 1,), draw=not warp.greedy)
    tokens = draft_tokens.tolist()
    rows = HiddenRows(LazyLogits(head, hidden, logits_fn), draft_logits, warp, tokens)
    return reference._logits_sequence(rows, tokens, None if u is None else u.tolist(), block)


def verify_hidden_batched(hidden, head, draft_tokens, num_draft_tokens=None, draft_logits=None, *, temperature=1.0,
                          top_k=0, top_p=1.0, min_p=0.0, generator=None, uniforms=None, method="token",
                          logits_fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference ``spec_verify.verify_hidden_batched``: sequence ``b`` decided on its rows ``0 .. k_b``
    with ``u[b, :k_b]`` for its tests and ``u[b, k_b]`` for its draw, in order (``logits_fn``: see ``LazyLogits``)."""
    warp, block, counts = check_hidden_batched_call(hidden, head, draft_tokens, num_draft_tokens, draft_logits,
                                                    temperature, top_k, top_p, min_p, generator, method)
    batch, k = draft_tokens.shape
    u = reference._take_uniforms(uniforms, generator, (batch, k + 1), draw=not warp.greedy, what=BATCHED_UNIFORMS)
    accepted = torch.empty(batch, dtype=torch.int64)
    next_tokens = torch.empty(batch, dtype=torch.int64)
    for b, k_b in enumerate(counts):
        tokens = draft_tokens[b, :k_b].tolist()
        draft = None if draft_logits is None else draft_logits[b, :k_b]
        rows = HiddenRows(LazyLogits(head, hidden[b, : k_b + 1], logits_fn), draft, warp, tokens, (b,))
        accepted[b], next_tokens[b] = reference._logits_sequence(rows, tokens, None if u is None else
                                                                 u[b, : k_b + 1].tolist(), block)
    return accepted.to(hidden.device), next_tokens.to(hidden.device)


def sample_hidden(hidden, head, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None,
                  uniforms=None, logits_fn=None) -> torch.Tensor:
    """Reference ``spec_verify.sample_hidden``: ``sample_draft`` on each row's logits."""
    warp = check_sample_call(hidden, head, temperature, top_k, top_p, min_p, generator)
    n = hidden.shape[0]
    u = reference._take_uniforms(uniforms, generator, (n,), draw=not warp.greedy and n > 0,
                                 what="one per row of hidden")
    rows = LazyLogits(head, hidden, logits_fn)
    out = torch.empty(n, dtype=torch.int64)
    for j in range(n):
        if warp.greedy:
            out[j] = checked_argmax(rows[j], "logits", (j,))
        else:
            out[j] = reference.inverse_cdf(warp_row(rows[j], warp, "logits", (j,)).double(), float(u[j]))
    return out.to(hidden.device)
