"""Speculative decoding of B sequences per round, each with its own accepted length.

The one decode loop of the package lives here (``_DecodeLoop``);
``BatchedSpeculativeDecoder`` runs it over batched callbacks, and
``SpeculativeDecoder`` (``decoder.py``) runs the same loop over one sequence.
The glossary -- accepted, correction and bonus tokens, uniforms -- is
DESIGN.md's; ``decoder.py``'s module docstring says how rows are declared as
probabilities or as logits under a ``LogitsWarping``.

A batch round, in the style of gpt-fast's ``generate.py``: one small method per phase
-------------------------------------------------------------------------------------
Every unfinished sequence ``b`` gets a draft budget
``k_b = min(k, max_new - emitted_b - 1)`` (so it can never emit more than
``max_new``), and the round drafts ``K = max_b k_b`` tokens for all of them:

1. ``_draft_round``  -- ``draft_step(prefixes, K, rows)`` proposes ``[n, K]``
   tokens and the ``[n, K, V]`` rows they were drawn from (not called when
   ``K = 0``);
2. ``_target_round`` -- ``target_step(prefixes, proposed, rows)`` scores all
   of them in one ``[n, K+1, V]`` call;
3. ``_verify_round`` -- one batched op decides, per sequence, the accepted
   draft tokens and the correction or bonus token, reading only sequence
   ``b``'s first ``k_b`` draft tokens (``num_draft_tokens``):
   ``verify_greedy_batched`` (greedy, or a warping of temperature 0),
   ``verify_logits_batched`` (logits rows under the warping: no
   full-vocabulary probability row is written in Python and read back) or
   ``verify_sampled_batched`` (probability rows);
4. ``_commit_round`` -- each sequence appends its own ``accepted_b + 1``
   tokens, cut at ``max_new`` and after an end-of-sequence id; a sequence
   that stops leaves the batch, and later rounds pass only the others.

Batched callbacks
-----------------
``prefixes`` is a list of ``n`` 1-D int64 CPU tensors, the committed tokens
(prompt plus output) of every unfinished sequence, in batch order; ``rows``
is the list of their indices in the batch the run started with (it only
shrinks). ``draft_step(prefixes, k, rows) -> (tokens [n, k], rows [n, k, V]
or None)``; ``target_step(prefixes, proposed [n, k], rows) -> [n, k + 1, V]``.
Rows past a sequence's budget are never read. A callback holding a KV cache
for the batch (``hf_batched.HFBatchedCausalLM``) can roll each sequence back
to its own prefix and drop the sequences that left.

Randomness: one ``generator`` feeds the verifier's uniforms, ``n * (K+1)``
per batch round, drawn as ``torch.rand(n, K+1, dtype=torch.float64)``.

Only the Python standard library and torch are imported here: this module is
part of the kernel package that ``kernels`` loads.
"""

from __future__ import annotations

import array
import time
from typing import Callable, Mapping, Optional

import torch

from .decode_checks import (
    check_draft_against_target,
    check_draft_ids,
    check_draft_result,
    check_int,
    check_prompts,
    check_rows,
    eos_set,
    same_dtype,
)
from .cost_model import DEFAULT_K_MAX, AutoCost
from .decode_stats import DecodeStats
from .decode_warping import LogitsWarping, _resolve_warping, carried
from .hidden import verify_hidden, verify_hidden_batched
from .lm_head import LMHead
from .logits import point_mass_rows, verify_logits_batched, warp_probs
from .verify import verify_block_batched, verify_greedy_batched, verify_sampled_batched

__all__ = ["BatchedSpeculativeDecoder"]

BatchedDraftStep = Callable[[list, int, list], "tuple[torch.Tensor, Optional[torch.Tensor]]"]
BatchedTargetStep = Callable[[list, torch.Tensor, list], torch.Tensor]


# ----------------------------------------------------------------------------
# One sequence's output buffer
# ----------------------------------------------------------------------------


_BUFFER_START = 1024  # output slots allocated up front; a buffer doubles past them
if array.array("q").itemsize != 8:  # _Sequence views its array as int64
    raise ImportError("spec_verify needs an 8-byte array.array('q') (C long long) for its output buffers")


class _Sequence:
    """The prompt and the tokens committed so far, in one buffer grown by doubling.

    The buffer is an ``array.array`` of int64 that a tensor views
    (``torch.frombuffer``): a round's commit writes Python ints into the
    array, with no torch call, and the callbacks read the tensor. Why: a
    commit comes right after the target's eval has evicted the caches, where
    a tensor's item store costs ~60 us (measured on Zen 2; an array's ~10
    us), and a tiny model's plain step is ~3 ms (DESIGN.md, "k = auto": the
    loop's own cost). A grown buffer is a new array: views the callbacks kept
    of the old one stay valid.
    """

    __slots__ = ("ids", "buffer", "capacity", "length", "prompt_length", "max_length", "stopped_by")

    def __init__(self, prompt: torch.Tensor, max_new: int) -> None:
        # Sized by what a run uses, not by max_new alone: max_new=2**62 must
        # not allocate 2**62 slots up front.
        self._allocate(len(prompt) + min(max_new, _BUFFER_START))
        self.buffer[: len(prompt)] = prompt
        self.length = self.prompt_length = len(prompt)
        self.max_length = len(prompt) + max_new
        # Nothing to decode at all (max_new = 0): stopped before the first round.
        self.stopped_by = "max_new" if max_new == 0 else None

    def _allocate(self, capacity: int) -> None:
        self.ids = array.array("q", bytes(8 * capacity))  # "q": int64 (checked at import)
        self.buffer = torch.frombuffer(self.ids, dtype=torch.int64) if capacity else torch.empty(0, dtype=torch.int64)
        self.capacity = capacity

    @property
    def left(self) -> int:
        """New tokens this sequence may still emit."""
        return self.max_length - self.length

    @property
    def filled(self) -> torch.Tensor:
        """The committed tokens: a view the callbacks must not modify."""
        return self.buffer[: self.length]

    def append(self, new: list, eos_ids: frozenset) -> list:
        """Append ``new`` (Python ints, cut after the first eos id); return what was appended."""
        for i, token in enumerate(new):
            if token in eos_ids:
                # Keep the eos itself, drop whatever the round had after it.
                new, self.stopped_by = new[: i + 1], "eos"
                break
        end = self.length + len(new)
        if end > self.capacity:
            old, length = self.ids, self.length
            self._allocate(max(2 * self.capacity, end))
            self.ids[:length] = old[:length]  # equal lengths: a copy, never a resize of an exported array
        if len(new) == 1:  # a plain step's token
            self.ids[self.length] = new[0]
        else:
            self.ids[self.length : end] = array.array("q", new)
        self.length = end
        if self.stopped_by is None and self.left == 0:
            self.stopped_by = "max_new"
        return new


