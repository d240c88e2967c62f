"""``k="auto"``: how many tokens to draft this round, from measured costs and the law.

Speculation pays only where a target eval of ``k+1`` positions costs less
than the ``E[tokens]`` one-token evals it replaces. On a CPU that is often
false: llama.cpp computes its LM head row by row, so an eval of 5 positions of
Gemma 3 270M costs ~5x a one-token eval, while transformers' forward of the
same model costs ~1.7x. ``AutoCost`` measures that curve while decoding and,
each round, picks the ``k`` in ``{0 .. k_max}`` that maximizes the predicted
tokens per second (DESIGN.md, "k = auto"):

    rate(k) = E[tokens | alpha_hat, rho_hat, k] / (c_draft(k) + E[c_target(W + 1)] + c_other)

* ``E[tokens | alpha, rho, k] = 1 + sum_{j=1..k} prod_{i<j} rho_i alpha_i``
  is the package's own law (``law.expected_accepted``) over the estimated
  per-position acceptance ``alpha_i`` times the draft's *reach* ``rho_i``,
  the chance it proposes position ``i`` at all (1 for a draft model; a
  prompt lookup's match runs out), summed over the batch's sequences;
* ``W`` is the width the target will evaluate, ``max_b min(k, cap_b,
  proposed_b)``, and its law follows from the reaches: asking a lookup for
  8 tokens costs what the 3 it finds cost;
* ``c_target(n)`` is the median of the latest measured target evals of ``n``
  positions (per batch size): robust to a noisy machine's outliers; the
  medians are made non-decreasing in ``n`` (more positions never cost less). An ``n``
  never measured is allowed up to ``2 n_max - 1`` (exploration
  by doubling the draft tokens: n = 2, 3, 5, 9, 17), priced optimistically at
  the longest measured cost; where that stalls (no priced k pays), a longer
  size predicted at twice a plain step's rate at that price is tried once
  (``_jump``: a curve whose first step is its steepest); a gap below it is interpolated, and tried
  once when predicted within 0.9x of the best (a curve is not straight). The first rounds (per batch size) are
  plain steps until ``c_target(1)`` has 3 samples, so a first call's warm-up
  cannot make plain decoding look slow; the next size up from the best,
  while it has fewer than 3 samples and is predicted within 0.8x of the
  best, is measured again (in at most 3 rounds: a lookup may propose less
  than asked), so one slow outlier cannot stall the climb. A ``k > 0``
  round is priced with its *aftermath* too: what the plain eval right after
  an eval of ``n`` positions costs beyond ``c_target(1)`` (``_aftermath``;
  on llama.cpp a tiny model's plain step after a try costs 0.14-0.34
  ``c(1)`` more);
* ``c_draft(k)`` is a draft call's cost, ``call + k * per_token``, fitted to
  the median draft time of each ``k`` asked (~0 for prompt lookup), ``c_other``
  the median of the rest of a round (verify, commit);
* ``alpha_hat_i`` is each sequence's own acceptance at position ``i``,
  exponentially forgotten (``decay`` per round): prompt-lookup matches come
  in bursts, so a global average would speculate in a stretch of prose
  because of the quote before it. In sampled token-wise rounds a judged
  position counts its acceptance probability ``min(1, p(t) / q(t))``, not
  its 0/1 outcome: at T = 0.8 a lookup token the target gives 0.6 is
  rejected 4 times in 10, and one rejection read as 0 stopped speculation
  for ~9 rounds. The decoder *looks ahead* with a cheap point-mass draft
  (``probe_is_cheap``; a prompt lookup): it has the proposal before it calls
  ``choose``, so ``caps`` are what each sequence's proposal holds, and the
  sequences passed in are keys ``(b, context)`` when the draft names its
  proposal's kind (a lookup's match length, bucketed): each kind of match keeps
  its own estimate. A plain step chosen by ``auto`` still learns: the
  proposal's first token is judged by the step's own row (the *probe*), so a
  quote that begins is found in a round, not after the old evidence is
  forgotten. Forgotten evidence returns to the prior
  (position ``i-1``'s estimate; 0.5 at position 0; a context's pooled
  estimate, and for a draft without contexts -- a draft model -- the draft's
  own pool, whose positions share one rate), so a draft that failed a while
  ago is tried again where the costs allow. A draft model is not probed, so
  a sequence's own evidence is forgotten outright after 2, 4, 8, ... (at
  most 32) plain rounds in a row (``retry``): one early rejection no longer
  keeps a good draft idle for tens of rounds.

A curve measured in one process may seed the next (``AutoCost(curve=...)``,
``AutoCost.load``; ``curve()`` and ``save`` give it): the carried sizes are
priced at their ratio to ``c_target(1)`` times this process's own measured
``c_target(1)``, until a size is measured here, so a new process climbs no
sizes from cold; ``save`` / ``load`` carry the contexts' pooled acceptance
too (DESIGN.md, "k = auto": a curve carried across processes).

``k = 0`` is a plain decoding step (the draft is not called). Exactness: the
choice depends only on what happened before the round (timings, earlier
outcomes), never on the round's own uniforms, so every round is a valid
speculative round and the output law is the target's (DESIGN.md, "k = auto").

Only the Python standard library is imported here.
"""

from __future__ import annotations

import bisect
import collections
import collections.abc
import json
import math
import numbers
import os
import platform
import statistics
import warnings


__all__ = ["AutoCost", "DEFAULT_K_MAX"]

_PRIOR_ALPHA = 0.5  # acceptance assumed at position 0 before any evidence
_PRIOR_REACH = 1.0  # a draft is assumed to propose all it is asked, before any evidence
_MIN_SAMPLES = 3  # plain steps measured before any speculation; samples before one size's median is trusted
_CLOSE = 0.8  # the next size up, predicted within this factor of the best, is measured again
_STALE_CLOSE = 0.7  # a stale check (_stale) chooses a size predicted within this factor of the chosen one
_STALE_FIRST = 16  # recorded rounds between stale checks, and since the checked size's last sample (doubling ...
_STALE_MAX = 256  # ... up to this while the checks find the prices right)
_STALE_OLD = 64  # ... or whose last sample is this many recorded rounds old, whatever its samples say
_STALE_DROP = 0.8  # a checked size's new sample below this share of its price: its older samples are dropped
_GAP_CLOSE = 0.9  # a never-measured size between measured ones, predicted within this factor of the best, is tried once
_JUMP = 2.0  # stalled at plain, a size past the doubling's reach predicting this many plain steps' rate is tried once
_PRIOR_WEIGHT = 0.25  # its weight, in rounds' worth of evidence: evidence soon outweighs it
_CONTEXT_WEIGHT = 1.0  # a context's pooled estimate as a prior: one round's worth (see alpha)
_POSITION_WEIGHT = 4.0  # a draft model's pool: each position shrunk towards its rate over all positions (alpha)
_POOL_OPTIMISM = 1.5  # ... that rate taken this many standard errors high: a pool of few rounds is explored (alpha)
_PROBE_SHARE = 0.05  # the draft is looked ahead with (and probed) while a look-ahead costs at most this share of c_target(1)
_CONTEXT_DECAY = 0.98  # a context's pooled evidence, forgotten this much per sequence's round recorded in it
_POOL_IDLE_DECAY = 0.99  # a draft model's pool, forgotten this much per plain round that asked it nothing (record)
_DRAFT_POOL = "draft"  # the pool of keys without a context (a draft model): its acceptance over every run
_REST_SHARE = 0.02  # a round's own work (all but the eval) above this share of c_target(1): plain stretches rest
_REST_AFTER = 8  # chosen plain steps in a row before the first rest
_REST_MAX = 16  # the longest rest, in rounds (rests double from 1 while the looks between them do not pay)
_LOOK_DECAY = 0.8  # the looking rounds' realized rate: its evidence, forgotten this much per looking round
_LOOK_MIN = 3.0  # ... judged once it holds this many rounds' worth
_RETRY_FIRST = 2  # plain rounds after which a never-probed draft's own evidence is first forgotten (retry)
_RETRY_MAX = 32  # the longest wait between retries, in plain rounds (waits double while retries fail)
_CURVE_FORMAT = "spec-verify AutoCost curve 1"  # save's JSON, as load checks it
# The most a k = "auto" round drafts unless told otherwise. Why 16, not 8: where the curve is flat
# (transformers' Gemma 3 270M: 9 positions cost 2.1 c(1), 17 about as much) a copy in progress is
# accepted a dozen tokens at a time, and k_max = 8 left it at 9 a round (input-grounded greedy, Zen 4:
# 2.65x plain at k_max = 8, 4.02x at 16, transformers' prompt_lookup_num_tokens=10 3.42x). Where the
# curve is steep, 17 positions are tried once, only when a proposal that long is predicted to pay.
DEFAULT_K_MAX = 16


