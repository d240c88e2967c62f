"""Hugging Face causal LMs as batched callbacks: one KV cache per model for the whole batch.

``HFBatchedCausalLM`` serves ``BatchedSpeculativeDecoder``
(``batched_decoder.py``): ``draft_step(prefixes, k, rows)`` and
``target_step(prefixes, proposed, rows)`` for ``n`` sequences at once, with
one KV cache holding all of them. Duck-typed, like ``hf_adapter.py``: a model
is anything that answers ``model(input_ids=[n, W], attention_mask=[n, S + W],
position_ids=[n, W], past_key_values=cache, use_cache=True)`` with
``.logits`` ``[n, W, V]`` and ``.past_key_values`` (``attention_mask`` and
``position_ids`` are left out when no row has a hole: then the model's
defaults are exactly them); transformers is never imported, because this
module is part of the kernel package.

Ragged rounds in one cache: masked slots and per-row positions
--------------------------------------------------------------
Sequences accept different numbers of draft tokens, so after a round they
are at different lengths, yet the batch's cache has one length (*slots*).
The scheme:

* Every forward appends the same number of slots ``W`` to every row. A row
  with fewer than ``W`` tokens to feed is right-aligned: its leading columns
  are *holes*, fed a pad id and masked out.
* A rejected draft token's slot stays in the cache and is masked out (a hole
  too): nothing is copied or recomputed. The 2-D ``attention_mask`` over all
  slots marks, per row, the slots that hold its sequence; causality runs over
  slots, which are in order for every row.
* ``position_ids`` are per row: a token's position is the number of real
  tokens before it in its own sequence, so rotary (or learnt) positions are
  what the sequence would have alone, whatever the holes.
* Trailing slots that are holes in every row are cropped (``cache.crop``);
  sequences that stop leave the batch (``cache.batch_select_indices``).

So no prefix is ever re-run, and a round costs ``k`` draft forwards and one
target forward for the whole batch: the draft's first forward feeds one token
per row (two for a row that accepted every draft token: its last draft token,
which the draft never fed, and the bonus token; the first forward of a run
feeds the prompts, left-padded), the next ``k - 1`` one token each; the
target feeds ``k + 1`` per row (the last committed token and the ``k``
proposals). Left-padded prompts are the same scheme: padding is holes.

Why this scheme and not per-row cropping: a KV cache is one ``[n, heads,
slots, d]`` tensor per layer, so per-row lengths would mean copying every
layer's keys and values after every round; masking costs nothing but the
attention over hole slots. A row carries at most ``k - accepted`` holes per
round (more for the draft after a full acceptance elsewhere in the batch);
with the acceptance of a useful draft that is a fraction of the sequence
(``holes`` counts them), and the rows' real lengths, not the slots, set the
positions.

Sliding windows (Gemma 3's local layers, Mistral) count a row's real tokens,
not slots: with holes in the cache, a row's last ``window`` tokens span more
slots than that, and the model's own masks and cache (which keep the last
``window - 1`` *slots*) would be wrong. So, for a model with
``config.sliding_window``, the cache's sliding layers are made to keep every
slot (their window set past any length, after a first forward of one
column that creates the cache before a long prefill could be cut), and when
the cache has a hole the adapter passes the attention masks itself, 4-D, per
layer type (a ``{"full_attention", "sliding_attention"}`` dict for models
mixing both): a query at position ``p`` sees the slots of its row that hold
positions ``> p - window``, positions counted per row, holes excluded. That
is exact at any length; the price is attention over all of a sliding layer's
slots (masked) instead of its window, and a cache the size of a full one.
Without holes (one sequence, or a batch that accepted alike) the model's own
masks are used, which are then the same.

Rows are raw float32 logits on the CPU, as in ``hf_adapter.py``: the draft
draws each token with ``sample_draft`` under the adapter's ``LogitsWarping``
(its ``warping`` attribute, which the decoder reads), and sampled decoding
verifies with ``verify_logits_batched`` under the same warping. At
temperature 0 the draft takes argmaxes and returns no rows.
"""