# ----------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------


class _Proposal:
    """A round's k and proposal (``_DecodeLoop._propose``), in the glossary's terms.

    ``k`` the k chosen and ``predicted`` its ``(tokens, seconds)`` prediction (k="auto"); ``keys``
    the sequences' evidence keys; ``tokens [n, K]`` / ``rows`` the proposal (rows None: point
    masses) and ``budgets`` each sequence's draft tokens in it; ``asked`` what each sequence's
    draft was asked for (its reach's evidence); ``seconds`` the draft's time and
    ``asked_of_draft`` the tokens it was asked for then; ``probe`` a plain step's judged token;
    ``looked`` whether the draft was asked before ``k`` was chosen (looking ahead). (A resting
    round has none: ``_plain_round``.)
    """

    __slots__ = ("k", "predicted", "keys", "tokens", "rows", "budgets", "asked", "seconds", "asked_of_draft",
                 "probe", "looked")

    def __init__(self, k, predicted, keys, tokens, rows, budgets, asked, seconds, asked_of_draft, probe=None,
                 looked=True):
        self.k, self.predicted, self.keys = k, predicted, keys
        self.tokens, self.rows, self.budgets, self.asked = tokens, rows, budgets, asked
        self.seconds, self.asked_of_draft, self.probe, self.looked = seconds, asked_of_draft, probe, looked


