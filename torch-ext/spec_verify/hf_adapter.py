"""Hugging Face causal LMs as ``draft_step`` / ``target_step`` callbacks.

Duck-typed: a model is anything that answers
``model(input_ids, past_key_values=cache, use_cache=True)`` with an object
holding ``.logits`` ``[1, T, V]`` and ``.past_key_values``, whose cache offers
``crop`` (and, optionally, ``get_seq_length``). transformers is never imported
here, because this module is part of the kernel package, which ``kernels``
loads with torch alone; the cache is the one the model itself returns from its
first forward.

Each adapter keeps its model's KV cache between calls, together with the
tokens the cache holds. On every call it crops the cache back to the longest
prefix it shares with the tokens asked about, then feeds only the rest, so a
speculative round costs

* draft: ``k`` forwards of one token each (two tokens in the first forward
  after a round that accepted every draft token: the last draft token, which
  the draft never had to feed, plus the bonus token);
* target: one forward over ``k + 1`` tokens (the last committed token and the
  ``k`` proposals), giving the ``k + 1`` rows,

and the prefix is never run again. The first call of a run feeds the prompt
(prefill).

Warping (temperature, then top-k, then top-p: the order of transformers'
logits processors) is applied by one function, identically for the draft and
for the target, and the draft samples each token from exactly the warped row it
returns, which is what makes speculative sampling distribution-preserving.
"""

from __future__ import annotations

import torch

from .logits import warp_probs

__all__ = ["HFCausalLMStep", "hf_step_pair", "warp_logits"]


# ----------------------------------------------------------------------------
# Warping
# ----------------------------------------------------------------------------