class AutoCost:
    """The cost curve and acceptance estimates behind ``k="auto"``.

    Parameters
    ----------
    k_max : int, default 16
        Largest ``k`` ever chosen (``DEFAULT_K_MAX``).
    window : int, default 9
        Samples kept per measured cost (their median is the estimate).
    decay : float, default 0.5
        Forgetting factor of a sequence's acceptance evidence per round that
        drafted for it, in ``(0, 1]``.
    idle_decay : float, default 0.95
        The same per round that drafted nothing for it (a plain step).
    curve : mapping, optional
        A cost curve carried from an earlier process: ``{batch size:
        {positions: cost}}``, each inner mapping holding ``positions = 1``;
        costs in any unit (they are divided by the ``positions = 1`` cost),
        as ``curve()`` returns them. Each carried size is priced at its
        ratio times this process's measured ``c_target(1)`` until it is
        measured here; ``c_target(1)`` itself is always measured first (3
        plain steps), as without a curve.
    retry : bool, default True
        A sequence whose draft is asked nothing in plain rounds (a draft
        model: never probed) has its own evidence forgotten after 2 such
        rounds, then 4, 8, ... up to 32 while the tries fail, so the next
        round is chosen from the draft's pool as a new sequence's is
        (``record``; DESIGN.md, "k = auto": retrying a draft model).
        ``False``: only the idle decay brings it back.

    Notes
    -----
    One ``AutoCost`` lives as long as its decoder: the cost curve is the
    engine's and carries over between ``generate`` calls, as does what
    resting has learnt of looking (``rested``); the acceptance estimates are
    the sequences' and start afresh with each call (``new_run``). Across processes, ``save`` and ``load`` carry the curve
    and the draft's acceptance pools per context (not the sequences' own
    estimates: a new process's prompts are new text).

    See Also
    --------
    AutoCost.curve, AutoCost.save, AutoCost.load
    """

    def __init__(self, k_max: int = DEFAULT_K_MAX, window: int = 9, decay: float = 0.5, idle_decay: float = 0.95,
                 curve=None, retry: bool = True) -> None:
        for name, value in (("k_max", k_max), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AutoCost {name} must be an int >= 1, got {value!r}")
        for name, value in (("decay", decay), ("idle_decay", idle_decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"AutoCost {name} must be a number in (0, 1], got {value!r}")
        self.k_max = k_max
        self.window = window
        self.decay = decay
        self.idle_decay = idle_decay
        if not isinstance(retry, bool):
            raise TypeError(f"AutoCost retry must be a bool, got {type(retry).__name__}")
        self.retry = retry
        # batch -> {positions: c(n) / c(1)} carried from an earlier process (curve=), until measured here
        self._carried: dict = _checked_curve(curve)
        # (batch size, positions) -> recent target eval seconds
        self._target: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))
        # (batch size, tokens asked) -> recent draft seconds, and their median (the affine fit's points)
        self._draft: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))
        self._draft_median: dict = {}
        self._other: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))
        self._look_ahead: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))  # s a look-ahead
        self._retries: dict = collections.defaultdict(int)  # (batch size, positions) -> rounds the re-measure rule chose it
        # Medians kept until a sample changes them: choose() runs every round, and statistics.median
        # over every measured size each round costs a tiny model's round ~1% (sort in Python, cold caches).
        self._medians: dict = {}  # ("target", batch) -> {positions: s}; ("draft", batch) -> (a, b); ("other", batch) -> s
        self._raw: dict = {}  # (batch, positions) -> that size's median, before the curve is made monotone
        # sequence -> decayed counts per position: accepted, judged (acceptance); extended, reached (reach)
        self._evidence: dict = {}
        # sequence -> [plain rounds since its draft was last asked, the wait before its next retry] (record)
        self._idle: dict = {}
        # context -> accepted, judged per position, pooled over the sequences keyed (b, context): the
        # prior of a sequence's first rounds in that context (alpha), kept across runs like the curve.
        self._context: dict = {}
        # key -> alpha_i * reach_i per position (expected_tokens), kept until record() changes the key's
        # evidence or its context's pool: choose() runs every round, most keys are unchanged since the last.
        self._emit: dict = {}
        # Resting (rest, rested): per batch size, the round's own work, the chosen plain steps in a
        # row, the rounds left to rest and the next rest's length.
        self._work: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))
        self._plain_streak: dict = collections.defaultdict(int)
        self._resting: dict = collections.defaultdict(int)
        self._next_rest: dict = collections.defaultdict(lambda: 1)
        # Per batch size, the looking rounds' decayed [tokens emitted, wall seconds, rounds] (rested).
        self._realized: dict = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        # (batch size, n) -> recent plain evals right after an eval of n > 1 positions (_aftermath), and
        # the positions of the last eval this model saw (record; a resting round is a plain step).
        self._after: dict = collections.defaultdict(lambda: collections.deque(maxlen=window))
        self._last_positions = 1
        # Stale prices (_stale): rounds recorded so far; per (batch size, positions), the round of its last
        # sample and the rounds to wait before it is measured again; the size a stale check chose.
        self._rounds = 0
        self._sampled_at: dict = {}
        self._last_check: dict = collections.defaultdict(int)  # batch size -> the round of its last stale check
        self._stale_wait: dict = collections.defaultdict(lambda: _STALE_FIRST)  # batch size -> rounds
        self._checking = None

    # -- measurements ------------------------------------------------------------

    def new_run(self) -> None:
        """Forget the sequences' acceptance and reach (new prompts); keep the cost curve, and what
        resting has learnt of looking on this engine (the next rest's length, the looking rounds'
        realized rate): a new prompt's first look still comes first, and one that pays sets the rests
        back (``rested``)."""
        self._evidence = {}
        self._idle = {}
        self._emit = {}
        self._plain_streak.clear()
        self._resting.clear()
        self._last_positions = 1

    # -- the curve across processes -----------------------------------------------

    def curve(self) -> dict:
        """The cost curve to carry to another process: ``{batch size: {positions: c(n) / c(1)}}``.

        Each size's median as measured here (not the non-decreasing fit:
        the next process fits it with its own samples), over ``c(1)``;
        carried sizes not measured here are kept. A batch size without a
        measured ``c(1)`` keeps its carried curve, if any.

        Returns
        -------
        dict
            ``{int: {int: float}}``, each inner mapping holding ``1: 1.0``;
            what ``AutoCost(curve=...)`` takes.
        """
        out = {batch: dict(ratios) for batch, ratios in self._carried.items()}
        for (batch, n), seconds in self._raw.items():
            base = self._raw.get((batch, 1))
            if base:  # a c(1) of 0 s (a clock too coarse) carries nothing
                out.setdefault(batch, {})[n] = seconds / base
        return {batch: dict(sorted(ratios.items())) for batch, ratios in sorted(out.items()) if 1 in ratios}

    def save(self, path) -> None:
        """Write ``curve()`` and the draft's acceptance pools to ``path`` as JSON (for ``AutoCost.load``).

        The pools are each context's pooled acceptance per position (a prompt
        lookup's match-length buckets; a draft model's own pool), the prior of
        a new sequence's first rounds in that context, kept across runs in a
        process as the curve is; contexts that are not an int or a str are not
        saved. Why a file and not a cache of the package's own: the curve is
        one engine's, model's, thread count's and machine's, and the pools one
        draft's and target's, which only the caller knows; it names the file.
        """
        pools = [[context, list(accepted), list(judged)] for context, (accepted, judged) in self._context.items()
                 if isinstance(context, (int, str)) and not isinstance(context, bool)]
        doc = {"format": _CURVE_FORMAT, "machine": _machine(),
               "curve": {str(b): {str(n): r for n, r in ratios.items()} for b, ratios in self.curve().items()},
               "pools": pools}
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path, **kwargs) -> "AutoCost":
        """An ``AutoCost`` carrying the curve and pools ``save`` wrote to ``path`` (``kwargs``: as ``AutoCost``'s).

        Pools saved under another ``k_max`` are cut or padded with no evidence. A file saved on
        another machine (``save`` names the CPU and its count: ``_machine``) loads with a
        ``RuntimeWarning``: curves differ by machine (llama.cpp's Gemma 3 270M c(2) / c(1): 1.67 on a
        Zen 3 EPYC, 2.44 on a Zen 4), and each carried size is priced from the other machine's ratio
        until it is measured here. Why a warning and not an error: the curve is a prior that every
        size chosen replaces, and a fleet of like machines may share one file.

        Raises
        ------
        ValueError
            ``path`` holds no saved curve, or a curve that ``AutoCost(curve=...)`` refuses.
        """
        with open(os.fspath(path), encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except ValueError as e:
                raise ValueError(f"AutoCost.load: {os.fspath(path)!r} is not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != _CURVE_FORMAT or not isinstance(doc.get("curve"), dict):
            raise ValueError(f"AutoCost.load: {os.fspath(path)!r} holds no curve saved by AutoCost.save")
        try:
            curve = _checked_curve({int(b): {int(n): r for n, r in ratios.items()} for b, ratios in doc["curve"].items()})
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"AutoCost.load: {os.fspath(path)!r} holds no valid curve ({e})") from None
        saved, here = doc.get("machine"), _machine()
        if saved is not None and saved != here:
            warnings.warn(f"AutoCost.load: {os.fspath(path)!r} was measured on {saved!r}, this is {here!r}: "
                          "its sizes are priced by that machine's curve until each is measured here",
                          RuntimeWarning, stacklevel=2)
        model = cls(curve=curve, **kwargs)
        model._context = _checked_pools(doc.get("pools", []), model.k_max, os.fspath(path))
        return model

    def record(self, batch: int, k_asked: int, drafted: int, seconds: tuple, outcomes: list,
               looked_ahead: bool = False) -> None:
        """One round: its timings and each sequence's ``(sequence, asked, drafted, accepted[, probs])``.

        ``seconds`` is ``(draft, target, rest)``; ``drafted`` the width the
        target evaluated (``drafted + 1`` positions); ``asked`` what the draft
        was asked of that sequence, ``drafted`` what it proposed (a prompt
        lookup may propose fewer, or none). ``probs``, optional: the
        acceptance probability of each judged position (``0 ..
        min(drafted, accepted + 1) - 1``), counted instead of the 0/1
        outcomes (Rao-Blackwell: the same mean, less noise). ``looked_ahead``:
        the draft was asked before ``k`` was chosen; its seconds are then
        also one look-ahead's cost (``probe_is_cheap``).
        """
        draft_s, target_s, rest_s = seconds
        after, self._last_positions = self._last_positions, drafted + 1
        self._rounds += 1
        if drafted == 0 and after > 1:
            # A plain eval right after a longer one: the longer round's aftermath, not c(1) (_aftermath).
            self._after[(batch, after)].append(target_s)
            self._medians.pop(("costs", batch), None)
        else:
            size = (batch, drafted + 1)
            samples = self._target[size]
            if self._checking == size and samples and target_s < _STALE_DROP * self._raw.get(size, target_s):
                samples.clear()  # a stale price, well above what it costs now: the old samples go (_stale)
                self._stale_wait[batch] = _STALE_FIRST
            samples.append(target_s)
            self._sampled_at[size] = self._rounds
            median = statistics.median(samples)  # one size's median: the others' did not move
            if self._raw.get(size) != median:
                self._raw[size] = median
                self._medians.pop(("target", batch), None)
                self._medians.pop(("costs", batch), None)
        if k_asked:
            drafts = self._draft[(batch, k_asked)]
            grew = len(drafts) < self.window  # the fit weighs each k's median by its samples
            drafts.append(draft_s)
            median = statistics.median(drafts)
            if grew or self._draft_median.get((batch, k_asked)) != median:  # else the fit cannot move
                self._draft_median[(batch, k_asked)] = median
                self._medians.pop(("draft", batch), None)
            if looked_ahead:
                self._look_ahead[batch].append(draft_s)
                self._medians.pop(("look", batch), None)
        self._other[batch].append(rest_s)
        self._medians.pop(("other", batch), None)
        emit = self._emit
        idle_pool = False  # a plain key asked nothing this round: the draft's pool ages (below)
        for outcome in outcomes:
            seq, n_asked, n_drafted, n_accepted = outcome[:4]
            idle_pool = idle_pool or (not n_asked and _context_of(seq) == _DRAFT_POOL)
            probs = outcome[4] if len(outcome) > 4 else None
            emit.pop(seq, None)
            acc, judged, ext, reached = self._evidence.setdefault(seq, [[0.0] * self.k_max for _ in range(4)])
            # Rounds with evidence forget fast (a burst ends in a round or two); rounds without it
            # slowly, so a draft that failed is tried again only after a while (a retry costs a longer eval).
            keep_alpha = self.decay if n_drafted else self.idle_decay
            keep_reach = self.decay if n_asked else self.idle_decay
            for i in range(self.k_max):
                acc[i] *= keep_alpha
                judged[i] *= keep_alpha
                ext[i] *= keep_reach
                reached[i] *= keep_reach
            # Position i was judged if it was drafted and every earlier one accepted. Its evidence is
            # its acceptance probability where the decoder gives it (sampled token-wise rounds), else
            # the outcome: the same mean, and a rejection at p = 0.6 no longer reads as 0.
            pooled = self._decayed_pool(_context_of(seq), _CONTEXT_DECAY) if n_drafted else None
            for i in range(min(n_drafted, n_accepted + 1, self.k_max)):
                judged[i] += 1.0
                hit = float(i < n_accepted) if probs is None else min(max(float(probs[i]), 0.0), 1.0)
                acc[i] += hit
                if pooled is not None:
                    pooled[0][i] += hit
                    pooled[1][i] += 1.0
            # Position i was reached if it was asked for and the proposal got that far.
            for i in range(min(n_asked, n_drafted + 1, self.k_max)):
                reached[i] += 1.0
                ext[i] += float(i < n_drafted)
            if self.retry:
                self._count_idle(seq, n_asked, n_accepted, self._evidence[seq])
        if idle_pool and self.retry and _DRAFT_POOL in self._context:
            # A plain round that asked a draft model nothing: its pool ages (see _decayed_pool).
            self._decayed_pool(_DRAFT_POOL, _POOL_IDLE_DECAY)

    def _decayed_pool(self, context, keep: float) -> list:
        """The pooled ``[accepted, judged]`` of ``context`` (``_DRAFT_POOL``: a draft model's), its counts
        times ``keep`` for this round: ``_CONTEXT_DECAY`` for a round recorded in it, ``_POOL_IDLE_DECAY``
        for a plain round that asked a draft model nothing (``record``, with ``retry``).

        Why a draft model's pool ages over plain rounds too: the pool is a new or retried sequence's
        prior, and it learns only from rounds that draft. Measured on text where the draft does not pay (accepted ~0.74 a position: the shipped
        pair on llama.cpp, input-grounded, a Zen 4 whose curve is steep), it kept saying so on text
        where it does (~0.87: open prose, where ``k = 8`` ran 1.20x plain), and the draft was never
        tried again: auto 0.79 of ``k = 8`` (docs/performance.md, sixteenth session). Aged, the pool
        thins over plain rounds as it does over drafting ones (``_CONTEXT_DECAY``), and a retried
        sequence priced from a thin pool is read optimistically (``_draft_priors``), so the draft is
        tried again -- rarely while it keeps failing, since each try thickens the pool again.
        Replayed (``python -m benchmarks.bench_auto_draft``, 21 seeds, with that machine's curve
        added): its four greedy rows 0.71-0.87 -> 0.93-0.97 of the best fixed ``k``; all 40 rows'
        geometric mean 0.922 -> 0.941, the worst 0.707 -> 0.822. What it costs where the draft never
        pays: a try every ~25 recorded rounds (``tests/test_auto_k.py``: ~1.7% of a plain stretch at
        0.99 a round, 3.2% at 0.98, which found the draft a few rounds sooner). Why recorded rounds
        only, not the resting ones too (``rest``): tried on the engine (the shipped pair on llama.cpp,
        Zen 4), a pool aged by up to 17 rounds between looks sent the draft into grounded text where
        it loses, 0.82x plain against 0.97x, while the open cell rose only to 0.93 of ``k = 8``. So on a
        tiny model that rests, a draft that turns good late is found late or not at all (0.82-0.87 of
        ``k = 8`` in that cell).
        """
        pooled = self._context.setdefault(context, [[0.0] * self.k_max, [0.0] * self.k_max])
        for key in [key for key in self._emit if _context_of(key) == context]:
            del self._emit[key]  # the pool is every such key's prior
        for counts in pooled:
            for i in range(self.k_max):
                counts[i] *= keep
        return pooled

    def _count_idle(self, seq, n_asked: int, n_accepted: int, evidence: list) -> None:
        """Retrying a draft that is never probed (``retry``): forget ``seq``'s own evidence (acceptance
        and reach) after ``wait`` plain rounds in a row that asked its draft nothing; ``wait`` doubles (2, 4, ...,
        ``_RETRY_MAX``) each time, and is back to 2 once a drafted round has a token accepted.

        Why: a draft model is not probed (a probe is a draft eval), so after one rejected round -- a
        draft accepted 7 times in 10 is rejected at its first token 3 rounds in 10 -- its estimate fell
        to ~0.14 and came back only by the idle decay (~48 plain rounds), stretched further by resting:
        the shipped pair on llama.cpp, open greedy, one rejected ``k = 2`` round then 63 plain rounds
        where ``k = 8`` ran 1.38x plain (docs/performance.md, ninth session). Forgotten, the sequence
        is priced from the draft's pool, as a new sequence is: a draft the pool says pays is tried
        again in 2 rounds, one that keeps failing ever more rarely (at most log2 of the plain
        rounds), and one the pool says does not pay is not tried at all.
        """
        if n_asked:
            idle = self._idle.get(seq)  # none: never idle (a lookup, asked every round), nothing to reset
            if idle is not None:
                idle[0] = 0
                if n_accepted:
                    idle[1] = _RETRY_FIRST
            return
        idle = self._idle.setdefault(seq, [0, _RETRY_FIRST])
        idle[0] += 1
        if idle[0] >= idle[1] and any(evidence[1]):
            for counts in evidence:
                counts[:] = [0.0] * self.k_max
            idle[0], idle[1] = 0, min(2 * idle[1], _RETRY_MAX)

    # -- resting ---------------------------------------------------------------------

    def rest(self, batch: int) -> bool:
        """Should this round skip looking and choosing, and be a plain step (resting)?

        Called at the start of every round; ``rested`` reports the round.
        """
        left = self._resting[batch]
        if left:
            self._resting[batch] = left - 1
            self._last_positions = 1  # a plain eval that record() does not see
            return True
        return False

    def rested(self, batch: int, k: int, work: float, tokens: int | None = None,
               seconds: float | None = None) -> None:
        """The round just done (not called after a resting round): ``k`` the draft tokens it verified
        (0: a plain step, whatever ``choose`` said), and its own ``work`` in seconds (the round's wall
        time but the target eval: looking, choosing, verify, commit, record); optionally the
        ``tokens`` it emitted (all sequences) and its whole wall ``seconds`` -- the decoders give them
        for a round that looked ahead (a cheap point-mass draft: a prompt lookup).

        Why rest: a round that looks ahead and chooses pays the lookup, the choice and their records
        after every eval, ~0.1-0.3 ms of Python with cold caches (DESIGN.md, "k = auto": the loop's own
        cost) -- 5-10% of a tiny model's 2-4 ms step, and nothing when no ``k`` pays. So while the
        measured work is above ``_REST_SHARE`` of ``c_target(1)``, the next rounds rest (plain steps
        that neither look nor choose): 1 round, then 2, 4, up to ``_REST_MAX`` while the looks between
        rests do not pay. A quote that begins during a rest is found at most ``_REST_MAX`` rounds late;
        a model whose step dwarfs the work (Gemma 3 270M, ~25 ms against ~0.3) never rests. Why 16
        rounds, not 8: the looks between rests, and the tries at ``k > 0`` some of them make, were
        still ~3% of the shipped pair's grounded cells (auto 0.93-0.95x plain over three runs against
        0.95-0.98x at 16); its open greedy cell, where a loop is found late, 1.28-1.38x against
        1.33-1.37x, and SmolLM2's grounded cells no worse (llama.cpp, Zen 2). A rest begins

        * after ``_REST_AFTER`` chosen plain steps in a row (a ``k > 0`` ends that stretch), or
        * when the looking rounds' *realized* rate -- their tokens over their whole wall time,
          decayed by ``_LOOK_DECAY`` a round, at least ``_LOOK_MIN`` rounds' worth -- is below a
          resting round's, one token per sequence in ``c_target(1)`` plus the verify and commit.
          Why: the choice's predictions miss what no term of them holds (the choice's own cost, an
          acceptance estimate a little high), and on a tiny model the misses are the margin. The
          shipped pair on llama.cpp, input-grounded greedy text: ``k = 1`` and ``2`` were chosen in
          a fifth of the rounds, each about even with a plain step, so the plain stretches between
          them never reached 8 and every round paid the ~0.28 ms of looking -- ``k="auto"`` ran
          0.90x plain where a plain step through the loop ran 0.96x. Only rounds that looked ahead
          are judged so: a draft model is not asked in a plain step, its cost is in the choice's
          prices, and judged by its realized rate it rested through its climb to the sizes that
          pay (the same pair's draft model, open greedy text: 1.53-1.59x plain -> 1.37-1.41x).

        A ``k > 0`` round sets the rests back to 1 round only while looking pays.
        """
        self._work[batch].append(work)
        self._medians.pop(("work", batch), None)
        self._plain_streak[batch] = 0 if k else self._plain_streak[batch] + 1
        base = self._measured(batch).get(1)
        if base is None or self._median("work", batch, self._work) <= _REST_SHARE * base:
            return  # not busy: resting would save nothing worth a quote found late
        if tokens is not None and seconds is not None:
            realized = self._realized[batch]
            realized[0] = _LOOK_DECAY * realized[0] + tokens
            realized[1] = _LOOK_DECAY * realized[1] + seconds
            realized[2] = _LOOK_DECAY * realized[2] + 1.0
            if realized[2] >= _LOOK_MIN and self._other.get(batch) and \
                    realized[0] * (base + self._median("other", batch, self._other)) < batch * realized[1]:
                self._rest_now(batch)  # looking, choices included, emits less a second than resting
                return
        if k:
            self._next_rest[batch] = 1
        elif self._plain_streak[batch] >= _REST_AFTER:
            self._rest_now(batch)

    def _rest_now(self, batch: int) -> None:
        """Rest the next rounds: 1, then twice the last rest (at most ``_REST_MAX``)."""
        self._resting[batch] = self._next_rest[batch]
        self._next_rest[batch] = min(2 * self._next_rest[batch], _REST_MAX)

    # -- estimates ---------------------------------------------------------------

    def alpha(self, seq) -> list:
        """The estimated acceptance of ``seq`` at positions ``0 .. k_max-1`` (given the position is proposed).

        A key ``(b, context)`` is shrunk towards its context's pooled estimate (every sequence's
        evidence in that context, kept across runs): a prompt lookup's 1-gram matches in prose are
        accepted ~1 time in 10, and starting each new sequence's at 0.5 spent a try on each. The
        pool weighs one round's evidence (``_CONTEXT_WEIGHT``): at a quarter round, one rejection
        took a sequence from its pool's 0.43 to ~0.09, under what a cheap eval needs (transformers
        Gemma, open prose, T = 0.8: half of ``k = 1``'s paying proposals were skipped); replayed on
        real text (``benchmarks.bench_auto_replay``), its input-grounded Gemma cell on
        transformers' curve went from 0.88 to 0.96 of the best fixed ``k``, no row worse by more than 0.03.

        A plain key ``b`` (a draft without contexts: a draft model) is shrunk towards the draft's own
        pool (``_DRAFT_POOL``: every sequence's evidence, kept across runs) at a quarter round's
        weight, as it was towards 0.5 before: a new prompt starts from the draft's measured
        acceptance, and a sequence's evidence forgotten over plain steps (``retry``, the idle decay)
        returns to it rather than to 0.5. A quarter round, not one: a draft model has one pool for
        all its text, and a sequence's own recent outcomes must outweigh it within a round or two (at
        one round's weight, 25 accepted rounds then a run of rejections kept ``k = 8`` for 18 rounds;
        measured again with the pool's positions sharing a rate, 24). Its prior per position, and
        why its positions share a rate and a thin pool is read optimistically: ``_draft_priors``.
        """
        evidence = self._evidence.get(seq)
        acc, judged = (evidence[0], evidence[1]) if evidence is not None else ([0.0] * self.k_max,) * 2
        key = _context_of(seq)
        if key == _DRAFT_POOL:
            fresh = evidence is None or not any(evidence[3])  # nothing of its own: new, or just retried
            return _shrunk(acc, judged, _PRIOR_ALPHA, priors=self._draft_priors(fresh), weight=_PRIOR_WEIGHT)
        context = self._context.get(key)
        if context is None:
            return _shrunk(acc, judged, _PRIOR_ALPHA)
        return _shrunk(acc, judged, _PRIOR_ALPHA, priors=_shrunk(context[0], context[1], _PRIOR_ALPHA),
                       weight=_CONTEXT_WEIGHT)

    def _draft_priors(self, fresh: bool) -> list:
        """A draft model's prior per position, from its pool (``_DRAFT_POOL``; none yet: an empty one).

        ``fresh``: the sequence has no evidence of its own (new, or just retried; see below).

        The positions share one rate: position ``i``'s prior is the pool's evidence there
        shrunk towards the pool's rate over all positions (``_POSITION_WEIGHT`` rounds' weight),
        not towards position ``i - 1``. Why: a draft model's acceptance at a position, given the one
        before was accepted, is about the same at every position (the constant rate of speculative
        sampling's analysis); positions 5-7 are judged only in rounds that got that far, so on their
        own they are a few rounds' noise, and one rejection at position 5 priced ``k >= 6`` out for
        tens of rounds. Replayed on the shipped pair's real text (``benchmarks.bench_auto_draft``:
        four measured cells, 16 rows, 21 seeds), with ``retry``: the rows' geometric mean 0.91 ->
        0.93 of the best fixed ``k``, the worst row 0.81 -> 0.86 (the ninth session's estimator,
        without ``retry``, the shared rate or the affine draft cost: 0.84 and 0.67).

        A sequence priced from the draft's pool alone (new, or just retried: no evidence of its own)
        takes the pool's rate ``_POOL_OPTIMISM`` standard errors high: the pool learns only from rounds
        that draft, so one that said "does not pay" after a prompt's hard start was never asked again
        (the shipped draft at T = 0.8: judged 0.45 where it accepts ~0.7; transformers' padded stand-in
        left at ``k = 0`` for a whole run where ``k = 8`` ran 1.61x plain). A thin pool is explored; a
        thick one barely moves; no pool yet is an empty one (0.75: with a carried curve no size is left
        to explore, and at 0.5 a draft model was never tried at all; DESIGN.md, "k = auto").
        """
        hits, trials = self._context.get(_DRAFT_POOL, ([0.0] * self.k_max,) * 2)
        total_hits, total_trials = sum(hits), sum(trials)
        rate = (total_hits + _PRIOR_ALPHA) / (total_trials + 1.0)
        if fresh:
            bonus = _POOL_OPTIMISM * math.sqrt(rate * (1.0 - rate) / (total_trials + 1.0))
            rate = max(rate, min(rate + bonus, (total_trials + 1.5) / (total_trials + 2.0)))  # never all-accepting
        return [(h + _POSITION_WEIGHT * rate) / (t + _POSITION_WEIGHT) for h, t in zip(hits, trials)]

    def reach(self, seq) -> list:
        """``P(the draft proposes position i | it proposed i - 1 and was asked for i)`` for ``seq``.

        1 for a draft that always proposes what it is asked; a prompt lookup's
        matches run out (a quote ends), or do not exist (prose).
        """
        evidence = self._evidence.get(seq)
        if evidence is None:
            return _shrunk([0.0] * self.k_max, [0.0] * self.k_max, _PRIOR_REACH)
        return _shrunk(evidence[2], evidence[3], _PRIOR_REACH)

    def probe_is_cheap(self, batch: int) -> bool:
        """May the draft be asked for all it may propose before ``k`` is chosen (looking ahead, the probe)?

        Yes while a look-ahead's measured cost (the draft's seconds for all it
        was asked, a median of at least ``_MIN_SAMPLES`` look-aheads: a first
        call's warm-up is no verdict) is at most ``_PROBE_SHARE`` of a
        one-position target eval: a prompt lookup (~20-50 us for all it
        finds) always is; a draft model is tried a few times, then left
        alone. Why the whole look-ahead, not a token: it is paid every round,
        plain steps included, and a draft model at 0.6% of ``c_target(1)`` a
        token (the shipped draft beside the padded stand-in) asked for 8 cost
        5-6% of every plain step. Why measured per look-ahead, not as a token's
        cost times ``k_max``: a lookup's cost does not grow with what it is
        asked, and near the end of a generation it is asked for less.
        """
        looks, base = self._look_ahead.get(batch), self._measured(batch).get(1)
        if not looks or len(looks) < _MIN_SAMPLES or base is None:
            return True
        return self._median("look", batch, self._look_ahead) <= _PROBE_SHARE * base

    def target_cost(self, batch: int, positions: int, measured: dict | None = None):
        """Estimated seconds of a target eval of ``positions`` (None: not to be tried yet).

        ``measured``: ``_measured(batch)``, when the caller prices many sizes at once. The rule
        (``_priced``): a measured size its own cost; a size between two measured ones interpolated;
        a size past the longest measured one, up to twice it less one, the longest's cost --
        optimistic, at least what the longest costs. Explored so, by doubling the draft tokens (n =
        2, 3, 5, 9, 17: k = 1, 2, 4, 8, 16), a short generation reaches k_max in a few rounds, a
        steep curve (llama.cpp computing every logits row) costs a step or two, and a step in a
        curve (transformers' GEMM blocking at 4 rows) is explored past. Why k, not n (2, 4, 8, 9
        before): the gap below a step was interpolated from the step -- transformers' c(3) = 1.17
        priced at 1.46 from c(2) and c(4) = 1.94 -- and a decoder that drafts exactly the k it
        chose (looking ahead) never measured it (bench_auto, transformers Gemma, grounded sampled:
        1.39x plain against 1.52x). Beyond that, None.
        """
        if measured is None:
            measured = self._measured(batch)
        return _priced(measured, sorted(measured), positions)

    def _measured(self, batch: int) -> dict:
        """``{positions: seconds}`` of the target evals measured at ``batch`` (kept until a median moves).

        Each size's median, then made non-decreasing in ``positions`` (pool
        adjacent violators, weighted by samples): an eval of more positions
        does at least the work of fewer, so a curve that dips (``c(4) <
        c(3)`` from a few samples on a loaded machine) is noise, and priced as
        measured it made a longer round look cheaper than a shorter one
        (``k = 3`` chosen over and over on the padded stand-in, AMD EPYC).
        """
        key = ("target", batch)
        if key not in self._medians:
            costs = {n: (self._raw[(batch, n)], len(self._target[(batch, n)])) for (b, n) in self._raw if b == batch}
            carried = self._carried.get(batch)
            if carried and 1 in costs:
                # A carried size is priced by this process's own c(1): the ratios travel between
                # processes and machines' loads, the seconds do not. One sample's weight in the fit.
                for n, ratio in carried.items():
                    costs.setdefault(n, (ratio * costs[1][0], 1))
            sizes = sorted(costs)
            self._medians[key] = dict(zip(sizes, _monotone([costs[n][0] for n in sizes],
                                                           [costs[n][1] for n in sizes])))
        return self._medians[key]

    def _draft_cost(self, batch: int) -> tuple:
        """``(call, per_token)``: a draft asked for ``k >= 1`` tokens costs ``call + k * per_token`` seconds.

        Fitted to each asked ``k``'s median by least squares weighted by its samples
        (``_affine``). Why not a cost per token: a draft model's call has a fixed part (the
        catch-up of last round's tokens, the first eval after the target's, the adapter's Python),
        so a token's cost measured at ``k = 1`` was twice its cost at ``k = 8`` (the shipped draft
        on llama.cpp, greedy: 0.71 against 0.36 ms a token), and ``k = 8`` was priced 2.8 ms, 0.7 of
        a target step, dearer than it is. With one ``k`` measured the fit cannot split the two:
        the cost is taken per token, as before (the dearer guess, until a second ``k`` is tried).
        """
        key = ("draft", batch)
        if key not in self._medians:
            self._medians[key] = _affine([(k, m, len(self._draft[(b, k)]))
                                          for (b, k), m in self._draft_median.items() if b == batch])
        return self._medians[key]

    def _median(self, name: str, batch: int, samples: dict) -> float:
        """The median of ``samples[batch]`` (non-empty), kept until ``record`` adds to it."""
        key = (name, batch)
        if key not in self._medians:
            self._medians[key] = statistics.median(samples[batch])
        return self._medians[key]

    def expected_tokens(self, seqs: list, caps: list) -> tuple:
        """``(E[tokens | k] summed over seqs for k = 0 .. k_max, [(reach, cap) per seq])``.

        By the law over ``alpha_i * reach_i`` (a position emits only if proposed
        and accepted): ``law.expected_accepted``'s sum of prefix products,
        ``1 + sum_{j <= min(k, cap)} prod_{i < j} alpha_i reach_i`` (tested
        equal), in plain Python -- this runs every round, and a tiny model's
        round is a few milliseconds.
        """
        tokens = [0.0] * (self.k_max + 1)
        reaches = []
        cache = self._emit
        # Past the longest cap no sequence adds a token: E[tokens | k] there is E at that cap (filled
        # below), and a plain stretch's rounds (caps 0-3) skip most of k_max's positions.
        top = min(self.k_max, max(caps, default=0))
        for s, cap in zip(seqs, caps):
            cached = cache.get(s)
            if cached is None:
                reach = self.reach(s)
                cached = cache[s] = ([a * r for a, r in zip(self.alpha(s), reach)], reach)
            emit, reach = cached
            total = prefix = 1.0
            tokens[0] += total
            for k in range(1, top + 1):
                if k <= cap:
                    prefix *= emit[k - 1]
                    total += prefix
                tokens[k] += total
            reaches.append((reach, cap))
        tokens[top + 1:] = [tokens[top]] * (self.k_max - top)
        return tokens, reaches

    def choose(self, seqs: list, caps: list) -> tuple:
        """``(k, (predicted tokens, predicted seconds))`` for a round over ``seqs``, each drafting at most ``caps[b]``.

        The prediction is None for a round chosen with nothing measured (a plain step).
        """
        batch = len(seqs)
        if len(self._target.get((batch, 1), ())) < _MIN_SAMPLES:
            # The baseline first: plain steps (no loss against plain decoding) until c(1) is a
            # median of _MIN_SAMPLES, so a first call's warm-up cannot make plain look slow.
            return 0, None
        c_other = self._median("other", batch, self._other) if self._other.get(batch) else 0.0
        if max(caps) == 0:
            # Nothing proposed (a lookup that found no match) or nothing left to draft: a plain step, the
            # only candidate, priced as below with no draft and one token a sequence. Why a path of its
            # own: it is a third of the choices on prose, and the full pricing is ~40 us of Python
            # after an eval (DESIGN.md, "k = auto": the loop's own cost).
            seconds = max(self._target_prices(batch)[0] + c_other, 1e-12)
            return 0, (float(len(seqs)), seconds)
        call, per_token = self._draft_cost(batch)
        tokens, reaches = self.expected_tokens(seqs, caps)
        costs = self._expected_target_costs(batch, reaches, self._measured(batch))

        def candidate(k: int, cost: float) -> tuple:  # (rate, -k, tokens, seconds): ties go to the smaller k
            seconds = max((call + k * per_token if k else 0.0) + cost + c_other, 1e-12)
            return tokens[k] / seconds, -k, tokens[k], seconds

        top = min(self.k_max, max(caps))
        candidates = [candidate(k, costs[k]) for k in range(top + 1) if costs[k] is not None]
        best = max(candidates)
        # No priced k pays (the doubling has stalled), a k the proposal allows is past its reach, and it
        # could predict _JUMP times a plain step's rate (its seconds are at least a plain step's, so its
        # tokens must be _JUMP times a plain step's: a cheap test before _jump prices anything).
        if best[1] == 0 and len(candidates) <= top and tokens[top] >= _JUMP * tokens[0]:
            jump = self._jump(batch, reaches, candidate, best, len(candidates))
            if jump is not None:
                return -jump[1], (jump[2], jump[3])
        # One step up from the best, measured once or twice, may hold an outlier that stalls the climb:
        # while it is close, measure it again (bounded: _MIN_SAMPLES rounds per size, ever). A size
        # that looked too fast is chosen anyway, and its median corrects it.
        # Bounded by tries, not by samples: a lookup asked for k + 1 tokens may propose fewer,
        # and the size would never get its samples while the rule kept choosing it.
        chosen, up = best, -best[1] + 1  # up: the next k; its eval has up + 1 positions
        c = next((c for c in candidates if c[1] == -up), None)
        if c is not None:
            size = (batch, up + 1)
            if (0 < len(self._target.get(size, ())) < _MIN_SAMPLES and self._retries[size] < _MIN_SAMPLES
                    and c[0] >= _CLOSE * best[0]):
                chosen = c
                self._retries[size] += 1
        if chosen is best:
            chosen = self._gap(batch, candidates, best)
        self._checking = None
        if chosen is best:
            chosen = self._stale(batch, candidates, best)
        return -chosen[1], (chosen[2], chosen[3])

    def _stale(self, batch: int, candidates: list, best: tuple) -> tuple:
        """The best candidate, or another ``k > 0`` whose price is stale, chosen once to measure it again.

        Why: a size's price is the median of its last ``window`` samples, and a size priced out is
        never sampled again, so a price taken in a slow moment lasts. The shipped pair's draft
        model on llama.cpp, the bench's 15-pass cells (Intel Xeon): input-grounded, one decode at
        0.6 of the others' speed left ``c(2)`` at 4.0 ms (2.0 ``c(1)``; 2.4-2.9 before it), ``k = 1``
        lost to plain at that price, and the next 11 decodes ran 64 plain steps each where ``k = 1``
        ran 1.22x plain; in open prose ``c(3)`` kept a 4.2-4.8 ms price (fixed ``k = 2``'s evals:
        ~2.5 ms), and auto ran ``k = 1`` at 0.72 of ``k = 2``. So ``wait`` recorded rounds after the
        last check, the best candidate other than the chosen one, predicted within ``_STALE_CLOSE``
        of it, whose size has not been sampled for ``wait`` rounds, and which priced at its own
        fastest sample (not its median) would beat the chosen one or was last sampled ``_STALE_OLD``
        rounds ago (in the same cell, rerun: a whole window of slow samples, ``c(2)`` = ``c(3)`` =
        3.8 ms, kept auto plain for 25 decodes), is chosen once; a sample below
        ``_STALE_DROP`` of its price replaces the size's old samples (``record``) and sets ``wait``
        back to 16; else ``wait`` doubles (16 .. 256). What checks cost where the prices are right:
        nothing while a size's window agrees with itself and is recent; then one round at
        ``_STALE_CLOSE`` of the best rate or better per ``wait`` (the simulations, which have no
        slow moments: 0.1-0.7% lower; DESIGN.md, "A price taken in a slow moment is checked again").
        """
        wait = self._stale_wait[batch]
        if self._rounds - self._last_check[batch] < wait:
            return best
        for c in sorted(candidates, reverse=True):
            if c[0] < _STALE_CLOSE * best[0]:
                break
            size = (batch, -c[1] + 1)
            age = self._rounds - self._sampled_at.get(size, self._rounds)
            if c is best or not c[1] or age < wait:
                continue
            # Suspect a price its own fastest sample would overturn (priced so, it beats the best), or one
            # whose samples are all _STALE_OLD rounds old (a window of slow samples has no fast one).
            seconds = c[3] - (self._raw[size] - min(self._target[size]))
            if age >= _STALE_OLD or (seconds > 0 and c[2] / seconds > best[0]):
                self._stale_wait[batch] = min(2 * wait, _STALE_MAX)
                self._last_check[batch] = self._rounds
                self._checking = size
                return c
        return best

    def _jump(self, batch: int, reaches: list, candidate, best: tuple, first: int):
        """A size past the doubling's reach worth one try, as a candidate, or None.

        Doubling (``target_cost``) prices a size up to ``2 n_max - 1`` at the longest measured
        cost, and no further; where a curve's first step is its steepest, it stalls there.
        llama.cpp's ``-march=native`` build on an AMD EPYC (Zen 4) measured Gemma 3 270M at
        ``c(2)`` = 2.55, ``c(3)`` = 3.03, ``c(17)`` = 10.8 ``c(1)``: ``k = 2`` cannot pay at
        2.55 (at most 3 tokens), so ``k = 16`` was never tried, and auto ran 1.00x plain on
        input-grounded greedy text where fixed ``k = 16`` ran 1.44x and auto with the curve
        carried in 2.01x (docs/performance.md, seventeenth session). So when no priced ``k``
        pays (the best is a plain step: the doubling has stalled), a size past the reach is
        priced at the longest measured cost too (optimistic: an eval of more positions costs at
        least as much), and tried once (per size and batch size, ever) when it predicts at least
        ``_JUMP`` times a plain step's rate: a long match in a copy does, a sampled lookup's short
        hopes do not. Only when stalled: while the climb goes on it reaches the size in a few
        rounds, measuring the sizes between on the way (jumping from ``c(1)`` alone, on the empty
        pool's prior, would try ``k = 8`` before ``k = 1``). A try measures its size, so the
        sizes below it are priced by interpolation from then on; what one can lose is one eval
        of that size, once. Engine, the same cell: auto 1.00x -> 2.12x plain (carried 2.06x).

        ``candidate(k, cost)``: ``choose``'s candidate of ``k`` at that expected target cost;
        ``best``: the plain step's candidate; ``first``: the first unpriced ``k`` (``choose``'s
        candidates are ``0 .. first - 1``).
        """
        measured = self._measured(batch)
        longest = max(measured)
        fill = measured[longest] + self._aftermath(batch, longest, measured)
        costs = self._expected_target_costs(batch, reaches, measured, fill=fill)
        jump = None
        for k in range(first, min(self.k_max, max(cap for _, cap in reaches)) + 1):
            if self._retries[(batch, k + 1)]:
                continue
            c = candidate(k, costs[k])
            if c[0] >= _JUMP * best[0] and (jump is None or c > jump):
                jump = c
        if jump is not None:
            self._retries[(batch, -jump[1] + 1)] += 1
        return jump

    def _gap(self, batch: int, candidates: list, best: tuple) -> tuple:
        """The best candidate, or a size in a gap of the measured curve worth one try.

        Exploration doubles the draft tokens (k = 1, 2, 4, 8: n = 2, 3, 5, 9), so the sizes between
        are interpolated -- and a curve is not always straight: llama.cpp with our head in the op on
        an AMD EPYC (Zen 4) measured c(7) = 2.27 and c(9) = 3.52 c(1) (GCC rolls the head's row loop
        for 8+ rows), so c(7) was priced 2.83 from c(5) and c(9), and k = 6, the best fixed k there,
        was found late or never (``bench_auto_replay``: 0.77 of k = 6 in the bench's cell). So a
        never-measured size below the longest measured one, predicted within ``_GAP_CLOSE`` of the
        best, is tried once (ever, per batch size): at most ``1 - _GAP_CLOSE`` of a round lost per
        gap. Replayed (21 seeds): that cell 0.77 -> 0.90 of its best fixed k, the worst row of all
        0.77 -> 0.88 (DESIGN.md, "k = auto"; docs/performance.md, seventh session).
        """
        measured = self._measured(batch)
        longest = max(measured)
        for c in sorted(candidates, reverse=True):
            if c[0] < _GAP_CLOSE * best[0]:
                break
            size = (batch, -c[1] + 1)
            if size[1] < longest and size[1] not in measured and not self._retries[size]:
                self._retries[size] += 1
                return c
        return best

    def _aftermath(self, batch: int, positions: int, measured: dict) -> float:
        """Seconds more than ``c_target(1)`` that the plain eval right after one of ``positions`` costs.

        The median of the plain evals measured right after an eval of ``positions`` (``record``
        keeps them out of ``c_target(1)``'s samples), less ``c_target(1)``; a size with none
        measured takes the nearest smaller size's (a longer eval leaves at least as much behind);
        none at all, or a plain eval no dearer: 0. A ``k > 0`` round is priced with it, as though
        a plain step followed (the usual case where a try is marginal; inside a copy, where the next
        round is another try, the tries pay many times over).

        Why: on llama.cpp a tiny model's plain eval after a longer one costs more than after a plain
        one -- the shipped pair (f32, a 3.3 ms step) on a Xeon, evals in random order: 3.33 ms after
        a plain eval, 3.93 after one of 2 positions, 3.91 after 3, 4.46 after 5; an eval of ``n``
        after one of ``n`` cost no more than after a plain one (``python -m benchmarks.bench_evals``).
        Each try therefore cost ~0.14-0.34 ``c(1)`` that no measured size held, since the plain
        step paid it and ``c(1)``'s median shrugged it off: ``k="auto"``'s tries on the pair's
        input-grounded text each lost about that. Larger or other engines show little: SmolLM2-135M
        (Q4_1, 24 ms) on llama.cpp 3-4%, transformers 0-2% (the same bench, the same Xeon).
        """
        if positions == 1 or 1 not in measured:
            return 0.0
        return _after_price(self._after_medians(batch), positions, measured[1])

    def _after_medians(self, batch: int) -> tuple:
        """``(sizes, medians)``: the sizes with plain evals measured right after them, sorted, and those medians."""
        after = sorted((n, statistics.median(samples)) for (b, n), samples in self._after.items() if b == batch and samples)
        return [n for n, _ in after], [m for _, m in after]

    def _target_prices(self, batch: int, measured: dict | None = None) -> list:
        """``_price_table``, kept until ``record`` moves a median (``measured``: ``_measured(batch)``)."""
        key = ("costs", batch)
        if key not in self._medians:  # c(j + 1) and its aftermath, or None: priced once per new sample
            self._medians[key] = self._price_table(batch, self._measured(batch) if measured is None else measured)
        return self._medians[key]

    def _price_table(self, batch: int, measured: dict) -> list:
        """``[c_target(j + 1) + its aftermath for j > 0, or None]`` for ``j`` in ``0 .. k_max``: every size at once.

        ``target_cost`` and ``_aftermath`` of each size (their rules: ``_priced``, ``_after_price``;
        tested equal, size by size), with the sizes sorted and the aftermaths' medians taken once.
        Why not a call of each per size: the table is rebuilt whenever a sample moves a median --
        most rounds that look -- and 2 (k_max + 1) calls, each scanning the measured sizes and
        sorting an aftermath's samples, were half of ``choose``'s time (~20
        of ~43 us warm; choices replayed from the shipped pair's cells on llama.cpp), paid after an
        eval has evicted the caches (DESIGN.md, "k = auto": the loop's own cost).
        """
        sizes, base = sorted(measured), measured.get(1)
        after = self._after_medians(batch) if base is not None else ([], [])
        out = []
        for positions in range(1, self.k_max + 2):
            c = _priced(measured, sizes, positions)
            if c is not None and positions > 1:
                c += _after_price(after, positions, base)
            out.append(c)
        return out

    def _expected_target_costs(self, batch: int, reaches: list, measured: dict, fill: float | None = None) -> list:
        """``E[c_target(W + 1)]`` for every ``k`` in ``0 .. k_max`` (None: unpriced), ``W = max_b min(k, cap_b, proposed_b)``.

        ``fill``: the price of every unpriced size (``_jump``'s optimism) instead of None.

        ``P(W >= j) = 1 - prod_b (1 - P(b proposes >= j))`` for ``j <= k`` (0 beyond), with
        ``P(b proposes >= j) = prod_{i<j} reach_b,i`` for ``j <= cap_b``: the same for every
        ``k``, so ``E_k = sum_{j<k} (G_j - G_{j+1}) c(j+1) + G_k c(k+1)``, one pass for all ``k``.
        """
        rows = []
        for reach, cap in reaches:
            p, row = 1.0, [1.0]
            for j in range(1, self.k_max + 1):
                p = p * reach[j - 1] if j <= cap else 0.0
                row.append(p)
            rows.append(row)
        if len(rows) == 1:
            ge = rows[0]  # one sequence: P(W >= j) is its own
        else:
            ge = [1.0] + [1.0 - math.prod(1.0 - row[j] for row in rows) for j in range(1, self.k_max + 1)]
        cost = self._target_prices(batch, measured)
        if fill is not None:
            cost = [fill if c is None else c for c in cost]
        out, head, priced = [], 0.0, True  # head: sum_{j<k} (G_j - G_{j+1}) c(j+1); priced: no None in it
        for k in range(self.k_max + 1):
            if ge[k] <= 0.0:
                out.append(head if priced else None)
            else:
                out.append(head + ge[k] * cost[k] if priced and cost[k] is not None else None)
            if k < self.k_max and ge[k] - ge[k + 1] > 0.0:
                if cost[k] is None:
                    priced = False
                else:
                    head += (ge[k] - ge[k + 1]) * cost[k]
        return out


def _machine() -> str:
    """The CPU a curve is measured on, as ``save`` names it: model name, x86 family and model, CPU count.

    Why family and model: a VM's model name may be the vendor alone ("AMD EPYC" on a Zen 3 and a Zen 4).
    From ``/proc/cpuinfo`` on Linux; elsewhere ``platform.processor()`` (or the architecture).
    """
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return f"{name}, {os.cpu_count() or 1} CPUs"


def _checked_curve(curve) -> dict:
    """``curve`` as ``{batch: {positions: c(n) / c(1)}}``, or the named error (``AutoCost(curve=...)``)."""
    if curve is None:
        return {}
    if not isinstance(curve, collections.abc.Mapping):
        raise TypeError(f"AutoCost curve must be a mapping {{batch size: {{positions: cost}}}}, got {type(curve).__name__}")
    out = {}
    for batch, costs in curve.items():
        batch = _at_least_one(batch, "AutoCost curve: a batch size")
        if not isinstance(costs, collections.abc.Mapping):
            raise TypeError(f"AutoCost curve[{batch}] must be a mapping {{positions: cost}}, got {type(costs).__name__}")
        ratios = {}
        for n, cost in costs.items():
            n = _at_least_one(n, f"AutoCost curve[{batch}]: positions")
            if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
                raise TypeError(f"AutoCost curve[{batch}][{n}]: a cost must be a number, got {cost!r}")
            if not math.isfinite(cost) or cost <= 0:
                raise ValueError(f"AutoCost curve[{batch}][{n}]: a cost must be finite and > 0, got {cost!r}")
            ratios[n] = float(cost)
        if 1 not in ratios:
            raise ValueError(f"AutoCost curve[{batch}] must hold positions = 1 (the costs are relative to it)")
        out[batch] = {n: cost / ratios[1] for n, cost in sorted(ratios.items())}
    return out


def _at_least_one(value, what: str) -> int:
    """``value`` as an int >= 1, or TypeError (not an int; a bool is not) / ValueError (< 1) naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value!r}")
    return int(value)


def _checked_pools(pools, k_max: int, path: str) -> dict:
    """``save``'s pools as ``{context: [accepted, judged]}``, cut or padded to ``k_max``; ValueError if malformed."""
    if not isinstance(pools, list):
        raise ValueError(f"AutoCost.load: {path!r}'s pools are not a list")
    out = {}
    for entry in pools:
        counts = _pool_counts(entry)
        if counts is None:
            raise ValueError(f"AutoCost.load: {path!r}: a pool is not [context, accepted, judged] with "
                             f"0 <= accepted <= judged per position, got {entry!r}")
        out[entry[0]] = [(c + [0.0] * k_max)[:k_max] for c in counts]
    return out


def _pool_counts(entry):
    """``[accepted, judged]`` (float lists) of one saved pool ``[context, accepted, judged]``, or None if malformed."""
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], (int, str))
            and not isinstance(entry[0], bool)):
        return None
    accepted, judged = entry[1:]
    if not (isinstance(accepted, list) and isinstance(judged, list) and len(accepted) == len(judged)):
        return None
    numbers_only = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in accepted + judged)
    if not numbers_only or not all(math.isfinite(x) and x >= 0 for x in accepted + judged):
        return None
    if any(a > j * (1 + 1e-9) + 1e-12 for a, j in zip(accepted, judged)):  # float slack: decayed sums
        return None
    return [[float(x) for x in accepted], [float(x) for x in judged]]


