"""``DecodeStats``: what one decode run did, round by round.

Shared by ``SpeculativeDecoder`` (one sequence) and
``BatchedSpeculativeDecoder`` (B sequences per round): a batch records one
entry per sequence per round, so every per-round figure reads per sequence.
The glossary (accepted, correction and bonus tokens) is DESIGN.md's.

Only the Python standard library and torch are imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .decode_warping import LogitsWarping

__all__ = ["DecodeStats"]


# ----------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------


@dataclass
class DecodeStats:
    """What one ``generate`` call did, round by round.

    For a batch (``BatchedSpeculativeDecoder``), a *round* here is one
    sequence's share of a batch round: a batch round over ``n`` unfinished
    sequences records ``n`` rounds, each with that sequence's own draft
    length and accepted count. Every figure below then reads per sequence
    (``tokens_per_round`` is still the speed-up in target calls per
    sequence); ``batch_rounds`` counts the batch's forwards.

    Attributes
    ----------
    k : int
        The decoder's draft length (a round drafts ``min(k, remaining - 1)``).
    greedy : bool
        Verification mode of the run.
    rounds : int
        Draft / target / verify rounds run, one per sequence per batch round.
    drafted : int
        Draft tokens proposed, summed over rounds (for a batch: each
        sequence's own draft length, ``num_draft_tokens``).
    accepted : int
        Accepted draft tokens, summed over rounds (counted as verified,
        before any truncation at the end-of-sequence id).
    new_tokens : int
        Tokens appended to the prompts (after truncation at ``eos_token_id``),
        summed over sequences.
    histogram : list[int]
        ``histogram[j]`` = rounds that accepted exactly ``j`` draft tokens,
        ``j = 0 .. min(k, max_new - 1)`` (the longest round the run can
        draft; ``k`` itself may be huge); sums to ``rounds``.
    per_round : list[tuple[int, int]]
        ``(drafted, accepted)`` for every round, in order.
    draft_seconds, target_seconds, verify_seconds, total_seconds : float
        Wall time spent in ``draft_step``, in ``target_step``, in the verify op
        (with the decoder's own checks), and in the whole ``generate`` call.
    prefill_seconds : float
        ``k="auto"``: wall time of the prefill phase (the prompts fed before
        the first round; part of ``total_seconds``, not of ``target_seconds``).
    stopped_by : str
        ``"max_new"`` or ``"eos"``; for a batch whose sequences stopped for
        both reasons, ``"eos and max_new"`` (``stopped_by_row`` has each).
    warping : LogitsWarping or None
        The warping of the logits rows verified (None: probability rows).
    batch_size : int
        Sequences decoded together (1 for ``SpeculativeDecoder``).
    batch_rounds : int
        Batch rounds run: draft and target calls, each for every unfinished
        sequence at once (``== rounds`` for one sequence).
    stopped_by_row : list[str]
        Why each sequence stopped, in batch order.
    auto : bool
        True for ``k="auto"`` (``k`` is then ``k_max``).
    k_per_round : list[int]
        The ``k`` asked of the draft in each batch round (fixed: ``k``, or
        less near ``max_new``; auto: the cost model's choice; 0 is a plain
        step). A draft may have proposed fewer (``per_round``).
    predicted_tokens, predicted_seconds : float
        ``k="auto"``: the cost model's predicted tokens and seconds, summed
        over the rounds it predicted (0.0 otherwise).

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
    prefill_seconds: float = 0.0
    stopped_by: str = "max_new"
    warping: Optional[LogitsWarping] = None
    batch_size: int = 1
    batch_rounds: int = 0
    stopped_by_row: list = field(default_factory=list)
    auto: bool = False
    k_per_round: list = field(default_factory=list)
    predicted_tokens: float = 0.0
    predicted_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)
        self.histogram = list(self.histogram)

    def record_round(self, drafted: int, accepted: int) -> None:
        """Add one round that drafted ``drafted`` and accepted ``accepted`` tokens."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.histogram[accepted] += 1
        self.per_round.append((drafted, accepted))

    def record_choice(self, k_asked: int, predicted) -> None:
        """Add one batch round's ``k`` and, for ``k="auto"``, its ``(tokens, seconds)`` prediction (or None)."""
        self.k_per_round.append(k_asked)
        if predicted is not None:
            self.predicted_tokens += predicted[0]
            self.predicted_seconds += predicted[1]

    @property
    def tokens_per_second(self) -> float:
        """Measured new tokens per second of the whole ``generate`` call (0.0 before it ends)."""
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def predicted_tokens_per_second(self) -> float:
        """``k="auto"``: the cost model's predicted tokens per second over the rounds it predicted (0.0 if none)."""
        return self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else 0.0

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
        # Verification runs once per batch round (one op call for the batch).
        per_round_us = 1e6 * self.verify_seconds / self.batch_rounds if self.batch_rounds else 0.0
        ms = 1e3
        batch = (f"  batch of {self.batch_size} sequences: {self.batch_rounds} batch rounds; figures below "
                 f"are per sequence") if self.batch_size > 1 else None
        k = f"auto, k_max={self.k}" if self.auto else str(self.k)
        lines = [
            f"speculative decoding ({self.mode}, k={k}): {self.new_tokens} new tokens "
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
        if self.auto:
            chosen = {}
            for k in self.k_per_round:
                chosen[k] = chosen.get(k, 0) + 1
            lines.append(
                "  k=auto: k chosen " + " ".join(f"{k}:{c}" for k, c in sorted(chosen.items()))
                + f"; predicted {self.predicted_tokens_per_second:.1f} tokens/s, measured "
                f"{self.tokens_per_second:.1f} tokens/s"
            )
        return "\n".join(lines[:1] + ([batch] if batch else []) + lines[1:])

    def __str__(self) -> str:
        return self.summary()
