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
4. commit -- they are appended, truncated at ``max_new`` and at the
   end-of-sequence id.

The loop itself is the batched decoder's (``batched_decoder._DecodeLoop``),
run over a batch of one: this class supplies the single-sequence phases
above, whose callbacks see one prefix, and ``BatchedSpeculativeDecoder``
the batched ones. One loop, so the two cannot drift apart: the same budget
per round, the same commit, the same statistics. The one phase written out
here is a plain step (``_plain_round``): the loop's, inlined for a batch of
one, the same calls in the same order, for the Python it saves after each
eval (``tests/test_batched_decoder.py`` holds both loops' plain steps to the same
output and statistics).

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
from typing import Callable, Mapping, Optional

import torch

from .batched_decoder import _DecodeLoop, _round_errors
from .cost_model import AutoCost
from .decode_checks import (
    check_draft_against_target,
    check_draft_ids,
    check_draft_result,
    check_prompt,
    check_rows,
    same_dtype,
    usual_rows,
)
from .decode_stats import DecodeStats
from .decode_warping import LogitsWarping
from .lm_head import LMHead
from .logits import point_mass_rows, verify_logits
from .verify import verify_block, verify_greedy, verify_sampled

__all__ = ["SpeculativeDecoder", "DecodeStats", "LogitsWarping"]

DraftStep = Callable[[torch.Tensor, int], "tuple[torch.Tensor, Optional[torch.Tensor]]"]
TargetStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------


