"""The draft / verify loop of speculative decoding over any pair of callbacks.

Glossary (DESIGN.md's; the same words in every docstring here and in ``DecodeStats``)
------------------------------------------------------------------------------------
A round drafts K tokens; verification keeps a prefix of them, the *accepted*
draft tokens, and emits one token more:

* the *correction* token, at the first rejection -- greedy: the target's
  argmax at that position; sampled: a draw from the residual
  ``norm(max(0, p - q))`` there;
* the *bonus* token, when all K draft tokens are accepted -- the target's
  argmax (greedy) or a draw from ``p_K`` (sampled) at position K.

Sampled verification spends K+1 float64 *uniforms* per round: ``u_i`` decides
draft token ``i`` (accepted iff ``u_i * q_i(t_i) < p_i(t_i)``) and ``u_K``
drives the draw of the correction or bonus token. A round thus emits
``accepted + 1`` tokens.

A round, in the style of gpt-fast's ``generate.py``: one small method per phase
------------------------------------------------------------------------------
1. ``_draft``  -- ``draft_step(prefix, k)`` proposes ``k`` tokens and the rows
   they were drawn from;
2. ``_target`` -- ``target_step(prefix, proposed)`` scores all of them in one
   ``[k+1, V]`` call;
3. ``_verify`` -- one op of this package decides the accepted draft tokens and
   the correction or bonus token;
4. ``_commit`` -- they are appended, truncated at ``max_new`` and at the
   end-of-sequence id.

Rows: probabilities, or logits under a declared warping
-------------------------------------------------------
The callbacks return either

* **probability rows** (``warping=None``, the default and the original API):
  ``draft_step`` gives the distribution each draft token was sampled from,
  ``target_step`` the target's, warped identically by the caller; verified by
  ``verify_greedy`` / ``verify_sampled``;
* **logits rows** under a ``LogitsWarping`` (temperature, top-k, top-p,
  min-p): both return raw logits, the draft tokens were drawn with
  ``sample_draft`` under that warping, and the decoder verifies with
  ``verify_logits`` under the same warping. The op warps the target and the
  draft rows identically, inside, so no full-vocabulary probability row is
  written in Python and read back, and the draft cannot be verified against a
  distribution it did not sample from.

Greedy verification reads only the argmax of each target row, which is the
same for logits and probabilities: ``verify_greedy`` serves both kinds. A
warping of temperature 0 is greedy too (as in ``verify_logits``).

Design decision: the kind of rows is *declared*, never guessed. Both kinds are
float ``[rows, V]`` tensors (logits may all be non-negative), and reading
logits as probabilities is silently wrong: the draws would follow another law.
The declaration is ``warping=``, or the callbacks themselves: a callback that
returns logits carries its ``LogitsWarping`` as a ``warping`` attribute (of
the function, or, for a bound method, of its object). ``HFCausalLMStep`` does,
so ``SpeculativeDecoder(*hf_step_pair(draft, target, temperature=0.8,
top_p=0.95), k=4, greedy=False)`` verifies with ``verify_logits`` under the
adapters' warping with nothing more to pass. In sampled mode the draft's and
the target's warpings, and ``warping=`` when given, must agree, and a callback
carrying a warping is never paired with one whose rows would be read as
probabilities: any mismatch raises ``ValueError`` at construction. Greedy
mode compares nothing: it reads only target argmaxes, whatever the rows. (An
attribute rather than a return value: the callbacks keep the original
``(tokens, rows)`` / ``rows`` signatures, and the check runs once, before the
first round.)

The callbacks are plain functions, so any models compose (Hugging Face models
through ``hf_adapter.HFCausalLMStep``, GGUF models through the companion
kernels, or explicit tables in tests). The full prefix is passed on every
call, so a callback holding a KV cache can roll it back to ``len(prefix)``
after a rejection.

Only the Python standard library and torch are imported here: this module is
part of the kernel package that ``kernels`` loads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

import torch

from .logits import verify_logits
from .verify import verify_block, verify_greedy, verify_sampled
from .warping import check_warp

__all__ = ["SpeculativeDecoder", "DecodeStats", "LogitsWarping"]

DraftStep = Callable[[torch.Tensor, int], "tuple[torch.Tensor, Optional[torch.Tensor]]"]
TargetStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------
# The warping of logits rows
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogitsWarping:
    """The warping that turns a row of logits into the distribution sampled from.

    Temperature, then top-k, then top-p, then min-p (the order of
    transformers' logits processors), exactly as ``sample_draft``,
    ``verify_logits`` and ``warp_probs`` apply it; ``warping.py`` defines it.
    Checked at construction with the kernel's own rules (``ValueError``
    naming the argument).

    Parameters
    ----------
    temperature : float, default 1.0
        ``>= 0`` and finite; ``0`` is greedy (the point mass on the argmax).
    top_k : int, default 0
        ``>= 0``; 0 = off.
    top_p : float, default 1.0
        In ``(0, 1]``; 1 = off.
    min_p : float, default 0.0
        In ``[0, 1)``; 0 = off.

    Examples
    --------
    >>> w = LogitsWarping(temperature=0.8, top_p=0.95)
    >>> w.kwargs()
    {'temperature': 0.8, 'top_k': 0, 'top_p': 0.95, 'min_p': 0.0}
    >>> str(w), w.greedy
    ('temperature 0.8, top-p 0.95', False)
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        check_warp(self.temperature, self.top_k, self.top_p, self.min_p)
        # Normalized, so that equal warpings compare equal (1 == 1.0 already;
        # this also makes repr and kwargs plain Python numbers).
        for name, cast in (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float)):
            object.__setattr__(self, name, cast(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        """Temperature 0: every warped row is the point mass on its argmax."""
        return self.temperature == 0.0

    def kwargs(self) -> dict:
        """The keyword arguments of ``sample_draft`` / ``verify_logits`` / ``warp_probs``."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def __str__(self) -> str:
        if self.greedy:
            return "temperature 0 (greedy)"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1.0 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0.0 else []
        return ", ".join(parts)


def _as_warping(value) -> LogitsWarping | None:
    """``warping=``: None, a ``LogitsWarping``, or a mapping of its fields."""
    if value is None or isinstance(value, LogitsWarping):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"temperature", "top_k", "top_p", "min_p"}
        if unknown:
            raise TypeError(f"warping got unknown keys {sorted(unknown)}: use temperature, top_k, top_p, min_p")
        return LogitsWarping(**value)
    raise TypeError(f"warping must be None, a LogitsWarping or a dict of its fields, got {type(value).__name__}")


def _carried_warping(step, name: str) -> LogitsWarping | None:
    """The warping a callback declares for its logits rows: its ``warping``
    attribute, or for a bound method its object's; None for probability rows."""
    for holder in (step, getattr(step, "__self__", None)):
        value = getattr(holder, "warping", None)
        if value is not None:
            if not isinstance(value, LogitsWarping):
                raise TypeError(
                    f"{name}.warping must be a LogitsWarping (the warping of the logits rows it returns), "
                    f"got {type(value).__name__}"
                )
            return value
    return None


def _resolve_warping(declared, draft_step, target_step, greedy: bool) -> LogitsWarping | None:
    """The one warping of the run (None: probability rows), or a ``ValueError``."""
    declared = _as_warping(declared)
    draft_w = _carried_warping(draft_step, "draft_step")
    target_w = _carried_warping(target_step, "target_step")
    if greedy:
        # Only the target rows' argmax is read, the same for logits and probabilities.
        return next((w for w in (declared, target_w, draft_w) if w is not None), None)
    for name, carried in (("draft_step", draft_w), ("target_step", target_w)):
        if carried is not None and declared is not None and carried != declared:
            raise ValueError(
                f"{name} carries the warping ({carried}), but warping=({declared}): sampled verification "
                f"needs the one warping the draft sampled from"
            )
    if draft_w is not None and target_w is not None and draft_w != target_w:
        raise ValueError(
            f"draft_step carries the warping ({draft_w}) and target_step ({target_w}): sampled verification "
            f"needs one warping for both (hf_step_pair makes such a pair)"
        )
    if declared is None and (draft_w is None) != (target_w is None):
        has, lacks = ("draft_step", "target_step") if draft_w is not None else ("target_step", "draft_step")
        raise ValueError(
            f"{has} returns logits rows (it carries the warping ({draft_w or target_w})), but {lacks} carries "
            f"none, so its rows would be read as probabilities: logits and probabilities cannot be verified "
            f"against each other. Pass warping= if {lacks} returns logits under the same warping"
        )
    return next((w for w in (declared, draft_w, target_w) if w is not None), None)


# ----------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------


@dataclass
class DecodeStats:
    """What one ``SpeculativeDecoder.generate`` call did, round by round.

    Attributes
    ----------
    k : int
        The decoder's draft length (a round drafts ``min(k, remaining - 1)``).
    greedy : bool
        Verification mode of the run.
    rounds : int
        Draft / target / verify rounds run.
    drafted : int
        Draft tokens proposed, summed over rounds.
    accepted : int
        Accepted draft tokens, summed over rounds (counted as verified,
        before any truncation at the end-of-sequence id).
    new_tokens : int
        Tokens appended to the prompt (after truncation at ``eos_token_id``).
    histogram : list[int]
        ``histogram[j]`` = rounds that accepted exactly ``j`` draft tokens,
        ``j = 0 .. k``; sums to ``rounds``.
    per_round : list[tuple[int, int]]
        ``(drafted, accepted)`` for every round, in order.
    draft_seconds, target_seconds, verify_seconds, total_seconds : float
        Wall time spent in ``draft_step``, in ``target_step``, in the verify op
        (with the decoder's own checks), and in the whole ``generate`` call.
    stopped_by : str
        ``"max_new"`` or ``"eos"``.
    warping : LogitsWarping or None
        The warping of the logits rows verified (None: probability rows).

    Every round emits one correction or one bonus token after its accepted
    draft tokens: ``corrections + bonuses == rounds``.
    """

    k: int
    greedy: bool
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    histogram: list = field(default_factory=list)
    per_round: list = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    stopped_by: str = "max_new"
    warping: Optional[LogitsWarping] = None

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)

    def record_round(self, drafted: int, accepted: int) -> None:
        """Add one round that drafted ``drafted`` and accepted ``accepted`` tokens."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.histogram[accepted] += 1
        self.per_round.append((drafted, accepted))

    @property
    def corrections(self) -> int:
        """Rounds that ended at a rejection, emitting a correction token."""
        return sum(1 for drafted, accepted in self.per_round if accepted < drafted)

    @property
    def bonuses(self) -> int:
        """Rounds that accepted every draft token (possibly none drafted), emitting a bonus token."""
        return self.rounds - self.corrections

    @property
    def acceptance_rate(self) -> float:
        """``accepted / drafted`` (0.0 when nothing was drafted)."""
        # Default for an empty run (max_new <= 1): no draft token was judged.
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round (0.0 when no round ran)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """New tokens per round: the speed-up over plain decoding in target calls."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def mode(self) -> str:
        """``"greedy"``, ``"sampled"`` (probability rows) or ``"sampled from logits (<warping>)"``."""
        if self.greedy:
            return "greedy"
        return "sampled" if self.warping is None else f"sampled from logits ({self.warping})"

    def summary(self) -> str:
        """A few readable lines; also what ``str(stats)`` prints."""
        hist = " ".join(f"{j}:{c}" for j, c in enumerate(self.histogram))
        per_round_us = 1e6 * self.verify_seconds / self.rounds if self.rounds else 0.0
        ms = 1e3
        return "\n".join(
            [
                f"speculative decoding ({self.mode}, k={self.k}): {self.new_tokens} new tokens "
                f"in {self.rounds} rounds, {self.tokens_per_round:.2f} tokens/round, "
                f"stopped by {self.stopped_by}",
                f"  drafted {self.drafted}, accepted {self.accepted} "
                f"(acceptance rate {self.acceptance_rate:.3f}, "
                f"mean accepted length {self.mean_accepted:.2f}); "
                f"{self.corrections} correction and {self.bonuses} bonus tokens",
                f"  accepted-length histogram  {hist}",
                f"  time: draft {self.draft_seconds * ms:.1f} ms, target "
                f"{self.target_seconds * ms:.1f} ms, verify {self.verify_seconds * ms:.2f} ms "
                f"({per_round_us:.0f} us/round), total {self.total_seconds * ms:.1f} ms",
            ]
        )

    def __str__(self) -> str:
        return self.summary()


# ----------------------------------------------------------------------------
# Argument and callback checks
# ----------------------------------------------------------------------------


def _check_int(name: str, value, minimum: int) -> int:
    # bool is an int subclass, but k=True is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_prompt(prompt_ids) -> torch.Tensor:
    """The prompt as a fresh 1-D int64 CPU tensor."""
    if isinstance(prompt_ids, (list, tuple)):
        prompt_ids = torch.tensor(prompt_ids, dtype=torch.int64)
    if not isinstance(prompt_ids, torch.Tensor):
        raise TypeError(f"prompt_ids must be a 1-D integer tensor, got {type(prompt_ids).__name__}")
    if prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex or prompt_ids.dtype == torch.bool:
        raise TypeError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}")
    # Accept transformers' [1, n] input_ids too: a batch of one is a sequence.
    if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
        prompt_ids = prompt_ids[0]
    if prompt_ids.dim() != 1:
        raise ValueError(
            f"prompt_ids must be 1-D [n] (or [1, n]), got shape {tuple(prompt_ids.shape)}"
        )
    if prompt_ids.numel() == 0:
        raise ValueError("prompt_ids is empty: the target needs at least one token to condition on")
    return prompt_ids.to(device="cpu", dtype=torch.int64).clone()