class _DecodeLoop:
    """The draft / target / verify / commit loop over a batch of sequences.

    Subclasses supply the round phases that call their callbacks
    (``_draft_round``, ``_target_round``, ``_verify_round``); the defaults
    here are the batched ones. ``SpeculativeDecoder`` overrides them for one
    sequence and its single-sequence callbacks.
    """

    def __init__(self, draft_step, target_step, k: int | str = 4, greedy: bool = True, eos_token_id=None,
                 generator: torch.Generator | None = None, *,
                 warping: LogitsWarping | Mapping | None = None, method: str = "token",
                 k_max: int | None = None, head: LMHead | None = None) -> None:
        if not callable(draft_step):
            raise TypeError(f"draft_step must be callable, got {type(draft_step).__name__}")
        if not callable(target_step):
            raise TypeError(f"target_step must be callable, got {type(target_step).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.draft_step = draft_step
        self.target_step = target_step
        # k="auto": each round picks k in 0..k_max from the measured costs (cost_model.py);
        # self.k is then the most a round drafts. A fixed k = 0 is plain decoding.
        if isinstance(k, AutoCost):
            # A cost model shared with other decoders on the same engine (its curve is the engine's).
            if k_max is not None and k_max != k.k_max:
                raise ValueError(f"k_max={k_max!r} disagrees with the AutoCost's k_max={k.k_max}")
            self.k = k.k_max
            self.auto = k
        elif isinstance(k, str):
            if k != "auto":
                raise ValueError(f'k must be an int >= 0 or "auto", got {k!r}')
            self.k = check_int("k_max", DEFAULT_K_MAX if k_max is None else k_max, 1)
            self.auto: AutoCost | None = AutoCost(self.k)
        else:
            if k_max is not None:
                raise ValueError(f'k_max applies only to k="auto", got k={k!r} and k_max={k_max!r}')
            self.k = check_int("k", k, 0)
            self.auto = None
        self._plain_only = self.auto is None and self.k == 0  # every round a plain step (_plain_round)
        self.greedy = bool(greedy)
        if method not in ("token", "block"):
            raise ValueError(f'method must be "token" or "block", got {method!r}')
        # Sampled verification: token-wise or block (DESIGN.md, "Block verification"); greedy ignores it.
        self.method = method
        self.eos_token_ids = eos_set(eos_token_id)
        self.generator = generator
        self.warping = _resolve_warping(warping, draft_step, target_step, self.greedy)
        # Greedy verification (only target argmaxes read): greedy mode, or sampling at temperature 0.
        self._argmax_only = self.greedy or (self.warping is not None and self.warping.greedy)
        self._rows = "probs" if self.warping is None else "logits"
        # head=: target_step returns hidden states and the head makes the logits inside the
        # op (verify_hidden; DESIGN.md, "Hidden states in the decoder").
        self.head = _resolve_head(head, target_step)
        if self.head is not None and not self._argmax_only and self.warping is None:
            raise ValueError(
                "head= verifies the head's logits, so sampled mode needs the warping they are verified under "
                "(warping=, or a callback's warping attribute); the draft's rows, if any, are then logits"
            )
        self.stats: DecodeStats | None = None
        self._vocab: int | None = None
        self._no_drafts: dict = {}  # batch size -> a plain step's [n, 0] draft tokens (_no_draft)

    def _run(self, prompts: list, max_new: int, on_commit=None) -> list:
        """Decode every prompt (1-D int64 CPU tensors); prompt + new tokens for each."""
        max_new = check_int("max_new", max_new, 0)
        if on_commit is not None and not callable(on_commit):
            raise TypeError(f"on_commit must be callable or None, got {type(on_commit).__name__}")
        # One counter per accepted length a round can reach: k itself may be huge (k=10**7).
        longest_round = min(self.k, max(max_new - 1, 0))
        stats = DecodeStats(k=self.k, greedy=self.greedy, warping=self.warping, batch_size=len(prompts),
                            histogram=[0] * (longest_round + 1), auto=self.auto is not None)
        self.stats = stats
        if self.auto is not None:
            self.auto.new_run()  # new prompts: their acceptance is unknown; the cost curve is kept
        self._looks = True  # k="auto" may look ahead until the draft gives rows (_look_ahead)
        self._vocab = None  # learnt from the first target call of this run
        start = time.perf_counter()
        sequences = [_Sequence(prompt, max_new) for prompt in prompts]
        active = [b for b, seq in enumerate(sequences) if seq.stopped_by is None]
        if self.auto is not None:
            t0 = time.perf_counter()
            self._prefill(sequences, active)
            stats.prefill_seconds = time.perf_counter() - t0
        while active:
            active = self._round(sequences, active, on_commit)
        stats.new_tokens = sum(seq.length - seq.prompt_length for seq in sequences)
        stats.stopped_by_row = [seq.stopped_by for seq in sequences]
        reasons = sorted(set(stats.stopped_by_row))
        stats.stopped_by = reasons[0] if len(reasons) == 1 else " and ".join(reasons)
        stats.total_seconds = time.perf_counter() - start
        return [seq.filled.clone() for seq in sequences]

    def _prefill(self, sequences: list, active: list) -> None:
        """``k="auto"``: feed the prompts but their last tokens before the first round (Note [The prefill phase]).

        One ``target_step`` call with nothing proposed, its rows unread and its time recorded nowhere;
        skipped where a prompt is one token (nothing to feed before its last).
        """
        prefixes = [sequences[b].filled[:-1] for b in active]
        if prefixes and min(len(p) for p in prefixes):
            self._target_round(prefixes, self._no_draft(len(active)), active)

    # Note [The prefill phase]
    # An adapter feeds whatever its cache does not hold, so without this the first round's target call also ran
    # the prompt (HFCausalLMStep, HFBatchedCausalLM, LlamaCppStep), and k="auto" recorded that time as an eval of
    # k + 1 positions. Where an AutoCost is shared by many short runs (a server's; custom_generate keeps one per
    # model) and a run has few rounds of that size, the size's median became the prompt's and auto stopped
    # choosing it, then polluted the next size its first rounds moved to (tests/test_auto_k.py: a flat curve
    # read c(3) = c(5) = 41 c(1) after 12 runs of 8 tokens, the first rounds' k falling from 6 to 1). Not timing
    # a run's first round instead starves the sizes only first rounds reach (the same runs: never past k = 4).
    # So the prompt is fed first, as its own phase: the first round's eval is then what it is recorded as. The
    # price, only with k="auto": one call and one unread logits row per run, and for a target that keeps no
    # cache (recomputes every prefix) one whole eval of the prompt.

    def _round(self, sequences: list, active: list, on_commit) -> list:
        """One batch round over the unfinished sequences ``active``; returns those still unfinished."""
        if self._plain_only or (self.auto is not None and self.auto.rest(len(active))):
            return self._plain_round(sequences, active, on_commit)
        stats = self.stats
        t0 = time.perf_counter()
        # Draft at most remaining - 1: a round emits accepted + 1 tokens.
        caps = [min(self.k, sequences[b].left - 1) for b in active]
        prefixes = [sequences[b].filled for b in active]
        prop = self._propose(prefixes, active, caps)
        draft_tokens, draft_rows, budgets = prop.tokens, prop.rows, prop.budgets
        t1 = time.perf_counter()
        target_rows = self._target_round(prefixes, draft_tokens, active)
        t2 = time.perf_counter()
        accepted, next_tokens = self._verify_round(target_rows, draft_tokens, draft_rows, budgets)
        t3 = time.perf_counter()
        stats.draft_seconds += prop.seconds
        stats.target_seconds += t2 - t1
        stats.verify_seconds += t3 - t2
        stats.batch_rounds += 1
        still = self._commit_round(sequences, active, draft_tokens, budgets, accepted, next_tokens, on_commit)
        stats.record_choice(prop.k, prop.predicted)
        if self.auto is not None:
            # With head=, verification computes the head's logits of every row: it is part of
            # the target eval's cost per width, not a constant.
            t_eval = t3 - t1 if self.head is not None else t2 - t1
            if max(caps) == 0:  # the last token of every sequence: no draft could be asked, no evidence
                outcomes = []
            elif prop.probe is None:
                probs = self._acceptance(target_rows, draft_tokens, draft_rows, budgets, accepted)
                outcomes = list(zip(prop.keys, prop.asked, budgets, accepted, probs))
            else:
                outcomes = self._probe_outcomes(prop.probe, target_rows, prop.keys, caps, next_tokens)
            # The draft's cost is per token asked of it (looking ahead: max(caps)).
            looked = prop.looked and prop.asked_of_draft > 0
            self.auto.record(len(active), prop.asked_of_draft, draft_tokens.shape[1],
                             (prop.seconds, t_eval, time.perf_counter() - t1 - t_eval), outcomes,
                             looked_ahead=looked)
            # Resting follows what the round verified (a k chosen but nothing proposed is a plain step)
            # and, for a round that looked ahead, what it emitted in its whole wall time (AutoCost.rested).
            seconds = time.perf_counter() - t0
            self.auto.rested(len(active), draft_tokens.shape[1], seconds - t_eval,
                             tokens=sum(accepted) + len(accepted) if looked else None,
                             seconds=seconds if looked else None)
        return still

    def _plain_round(self, sequences: list, active: list, on_commit) -> list:
        """A plain step for every sequence in ``active``: nothing drafted, one target row each, and
        its argmax or a draw from it -- a fixed ``k = 0``, or ``k="auto"`` resting (``AutoCost.rested``).

        ``_round``'s target, verify and commit phases with nothing proposed, and nothing looked at,
        chosen or recorded. Why a path of its own: on a tiny model the Python between two evals
        is a few percent of a token, and a plain step through ``_round`` built the caps, the
        proposal and its record for nothing (DESIGN.md, "k = auto": the loop's own cost).
        """
        stats = self.stats
        no_draft = self._no_draft(len(active))
        budgets = [0] * len(active)
        t1 = time.perf_counter()
        target_rows = self._target_round([sequences[b].filled for b in active], no_draft, active)
        t2 = time.perf_counter()
        accepted, next_tokens = self._verify_round(target_rows, no_draft, None, budgets)
        stats.target_seconds += t2 - t1
        stats.verify_seconds += time.perf_counter() - t2
        stats.batch_rounds += 1
        stats.record_choice(0, None)
        return self._commit_round(sequences, active, no_draft, budgets, accepted, next_tokens, on_commit)

    def _propose(self, prefixes: list, active: list, caps: list) -> "_Proposal":
        """Phase 1: the round's k and its proposal.

        A fixed k, or k="auto" without looking ahead: k first, then the draft asked for it. k="auto"
        looking ahead (``_look_ahead``): the proposal first, then k chosen knowing it.
        """
        t0 = time.perf_counter()
        look = self._look_ahead(prefixes, active, caps)
        seconds, asked_of_draft = time.perf_counter() - t0, max(caps)
        if look is not None and look[1] is None:
            # A cheap point-mass draft's proposal is in hand: k is chosen knowing how many tokens it
            # has and what kind of match they are (DESIGN.md, "k = auto": looking ahead).
            tokens, _, got = look
            keys = self._context_keys(active)
            k, predicted = self.auto.choose(keys, got)
            budgets = [min(k, g) for g in got]
            if max(budgets) > 0:
                return _Proposal(k, predicted, keys, tokens[:, : max(budgets)], None, budgets, budgets,
                                 seconds, asked_of_draft)
            # A plain step; it judges the proposal's first token, if any (the probe).
            probe = (tokens[:, :1], None, [min(1, g) for g in got]) if max(got) > 0 else None
            return _Proposal(k, predicted, keys, self._no_draft(len(active)), None, budgets, budgets,
                             seconds, asked_of_draft, probe)
        k, predicted = self._choose_k(active, caps)
        asked = [min(k, cap) for cap in caps]
        if max(asked) == 0:
            # A plain step (k = 0, or the last token of every sequence): nothing to draft.
            return _Proposal(k, predicted, active, self._no_draft(len(active)), None, asked, asked,
                             seconds, asked_of_draft if look is not None else 0, looked=look is not None)
        if look is not None:
            # The look-ahead draft gave rows (a draft model): k was chosen without its tokens,
            # and its first k are a proposal of that length.
            tokens, rows, budgets = self._cut_proposal(look, k)
            return _Proposal(k, predicted, active, tokens, rows, budgets, asked, seconds, asked_of_draft)
        t0 = time.perf_counter()
        tokens, rows, budgets = self._draft_round(prefixes, max(asked), active, asked)
        return _Proposal(k, predicted, active, tokens, rows, budgets, asked, time.perf_counter() - t0, k,
                         looked=False)

    def _look_ahead(self, prefixes: list, active: list, caps: list):
        """k="auto": the draft's proposal of ``max(caps)`` tokens before k is chosen, or None.

        Asked only of a draft that is cheap (``AutoCost.probe_is_cheap``: a
        prompt lookup) and, so far in the run, answered with point masses
        (rows None): a draft that gives rows is a model, whose tokens must
        not choose k (only point-mass verification is exact whatever decides
        the proposal's length), so it is asked for what k says from then on.
        """
        if self.auto is None or max(caps) == 0 or not self._looks or not self.auto.probe_is_cheap(len(active)):
            return None
        look = self._draft_round(prefixes, max(caps), active, caps)
        if look[1] is not None:
            self._looks = False
        return look

    def _cut_proposal(self, look, k: int):
        """The first ``k`` tokens (and rows) of a look-ahead proposal, budgets cut to them."""
        tokens, rows, got = look
        budgets = [min(k, g) for g in got]
        width = max(budgets)
        return tokens[:, :width], None if rows is None else rows[:, :width], budgets

    def _context_keys(self, active: list) -> list:
        """Each sequence's key for k="auto"'s acceptance evidence: ``(b, context)`` when the draft names
        its proposal's kind (``PromptLookupDraft.context``: the match length, bucketed), else ``b``.

        Why: a lookup's acceptance depends on its match far more than on the sequence's recent
        past (Gemma 3 270M, T = 0.8, input-grounded prompts: mean p(t) 0.79 after a 3-gram match,
        0.18 after a 1-gram one), so each kind of match keeps its own estimate.
        """
        context = carried(self.draft_step, "context")
        if isinstance(context, int) and not isinstance(context, bool):
            return [(b, context) for b in active]
        if isinstance(context, (list, tuple)) and len(context) == len(active) and \
                all(isinstance(c, int) and not isinstance(c, bool) for c in context):
            return [(b, c) for b, c in zip(active, context)]
        return active  # no context, or an attribute of that name that is not one: keyed by sequence

    def _probe_outcomes(self, probe, target_rows, keys: list, caps: list, next_tokens: list) -> list:
        """``AutoCost.record``'s outcomes for a plain step's probe: position 0 judged by the step's own row.

        The probe token ``t`` counts as accepted iff the step emitted it:
        greedy, exactly the test verification would have made (``t`` is the
        argmax); sampled, an outcome of mean ``p(t)``, a point mass's
        acceptance probability -- and where the rows allow, ``p(t)`` itself
        (``_acceptance``). The step's emitted token does not depend on the
        probe, which only informs later rounds' ``k``.
        """
        tokens, rows, got = probe
        hits = [int(g > 0 and int(tokens[b, 0]) == int(next_tokens[b])) for b, g in enumerate(got)]
        probs = self._acceptance(target_rows, tokens, rows, got, [0] * len(got))
        return [(seq, min(1, cap), g, hit, p) for seq, cap, g, hit, p in zip(keys, caps, got, hits, probs)]

    def _acceptance(self, target_rows, draft_tokens, draft_rows, budgets: list, accepted: list) -> list:
        """Per sequence, each judged draft token's acceptance probability (None: its outcomes count).

        For ``k="auto"``'s acceptance estimate (``AutoCost.record``): in a
        sampled token-wise round, position ``i`` (judged: drafted, every
        earlier one accepted) was accepted with probability ``min(1, p_i(t_i) /
        q_i(t_i))`` (``q = 1`` for a point mass), which has the 0/1 outcome's
        mean and none of its noise. Greedy outcomes are already
        deterministic; block verification does not accept token by token;
        with ``head=`` the rows are hidden states. Costs one ``warp_probs``
        pass per judged row (~25 us at V = 32000), counted in the round's time.
        """
        none = [None] * len(budgets)
        if self._argmax_only or self.method != "token" or self.head is not None:
            return none
        where = [(b, i) for b, (k_b, a) in enumerate(zip(budgets, accepted)) for i in range(min(k_b, a + 1))]
        if not where:
            return none
        if len(budgets) == 1:  # one sequence: its first len(where) positions, by slicing (no index tensors)
            n = len(where)
            tokens, rows, draft = draft_tokens[0, :n], self._first_rows(target_rows)[:n], None if draft_rows is None \
                else draft_rows[0, :n]
        else:
            seq, pos = (torch.tensor(c, dtype=torch.int64) for c in zip(*where))
            tokens, rows, draft = draft_tokens[seq, pos], target_rows[seq, pos], None if draft_rows is None else \
                draft_rows[seq, pos]
        probs = self._token_probs(rows, tokens)
        if draft is not None:
            q = self._token_probs(draft, tokens)
            probs = torch.where(q > 0, probs / q, 1.0).clamp(max=1.0)
        out = [[] for _ in budgets]
        for (b, _), value in zip(where, probs.tolist()):
            out[b].append(value)
        return [row or None for row in out]

    def _token_probs(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[J]`` float64: row ``j``'s (warped) probability of ``tokens[j]``.

        A temperature-only warping is ``softmax(z / T)``, computed as such in
        float32 (three torch calls where ``warp_probs`` and its sums take
        seven: this runs in every sampled plain step that probes, right after
        the eval, and a tiny model's step is ~2 ms). It is ``warp_probs``'s
        value to float32 rounding: the cost model's estimate, never a decision
        of verification. Not float64: torch's float64 softmax over Gemma's
        262,144 logits took 7.6 ms on an AMD EPYC core (float32: 0.23 ms,
        ``warp_probs`` and its sums 0.42 ms), a third of a token.
        """
        w = self.warping
        if w is not None and w.top_k == 0 and w.top_p == 1.0 and w.min_p == 0.0:
            return torch.softmax(rows.float() / w.temperature, -1).gather(-1, tokens[:, None])[:, 0].double()
        if w is None:
            weights = rows.double()
        else:
            weights = warp_probs(rows, normalize=False, **w.kwargs()).double()
        mass = weights.sum(-1)
        picked = weights.gather(-1, tokens[:, None])[:, 0]
        return torch.where(mass > 0, picked / mass, 0.0)

    @staticmethod
    def _first_rows(rows: torch.Tensor) -> torch.Tensor:
        """The first sequence's ``[k + 1, V]`` of the target's rows (the single-sequence decoder's are just that)."""
        return rows[0]

    def _choose_k(self, active: list, caps: list) -> tuple:
        """``(k to ask the draft for, (predicted tokens, predicted seconds) or None)``."""
        if self.auto is None:
            return self.k, None
        return self.auto.choose(active, caps)

    # -- phase 1: draft --------------------------------------------------------

    def _draft_round(self, prefixes: list, k_round: int, rows: list, budgets: list):
        """``[n, K]`` draft tokens, the ``[n, K, V]`` rows they were drawn from (or None), and the budgets.

        The draft may propose fewer than ``k_round`` (``num_tokens``): each
        budget is cut to what its sequence got, and ``K`` is the longest.
        """
        where = f"draft_step(prefixes, k={k_round}, rows) for {len(prefixes)} sequences"
        tokens, draft_rows, counts = check_draft_result(self.draft_step(prefixes, k_round, rows), where,
                                                        (len(prefixes), k_round), self._rows)
        return self._fit_budgets(tokens, draft_rows, counts, budgets, where)

    def _fit_budgets(self, tokens, draft_rows, counts, budgets: list, where: str):
        """Budgets cut to what the draft proposed; tokens and rows cut to the longest; ids checked."""
        got = [tokens.shape[1]] * len(budgets) if counts is None else counts.tolist()
        budgets = [min(b, g) for b, g in zip(budgets, got)]
        width = max(budgets)
        if width < tokens.shape[1]:
            tokens = tokens[:, :width]
            draft_rows = None if draft_rows is None else draft_rows[:, :width]
        if self._vocab is not None:
            # V is known from round 1: bad ids never reach target_step.
            check_draft_ids(tokens, budgets, self._vocab, where)
        return tokens, draft_rows, budgets

    # -- phase 2: target -------------------------------------------------------

    def _target_round(self, prefixes: list, draft_tokens: torch.Tensor, rows: list) -> torch.Tensor:
        """The target's ``[n, k_round + 1, V]`` rows for the proposals, in one call."""
        n, k_round = draft_tokens.shape
        where = f"target_step(prefixes, proposed, rows) with proposed of shape ({n}, {k_round})"
        if self.head is not None:
            return self._check_hidden(self.target_step(prefixes, draft_tokens, rows), where, (n, k_round + 1),
                                      f"[{n}, {k_round + 1}, d] (len(proposed[b]) + 1 hidden rows per sequence)")
        result = check_rows(self.target_step(prefixes, draft_tokens, rows), where, "target_" + self._rows,
                            (n, k_round + 1), f"[{n}, {k_round + 1}, V] (len(proposed[b]) + 1 rows per sequence)")
        self._check_vocab(result.shape[-1], where)
        return result

    def _check_hidden(self, value, where: str, lead: tuple, expected: str) -> torch.Tensor:
        """target_step's hidden states ``[*lead, d]`` for ``head=``, or an error naming the callback."""
        hidden = check_rows(value, where, "target_hidden", lead, expected)
        if hidden.shape[-1] != self.head.dim:
            raise ValueError(f"{where} returned target_hidden of shape {tuple(hidden.shape)}: the head "
                             f"({self.head}) takes d = {self.head.dim}")
        self._check_vocab(self.head.vocab, where)
        return hidden

    def _check_vocab(self, vocab: int, where: str) -> None:
        """The target's V may not change within a run."""
        if self._vocab is None:
            self._vocab = vocab
        elif vocab != self._vocab:
            raise ValueError(
                f"{where} returned target_{self._rows} over V = {vocab} tokens, but an earlier round "
                f"returned V = {self._vocab}"
            )

    # -- phase 3: verify -------------------------------------------------------

    def _verify_round(self, target_rows, draft_tokens, draft_rows, budgets: list) -> tuple[list, list]:
        """Per sequence: ``(accepted count, correction or bonus token)``, as two lists of ints."""
        n, k_round = draft_tokens.shape
        where = f"draft_step(prefixes, k={k_round}, rows) for {n} sequences"
        check_draft_against_target(draft_tokens, budgets, draft_rows, self._vocab, where, self._rows,
                                   sampled_probs=not self._argmax_only and self.warping is None, batched=True)
        if self.head is not None:
            return self._verify_hidden_round(target_rows, draft_tokens, draft_rows, budgets)
        num_draft_tokens = torch.tensor(budgets, dtype=torch.int64)
        with self._naming_the_round():
            if self._argmax_only:
                accepted, next_tokens = verify_greedy_batched(target_rows, draft_tokens, num_draft_tokens)
            else:
                if draft_rows is None and k_round:
                    draft_rows = point_mass_rows(draft_tokens, target_rows, logits=self.warping is not None)
                target_rows, draft_rows = same_dtype(target_rows, draft_rows)
                draws = self._draws((n, k_round + 1))
                if self.warping is None:
                    verify = verify_block_batched if self.method == "block" else verify_sampled_batched
                    accepted, next_tokens = verify(target_rows, draft_rows, draft_tokens, num_draft_tokens, **draws)
                else:
                    accepted, next_tokens = verify_logits_batched(target_rows, draft_rows, draft_tokens,
                                                                  num_draft_tokens, method=self.method, **draws,
                                                                  **self.warping.kwargs())
        return accepted.tolist(), next_tokens.tolist()

    def _verify_hidden_round(self, hidden, draft_tokens, draft_rows, budgets: list) -> tuple[list, list]:
        """``head=``: one ``verify_hidden_batched`` call (one pass over the head for the whole batch).

        Greedy: ``verify_greedy``'s rule per sequence on the head's logits
        (accept while the draft token is the argmax; the next token is the
        argmax where that stops), rows after a rejection never read -- as
        ``verify_hidden``. Sampled: with the batch's uniforms in the batched layout (sequence ``b``:
        ``u[b, :k_b]`` for its tests, ``u[b, k_b]`` for its draw), so each
        sequence's result is ``verify_hidden`` on its own rows with those
        uniforms -- the law it has alone -- and the C++ op reads the weights
        once for the rows of every sequence (hidden.py: where each call runs).
        """
        n, k_round = draft_tokens.shape
        if self._argmax_only:
            draft_rows, warp = None, dict(temperature=0.0)
        else:
            warp = dict(self._draws((n, k_round + 1)), method=self.method, **self.warping.kwargs())
        with self._naming_the_round():
            accepted, next_tokens = verify_hidden_batched(
                hidden, self.head, draft_tokens, torch.tensor(budgets, dtype=torch.int64), draft_rows, **warp)
        return accepted.tolist(), next_tokens.tolist()

    def _verify_one_hidden(self, hidden, draft_tokens, draft_rows) -> tuple[int, int]:
        """One sequence's ``(accepted, next token)`` by ``verify_hidden`` on the head."""
        if self._argmax_only:
            return verify_hidden(hidden, self.head, draft_tokens, temperature=0.0)
        return verify_hidden(hidden, self.head, draft_tokens, draft_rows, method=self.method,
                             **self._draws((draft_tokens.shape[0] + 1,)), **self.warping.kwargs())

    def _no_draft(self, n: int) -> torch.Tensor:
        """A plain step's ``[n, 0]`` draft tokens, made once per batch size.

        Why cached: after a target eval has evicted the caches, each distinct
        torch call costs ~20-40 us, and a tiny model's plain step is ~2 ms
        (the shipped pair on llama.cpp): every call saved is ~1% of a step.
        """
        if n not in self._no_drafts:
            self._no_drafts[n] = torch.empty((n, 0), dtype=torch.int64)
        return self._no_drafts[n]

    def _uniforms(self, shape: tuple) -> torch.Tensor:
        """The round's float64 uniforms, drawn from ``generator`` as the ops would draw them.

        The one place the decoder's randomness enters (a test replaces it to
        enumerate the decoder's law exactly); ``_draws`` leaves the drawing
        to the op unless it is replaced.
        """
        return torch.rand(shape, dtype=torch.float64, generator=self.generator)

    def _draws(self, shape: tuple) -> dict:
        """The round's uniforms as the verify op's keyword: ``generator=`` or ``uniforms=``.

        The op given ``generator`` draws exactly ``torch.rand(shape, dtype=torch.float64,
        generator=generator)`` (tests/test_properties.py, ``test_generator_draws_match_torch_rand``;
        the batched layout in tests/test_hidden_batched.py), so the two are the same round. Why
        not ``uniforms=self._uniforms(shape)`` always: that is one torch call more right after the
        target's eval has evicted the caches, ~20-40 us of a tiny model's ~3 ms step (the shipped
        pair on llama.cpp, AMD EPYC Zen 3: a sampled plain step's own Python 57 -> 33 us over the
        plain loop's; DESIGN.md, "k = auto": the loop's own cost). Where ``_uniforms`` is replaced
        (on the class or the instance: the law's enumeration tests do), its uniforms are used.
        """
        if getattr(self._uniforms, "__func__", None) is _DecodeLoop._uniforms:
            return {"generator": self.generator}
        return {"uniforms": self._uniforms(shape)}

    def _naming_the_round(self):
        """A context that re-raises an op's ValueError / IndexError naming the round and the rows."""
        return _round_errors(self.stats.batch_rounds, self._rows)

    # -- phase 4: commit -------------------------------------------------------

    def _commit_round(self, sequences, active, draft_tokens, budgets, accepted, next_tokens, on_commit) -> list:
        """Append each sequence's accepted draft tokens and its correction or bonus token."""
        still = []
        for i, b in enumerate(active):
            self.stats.record_round(budgets[i], accepted[i])
            seq = sequences[b]
            kept = draft_tokens[i, : accepted[i]].tolist() if accepted[i] else []
            new = seq.append(kept + [int(next_tokens[i])], self.eos_token_ids)
            if on_commit is not None:
                on_commit(b, torch.tensor(new, dtype=torch.int64))
            if seq.stopped_by is None:
                still.append(b)
        return still


def _resolve_head(declared, target_step) -> LMHead | None:
    """``head=``, else the target callback's (or its object's) ``head`` attribute; None: rows, not hidden states."""
    if declared is not None:
        if not isinstance(declared, LMHead):
            raise TypeError(f"head must be an LMHead or None, got {type(declared).__name__}")
        return declared
    value = carried(target_step, "head")
    if value is not None and not isinstance(value, LMHead):
        raise TypeError(f"target_step.head must be an LMHead (the head its hidden states are read with), "
                        f"got {type(value).__name__}")
    return value


class _round_errors:
    """Re-raise the verify op's ``ValueError`` / ``IndexError`` as a ``ValueError`` naming the round.

    A class, not a ``contextlib.contextmanager``: it is entered every round,
    right after the target's eval, where a generator-based manager's extra
    calls are ~10 us of a tiny model's ~3 ms step (DESIGN.md, "k = auto": the
    loop's own cost).
    """

    __slots__ = ("round_index", "rows_name")

    def __init__(self, round_index: int, rows_name: str) -> None:
        self.round_index, self.rows_name = round_index, rows_name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, traceback) -> bool:
        if kind is not None and issubclass(kind, (ValueError, IndexError)):
            raise ValueError(
                f"verification of round {self.round_index} rejected the callbacks' output "
                f"(target_step's rows are target_{self.rows_name}, draft_step's are draft_{self.rows_name}): {err}"
            ) from err
        return False


# ----------------------------------------------------------------------------
# The batched decoder
# ----------------------------------------------------------------------------


class BatchedSpeculativeDecoder(_DecodeLoop):
    """Speculative decoding of a batch of sequences, each with its own accepted length.

    Parameters
    ----------
    draft_step : callable
        ``draft_step(prefixes, k, rows) -> (tokens, draft_rows)``: ``tokens``
        ``[n, k]`` integer, ``draft_rows`` ``[n, k, V]`` float32/16/bf16 --
        probability rows (row ``[b, i]`` the warped distribution
        ``tokens[b, i]`` was sampled from), or, under a warping, the raw
        logits it was drawn from with ``sample_draft``; None in greedy mode.
        See the module docstring for ``prefixes`` and ``rows``.
    target_step : callable
        ``target_step(prefixes, proposed, rows) -> [n, k + 1, V]``: row
        ``[b, i]`` is the target's distribution (or raw logits, under a
        warping) for the token after ``prefixes[b] + proposed[b, :i]``.
    k : int, "auto" or AutoCost, default 4
        Draft tokens per round, ``>= 0``; a sequence near ``max_new`` drafts
        fewer (``num_draft_tokens``). ``"auto"`` / an ``AutoCost``: as in
        ``SpeculativeDecoder``.
    greedy : bool, default True
        True: ``verify_greedy_batched`` (every sequence equals plain greedy
        decoding with the target). False: sampled verification (every
        sequence is distributed as sampling from the target).
    eos_token_id : int or list of int, optional
        A sequence stops after the first emitted token in this set (kept).
    generator : torch.Generator, optional
        Source of the verifier's uniforms in sampled mode (the default CPU
        generator when None).
    warping : LogitsWarping or dict, optional, keyword only
        Declares that both callbacks return logits rows warped by this; else
        the callbacks' ``warping`` attributes decide (``HFBatchedCausalLM``
        carries one), and without any the rows are probabilities.
    method : {"token", "block"}, default "token", keyword only
        Sampled verification: token-wise (``verify_sampled_batched`` /
        ``verify_logits_batched``) or block verification
        (``verify_block_batched`` / ``verify_logits_batched(method="block")``),
        per sequence. Ignored when greedy.
    k_max : int, optional, keyword only
        With ``k="auto"``, the most a round drafts (default 16, ``cost_model.DEFAULT_K_MAX``).
    head : LMHead, optional, keyword only
        ``target_step`` returns the target's last hidden states
        ``[n, k + 1, d]`` (after the final norm) instead of rows, and each
        sequence is verified by ``verify_hidden`` on this head (its logits,
        under the warping in sampled mode). Also read from ``target_step``'s
        ``head`` attribute. See ``SpeculativeDecoder``.

    Attributes
    ----------
    warping : LogitsWarping or None
        The warping the run verifies logits rows under (None: probability rows).
    head : LMHead or None
        The head ``target_step``'s hidden states are verified with (None: it returns rows).
    stats : DecodeStats or None
        Statistics of the latest ``generate`` call, one round per sequence
        per batch round (``batch_rounds`` counts the batch rounds).

    Raises
    ------
    ValueError
        In sampled mode, warpings that disagree, or one callback carrying a
        warping while the other's rows would be read as probabilities.

    Notes
    -----
    Each sequence follows exactly the law it would follow alone: its draft
    budget, its accepted count and its correction or bonus token depend only
    on its own rows and uniforms (the batched ops decide each sequence
    independently). Every callback result is checked (shapes, vocabulary,
    ``probs[b, i, tokens[b, i]] > 0`` for the tokens read, when sampling from
    probability rows) and a mismatch raises ``ValueError`` / ``TypeError``
    naming the callback.

    Examples
    --------
    >>> import torch
    >>> V = 5
    >>> def row(prefix):                  # a toy "model": favours last token + 1
    ...     r = torch.full((V,), 0.1)
    ...     r[(int(prefix[-1]) + 1) % V] = 1.0
    ...     return r
    >>> def target_step(prefixes, proposed, rows):
    ...     return torch.stack([torch.stack([row(torch.cat([p, t[:i]])) for i in range(len(t) + 1)])
    ...                         for p, t in zip(prefixes, proposed)])
    >>> def draft_step(prefixes, k, rows):  # perfect for the first sequence, wrong for the second
    ...     return torch.stack([(p[-1] + 1 + torch.arange(k) + (b == 1)) % V
    ...                         for p, b in zip(prefixes, rows)]), None
    >>> dec = BatchedSpeculativeDecoder(draft_step, target_step, k=3)
    >>> [out.tolist() for out in dec.generate([torch.tensor([0]), torch.tensor([2, 3])], max_new=4)]
    [[0, 1, 2, 3, 4], [2, 3, 4, 0, 1, 2]]
    >>> dec.stats.batch_rounds, dec.stats.rounds, dec.stats.histogram
    (4, 5, [4, 0, 0, 1])
    """

    def __init__(self, draft_step: BatchedDraftStep, target_step: BatchedTargetStep, k: int | str = 4,
                 greedy: bool = True, eos_token_id=None, generator: torch.Generator | None = None, *,
                 warping: LogitsWarping | Mapping | None = None, method: str = "token",
                 k_max: int | None = None, head: LMHead | None = None) -> None:
        super().__init__(draft_step, target_step, k, greedy, eos_token_id, generator, warping=warping,
                         method=method, k_max=k_max, head=head)

    def generate(self, prompts, max_new: int = 128, *, attention_mask=None, on_commit=None) -> list:
        """Decode up to ``max_new`` tokens after each prompt.

        Parameters
        ----------
        prompts : list of 1-D tensors (or lists of int), or torch.Tensor
            ``B`` prompts of any lengths ``n_b >= 1``; or a ``[B, n]`` integer
            tensor, with ``attention_mask`` when it is padded.
        max_new : int, default 128
            Maximum number of new tokens per sequence, ``>= 0``; exactly this
            many unless an end-of-sequence id comes first.
        attention_mask : torch.Tensor, optional, keyword only
            ``[B, n]`` of 0 (padding) and 1 (token) for a ``[B, n]``
            ``prompts``: each prompt is its unmasked tokens, which must be
            left-padded (``ValueError`` otherwise).
        on_commit : callable, optional, keyword only
            ``on_commit(b, tokens)`` after each round, for every sequence
            ``b`` that emitted tokens (a 1-D int64 tensor, in order): for
            streaming.

        Returns
        -------
        list of torch.Tensor
            ``B`` 1-D int64 CPU tensors: each prompt (without padding)
            followed by its new tokens, of length ``n_b + max_new`` or less
            when it ends at an ``eos_token_id`` (kept). Statistics of the call
            are left in ``self.stats``.
        """
        return self._run(check_prompts(prompts, attention_mask), max_new, on_commit)

    def __repr__(self) -> str:
        mode = DecodeStats(k=self.k, greedy=self.greedy, warping=self.warping).mode
        return f"BatchedSpeculativeDecoder(k={self.k}, {mode}, eos_token_id={sorted(self.eos_token_ids) or None})"