from __future__ import annotations

import inspect

import torch

from .decode_warping import LogitsWarping
from .hf_adapter import crop_cache, hidden_model, model_device, model_sliding_window, sliding_layers
from .logits import sample_draft

__all__ = ["HFBatchedCausalLM", "hf_batched_step_pair"]


# ----------------------------------------------------------------------------
# One sequence's share of the cache
# ----------------------------------------------------------------------------


class _Row:
    """The tokens a batch row of the cache holds (in order) and the slot each sits in."""

    __slots__ = ("tokens", "length", "slots", "agreed")

    def __init__(self) -> None:
        self.tokens = torch.empty(64, dtype=torch.int64)  # grown by doubling
        self.length = 0
        self.slots: list = []
        self.agreed = 0  # tokens of the last prefix given: committed, so never rolled back by a caller

    def extend(self, new: torch.Tensor, first_slot: int) -> None:
        end = self.length + len(new)
        if end > len(self.tokens):
            grown = torch.empty(max(end, 2 * len(self.tokens)), dtype=torch.int64)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        self.tokens[self.length : end] = new
        self.slots.extend(range(first_slot, first_slot + len(new)))
        self.length = end

    def common_prefix(self, seq: torch.Tensor) -> int:
        """Length of the longest common prefix of the held tokens and ``seq``."""
        m = min(self.length, len(seq))
        # The caller's committed part is checked in one C call; only the
        # tail (at most a round's tokens) is compared token by token.
        c = min(self.agreed, m)
        if c and not torch.equal(self.tokens[:c], seq[:c]):
            return int((self.tokens[:c] != seq[:c]).nonzero()[0, 0])
        for i, (held, asked) in enumerate(zip(self.tokens[c:m].tolist(), seq[c:m].tolist())):
            if held != asked:
                return c + i
        return m


# ----------------------------------------------------------------------------
# The adapter
# ----------------------------------------------------------------------------


