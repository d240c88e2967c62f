"""``PromptLookupDraft``: a draft that costs nothing, read from the prefix itself.

Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``,
llama.cpp's ``ngram-simple``) proposes, as the next tokens, the ones that
followed an earlier occurrence of the current n-gram -- the last ``n`` tokens
of prompt + output. On input-grounded work (quoting a passage, editing code)
the output repeats long runs of the input, and those runs are proposed whole.

Rules (DESIGN.md, "Prompt lookup"):

* n-gram sizes are tried from ``max_ngram`` down to ``min_ngram``; the first
  size with a match wins;
* the match is the **latest** earlier occurrence (the one closest to the end,
  other than the suffix itself): recent text predicts the next tokens better
  than the prompt's first mention (llama.cpp's choice; transformers takes the
  earliest);
* the proposal is the up-to-``k`` tokens after the match, cut at the end of the
  prefix -- unless the prefix ends in a loop: where the cut applies (the
  match is ``d < k`` tokens back) and the last ``d`` tokens repeat the ``d``
  before them, the loop is continued past the end, up to ``k`` tokens (Note
  [A loop continues]); fewer than ``k`` tokens, or none when nothing
  matches: the decoder verifies what it gets, and a round with no proposal
  is a plain decoding step.

The rows are ``None``: a point-mass draft (DESIGN.md, glossary). Greedy
verification reads only target argmaxes; sampled verification reads ``None``
as a point mass on each proposed token (accept ``t`` with probability
``p(t)``, else draw from ``p`` with ``t`` removed), which is exact for any
proposal that depends only on the prefix.

Only the Python standard library and torch are imported here: this module is
part of the kernel package that ``kernels`` loads.
"""

from __future__ import annotations

import ctypes

import torch

from .decode_checks import check_int

__all__ = ["PromptLookupDraft"]


# ----------------------------------------------------------------------------
# The lookup
# ----------------------------------------------------------------------------


