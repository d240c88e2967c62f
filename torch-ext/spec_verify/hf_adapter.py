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

Rows are the model's raw logits, float32 on the CPU: ``target_step`` returns
the ``k + 1`` target rows as they come, and ``draft_step`` returns each draft
token's logits row with the token drawn from it by ``sample_draft`` under the
adapter's ``LogitsWarping`` (temperature, then top-k, top-p, min-p: the order
of transformers' logits processors), i.e. from exactly the warped
distribution. The adapter carries that warping as its ``warping`` attribute,
which ``SpeculativeDecoder`` reads from the bound methods: sampled decoding
then verifies with ``verify_logits`` under the same warping, which warps the
draft and the target rows identically inside the op. No full-vocabulary
probability row is computed in Python. At temperature 0 (greedy) the draft
takes the argmax and returns no rows, and only the target rows' argmax is
read.

Why logits and not probability rows: the warping then happens only inside
the ops that sample and verify, by one definition (``warping.py``), and only
on the rows they read (``verify_logits`` stops at the first rejection),
instead of on every row in Python, written out and read back; and the pair
cannot be verified under another warping than the one the draft sampled
from, because the decoder checks that the draft's and the target's warpings
agree.
"""

from __future__ import annotations

import inspect

import torch

from .decode_warping import LogitsWarping
from .logits import sample_draft

__all__ = ["HFCausalLMStep", "hf_step_pair"]


# ----------------------------------------------------------------------------
# The adapter
# ----------------------------------------------------------------------------


def model_device(model) -> torch.device:
    """Where ``model`` runs: its ``.device`` (transformers models), else its
    first parameter's device, else (no parameters) the CPU."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for parameter in parameters():
            return parameter.device
    return torch.device("cpu")


def crop_cache(cache, held: int, keep: int) -> bool:
    """Crop a model's cache from the ``held`` positions it should hold to its first ``keep``; False if it could not.

    False for a cache without ``crop`` (legacy tuples), one whose ``crop``
    raises (recurrent states, a sliding window past its size that does not
    record its past), or one that does not then hold ``keep`` positions, or
    whose sliding-window layers do not then hold the last
    ``min(keep, window - 1)`` of them (a window that had already dropped
    positions the crop now needs): the caller rebuilds. ``crop`` gets a
    negative count, which means "remove that many" in transformers 4.x and
    5.x alike (a positive value is an absolute length in 4.x and an error in
    5.x).
    """
    crop = getattr(cache, "crop", None)
    if not callable(crop):
        return False
    try:
        crop(keep - held)
    except (RuntimeError, ValueError, NotImplementedError):
        return False
    get_len = getattr(cache, "get_seq_length", None)
    if callable(get_len) and int(get_len()) != keep:
        return False
    return sliding_layers_hold(cache, keep)


def model_sliding_window(model) -> int | None:
    """The model's attention window, ``model.config.sliding_window`` when an int > 0 (Mistral, Gemma 2/3, ...), else None."""
    window = getattr(getattr(model, "config", None), "sliding_window", None)
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def sliding_layers(cache) -> list:
    """The cache's sliding-window layers (transformers 5's ``DynamicSlidingWindowLayer`` and kin), else []."""
    return [layer for layer in getattr(cache, "layers", None) or ()
            if getattr(layer, "is_sliding", False) is True and isinstance(getattr(layer, "sliding_window", None), int)]


def sliding_layers_hold(cache, keep: int) -> bool:
    """Whether every sliding-window layer holds the last ``min(keep, window - 1)`` positions of ``keep``.

    What its next forward reads (transformers keeps ``window - 1`` past
    positions, the query being the window's last). A layer that is short
    dropped positions before a crop reached back to them: wrong keys, which
    its own length counter would not show.
    """
    for layer in sliding_layers(cache):
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_initialized", True) and isinstance(keys, torch.Tensor) and keys.dim() >= 2:
            if keys.shape[-2] != min(keep, layer.sliding_window - 1):
                return False
    return True


def record_past(cache) -> bool:
    """Make a cache's sliding-window layers keep what they would drop until the next ``crop``; whether it could.

    transformers 5's ``activate_past_recording`` (what its own assisted
    generation calls): a layer past its window then holds ``window - 1 + n``
    positions after a forward of ``n``, and ``crop(-m)`` for ``m <= n``
    removes the last ``m`` and drops the rest beyond ``window - 1``, exactly.
    So a speculative round rolls back its rejected tokens without a rebuild,
    and the window stays bounded by ``window - 1 + k + 1`` positions.
    """
    activate = getattr(cache, "activate_past_recording", None)
    if not callable(activate):
        return False
    activate()
    return True