def _context_of(seq):
    """The context of an evidence key ``(b, context)``; ``_DRAFT_POOL`` for a plain sequence key."""
    return seq[1] if isinstance(seq, tuple) and len(seq) == 2 else _DRAFT_POOL


def _priced(measured: dict, sizes: list, positions: int):
    """``target_cost``'s rule: a size's seconds from the measured curve (``sizes``: ``sorted(measured)``),
    or None (not to be tried yet). Measured: its own; past the longest, up to twice it less one: the
    longest's (why: ``AutoCost.target_cost``); between two measured sizes: interpolated."""
    if positions in measured:
        return measured[positions]
    if not sizes:
        return None
    longest = sizes[-1]
    if longest < positions <= max(2, 2 * longest - 1):
        return measured[longest]
    i = bisect.bisect_left(sizes, positions)  # sizes[:i] are below, sizes[i:] above
    if i == 0 or i == len(sizes):
        return None
    lo, hi = sizes[i - 1], sizes[i]
    return measured[lo] + (measured[hi] - measured[lo]) * (positions - lo) / (hi - lo)


def _after_price(after: tuple, positions: int, base: float) -> float:
    """``_aftermath``'s rule: the aftermath of the largest size at most ``positions`` with one measured
    (``after``: ``_after_medians``), less ``c(1)`` (``base``), never below 0; none such: 0."""
    sizes, medians = after
    i = bisect.bisect_right(sizes, positions)
    return max(0.0, medians[i - 1] - base) if i else 0.0


