"""The draft / verify loop of speculative decoding over any pair of callbacks.

One round, in the style of gpt-fast's ``generate.py``, is four small phases:

1. **draft**  -- ``draft_step(prefix, k)`` proposes ``k`` tokens (and, when
   sampling, the draft distribution each was drawn from);
2. **target** -- ``target_step(prefix, proposed)`` scores all of them in one
   ``[k+1, V]`` call;
3. **verify** -- ``verify_greedy`` / ``verify_sampled`` (this package's ops)
   decide how many to keep and which token comes next;
4. **commit** -- the accepted tokens and the correction (or bonus) token are
   appended, truncated at ``max_new`` and at the end-of-sequence id.

The callbacks are plain functions, so any models compose (Hugging Face models
through ``hf_adapter.HFCausalLMStep``, GGUF models through the companion
kernels, or explicit probability tables in tests). The full prefix is passed
on every call, so a callback holding a KV cache can roll it back to
``len(prefix)`` after a rejection.

Only the Python standard library and torch are imported here: this module is
part of the kernel package that ``kernels`` loads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

from .verify import verify_greedy, verify_sampled

__all__ = ["SpeculativeDecoder", "DecodeStats"]

DraftStep = Callable[[torch.Tensor, int], "tuple[torch.Tensor, Optional[torch.Tensor]]"]
TargetStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
        Draft tokens the verifier accepted, summed over rounds (counted as
        verified, before any truncation at the end-of-sequence id).
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
    def acceptance_rate(self) -> float:
        """``accepted / drafted`` (0.0 when nothing was drafted)."""
        # Default for an empty run (max_new <= 1): no draft token was judged.
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted length per round (0.0 when no round ran)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """New tokens per round: the speed-up over plain decoding in target calls."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    def summary(self) -> str:
        """A few readable lines; also what ``str(stats)`` prints."""
        mode = "greedy" if self.greedy else "sampled"
        hist = " ".join(f"{j}:{c}" for j, c in enumerate(self.histogram))
        per_round_us = 1e6 * self.verify_seconds / self.rounds if self.rounds else 0.0
        ms = 1e3
        return "\n".join(
            [
                f"speculative decoding ({mode}, k={self.k}): {self.new_tokens} new tokens "
                f"in {self.rounds} rounds, {self.tokens_per_round:.2f} tokens/round, "
                f"stopped by {self.stopped_by}",
                f"  drafted {self.drafted}, accepted {self.accepted} "
                f"(acceptance rate {self.acceptance_rate:.3f}, "
                f"mean accepted length {self.mean_accepted:.2f})",
                f"  accepted-length histogram  {hist}",
                f"  time: draft {self.draft_seconds * ms:.1f} ms, target "
                f"{self.target_seconds * ms:.1f} ms, verify {self.verify_seconds * ms:.2f} ms "
                f"({per_round_us:.0f} us/round), total {self.total_seconds * ms:.1f} ms",
            ]
        )

    def __str__(self) -> str:
        return self.summary()


# ----------------------------------------------------------------------------
# Argument checks
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