def trim_recorded(cache) -> None:
    """Drop what recording sliding layers hold beyond ``window - 1`` (their ``crop(0)``), keeping them bounded.

    Only on layers that record (``record_past``): their ``crop(0)`` trims; a
    4.x cache's ``crop(0)`` would empty it, so the whole cache's is never called.
    """
    for layer in sliding_layers(cache):
        if getattr(layer, "record_past", False) is True:
            layer.crop(0)


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
        ``logits=None``, and only the argmax of the target rows is read
        (exactly as in transformers' greedy search); top-k / top-p / min-p are
        then moot. ``> 0``: ``draft_step`` draws each token with
        ``sample_draft`` under the warping.
    top_k : int, default 0
        Top-k cut-off, 0 = off.
    top_p : float, default 1.0
        Top-p cut-off in ``(0, 1]``, 1.0 = off.
    min_p : float, default 0.0
        Min-p cut-off in ``[0, 1)``, 0.0 = off.
    generator : torch.Generator, optional
        Source of the draft's uniforms, one per drawn token (the default
        generator when None). Unused by ``target_step`` and in greedy mode.
    hidden : bool, default False
        The LM head inside the op: ``target_step`` returns the last hidden
        states ``[len(proposed) + 1, d]`` float32 instead of logits, the
        model's head never runs, and the adapter carries ``head``, which
        ``SpeculativeDecoder`` reads (``verify_hidden``; ``hf_hidden.py``).
        Target only: ``draft_step`` refuses.
    head : LMHead, optional
        With ``hidden=True``, the head to carry (default: the model's own).

    Attributes
    ----------
    head : LMHead or None
        With ``hidden=True``, the head the hidden states are verified with.
    warping : LogitsWarping
        The warping above, which ``SpeculativeDecoder`` reads from the bound
        ``draft_step`` / ``target_step`` (their rows are logits under it).
        ``temperature``, ``top_k``, ``top_p``, ``min_p`` and ``greedy`` mirror it.
    forward_calls, tokens_fed : int
        Model forwards run and input tokens fed, since construction or
        ``reset()``: a cheap check of the per-round cost.
    cache_rebuilds : int
        Times the cache had to be dropped and rebuilt from scratch: a cache
        without ``crop``, one whose ``crop`` raised (recurrent layers, a
        4.x sliding window past its size), or one whose ``crop`` did not reach
        the asked length. Correct, but the prefix is run again; 0 for ordinary
        attention caches and for transformers 5's sliding-window layers.

    Notes
    -----
    Use one adapter per model and per role: the draft and the target each need
    their own cache, even when they are the same model. Returned rows are
    raw float32 logits on the CPU, where the ops run; give them to
    ``verify_logits`` (or ``SpeculativeDecoder``) with this adapter's warping,
    never to ``verify_sampled``, which reads probabilities. The adapter accepts any
    prefix: it crops to the longest prefix it shares with its cache, so it can
    be reused across ``generate`` calls and prompts. ``crop`` is always called
    with a negative count ("remove that many tokens"), which means the same in
    transformers 4.x and 5.x (a positive value is an absolute length in 4.x and
    an error in 5.x), and never with 0 (which would empty a 4.x cache).

    The model's device is looked up once, at construction and on ``reset()``:
    call ``reset()`` after moving the model.

    Sliding-window layers (Gemma 2/3, Mistral; transformers 5) roll back
    exactly without a rebuild: the adapter turns on the cache's past
    recording after its first forward (``record_past``), so a layer past its
    window holds ``window - 1`` positions plus those fed since the last crop,
    and a round's crop removes its rejected tokens and trims the rest. A
    fresh cache whose first feed reaches the window (a long prompt) is fed in
    two forwards, all but the rows asked for, then those, so that the
    target's proposals in the first round can be cropped too. A crop that
    would reach back past what a window holds (a caller going back into an
    older prefix) is detected (``sliding_layers_hold``) and rebuilds.

    Limits: batch size 1, no attention mask (no padding), and the model in
    ``eval()`` mode (dropout would make the target's rows random). Caches that
    cannot roll back -- sliding-window layers of transformers 4.x once past
    their window, recurrent (Mamba-style) layers, legacy tuple caches -- stay
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
        min_p: float = 0.0,
        generator: torch.Generator | None = None,
        hidden: bool = False,
        head=None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable (a causal LM), got {type(model).__name__}")
        # The kernel's own rules and wording (ValueError naming the argument).
        self.warping = LogitsWarping(temperature, top_k, top_p, min_p)
        # hidden=True: the model without its head; target_step returns hidden states (hf_hidden.py).
        self.model, self.head = hidden_model(model, hidden, head)
        self.temperature, self.top_k = self.warping.temperature, self.warping.top_k
        self.top_p, self.min_p = self.warping.top_p, self.warping.min_p
        self.greedy = self.warping.greedy
        self.generator = generator
        self._sample_kwargs = dict(self.warping.kwargs(), generator=generator)
        self.reset()

    def reset(self) -> None:
        """Forget the cache and the counters (and look up the model's device again)."""
        # Looked up once, not per forward (transformers' .device walks the
        # parameters): after moving the model, call reset().
        self._device = self._model_device()
        self._cache = None
        self._cached = torch.empty(0, dtype=torch.int64)  # tokens the cache holds
        self._window = model_sliding_window(self.model)
        self._keeps_logits = _takes_argument(self.model, "logits_to_keep")
        self.forward_calls = 0
        self.tokens_fed = 0
        self.cache_rebuilds = 0

    # -- callbacks -------------------------------------------------------------

    def draft_step(self, prefix: torch.Tensor, k: int):
        """Propose ``k`` tokens after ``prefix``: ``(tokens [k] int64, logits [k, V] float32 or None)``.

        Row ``i`` of the logits is the one ``tokens[i]`` was drawn from
        (``sample_draft`` under ``warping``); None at temperature 0, where
        the tokens are argmaxes. ``k`` forwards of one new token each (the
        first may feed more: the prompt, or the tokens since the cache's last
        common point).
        """
        if self.head is not None:
            raise ValueError("a hidden=True adapter is a target: its draft_step would need logits rows")
        seq = prefix.to(device="cpu", dtype=torch.int64)
        logits = self._logits_for_last_rows(seq, rows=1)[0]
        tokens = []
        rows = None if self.greedy else logits.new_empty((k, logits.shape[-1]))
        for i in range(k):
            token = self._pick(logits)
            tokens.append(token)
            if rows is not None:
                rows[i] = logits
            if i + 1 < k:
                # The last token needs no forward: nothing is drafted after it.
                # The cache holds exactly the sequence so far: feed the token
                # on top, no prefix to compare, nothing to crop.
                logits = self._feed(torch.tensor([token], dtype=torch.int64), rows=1)[0]
        return torch.tensor(tokens, dtype=torch.int64), rows

    def target_step(self, prefix: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
        """The target's raw logits at every draft position and the bonus position: ``[len(proposed) + 1, V]`` float32.

        One forward over the last committed token and the proposals. With
        ``hidden=True``: the last hidden states ``[len(proposed) + 1, d]`` instead.
        """
        prefix = prefix.to(device="cpu", dtype=torch.int64)
        seq = torch.cat([prefix, proposed.to(device="cpu", dtype=torch.int64)])
        return self._logits_for_last_rows(seq, rows=len(proposed) + 1)

    # -- sampling --------------------------------------------------------------

    def _pick(self, logits: torch.Tensor) -> int:
        """One draft token from a logits row: its argmax, or a draw from its warped distribution."""
        if self.greedy:
            return int(torch.argmax(logits))
        # The very distribution verify_logits reads: a token outside it is never drawn.
        return int(sample_draft(logits, **self._sample_kwargs))

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

    def _feed(self, new_tokens: torch.Tensor, rows: int, split: bool = True) -> torch.Tensor:
        """Run ``new_tokens`` on top of the cache; float32 CPU logits of the last ``rows``."""
        if split and self._cache is None and self._window is not None and len(new_tokens) >= self._window > 1 \
                and len(new_tokens) > rows:
            # A fresh cache past a sliding window: the model makes it and drops
            # beyond the window at once. Feed all but the last `rows` first,
            # then record the past, so that the rows asked about (a target's
            # proposals) can be cropped back exactly.
            self._feed(new_tokens[:-rows], rows=1, split=False)
            new_tokens = new_tokens[-rows:]
        self.forward_calls += 1
        self.tokens_fed += len(new_tokens)
        kwargs = dict(logits_to_keep=rows) if self._keeps_logits else {}
        try:
            # inference_mode, not no_grad: no autograd bookkeeping at all (~7 % of a small model's
            # forward here: 7.5 against 7.05 ms a token on the shipped target).
            with torch.inference_mode():
                out = self.model(
                    new_tokens.view(1, -1).to(self._device), past_key_values=self._cache, use_cache=True, **kwargs
                )
        except BaseException:
            # A forward that raised part-way (Ctrl-C, out of memory, a fault in
            # a layer) has extended the cache in place in the layers that ran;
            # our record has not moved. Roll the cache back to the record.
            self._restore_after_failed_forward()
            raise
        if self._cache is None:
            # The model's own cache, made in its first forward: its sliding
            # layers keep their past until cropped (see record_past).
            record_past(out.past_key_values)
        self._cache = out.past_key_values
        self._cached = torch.cat([self._cached, new_tokens])
        return out.logits[0, -rows:].detach().to(device="cpu", dtype=torch.float32)

    def _model_device(self):
        return model_device(self.model)

    def _rollback(self, keep: int) -> None:
        """Crop the cache to its first ``keep`` tokens."""
        held = len(self._cached)
        if keep >= held:
            # Nothing rejected: recording sliding layers still drop what no
            # crop can reach back to now (the caller's prefix is committed).
            trim_recorded(self._cache)
            return
        if keep == 0 or self._cache is None:
            self._drop_cache()
            return
        if not crop_cache(self._cache, held, keep):
            # Fallback: rebuilt from scratch; correct, but the prefix reruns.
            self._drop_cache(rebuild=True)
            return
        self._cached = self._cached[:keep]

    def _restore_after_failed_forward(self) -> None:
        """Cut every cache layer back to the tokens recorded, or drop the cache.

        Layer by layer: the layers that ran hold more than ``held`` tokens and
        are cut by their own excess; the others are untouched (one relative
        ``crop`` of the whole cache would cut those too, and transformers 5
        refuses an absolute one). Unless every layer then holds exactly
        ``held`` tokens (a sliding window, an unknown cache type), the cache
        is dropped: rebuilt on the next call, slower but still exact.
        """
        held = len(self._cached)
        layers = getattr(self._cache, "layers", None)
        try:
            if held == 0 or not layers:
                raise LookupError("no per-layer cache to cut back")
            for layer in layers:
                excess = int(layer.get_seq_length()) - held
                if excess > 0:
                    layer.crop(-excess)
            if any(int(layer.get_seq_length()) != held for layer in layers):
                raise LookupError("a layer did not land on the recorded length")
        except Exception:
            self._drop_cache(rebuild=self._cache is not None)

    def _drop_cache(self, rebuild: bool = False) -> None:
        self._cache = None
        self._cached = torch.empty(0, dtype=torch.int64)
        self.cache_rebuilds += int(rebuild)


def hidden_model(model, hidden: bool, head):
    """``(the model to call, its head or None)``: the model itself, or with ``hidden`` its ``HiddenStatesLM``."""
    if not hidden:
        if head is not None:
            raise ValueError("head= is for hidden=True (the adapter then returns hidden states)")
        return model, None
    from .hf_hidden import HiddenStatesLM

    wrapped = HiddenStatesLM(model, head)
    return wrapped, wrapped.head


def _takes_argument(model, name: str) -> bool:
    """Whether ``model``'s forward declares the keyword ``name``."""
    try:
        return name in inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False


def hf_step_pair(draft_model, target_model, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, generator=None,
                 hidden=False):
    """``(draft_step, target_step)`` for two causal LMs, under one warping.

    Parameters
    ----------
    draft_model, target_model : transformers-style causal LMs
        Must share one vocabulary (same tokenizer, same ``V``).
    temperature, top_k, top_p, min_p, generator
        As in ``HFCausalLMStep``; the same warping for both models is what
        speculative sampling needs to preserve the target's distribution.
    hidden : bool, default False
        The target's head in the op (``HFCausalLMStep(hidden=True)``): its
        ``target_step`` returns hidden states and carries ``head``.

    Returns
    -------
    tuple
        ``(draft.draft_step, target.target_step)``: bound methods of two
        ``HFCausalLMStep`` adapters (reach them via ``__self__``), whose
        ``warping`` ``SpeculativeDecoder`` reads: they return logits rows, and
        sampled decoding verifies them with ``verify_logits`` under that
        warping.

    Examples
    --------
    >>> draft_step, target_step = hf_step_pair(draft_model, target_model,
    ...                                        temperature=0)        # doctest: +SKIP
    >>> SpeculativeDecoder(draft_step, target_step, k=4).generate(ids, 64)  # doctest: +SKIP
    >>> draft_step, target_step = hf_step_pair(draft_model, target_model, temperature=0.8,
    ...                                        top_p=0.95)           # doctest: +SKIP
    >>> SpeculativeDecoder(draft_step, target_step, k=4, greedy=False).generate(ids, 64)  # doctest: +SKIP
    """
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    draft = HFCausalLMStep(draft_model, generator=generator, **warp)
    target = HFCausalLMStep(target_model, hidden=hidden, **warp)  # hidden: the head in the op
    return draft.draft_step, target.target_step