def _lookup(prefix: torch.Tensor, k: int, max_ngram: int, min_ngram: int) -> tuple[torch.Tensor, int]:
    """Up to ``k`` tokens after the latest earlier occurrence of the longest matching suffix n-gram, and the
    match's context (``_match_context``; 0: none)."""
    length = len(prefix)
    top = min(max_ngram, length - 1)
    if top < min_ngram:
        return _EMPTY, 0
    # The prefix's bytes, searched by bytes.rfind (see Note [Lookup on bytes]).
    if not prefix.is_contiguous():
        prefix = prefix.contiguous()
    data = ctypes.string_at(prefix.data_ptr(), _WORD * length)
    limit = _WORD * (length - 1)  # an earlier occurrence ends before the last token: never the suffix itself
    for n in range(top, min_ngram - 1, -1):
        pattern, end = data[_WORD * (length - n):], limit
        while (at := data.rfind(pattern, 0, end)) >= 0:
            if at % _WORD == 0:  # token-aligned: the latest occurrence of this n-gram
                e = at // _WORD + n - 1  # the index of its last token
                after = data[_WORD * (e + 1): _WORD * (e + 1 + k)]
                d = length - 1 - e  # how far back the match is: after holds min(k, d) tokens
                if d < k and 2 * d <= length and data[_WORD * (length - 2 * d): _WORD * (length - d)] == after:
                    after = (after * (k // d + 1))[: _WORD * k]  # continued past the end (Note [A loop continues])
                return torch.frombuffer(bytearray(after), dtype=torch.int64), _match_context(data, length, e, n)
            end = at + len(pattern) - 1  # straddles two tokens: look again, ending before it
    return _EMPTY, 0


# Note [Lookup on bytes]
# A decode calls the lookup every round (and k="auto"'s probe every plain step) right after the target's
# eval has evicted the caches, where each torch call costs tens of microseconds and each Python object made
# costs too. So the prefix is copied out once as raw int64 bytes (ctypes.string_at: one memcpy, no Python
# int per token; tolist() made one per token, ~20 us at 300 tokens and ~60 at 3,000 with cold caches on a
# Xeon), and each n-gram is found by bytes.rfind, which searches from the end at C speed: the latest
# occurrence first, as the rule asks. A hit at an offset that is not a multiple of 8 straddles two tokens
# (the bytes of "1, 0" hold those of "0" one byte in) and is skipped. Equal bytes are equal tokens, in
# either byte order. One torch call out: the proposal is a view of a bytearray of its own.
_WORD = 8  # bytes per int64 token


# Note [A loop continues]
# The tokens after the match end where the prefix ends: a match d tokens back gives at most d. Small models
# loop (greedy text repeating a line, or a phrase), and there the latest match is one period back, so a
# loop of 3 tokens proposed 3 a round however flat the engine's cost curve (transformers' own lookup takes
# the earliest match and proposes its 10 from the loop's first lap). So where the cut applies and the last
# d tokens repeat the d before them -- the loop has run at least twice -- the proposal continues it: those
# d tokens repeated, up to k. Measured offline on the bench's plain greedy text (k = 16, every position's
# proposal against the text that followed, accepted = the proposal's prefix that matched; 3 prompts x 128
# tokens, llama.cpp): the shipped pair's open prose 1988 accepted of 2729 proposed -> 3761 of 5029; Gemma
# 3 270M's open prose 2386 of 4491 -> 2578 of 4740; input-grounded text unchanged (Gemma, SmolLM2: the
# same proposals; the shipped pair 66 more proposed of 2762, none accepted); SmolLM2's open prose 30 more
# proposed, none accepted. Continuing after one lap instead (any cut proposal repeated): 5392 / 4992
# proposed for 3870 / 2614 accepted, SmolLM2 421 more proposed for none. A proposal depends only on the
# prefix, so sampled decoding stays exact whatever the rule.

# A match extended back this far is a copy in progress (see _match_context).
_LONG_MATCH = 8


def _match_context(data: bytes, length: int, e: int, n: int) -> int:
    """The match's length, bucketed: 1, 2, 3, 4 (4-7 tokens) or 8 (8 or more).

    Its length: how many of the prefix's last tokens agree with the tokens
    ending at the occurrence ``e`` -- the n-gram, extended back (up to
    ``_LONG_MATCH``); ``data`` is the ``length``-token prefix's bytes. Why not
    the n-gram size: at ``max_ngram`` the size
    says nothing of how long a copy has run, and a copy that has run on
    predicts the next token far better. Measured on plain greedy output of
    Gemma 3 270M and SmolLM2-135M on llama.cpp (the bench's prompts, 160
    tokens): the first proposed token was accepted 0.47-0.74 after a match of
    exactly 3 tokens, 0.82-0.98 after one of 9 or more. Buckets, not the
    length itself: each context learns its own acceptance (``k="auto"``),
    and fewer contexts learn faster (replayed on the models' own text,
    ``python -m benchmarks.bench_auto_replay``: 4-7 and 8+ pooled beat one
    context per length).
    """
    m = n
    while m < _LONG_MATCH and e - m >= 0 and \
            data[_WORD * (e - m): _WORD * (e - m + 1)] == data[_WORD * (length - 1 - m): _WORD * (length - m)]:
        m += 1
    return m if m < 4 else (4 if m < _LONG_MATCH else _LONG_MATCH)


# No proposal: one shared 0-element int64 tensor (nothing in it to modify), not a new one per call.
_EMPTY = torch.empty(0, dtype=torch.int64)


# ----------------------------------------------------------------------------
# The draft
# ----------------------------------------------------------------------------


class PromptLookupDraft:
    """A ``draft_step`` that proposes what followed the current n-gram earlier in the prefix.

    Parameters
    ----------
    max_ngram : int, default 3
        Longest n-gram matched, ``>= min_ngram``.
    min_ngram : int, default 1
        Shortest n-gram matched, ``>= 1``.

    Attributes
    ----------
    calls, proposed, empty : int
        Calls answered, tokens proposed in all, and calls that proposed nothing.
    context : int or list of int
        The last call's match length, bucketed: 1, 2 or 3 (the matched
        n-gram), 4 (a match of 4-7 tokens: the n-gram and the tokens before
        it agree) or 8 (8 or more); 0: no proposal. After ``batched``, one
        per sequence. ``k="auto"`` keeps its acceptance estimates per
        context: a long match is a copy in progress far more often than a
        1-gram one (DESIGN.md, "k = auto": looking ahead).

    See Also
    --------
    SpeculativeDecoder : takes ``PromptLookupDraft()`` as its ``draft_step``;
        with ``k="auto"`` it speculates only where the measured costs say it pays.
    BatchedSpeculativeDecoder : takes ``PromptLookupDraft().batched``.

    Notes
    -----
    A call copies the prefix's bytes once and searches them from the end
    (``bytes.rfind``; Note [Lookup on bytes] in this module): ~15 us warm for
    300 to 3,000 tokens, ~140 us with cold caches, the same at any length
    (Xeon). It keeps no state between calls, so rollback, prompts and
    batches need no bookkeeping. Proposals never depend on the verifier's uniforms, which is
    what keeps sampled decoding exact (DESIGN.md, "Prompt lookup").

    Examples
    --------
    >>> import torch
    >>> draft = PromptLookupDraft(max_ngram=2)
    >>> tokens, rows = draft(torch.tensor([5, 6, 7, 8, 9, 5, 6]), 3)   # "5 6" was followed by 7 8 9
    >>> tokens.tolist(), rows
    ([7, 8, 9], None)
    >>> draft(torch.tensor([1, 2, 3]), 3)[0].tolist()                  # no earlier occurrence
    []
    >>> draft(torch.tensor([1, 2, 7, 1, 2]), 5)[0].tolist()            # cut at the end of the prefix
    [7, 1, 2]
    >>> draft(torch.tensor([4, 1, 2, 1, 2]), 5)[0].tolist()            # "1 2" twice: a loop, continued
    [1, 2, 1, 2, 1]
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.min_ngram = check_int("min_ngram", min_ngram, 1)
        self.max_ngram = check_int("max_ngram", max_ngram, 1)
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram, got max_ngram={max_ngram} < min_ngram={min_ngram}")
        self.calls = self.proposed = self.empty = 0
        self.context = 0

    def __call__(self, prefix: torch.Tensor, k: int):
        """``(tokens [m], None)`` with ``m <= k``: the single-sequence ``draft_step``.

        Parameters
        ----------
        prefix : torch.Tensor
            ``[L]`` integer token ids, prompt plus output (read, never modified).
        k : int
            Most tokens to propose, ``>= 0``.

        Returns
        -------
        tuple[torch.Tensor, None]
            ``[m]`` int64 proposed tokens (``m = 0`` when nothing matches) and
            ``None``: point-mass rows.
        """
        if type(k) is not int or k < 0:
            k = check_int("k", k, 0)  # raises: bools, non-ints and negatives are named errors
        if not (type(prefix) is torch.Tensor and prefix.dtype is torch.int64 and prefix.is_cpu
                and prefix.dim() == 1):
            prefix = _as_prefix(prefix, "prefix")  # the decoders' prefixes skip this: no torch call
        tokens, self.context = _lookup(prefix, k, self.max_ngram, self.min_ngram) if k else (_EMPTY, 0)
        self.calls += 1
        self.proposed += len(tokens)
        self.empty += int(len(tokens) == 0)
        return tokens, None

    def batched(self, prefixes: list, k: int, rows=None):
        """``(tokens [n, m], None, num_tokens [n])``: the batched ``draft_step``.

        Parameters
        ----------
        prefixes : list of torch.Tensor
            ``n`` 1-D integer prefixes.
        k : int
            Most tokens to propose per sequence, ``>= 0``.
        rows : list of int, optional
            The sequences' batch indices (``BatchedSpeculativeDecoder`` passes
            them); unused: a lookup needs only the prefix.

        Returns
        -------
        tuple[torch.Tensor, None, torch.Tensor]
            ``[n, m]`` int64 proposals, ``m`` the longest, padded with 0 past
            each sequence's own count (never read); ``None``; and
            ``num_tokens [n]`` int64, each sequence's count.
        """
        if not isinstance(prefixes, (list, tuple)):
            raise TypeError(f"prefixes must be a list of 1-D tensors, got {type(prefixes).__name__}")
        found, context = [], []
        for b, p in enumerate(prefixes):
            found.append(self(_as_prefix(p, f"prefixes[{b}]"), k)[0])
            context.append(self.context)
        self.context = context
        counts = torch.tensor([len(t) for t in found], dtype=torch.int64)
        width = int(counts.max()) if len(found) else 0
        tokens = torch.zeros((len(found), width), dtype=torch.int64)
        for b, t in enumerate(found):
            tokens[b, : len(t)] = t
        return tokens, None, counts

    def __repr__(self) -> str:
        return f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


def _as_prefix(prefix, name: str) -> torch.Tensor:
    """A 1-D int64 CPU view of ``prefix``, or a named error."""
    if not isinstance(prefix, torch.Tensor):
        raise TypeError(f"{name} must be a 1-D integer tensor, got {type(prefix).__name__}")
    if prefix.dtype.is_floating_point or prefix.dtype.is_complex or prefix.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {prefix.dtype}")
    if prefix.dim() != 1:
        raise ValueError(f"{name} must be 1-D [L], got shape {tuple(prefix.shape)}")
    if prefix.is_meta:
        raise ValueError(f"{name} is a meta tensor: it has no token ids to read")
    return prefix.to(device="cpu", dtype=torch.int64)