def _check_probs_tensor(value, where: str, what: str) -> torch.Tensor:
    """A callback's ``[rows, V]`` float result, or an error naming it."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} returned {what} of type {type(value).__name__}, expected a [rows, V] float tensor")
    if value.dtype not in _PROB_DTYPES:
        raise TypeError(f"{where} returned {what} of dtype {value.dtype}, expected float32, float16 or bfloat16")
    if value.dim() != 2:
        raise ValueError(f"{where} returned {what} of shape {tuple(value.shape)}, expected 2-D [rows, V]")
    return value


# ----------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------


class SpeculativeDecoder:
    """Speculative decoding over a draft callback and a target callback.

    Parameters
    ----------
    draft_step : callable
        ``draft_step(prefix, k) -> (tokens, probs)``. ``prefix`` is a 1-D int64
        CPU tensor of every token so far (prompt plus accepted output; do not
        modify it). ``tokens`` is ``[k]`` integer (a list of ints is accepted);
        ``probs`` is ``[k, V]`` float32/16/bf16, row ``i`` the (warped)
        distribution ``tokens[i]`` was sampled from, unnormalized allowed.
        ``probs`` may be None in greedy mode.
    target_step : callable
        ``target_step(prefix, proposed) -> target_probs`` of shape
        ``[len(proposed) + 1, V]``: row ``i`` is the target's distribution for
        the token after ``prefix + proposed[:i]``. Logits are fine in greedy
        mode (only the argmax is read); in sampled mode they must be
        non-negative probabilities, warped exactly as the draft's.
    k : int, default 4
        Draft tokens per round, ``>= 1``.
    greedy : bool, default True
        True: ``verify_greedy`` (the output equals plain greedy decoding with
        the target). False: ``verify_sampled`` (the output is distributed as
        sampling from the target), which needs the draft's ``probs``.
    eos_token_id : int or list of int, optional
        Stop after the first emitted token in this set (it is kept). None: stop
        only at ``max_new``.
    generator : torch.Generator, optional
        Source of the verifier's uniforms in sampled mode (the default CPU
        generator when None). Seed it, and seed the draft's own sampling, for
        reproducible runs. Unused in greedy mode.

    Attributes
    ----------
    stats : DecodeStats or None
        Statistics of the latest ``generate`` call (None before the first).

    Notes
    -----
    A round drafts ``min(k, max_new - emitted - 1)`` tokens, so it can emit at
    most what is left and ``generate`` never overshoots ``max_new``; when one
    token is left, the round drafts nothing (``draft_step`` is not called) and
    the target alone picks it. Every callback result is checked (counts,
    shapes, vocabulary size, ``probs[i, tokens[i]] > 0`` when sampling) and a
    mismatch raises ``ValueError`` / ``TypeError`` naming the callback and what
    it returned.

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
    >>> dec.stats.rounds, dec.stats.accepted
    (2, 4)
    """

    def __init__(
        self,
        draft_step: DraftStep,
        target_step: TargetStep,
        k: int = 4,
        greedy: bool = True,
        eos_token_id=None,
        generator: torch.Generator | None = None,
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
        self.eos_token_ids = _eos_set(eos_token_id)
        self.generator = generator
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
        stats = DecodeStats(k=self.k, greedy=self.greedy)
        self.stats = stats
        self._vocab = None  # learnt from the first target call of this run
        start = time.perf_counter()
        # One buffer for the whole output; callbacks see views of its filled part.
        buffer = torch.empty(len(prompt) + max_new, dtype=torch.int64)
        buffer[: len(prompt)] = prompt
        length = len(prompt)
        while length - len(prompt) < max_new:
            remaining = max_new - (length - len(prompt))
            # Draft at most remaining - 1: a round emits accepted + 1 tokens.
            k_round = min(self.k, remaining - 1)
            prefix = buffer[:length]
            draft_tokens, draft_probs = self._draft(prefix, k_round)
            target_probs = self._target(prefix, draft_tokens)
            n_accepted, next_token = self._verify(target_probs, draft_tokens, draft_probs)
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
        """Ask the draft for ``k_round`` tokens; check what it returned."""
        if k_round == 0:
            # Last token of the run: nothing to draft, the target picks it.
            return torch.empty(0, dtype=torch.int64), None
        t0 = time.perf_counter()
        result = self.draft_step(prefix, k_round)
        self.stats.draft_seconds += time.perf_counter() - t0
        where = f"draft_step(prefix, k={k_round})"
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(
                f"{where} must return a pair (tokens, probs), got {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
            )
        tokens = _as_tokens(result[0], where)
        if tuple(tokens.shape) != (k_round,):
            raise ValueError(
                f"{where} returned tokens of shape {tuple(tokens.shape)}, expected ({k_round},)"
            )
        probs = result[1]
        if probs is None:
            if not self.greedy:
                raise ValueError(
                    f"{where} returned probs=None, but sampled verification (greedy=False) "
                    f"needs the draft distribution [k, V] each token was sampled from"
                )
            return tokens, None
        probs = _check_probs_tensor(probs, where, "probs")
        if probs.shape[0] != k_round:
            raise ValueError(
                f"{where} returned probs of shape {tuple(probs.shape)}: expected {k_round} rows, "
                f"one per token"
            )
        return tokens, probs

    # -- phase 2: target -------------------------------------------------------

    def _target(self, prefix: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Score the proposal in one target call; check the rows and vocabulary."""
        t0 = time.perf_counter()
        target_probs = self.target_step(prefix, draft_tokens)
        self.stats.target_seconds += time.perf_counter() - t0
        k_round = len(draft_tokens)
        where = f"target_step(prefix, proposed) with {k_round} proposed tokens"
        target_probs = _check_probs_tensor(target_probs, where, "target_probs")
        if target_probs.shape[0] != k_round + 1:
            raise ValueError(
                f"{where} returned target_probs of shape {tuple(target_probs.shape)}: "
                f"expected [{k_round + 1}, V] (len(proposed) + 1 rows)"
            )
        vocab = target_probs.shape[1]
        if self._vocab is None:
            self._vocab = vocab
        elif vocab != self._vocab:
            raise ValueError(
                f"{where} returned target_probs over V = {vocab} tokens, but an earlier round "
                f"returned V = {self._vocab}"
            )
        return target_probs

    # -- phase 3: verify -------------------------------------------------------

    def _check_draft_against_target(self, draft_tokens, draft_probs, vocab: int) -> None:
        where = f"draft_step(prefix, k={len(draft_tokens)})"
        if len(draft_tokens):
            lo, hi = int(draft_tokens.min()), int(draft_tokens.max())
            if lo < 0 or hi >= vocab:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{where} returned token {bad}, outside the target's vocabulary [0, {vocab})")
        if draft_probs is None:
            return
        if draft_probs.shape[1] != vocab:
            raise ValueError(
                f"{where} returned probs over V = {draft_probs.shape[1]} tokens, but target_step "
                f"returned V = {vocab}: draft and target must share one vocabulary"
            )
        if self.greedy or not len(draft_tokens):
            return  # greedy verification never reads the draft's probs
        picked = draft_probs.gather(1, draft_tokens.to(draft_probs.device).view(-1, 1)).view(-1)
        zero = (picked <= 0).nonzero()
        if len(zero):
            i = int(zero[0, 0])
            raise ValueError(
                f"{where} returned tokens[{i}] = {int(draft_tokens[i])} with probs[{i}, "
                f"{int(draft_tokens[i])}] = {float(picked[i])}: probs must be the distribution "
                f"the tokens were sampled from"
            )

    def _verify(self, target_probs, draft_tokens, draft_probs) -> tuple[int, int]:
        """Run the verify op; its errors are re-raised naming the round."""
        t0 = time.perf_counter()
        self._check_draft_against_target(draft_tokens, draft_probs, target_probs.shape[1])
        try:
            if self.greedy:
                result = verify_greedy(target_probs, draft_tokens)
            else:
                target_probs, draft_probs = self._same_dtype(target_probs, draft_probs)
                result = verify_sampled(target_probs, draft_probs, draft_tokens, generator=self.generator)
        except (ValueError, IndexError) as err:
            raise ValueError(
                f"verification of round {self.stats.rounds} rejected the callbacks' output "
                f"(target_step's rows are target_probs, draft_step's probs are draft_probs): {err}"
            ) from err
        self.stats.verify_seconds += time.perf_counter() - t0
        return result

    @staticmethod
    def _same_dtype(target_probs, draft_probs):
        """The op wants both on one dtype and device."""
        if draft_probs is None:
            # Only when nothing was drafted (last token): the op wants [0, V].
            return target_probs, target_probs.new_empty((0, target_probs.shape[1]))
        if draft_probs.dtype != target_probs.dtype:
            # float32 holds all three accepted dtypes exactly: nothing is lost.
            target_probs, draft_probs = target_probs.float(), draft_probs.float()
        return target_probs, draft_probs.to(target_probs.device)

    # -- phase 4: commit -------------------------------------------------------

    def _commit(self, buffer, length: int, accepted: torch.Tensor, next_token: int) -> tuple[int, bool]:
        """Append the accepted tokens and the next token; stop at an eos id."""
        new = accepted.tolist() + [int(next_token)]
        if self.eos_token_ids:
            for i, token in enumerate(new):
                if token in self.eos_token_ids:
                    # Keep the eos itself, drop whatever the round had after it.
                    new = new[: i + 1]
                    buffer[length : length + len(new)] = torch.tensor(new, dtype=torch.int64)
                    return length + len(new), True
        buffer[length : length + len(new)] = torch.tensor(new, dtype=torch.int64)
        return length + len(new), False

    # -- convenience -------------------------------------------------------------

    def __repr__(self) -> str:
        mode = "greedy" if self.greedy else "sampled"
        return f"SpeculativeDecoder(k={self.k}, {mode}, eos_token_id={sorted(self.eos_token_ids) or None})"