def _eos_set(eos_token_id) -> frozenset:
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


def _as_tokens(value, where: str) -> torch.Tensor:
    """Callback tokens as a 1-D int64 CPU tensor, or a clear error."""
    if isinstance(value, (list, tuple)):
        try:
            value = torch.tensor(value, dtype=torch.int64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{where} returned tokens that are not integers: {err}") from None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} returned tokens of type {type(value).__name__}, expected a 1-D int tensor")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{where} returned tokens of dtype {value.dtype}, expected int64 or int32")
    return value.to(device="cpu", dtype=torch.int64)


def _check_rows(value, where: str, what: str, count: int, expected: str) -> torch.Tensor:
    """A callback's ``[count, V]`` float rows, or an error naming the callback and ``what``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} returned {what} of type {type(value).__name__}, expected a [rows, V] float tensor")
    if value.dtype not in _ROW_DTYPES:
        raise TypeError(f"{where} returned {what} of dtype {value.dtype}, expected float32, float16 or bfloat16")
    if value.dim() != 2:
        raise ValueError(f"{where} returned {what} of shape {tuple(value.shape)}, expected 2-D [rows, V]")
    if value.shape[0] != count:
        raise ValueError(f"{where} returned {what} of shape {tuple(value.shape)}: expected {expected}")
    return value


def _check_draft_result(result, k_round: int, rows_name: str, needs_rows: bool):
    """``draft_step``'s ``(tokens [k], rows [k, V] or None)``, checked."""
    where = f"draft_step(prefix, k={k_round})"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(
            f"{where} must return a pair (tokens, {rows_name}), got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
        )
    tokens = _as_tokens(result[0], where)
    if tuple(tokens.shape) != (k_round,):
        raise ValueError(f"{where} returned tokens of shape {tuple(tokens.shape)}, expected ({k_round},)")
    rows = result[1]
    if rows is None:
        if needs_rows:
            drawn = ("the distribution [k, V] each token was sampled from" if rows_name == "probs"
                     else "the logits [k, V] each token was drawn from (with sample_draft, same warping)")
            raise ValueError(
                f"{where} returned {rows_name}=None, but sampled verification (greedy=False) needs {drawn}"
            )
        return tokens, None
    return tokens, _check_rows(rows, where, rows_name, k_round, f"{k_round} rows, one per token")