def _affine(points: list) -> tuple:
    """``(a, b)`` with ``a, b >= 0`` fitting ``m ~ a + b k`` over ``points`` ``(k, m, weight)`` by weighted least
    squares; one distinct ``k``: ``(0, m / k)``; none: ``(0, 0)``."""
    if not points:
        return 0.0, 0.0
    if len({k for k, _, _ in points}) == 1:
        k, m, _ = points[0]
        return 0.0, m / k
    w = sum(p[2] for p in points)
    sk = sum(wt * k for k, _, wt in points)
    sm = sum(wt * m for _, m, wt in points)
    skk = sum(wt * k * k for k, _, wt in points)
    skm = sum(wt * k * m for k, m, wt in points)
    b = (w * skm - sk * sm) / (w * skk - sk * sk)
    a = (sm - b * sk) / w
    if b < 0:  # dearer for fewer tokens: noise; a call costs its mean
        return sm / w, 0.0
    if a < 0:  # a negative fixed part: noise; a cost per token through the origin
        return 0.0, skm / skk
    return a, b


def _monotone(values: list, weights: list) -> list:
    """The non-decreasing fit of ``values`` (least squares, ``weights``): pool adjacent violators."""
    blocks = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, max(w, 1), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, c1), (m2, w2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(c)]


def _shrunk(hits: list, trials: list, prior: float, priors: list | None = None,
            weight: float = _PRIOR_WEIGHT) -> list:
    """Per-position ``(hits + w * prior_i) / (trials + w)``: ``prior_i`` is ``priors[i]`` when given
    (a context's pooled estimate), else the estimate at ``i - 1`` (``prior`` at position 0)."""
    out = []
    for i, (h, t) in enumerate(zip(hits, trials)):
        prior = (h + weight * (prior if priors is None else priors[i])) / (t + weight)
        out.append(prior)
    return out