class HFBatchedCausalLM:
    """One causal LM with one KV cache for a batch, as batched speculative-decoding callbacks.

    Parameters
    ----------
    model : transformers-style causal LM
        Called as ``model(input_ids=[n, W], attention_mask=[n, S + W],
        position_ids=[n, W], past_key_values=cache, use_cache=True)`` (plus
        ``logits_to_keep`` when its ``forward`` takes it); the output must
        have ``.logits`` ``[n, W, V]`` and ``.past_key_values``.
    temperature, top_k, top_p, min_p : optional
        The warping (``LogitsWarping``); ``temperature=0`` is greedy.
    generator : torch.Generator, optional
        Source of the draft's uniforms (the default generator when None).
    pad_token_id : int, default 0
        The id fed in hole columns (masked out: any id in ``[0, V)`` does).
    hidden : bool, default False
        ``target_step`` returns the last hidden states ``[n, k + 1, d]``
        instead of logits and the adapter carries ``head`` (as
        ``HFCausalLMStep(hidden=True)``); target only.
    head : LMHead, optional
        With ``hidden=True``, the head to carry (default: the model's own).

    Attributes
    ----------
    head : LMHead or None
        With ``hidden=True``, the head the hidden states are verified with.
    warping : LogitsWarping
        The warping of the rows returned, read by ``BatchedSpeculativeDecoder``.
    forward_calls, tokens_fed, slots_fed : int
        Forwards run, real tokens fed and slots appended (tokens plus holes),
        since construction or ``reset()``.
    cache_rebuilds : int
        Times the cache was dropped and its sequences fed again because it
        could not drop finished rows (no ``batch_select_indices``) or its
        ``crop`` failed. 0 for transformers' ``DynamicCache``.

    Notes
    -----
    Use one adapter per model and per role. The adapter follows the prefixes
    it is given: each row rolls back to the longest prefix its cache shares
    with what it is asked about, so it can be reused across ``generate``
    calls (a new run with other prompts starts afresh). The model must be in
    ``eval()`` mode. See the module docstring for the cache scheme and for
    sliding windows (Gemma 3, Mistral), counted per row: exact at any length,
    with the model's ``attn_implementation`` ``"sdpa"`` or ``"eager"``
    (another raises ``ValueError`` once a sliding model's cache has a hole).

    Examples
    --------
    >>> draft = HFBatchedCausalLM(draft_model, temperature=0.8, top_p=0.95)    # doctest: +SKIP
    >>> target = HFBatchedCausalLM(target_model, temperature=0.8, top_p=0.95)  # doctest: +SKIP
    >>> dec = BatchedSpeculativeDecoder(draft.draft_step, target.target_step, k=4,
    ...                                 greedy=False)                          # doctest: +SKIP
    >>> enc = tokenizer(texts, return_tensors="pt", padding=True)             # doctest: +SKIP
    >>> outs = dec.generate(enc.input_ids, 64, attention_mask=enc.attention_mask)  # doctest: +SKIP
    """

    def __init__(self, model, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, generator: torch.Generator | None = None, pad_token_id: int = 0,
                 hidden: bool = False, head=None) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable (a causal LM), got {type(model).__name__}")
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {pad_token_id!r}")
        self.warping = LogitsWarping(temperature, top_k, top_p, min_p)
        # hidden=True: the model without its head; target_step returns hidden states (hf_hidden.py).
        self.model, self.head = hidden_model(model, hidden, head)
        self.greedy = self.warping.greedy
        self.generator = generator
        self.pad_token_id = pad_token_id
        self._sample_kwargs = dict(self.warping.kwargs(), generator=generator)
        self._keeps_logits = _takes_argument(self.model, "logits_to_keep")
        self.reset()

    def reset(self) -> None:
        """Forget the cache and the counters (and look up the model's device again)."""
        self._device = model_device(self.model)
        self._window = model_sliding_window(self.model)  # None: no sliding-window layers
        self._ids, self._rows = [], []  # the batch indices the cache's rows hold, and their state
        self._cache, self._mask = None, None  # the model's cache; [n, slots] int64, 1 = a real token
        self.forward_calls = self.tokens_fed = self.slots_fed = self.cache_rebuilds = 0

    @property
    def holes(self) -> int:
        """Masked-out slots in the cache now (padding and rejected tokens), over all rows."""
        return 0 if self._mask is None else int((self._mask == 0).sum())

    # -- callbacks -------------------------------------------------------------

    def draft_step(self, prefixes: list, k: int, rows: list):
        """Propose ``k`` tokens after each prefix: ``(tokens [n, k] int64, logits [n, k, V] float32 or None)``.

        Row ``[b, i]`` of the logits is the one ``tokens[b, i]`` was drawn
        from (``sample_draft`` under ``warping``); None at temperature 0.
        ``k`` forwards for the whole batch.
        """
        if self.head is not None:
            raise ValueError("a hidden=True adapter is a target: its draft_step would need logits rows")
        logits = self._advance(prefixes, rows, None, keep=1)[:, -1]
        tokens = torch.empty((len(prefixes), k), dtype=torch.int64)
        drawn_from = None if self.greedy else logits.new_empty((len(prefixes), k, logits.shape[-1]))
        for i in range(k):
            tokens[:, i] = self._pick(logits)
            if drawn_from is not None:
                drawn_from[:, i] = logits
            if i + 1 < k:
                # The last token needs no forward: nothing is drafted after it.
                logits = self._feed(tokens[:, i : i + 1], keep=1)[:, -1]
        return tokens, drawn_from

    def target_step(self, prefixes: list, proposed: torch.Tensor, rows: list) -> torch.Tensor:
        """The target's raw logits at every draft position and the bonus position: ``[n, k + 1, V]`` float32.

        One forward over each row's last committed token and its ``k`` proposals.
        """
        return self._advance(prefixes, rows, proposed, keep=proposed.shape[1] + 1)

    # -- sampling --------------------------------------------------------------

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """One draft token per row of ``[n, V]`` logits: argmaxes, or draws from the warped rows."""
        if self.greedy:
            return torch.argmax(logits, dim=-1)
        # The very distribution verify_logits_batched reads: a token outside it is never drawn.
        return sample_draft(logits, **self._sample_kwargs)

    # -- the cache -------------------------------------------------------------

    def _advance(self, prefixes: list, rows: list, proposed, keep: int) -> torch.Tensor:
        """Logits ``[n, keep, V]`` for the last ``keep`` positions of each ``prefix (+ proposed)``."""
        self._select(rows)
        seqs = []
        for b, prefix in enumerate(prefixes):
            prefix = prefix.to(device="cpu", dtype=torch.int64)
            seq = prefix if proposed is None else torch.cat([prefix, proposed[b].to("cpu", torch.int64)])
            row = self._rows[b]
            # Feed at least the last `keep` tokens: their logits are what we were asked for.
            self._rollback(b, min(row.common_prefix(seq), len(seq) - keep))
            row.agreed = len(prefix)
            seqs.append(seq)
        self._crop_trailing_holes()
        return self._feed_ragged([seq[row.length :] for seq, row in zip(seqs, self._rows)], keep)

    def _select(self, rows: list) -> None:
        """Make the cache's rows the sequences ``rows`` (original batch indices), in that order."""
        if self._cache is None or not set(rows) <= set(self._ids):
            # A new run (or a row this cache never held): start afresh.
            self._drop_cache()
            self._ids, self._rows = list(rows), [_Row() for _ in rows]
            return
        if list(rows) == self._ids:
            return
        index = [self._ids.index(r) for r in rows]
        select = getattr(self._cache, "batch_select_indices", None)
        if not callable(select):
            # Fallback: a cache that cannot drop rows is rebuilt for those left.
            self._drop_cache(rebuild=True)
            self._ids, self._rows = list(rows), [_Row() for _ in rows]
            return
        select(torch.tensor(index, device=self._device))
        self._mask = self._mask[index]
        self._ids, self._rows = list(rows), [self._rows[i] for i in index]

    def _rollback(self, b: int, keep: int) -> None:
        """Row ``b`` keeps its first ``keep`` tokens; the slots after become holes."""
        row = self._rows[b]
        if keep < row.length:
            self._mask[b, row.slots[keep:]] = 0
            del row.slots[keep:]
            row.length = keep

    def _crop_trailing_holes(self) -> None:
        """Drop the trailing slots that are holes in every row."""
        if self._cache is None:
            return
        used = max((row.slots[-1] + 1 for row in self._rows if row.slots), default=0)
        held = self._mask.shape[1]
        if used == held:
            return
        if used == 0:
            self._drop_cache()  # nothing held: the next feed starts afresh
            return
        if not callable(getattr(self._cache, "crop", None)):
            return  # harmless: the holes stay masked
        if not crop_cache(self._cache, held, used):
            self._drop_cache(rebuild=True)  # a crop that failed half-way: feed every row afresh
            return
        self._mask = self._mask[:, :used]

    def _drop_cache(self, rebuild: bool = False) -> None:
        """Empty the cache; every row then holds nothing and is fed its whole prefix next."""
        self._cache, self._mask = None, None
        self._rows = [_Row() for _ in self._rows]
        self.cache_rebuilds += int(rebuild)

    # -- feeding ---------------------------------------------------------------

    def _feed_ragged(self, pending: list, keep: int) -> torch.Tensor:
        """Feed each row its ``pending`` tokens (1-D, any lengths >= 1), right-aligned; ``[n, keep, V]``."""
        lengths = [len(p) for p in pending]
        width = max(lengths)
        if min(lengths) == width:
            return self._feed(torch.stack(pending), keep)
        ids = torch.full((len(pending), width), self.pad_token_id, dtype=torch.int64)
        for b, tokens in enumerate(pending):
            ids[b, width - len(tokens) :] = tokens
        return self._feed(ids, keep, lengths)

    def _feed(self, ids: torch.Tensor, keep: int, lengths: list | None = None) -> torch.Tensor:
        """Run ``ids [n, W]`` on top of the cache, row ``b``'s real tokens its last ``lengths[b]``
        (all ``W`` when None); float32 CPU logits of the last ``keep`` columns."""
        n, width = ids.shape
        held = 0 if self._mask is None else self._mask.shape[1]
        if lengths is None:
            new_mask = torch.ones((n, width), dtype=torch.int64)
        else:
            columns, real = torch.arange(width).view(1, -1), torch.tensor(lengths).view(-1, 1)
            new_mask = (columns >= width - real).to(torch.int64)
        mask = new_mask if self._mask is None else torch.cat([self._mask, new_mask], dim=1)
        start = torch.tensor([row.length for row in self._rows]).view(-1, 1)
        # Holes get the row's next position: masked out, any valid position does.
        positions = start + (torch.arange(width) if lengths is None else (columns - (width - real)).clamp(min=0))
        if self._cache is None and self._window is not None and width > 1:
            # A fresh cache of a sliding-window model: one column first (every
            # row's, a pad for some: masked from the next forward on), to have
            # the cache before a long prefill could cut its windows; then the
            # windows are unbounded (module docstring) and the rest is fed.
            first = self._forward(ids[:, :1], 1, None, None)
            self._unbound_windows()
            rest = self._forward(ids[:, 1:], min(keep, width - 1), mask, positions[:, 1:])
            logits = torch.cat([first, rest], dim=1)[:, -keep:]
        else:
            logits = self._forward(ids, keep, mask, positions)
        self._mask = mask
        for b, row in enumerate(self._rows):
            count = width if lengths is None else lengths[b]
            row.extend(ids[b, width - count :], held + width - count)
        self.tokens_fed += n * width if lengths is None else sum(lengths)
        self.slots_fed += n * width
        return logits

    def _forward(self, ids: torch.Tensor, keep: int, mask, positions) -> torch.Tensor:
        """One model forward of ``ids [n, W]`` on the cache, whose slots' mask (theirs and these) is
        ``mask`` (None: all real); float32 CPU logits of the last ``keep`` columns."""
        model_kwargs = dict(logits_to_keep=keep) if self._keeps_logits else {}
        # No hole anywhere (always so for one sequence: its rejected slots are
        # trailing, hence cropped): the model's defaults -- a full mask,
        # positions from the cache's length -- are exactly these, and cheaper.
        if mask is not None and not bool(mask.all()):
            if self._window is None:
                model_kwargs.update(attention_mask=mask.to(self._device))
            else:
                model_kwargs.update(attention_mask=self._window_masks(mask, positions))
            model_kwargs.update(position_ids=positions.to(self._device))
        # inference_mode, not no_grad: no autograd bookkeeping at all (~10 % of a small model's forward).
        try:
            with torch.inference_mode():
                out = self.model(input_ids=ids.to(self._device), past_key_values=self._cache, use_cache=True,
                                 **model_kwargs)
        except BaseException:
            # A forward that raised part-way (Ctrl-C, out of memory, a fault in
            # a layer) has extended some layers of the cache and not our
            # books: drop it, so the next call feeds every row afresh (exact).
            self._drop_cache(rebuild=self._cache is not None)
            raise
        self._cache = out.past_key_values
        self.forward_calls += 1
        return out.logits[:, -keep:].to(device="cpu", dtype=torch.float32)

    # -- sliding windows -------------------------------------------------------

    def _unbound_windows(self) -> None:
        """Make the cache's sliding-window layers keep every slot (their window past any length)."""
        for layer in sliding_layers(self._cache):
            # transformers 5's DynamicSlidingWindowLayer keeps its last
            # `sliding_window - 1` slots; past any length, it keeps all and
            # crops, selects and sizes its masks as a full layer does.
            layer.sliding_window = _UNBOUNDED

    def _window_masks(self, mask: torch.Tensor, positions: torch.Tensor):
        """The 4-D attention masks of a forward of ``positions [n, W]`` over slots ``mask [n, S + W]``.

        Per layer type: ``{"full_attention": ..., "sliding_attention": ...}``
        for a model mixing both (``config.layer_types``), else the sliding
        one alone; boolean for ``sdpa`` (True = attend), additive float for
        ``eager``. A query sees its row's real slots up to its own, and for a
        sliding layer only those holding positions ``> p - window``.
        """
        n, width = positions.shape
        total = mask.shape[1]
        real = mask.bool()
        slot_pos = mask.cumsum(dim=1) - 1  # a real slot's position in its row
        query_slot = torch.arange(total - width, total).view(1, width, 1)
        causal = real.view(n, 1, total) & (torch.arange(total).view(1, 1, total) <= query_slot)
        local = causal & (slot_pos.view(n, 1, total) > positions.view(n, width, 1) - self._window)
        config = getattr(self.model, "config", None)
        implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        if implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"HFBatchedCausalLM builds sliding-window masks for attn_implementation 'sdpa' or 'eager', "
                f"not {implementation!r}: load the model with one of those"
            )

        def as_mask(allowed):
            allowed = allowed.view(n, 1, width, total).to(self._device)
            if implementation == "sdpa":
                return allowed
            dtype = getattr(self.model, "dtype", torch.float32)
            zero = torch.zeros((), dtype=dtype, device=self._device)
            return torch.where(allowed, zero, torch.finfo(dtype).min)

        types = set(getattr(config, "layer_types", None) or ())
        if "full_attention" in types and "sliding_attention" in types:
            return {"full_attention": as_mask(causal), "sliding_attention": as_mask(local)}
        return as_mask(local)