def _check_draft_against_target(tokens: list, draft_rows, vocab: int, rows_name: str, sampled_probs: bool) -> None:
    """Draft tokens inside the target's vocabulary, draft rows over it; when
    sampling from probability rows, each token of positive draft mass."""
    where = f"draft_step(prefix, k={len(tokens)})"
    if tokens:
        lo, hi = min(tokens), max(tokens)
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"{where} returned token {lo if lo < 0 else hi}, outside the target's vocabulary [0, {vocab})"
            )
    if draft_rows is None:
        return
    if draft_rows.shape[1] != vocab:
        raise ValueError(
            f"{where} returned {rows_name} over V = {draft_rows.shape[1]} tokens, but target_step "
            f"returned V = {vocab}: draft and target must share one vocabulary"
        )
    if not sampled_probs or not tokens:
        return  # greedy never reads the draft rows; verify_logits checks the warped support itself
    picked = draft_rows.gather(1, torch.tensor(tokens, device=draft_rows.device).view(-1, 1)).view(-1)
    zero = (picked <= 0).nonzero()
    if len(zero):
        i = int(zero[0, 0])
        raise ValueError(
            f"{where} returned tokens[{i}] = {tokens[i]} with probs[{i}, {tokens[i]}] = {float(picked[i])}: "
            f"probs must be the distribution the tokens were sampled from"
        )