class SpeculativeDecoder(_DecodeLoop):
    """Speculative decoding over a draft callback and a target callback.

    Parameters
    ----------
    draft_step : callable
        ``draft_step(prefix, k) -> (tokens, rows)``. ``prefix`` is a 1-D int64
        CPU tensor of every token so far (prompt plus output; do not modify
        it). ``tokens`` is ``[k]`` integer (a list of ints is accepted).
        ``tokens`` may be shorter than ``k``, even empty (``[m]``, ``m <= k``):
        the round verifies what it got, and ``m = 0`` is a plain step.
        ``rows`` is ``[m, V]`` float32/16/bf16: probability rows (row ``i`` the
        warped distribution ``tokens[i]`` was sampled from, unnormalized
        allowed), or, under a warping, the raw logits ``tokens[i]`` was drawn
        from with ``sample_draft``. ``rows=None`` is a point-mass draft
        (``PromptLookupDraft``, greedy drafts): sampled verification then
        accepts ``tokens[i]`` with the target's probability of it and else
        draws from the target with it removed, exact for any draft.
    target_step : callable
        ``target_step(prefix, proposed) -> rows`` of shape
        ``[len(proposed) + 1, V]``: row ``i`` is the target's distribution
        (probability rows, warped exactly as the draft's, non-negative) or its
        raw logits (under a warping) for the token after
        ``prefix + proposed[:i]``. Logits are fine in greedy mode either way
        (only the argmax is read).
    k : int or "auto", default 4
        Draft tokens asked for per round, ``>= 0`` (0: plain decoding through
        the same loop). ``"auto"``: each round picks ``k`` in ``0 .. k_max``
        that maximizes the predicted tokens per second, from the target's
        measured cost per eval size and the draft's recent acceptance
        (``cost_model.AutoCost``; DESIGN.md, "k = auto"). An ``AutoCost``
        instance: ``"auto"`` with that cost model, shared with other decoders
        on the same engine (the cost curve is the engine's, so a new decoder
        per request need not measure it again; ``k_max`` is the AutoCost's),
        or one carrying a curve from an earlier process
        (``AutoCost.load(path)``, written by ``dec.auto.save(path)``).
    greedy : bool, default True
        True: ``verify_greedy`` (the output equals plain greedy decoding with
        the target). False: sampled verification (the output is distributed as
        sampling from the target): ``verify_sampled`` on probability rows,
        ``verify_logits`` on logits rows; a draft without rows is a point mass.
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
    k_max : int, optional, keyword only
        With ``k="auto"``, the most a round drafts (default 16, ``cost_model.DEFAULT_K_MAX``); an error
        with a fixed ``k``.
    head : LMHead, optional, keyword only
        The LM head inside verification: ``target_step`` returns the target's
        last hidden states ``[len(proposed) + 1, d]`` (after the final norm)
        instead of rows, and each round is verified by ``verify_hidden`` on
        this head -- its logits, one pass over its weights for all rows, no
        ``[k+1, V]`` tensor. Greedy: the output equals plain greedy decoding
        on the same head (``k=0``, or ``sample_hidden``). Sampled mode needs
        the warping (the draft's rows, if any, are logits). Also read from
        ``target_step``'s ``head`` attribute (of the function, or its
        object's), as ``warping`` is: ``LlamaCppStep(..., hidden=True)``
        carries one. DESIGN.md, "Hidden states in the decoder".

    Attributes
    ----------
    warping : LogitsWarping or None
        The warping the run verifies logits rows under (None: probability rows).
    head : LMHead or None
        The head ``target_step``'s hidden states are verified with (None: it returns rows).
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
        k: int | str | AutoCost = 4,
        greedy: bool = True,
        eos_token_id=None,
        generator: torch.Generator | None = None,
        *,
        warping: LogitsWarping | Mapping | None = None,
        method: str = "token",
        k_max: int | None = None,
        head: LMHead | None = None,
    ) -> None:
        super().__init__(draft_step, target_step, k, greedy, eos_token_id, generator, warping=warping,
                         method=method, k_max=k_max, head=head)
        self._no_draft_row: torch.Tensor | None = None  # _first_tokens

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
        return self._run([check_prompt(prompt_ids)], max_new)[0]

    # -- the loop's phases for a batch of one ----------------------------------

    # The loop's draft tokens are [1, m] and its draft rows [1, m, V]; the target's rows stay [m + 1, V]
    # (_first_rows reads them as the batch's first sequence): a plain step wraps and unwraps nothing.

    def _draft_round(self, prefixes: list, k_round: int, rows: list, budgets: list):
        tokens, draft_rows = self._draft(prefixes[0], k_round)
        return tokens[None], None if draft_rows is None else draft_rows[None], [tokens.shape[0]]

    def _target_round(self, prefixes: list, draft_tokens: torch.Tensor, rows: list) -> torch.Tensor:
        return self._target(prefixes[0], self._first_tokens(draft_tokens))

    def _verify_round(self, target_rows, draft_tokens, draft_rows, budgets: list) -> tuple[list, list]:
        n_accepted, next_token = self._verify(target_rows, self._first_tokens(draft_tokens),
                                              None if draft_rows is None else draft_rows[0])
        return [n_accepted], [next_token]

    def _plain_round(self, sequences: list, active: list, on_commit) -> list:
        """A plain step of the one sequence: the loop's ``_plain_round`` with its phases inlined.

        The same calls in the same order -- ``target_step(prefix, [])``, its rows checked, the
        verify op on them, the token committed, the same statistics -- without the batch's lists
        and the layers between them. Why: every Python call here is paid after an eval has evicted
        the caches, on a tiny model's ~2.3 ms step (the shipped pair on llama.cpp, Intel Xeon: 150
        -> 142 us a token over the eval, against 119 for the same torch calls in a bare loop;
        DESIGN.md, "k = auto": the loop's own cost).
        """
        seq, stats = sequences[active[0]], self.stats
        no_draft = self._first_tokens(self._no_draft(1))
        t1 = time.perf_counter()
        rows = self._target(seq.filled, no_draft)
        t2 = time.perf_counter()
        accepted, token = self._verify(rows, no_draft, None)
        stats.target_seconds += t2 - t1
        stats.verify_seconds += time.perf_counter() - t2
        stats.batch_rounds += 1
        stats.record_choice(0, None)
        stats.record_round(0, accepted)
        new = seq.append([int(token)], self.eos_token_ids)
        if on_commit is not None:
            on_commit(active[0], torch.tensor(new, dtype=torch.int64))
        return active if seq.stopped_by is None else []

    def _first_tokens(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """``draft_tokens[0]``; a plain step's (``_no_draft(1)``) is made once (why: ``_no_draft``)."""
        if draft_tokens is self._no_drafts.get(1):
            if self._no_draft_row is None:
                self._no_draft_row = draft_tokens[0]
            return self._no_draft_row
        return draft_tokens[0]

    @staticmethod
    def _first_rows(rows: torch.Tensor) -> torch.Tensor:
        return rows

    # -- phase 1: draft --------------------------------------------------------

    def _draft(self, prefix: torch.Tensor, k_round: int):
        """At most ``k_round`` draft tokens and the rows they were drawn from (None: point masses)."""
        where = f"draft_step(prefix, k={k_round})"
        tokens, rows, _ = check_draft_result(self.draft_step(prefix, k_round), where, (k_round,), self._rows)
        if self._vocab is not None:
            # V is known from round 1: bad ids never reach target_step.
            check_draft_ids(tokens[None], [len(tokens)], self._vocab, where)
        return tokens, rows

    # -- phase 2: target -------------------------------------------------------

    def _target(self, prefix: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        """The target's ``[k_round + 1, V]`` rows for the proposal, in one call."""
        k_round = draft_tokens.shape[0]
        value = self.target_step(prefix, draft_tokens)
        if self.head is None and usual_rows(value, (k_round + 1,)) and value.shape[1] == self._vocab:
            return value  # the usual round: no message built for an error it does not have
        where = f"target_step(prefix, proposed) with {k_round} proposed tokens"
        if self.head is not None:
            return self._check_hidden(value, where, (k_round + 1,),
                                      f"[{k_round + 1}, d] (len(proposed) + 1 hidden rows)")
        rows = check_rows(value, where, "target_" + self._rows, (k_round + 1,),
                          f"[{k_round + 1}, V] (len(proposed) + 1 rows)")
        self._check_vocab(rows.shape[1], where)
        return rows

    # -- phase 3: verify -------------------------------------------------------

    def _verify(self, target_rows, draft_tokens, draft_rows) -> tuple[int, int]:
        """``(accepted count, correction or bonus token)``; op errors re-raised naming the round."""
        k_round = draft_tokens.shape[0]
        if k_round or draft_rows is not None:  # a plain step has no draft to check
            check_draft_against_target(draft_tokens[None], [k_round], draft_rows, self._vocab,
                                       f"draft_step(prefix, k={k_round})", self._rows,
                                       sampled_probs=not self._argmax_only and self.warping is None, batched=False)
        with _round_errors(self.stats.batch_rounds, self._rows):
            if self.head is not None:
                return self._verify_one_hidden(target_rows, draft_tokens, draft_rows)
            if self._argmax_only:
                return verify_greedy(target_rows, draft_tokens)
            if draft_rows is None and k_round:
                draft_rows = point_mass_rows(draft_tokens, target_rows, logits=self.warping is not None)
            target_rows, draft_rows = same_dtype(target_rows, draft_rows)
            draws = self._draws((k_round + 1,))
            if self.warping is None:
                verify = verify_block if self.method == "block" else verify_sampled
                return verify(target_rows, draft_rows, draft_tokens, **draws)
            return verify_logits(target_rows, draft_rows, draft_tokens, method=self.method, **draws,
                                 **self.warping.kwargs())

    # -- convenience -------------------------------------------------------------

    def __repr__(self) -> str:
        mode = DecodeStats(k=self.k, greedy=self.greedy, warping=self.warping).mode
        return f"SpeculativeDecoder(k={self.k}, {mode}, eos_token_id={sorted(self.eos_token_ids) or None})"