# A sliding window longer than any sequence: the layer then keeps every slot.
_UNBOUNDED = 1 << 62


def _takes_argument(model, name: str) -> bool:
    """Whether ``model``'s forward declares the keyword ``name``."""
    try:
        return name in inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False


def hf_batched_step_pair(draft_model, target_model, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                         generator=None, pad_token_id=0, hidden=False):
    """``(draft_step, target_step)`` for two causal LMs and a batch, under one warping.

    Parameters
    ----------
    draft_model, target_model : transformers-style causal LMs
        Must share one vocabulary (same tokenizer, same ``V``); when both have
        a ``config.vocab_size``, a difference raises ``ValueError``.
    temperature, top_k, top_p, min_p, generator, pad_token_id
        As in ``HFBatchedCausalLM``; one warping for both models.
    hidden : bool, default False
        The target's head in the op (``HFBatchedCausalLM(hidden=True)``).

    Returns
    -------
    tuple
        ``(draft.draft_step, target.target_step)``: bound methods of two
        ``HFBatchedCausalLM`` adapters (reach them via ``__self__``), for
        ``BatchedSpeculativeDecoder``.
    """
    sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in (draft_model, target_model)]
    if None not in sizes and sizes[0] != sizes[1]:
        raise ValueError(
            f"draft_model has a vocabulary of {sizes[0]} tokens and target_model of {sizes[1]}: speculative "
            f"decoding needs one tokenizer and one vocabulary for both"
        )
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, pad_token_id=pad_token_id)
    draft = HFBatchedCausalLM(draft_model, generator=generator, **warp)
    target = HFBatchedCausalLM(target_model, hidden=hidden, **warp)  # hidden: the head in the op
    return draft.draft_step, target.target_step