def _same_dtype(target_rows: torch.Tensor, draft_rows):
    """The sampled ops want both row tensors on one dtype and device."""
    if draft_rows is None:
        # Only when nothing was drafted (last token): the op wants [0, V].
        return target_rows, target_rows.new_empty((0, target_rows.shape[1]))
    if draft_rows.dtype != target_rows.dtype:
        # float32 holds all three accepted dtypes exactly: nothing is lost.
        target_rows, draft_rows = target_rows.float(), draft_rows.float()
    return target_rows, draft_rows.to(target_rows.device)


# ----------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------


class SpeculativeDecoder:
    """Speculative decoding over a draft callback and a target callback.

    Parameters
    ----------
    draft_step : callable
        ``draft_step(prefix, k) -> (tokens, rows)``. ``prefix`` is a 1-D int64
        CPU tensor of every token so far (prompt plus output; do not modify
        it). ``tokens`` is ``[k]`` integer (a list of ints is accepted).
        ``rows`` is ``[k, V]`` float32/16/bf16: probability rows (row ``i`` the
        warped distribution ``tokens[i]`` was sampled from, unnormalized
        allowed), or, under a warping, the raw logits ``tokens[i]`` was drawn
        from with ``sample_draft``. ``rows`` may be None in greedy mode.
    target_step : callable
        ``target_step(prefix, proposed) -> rows`` of shape
        ``[len(proposed) + 1, V]``: row ``i`` is the target's distribution
        (probability rows, warped exactly as the draft's, non-negative) or its
        raw logits (under a warping) for the token after
        ``prefix + proposed[:i]``. Logits are fine in greedy mode either way
        (only the argmax is read).
    k : int, default 4
        Draft tokens per round, ``>= 1``.
    greedy : bool, default True
        True: ``verify_greedy`` (the output equals plain greedy decoding with
        the target). False: sampled verification (the output is distributed as
        sampling from the target): ``verify_sampled`` on probability rows,
        ``verify_logits`` on logits rows; it needs the draft's rows.
    eos_token_id : int or list of int, optional
        Stop after the first emitted token in this set (it is kept). None: stop
        only at ``max_new``.
    generator : torch.Generator, optional
        Source of the verifier's uniforms in sampled mode (the default CPU
        generator when None). Seed it, and seed the draft's own sampling, for
        reproducible runs. Unused in greedy mode.
    warping : LogitsWarping or dict, optional, keyword only
        Declares that both callbacks return logits rows, warped by this (see
        the module docstring). None: the callbacks' own ``warping`` attributes
        decide (``HFCausalLMStep`` carries one), and without any, the rows are
        probabilities. Sampled mode at temperature 0 is greedy: verified by
        ``verify_greedy``, and the draft may return ``rows=None``.
    method : {"token", "block"}, default "token", keyword only
        Sampled verification: token-wise (``verify_sampled`` / ``verify_logits``)
        or block verification (``verify_block`` / ``verify_logits(method="block")``,
        never fewer tokens per round in expectation). Ignored when greedy.

    Attributes
    ----------
    warping : LogitsWarping or None
        The warping the run verifies logits rows under (None: probability rows).
    stats : DecodeStats or None
        Statistics of the latest ``generate`` call (None before the first).

    Raises
    ------
    ValueError
        In sampled mode, warpings that disagree (``warping=``, the draft's, the
        target's), or one callback carrying a warping while the other's rows
        would be read as probabilities.

    Notes
    -----
    A round drafts ``min(k, max_new - emitted - 1)`` tokens, so it can emit at
    most what is left and ``generate`` never overshoots ``max_new``; when one
    token is left, the round drafts nothing (``draft_step`` is not called) and
    the target alone picks it (a bonus token). Every callback result is
    checked (counts, shapes, vocabulary size, ``probs[i, tokens[i]] > 0`` when
    sampling from probability rows; ``verify_logits`` checks the warped
    support) and a mismatch raises ``ValueError`` / ``TypeError`` naming the
    callback and what it returned.

    Examples
    --------
    >>> import torch
    >>> V = 5
    >>> def next_row(prefix):            # a toy "model": favours last token + 1
    ...     row = torch.full((V,), 0.1)
    ...     row[(int(prefix[-1]) + 1) % V] = 1.0
    ...     return row
    >>> def target_step(prefix, proposed):
    ...     seq = torch.cat([prefix, proposed])
    ...     return torch.stack([next_row(seq[: len(prefix) + i]) for i in range(len(proposed) + 1)])
    >>> def draft_step(prefix, k):       # a perfect draft for this toy target
    ...     seq = prefix.tolist()
    ...     for _ in range(k):
    ...         seq.append((seq[-1] + 1) % V)
    ...     return torch.tensor(seq[len(prefix):]), None
    >>> dec = SpeculativeDecoder(draft_step, target_step, k=3)
    >>> dec.generate(torch.tensor([0]), max_new=6).tolist()
    [0, 1, 2, 3, 4, 0, 1]
    >>> dec.stats.rounds, dec.stats.accepted, dec.stats.bonuses
    (2, 4, 2)
    """

    def __init__(
        self,
        draft_step: DraftStep,
        target_step: TargetStep,
        k: int = 4,
        greedy: bool = True,
        eos_token_id=None,
        generator: torch.Generator | None = None,
        *,
        warping: LogitsWarping | Mapping | None = None,
        method: str = "token",
    ) -> None:
        if not callable(draft_step):
            raise TypeError(f"draft_step must be callable, got {type(draft_step).__name__}")
        if not callable(target_step):
            raise TypeError(f"target_step must be callable, got {type(target_step).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.draft_step = draft_step
        self.target_step = target_step
        self.k = _check_int("k", k, 1)
        self.greedy = bool(greedy)
        if method not in ("token", "block"):
            raise ValueError(f'method must be "token" or "block", got {method!r}')
        # Sampled verification: token-wise or block (DESIGN.md, "Block verification"); greedy ignores it.
        self.method = method
        self.eos_token_ids = _eos_set(eos_token_id)
        self.generator = generator
        self.warping = _resolve_warping(warping, draft_step, target_step, self.greedy)
        # Greedy verification (only target argmaxes read): greedy mode, or sampling at temperature 0.
        self._argmax_only = self.greedy or (self.warping is not None and self.warping.greedy)
        self._rows = "probs" if self.warping is None else "logits"
        self.stats: DecodeStats | None = None
        self._vocab: int | None = None

    # -- the loop ------------------------------------------------------------

    def generate(self, prompt_ids, max_new: int = 128) -> torch.Tensor:
        """Decode up to ``max_new`` tokens after ``prompt_ids``.

        Parameters
        ----------
        prompt_ids : torch.Tensor or list of int
            ``[n]`` (or transformers' ``[1, n]``) integer token ids, ``n >= 1``.
        max_new : int, default 128
            Maximum number of new tokens, ``>= 0``; exactly this many unless an
            end-of-sequence id comes first.

        Returns
        -------
        torch.Tensor
            1-D int64 CPU tensor: the prompt followed by the new tokens (as
            transformers' ``generate`` returns prompt plus continuation). Its
            length is ``n + max_new``, or less when it ends at an
            ``eos_token_id`` (kept as the last token). Statistics of the call
            are left in ``self.stats``.
        """
        prompt = _check_prompt(prompt_ids)
        max_new = _check_int("max_new", max_new, 0)
        stats = DecodeStats(k=self.k, greedy=self.greedy, warping=self.warping)
        self.stats = stats
        self._vocab = None  # learnt from the first target call of this run
        start = time.perf_counter()
        # One buffer for the whole output; callbacks see views of its filled part.
        buffer = torch.empty(len(prompt) + max_new, dtype=torch.int64)
        buffer[: len(prompt)] = prompt
        length = len(prompt)
        while length - len(prompt) < max_new:
            # Draft at most remaining - 1: a round emits accepted + 1 tokens.
            k_round = min(self.k, max_new - (length - len(prompt)) - 1)
            prefix = buffer[:length]
            draft_tokens, draft_rows = self._draft(prefix, k_round)
            target_rows = self._target(prefix, draft_tokens)
            n_accepted, next_token = self._verify(target_rows, draft_tokens, draft_rows)
            stats.record_round(k_round, n_accepted)
            length, hit_eos = self._commit(buffer, length, draft_tokens[:n_accepted], next_token)
            if hit_eos:
                stats.stopped_by = "eos"
                break
        stats.new_tokens = length - len(prompt)
        stats.total_seconds = time.perf_counter() - start
        return buffer[:length].clone()

    # -- phase 1: draft --------------------------------------------------------

    def _draft(self, prefix: torch.Tensor, k_round: int):
        """``k_round`` draft tokens and the rows they were drawn from (None if never read)."""
        if k_round == 0:
            # Last token of the run: nothing to draft, the target picks it.
            return torch.empty(0, dtype=torch.int64), None
        t0 = time.perf_counter()
        result = self.draft_step(prefix, k_round)
        self.stats.draft_seconds += time.perf_counter() - t0
        return _check_draft_result(result, k_round, self._rows, needs_rows=not self._argmax_only)

    # -- phase 2: target -------------------------------------------------------

    def _target(self, prefix: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        """The target's ``[k_round + 1, V]`` rows for the proposal, in one call."""
        t0 = time.perf_counter()
        rows = self.target_step(prefix, draft_tokens)
        self.stats.target_seconds += time.perf_counter() - t0
        k_round = len(draft_tokens)
        where = f"target_step(prefix, proposed) with {k_round} proposed tokens"
        rows = _check_rows(rows, where, "target_" + self._rows, k_round + 1,
                           f"[{k_round + 1}, V] (len(proposed) + 1 rows)")
        if self._vocab is None:
            self._vocab = rows.shape[1]
        elif rows.shape[1] != self._vocab:
            raise ValueError(
                f"{where} returned target_{self._rows} over V = {rows.shape[1]} tokens, but an earlier round "
                f"returned V = {self._vocab}"
            )
        return rows

    # -- phase 3: verify -------------------------------------------------------

    def _verify(self, target_rows, draft_tokens, draft_rows) -> tuple[int, int]:
        """``(accepted count, correction or bonus token)``; op errors re-raised naming the round."""
        t0 = time.perf_counter()
        sampled_probs = not self._argmax_only and self.warping is None
        _check_draft_against_target(draft_tokens.tolist(), draft_rows, target_rows.shape[1], self._rows,
                                    sampled_probs)
        try:
            if self._argmax_only:
                result = verify_greedy(target_rows, draft_tokens)
            else:
                target_rows, draft_rows = _same_dtype(target_rows, draft_rows)
                if self.warping is None:
                    verify = verify_block if self.method == "block" else verify_sampled
                    result = verify(target_rows, draft_rows, draft_tokens, generator=self.generator)
                else:
                    result = verify_logits(target_rows, draft_rows, draft_tokens, generator=self.generator,
                                           method=self.method, **self.warping.kwargs())
        except (ValueError, IndexError) as err:
            raise ValueError(
                f"verification of round {self.stats.rounds} rejected the callbacks' output "
                f"(target_step's rows are target_{self._rows}, draft_step's are draft_{self._rows}): {err}"
            ) from err
        self.stats.verify_seconds += time.perf_counter() - t0
        return result

    # -- phase 4: commit -------------------------------------------------------

    def _commit(self, buffer, length: int, accepted: torch.Tensor, next_token: int) -> tuple[int, bool]:
        """Append the accepted draft tokens and the correction or bonus token; stop at an eos id."""
        new = accepted.tolist() + [int(next_token)]
        hit_eos = False
        if self.eos_token_ids:
            for i, token in enumerate(new):
                if token in self.eos_token_ids:
                    # Keep the eos itself, drop whatever the round had after it.
                    new, hit_eos = new[: i + 1], True
                    break
        buffer[length : length + len(new)] = torch.tensor(new, dtype=torch.int64)
        return length + len(new), hit_eos

    # -- convenience -------------------------------------------------------------

    def __repr__(self) -> str:
        mode = DecodeStats(k=self.k, greedy=self.greedy, warping=self.warping).mode
        return f"SpeculativeDecoder(k={self.k}, {mode}, eos_token_id={sorted(self.eos_token_ids) or None})"