def warp_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Logits to sampling probabilities: temperature, then top-k, then top-p.

    Parameters
    ----------
    logits : torch.Tensor
        ``[..., V]`` float logits (float32, float16 or bfloat16; read as float32).
    temperature : float, default 1.0
        ``> 0``; logits are divided by it.
    top_k : int, default 0
        Keep the ``top_k`` highest logits (0 = off, as in transformers).
    top_p : float, default 1.0
        Keep the smallest set of highest-probability tokens whose mass reaches
        ``top_p`` (1.0 = off).

    Returns
    -------
    torch.Tensor
        ``[..., V]`` float32 probabilities (rows sum to 1), zero outside the kept
        set.

    Notes
    -----
    This is ``spec_verify.warp_probs`` (min-p off): the one definition of the
    warping, shared with ``verify_logits`` and ``sample_draft`` and written
    out in ``reference_logits``. Ties at a cut-off are never split: top-k
    keeps every token tied with the ``top_k``-th largest logit (as
    transformers' ``TopKLogitsWarper``), and top-p keeps every token tied
    with the last logit of the smallest head whose mass reaches ``top_p``
    (transformers' ``TopPLogitsWarper`` splits such a tie in the order of
    its unstable sort). The most likely token is always kept.

    Draft and target go through this same function, so their warps agree.
    """

    return warp_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)


# ----------------------------------------------------------------------------
# The adapter
# ----------------------------------------------------------------------------


def _common_prefix_length(cached: torch.Tensor, seq: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D int64 tensors."""
    m = min(len(cached), len(seq))
    if m == 0:
        return 0
    differ = (cached[:m] != seq[:m]).nonzero()
    return int(differ[0, 0]) if len(differ) else m


class HFCausalLMStep:
    """One causal LM with its KV cache, as speculative-decoding callbacks.

    Parameters
    ----------
    model : transformers-style causal LM
        Called as ``model(input_ids [1, T], past_key_values=cache, use_cache=True)``;
        the output must have ``.logits`` ``[1, T, V]`` and ``.past_key_values``.
    temperature : float, default 1.0
        ``0`` means greedy: ``draft_step`` takes the argmax and returns
        ``probs=None``, ``target_step`` returns float32 logits (only their
        argmax is read, exactly as in transformers' greedy search), and top-k /
        top-p are ignored. ``> 0``: rows are ``warp_logits(logits, temperature,
        top_k, top_p)``.
    top_k : int, default 0
        Top-k cut-off, 0 = off.
    top_p : float, default 1.0
        Top-p cut-off in ``(0, 1]``, 1.0 = off.
    generator : torch.Generator, optional
        Source of the draft's token samples (the default generator when None).
        Unused by ``target_step`` and in greedy mode.

    Attributes
    ----------
    forward_calls, tokens_fed : int
        Model forwards run and input tokens fed, since construction or
        ``reset()``: a cheap check of the per-round cost.
    cache_rebuilds : int
        Times the cache had to be dropped and rebuilt from scratch: a cache
        without ``crop``, one whose ``crop`` raised (recurrent layers, a
        sliding window past its size), or one whose ``crop`` did not reach the
        asked length. Correct, but the prefix is run again; 0 for ordinary
        attention caches.

    Notes
    -----
    Use one adapter per model and per role: the draft and the target each need
    their own cache, even when they are the same model. Returned tensors are
    float32 on the CPU, where the verify ops run. The adapter accepts any
    prefix: it crops to the longest prefix it shares with its cache, so it can
    be reused across ``generate`` calls and prompts. ``crop`` is always called
    with a negative count ("remove that many tokens"), which means the same in
    transformers 4.x and 5.x (a positive value is an absolute length in 4.x and
    an error in 5.x), and never with 0 (which would empty a 4.x cache).

    The model's device is looked up once, at construction and on ``reset()``:
    call ``reset()`` after moving the model.

    Limits: batch size 1, no attention mask (no padding), and the model in
    ``eval()`` mode (dropout would make the target's rows random). Caches that
    cannot roll back -- transformers' sliding-window layers once past their
    window, recurrent (Mamba-style) layers, legacy tuple caches -- stay
    correct through the rebuild fallback, but then re-run the prefix on each
    rejection (see ``cache_rebuilds``).

    Examples
    --------
    >>> draft = HFCausalLMStep(draft_model, temperature=0.8, top_p=0.95)   # doctest: +SKIP
    >>> target = HFCausalLMStep(target_model, temperature=0.8, top_p=0.95)  # doctest: +SKIP
    >>> dec = SpeculativeDecoder(draft.draft_step, target.target_step, k=4,
    ...                          greedy=False)                              # doctest: +SKIP
    >>> out = dec.generate(tokenizer("Hello", return_tensors="pt").input_ids, 64)  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable (a causal LM), got {type(model).__name__}")
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
        if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1 = off), got {top_p!r}")
        self.model = model
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = float(top_p)
        self.generator = generator
        self.greedy = self.temperature == 0.0
        self.reset()

    def reset(self) -> None:
        """Forget the cache and the counters (and look up the model's device again)."""
        # Looked up once, not per forward (transformers' .device walks the
        # parameters): after moving the model, call reset().
        self._device = self._model_device()
        self._cache = None
        self._cached = torch.empty(0, dtype=torch.int64)  # tokens the cache holds
        self.forward_calls = 0
        self.tokens_fed = 0
        self.cache_rebuilds = 0

    # -- callbacks -------------------------------------------------------------

    def draft_step(self, prefix: torch.Tensor, k: int):
        """Propose ``k`` tokens after ``prefix``: ``(tokens [k] int64, probs [k, V] or None)``.

        ``k`` forwards of one new token each (the first may feed more: the
        prompt, or the tokens since the cache's last common point).
        """
        seq = prefix.to(device="cpu", dtype=torch.int64)
        logits = self._logits_for_last_rows(seq, rows=1)[0]
        tokens, rows = [], []
        for i in range(k):
            token, row = self._pick(logits)
            tokens.append(token)
            rows.append(row)
            if i + 1 < k:
                # The last token needs no forward: nothing is drafted after it.
                # The cache holds exactly the sequence so far: feed the token
                # on top, no prefix to compare, nothing to crop.
                logits = self._feed(torch.tensor([token], dtype=torch.int64), rows=1)[0]
        probs = None if self.greedy else torch.stack(rows)
        return torch.tensor(tokens, dtype=torch.int64), probs

    def target_step(self, prefix: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
        """Rows for every proposal and the bonus: ``[len(proposed) + 1, V]`` float32.

        One forward over the last committed token and the proposals.
        """
        prefix = prefix.to(device="cpu", dtype=torch.int64)
        seq = torch.cat([prefix, proposed.to(device="cpu", dtype=torch.int64)])
        logits = self._logits_for_last_rows(seq, rows=len(proposed) + 1)
        if self.greedy:
            return logits  # greedy verification reads only the argmax
        return warp_logits(logits, self.temperature, self.top_k, self.top_p)

    # -- sampling --------------------------------------------------------------

    def _pick(self, logits: torch.Tensor):
        """One draft token from a logits row, and the row it was drawn from."""
        if self.greedy:
            return int(torch.argmax(logits)), None
        probs = warp_logits(logits, self.temperature, self.top_k, self.top_p)
        # multinomial never picks a zero-probability token, so probs[token] > 0.
        token = int(torch.multinomial(probs, 1, generator=self.generator))
        return token, probs

    # -- KV cache --------------------------------------------------------------

    def _logits_for_last_rows(self, seq: torch.Tensor, rows: int) -> torch.Tensor:
        """Float32 CPU logits ``[rows, V]`` for the last ``rows`` positions of ``seq``."""
        # Reuse the cache up to the common prefix, but feed at least the last
        # `rows` tokens: their logits are what we were asked for.
        keep = min(_common_prefix_length(self._cached, seq), len(seq) - rows)
        self._rollback(keep)
        # Not seq[keep:]: a fallback may have emptied the cache instead. What
        # the cache keeps is a prefix of seq, so feeding the rest holds seq.
        return self._feed(seq[len(self._cached) :], rows)

    def _feed(self, new_tokens: torch.Tensor, rows: int) -> torch.Tensor:
        """Run ``new_tokens`` on top of the cache; float32 CPU logits of the last ``rows``."""
        self.forward_calls += 1
        self.tokens_fed += len(new_tokens)
        with torch.no_grad():
            out = self.model(
                new_tokens.view(1, -1).to(self._device), past_key_values=self._cache, use_cache=True
            )
        self._cache = out.past_key_values
        self._cached = torch.cat([self._cached, new_tokens])
        return out.logits[0, -rows:].detach().to(device="cpu", dtype=torch.float32)

    def _model_device(self):
        # transformers models expose .device; else the first parameter's
        # device; else (no parameters) the CPU.
        device = getattr(self.model, "device", None)
        if isinstance(device, torch.device):
            return device
        parameters = getattr(self.model, "parameters", None)
        if callable(parameters):
            for parameter in parameters():
                return parameter.device
        return torch.device("cpu")

    def _rollback(self, keep: int) -> None:
        """Crop the cache to its first ``keep`` tokens."""
        held = len(self._cached)
        if keep >= held:
            return
        if keep == 0 or self._cache is None:
            self._drop_cache()
            return
        crop = getattr(self._cache, "crop", None)
        if not callable(crop):
            # Fallback: a cache that cannot crop (legacy tuples, some sliding
            # windows) is rebuilt from scratch; correct, but the prefix reruns.
            self._drop_cache(rebuild=True)
            return
        try:
            crop(keep - held)  # negative: remove held - keep tokens (4.x and 5.x)
        except (RuntimeError, ValueError, NotImplementedError):
            # Fallback: this cache refuses to roll back (recurrent states,
            # a sliding window past its size): rebuild it from scratch.
            self._drop_cache(rebuild=True)
            return
        get_len = getattr(self._cache, "get_seq_length", None)
        if callable(get_len) and int(get_len()) != keep:
            # Fallback: the crop did not reach the asked length (e.g. a sliding
            # window cache that already dropped those states): rebuild.
            self._drop_cache(rebuild=True)
            return
        self._cached = self._cached[:keep]

    def _drop_cache(self, rebuild: bool = False) -> None:
        self._cache = None
        self._cached = torch.empty(0, dtype=torch.int64)
        self.cache_rebuilds += int(rebuild)


def hf_step_pair(draft_model, target_model, *, temperature=1.0, top_k=0, top_p=1.0, generator=None):
    """``(draft_step, target_step)`` for two causal LMs, warped identically.

    Parameters
    ----------
    draft_model, target_model : transformers-style causal LMs
        Must share one vocabulary (same tokenizer, same ``V``).
    temperature, top_k, top_p, generator
        As in ``HFCausalLMStep``; the same warping for both models is what
        speculative sampling needs to preserve the target's distribution.

    Returns
    -------
    tuple
        ``(draft.draft_step, target.target_step)``: bound methods of two
        ``HFCausalLMStep`` adapters (reach them via ``__self__``).

    Examples
    --------
    >>> draft_step, target_step = hf_step_pair(draft_model, target_model,
    ...                                        temperature=0)        # doctest: +SKIP
    >>> SpeculativeDecoder(draft_step, target_step, k=4).generate(ids, 64)  # doctest: +SKIP
    """
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    draft = HFCausalLMStep(draft_model, generator=generator, **warp)
    target = HFCausalLMStep(target_model, **warp)
    return draft.draft_step, target.target_step
