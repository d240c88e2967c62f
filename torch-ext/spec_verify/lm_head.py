"""``LMHead``: the target's output projection, and the logits function it defines.

``verify_hidden`` / ``sample_hidden`` (``hidden.py``) take hidden states and
an ``LMHead`` instead of logits. The logits are one defined function
(DESIGN.md, Note [LM head logits]), written here in torch
(``reference_logits``) and in C++ (``csrc/cpu/hidden_impl.h``, ``q8_impl.h``),
bit for bit. Dense heads: weights widened exactly, float32 dot products in a
fixed order (16 lanes of fused multiply-adds, then a halving tree), then the
bias. Q8_0 heads: ggml's Q8_0 x Q8_0 dot (the rows quantized per 32-block,
exact int32 block sums, a float32 sum over the blocks in order), then the bias.
A Q8_0 head repacked by 16 ids (``LMHead.repacked``, format ``"Q8_0_R16"``:
DESIGN.md, Note [Q8_0 repacked by 16]) holds the same blocks in the order the
kernels read them, and has the same logits, bit for bit.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import gguf
from ._checks import check_vocab

__all__ = ["LMHead", "reference_logits", "quantize_rows_q8_0", "Q8_0_BLOCK", "Q8_0_BYTES", "Q8_0_GROUP"]

# GGUF's Q8_0 block: an fp16 scale then 32 int8 values (34 bytes, no padding).
Q8_0_BLOCK = 32
Q8_0_BYTES = 34
# Ids per group of a head repacked by 16 (Note [Q8_0 repacked by 16]).
Q8_0_GROUP = 16
# The dot product's lanes: lane j accumulates elements j, j + 16, ... (the Note).
LANES = 16
# Format codes shared with the C++ op (csrc/ops_hidden.cpp, kFormatDense / kFormatQ8_0 / kFormatQ8_0R16).
DENSE, Q8_0, Q8_0_R16 = 0, 1, 2
_FORMAT_CODES = {"Q8_0": Q8_0, "Q8_0_R16": Q8_0_R16}
_DENSE_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_GGUF_DENSE = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}
# Vocabulary ids per reference chunk: bounds the [rows, chunk, d] float32 products.
_CHUNK = 2048


class LMHead:
    """An LM head ``logits = W @ h (+ b)``, optionally soft-capped, as ``verify_hidden`` reads it.

    Parameters
    ----------
    weight : torch.Tensor
        ``[V, d]`` float32, bfloat16 or float16 (row ``v`` is token ``v``'s
        output vector; a tied head passes the embedding). Read in place when
        its rows are contiguous, else copied once.
    bias : torch.Tensor, optional
        ``[V]`` float32, bfloat16 or float16, added after the dot product
        (widened exactly to float32).
    softcap : float, optional
        ``cap > 0``: logits become ``cap * tanh(z / cap)`` (Gemma 2's final
        soft-cap). Such a head runs the pure-torch reference on every device
        (DESIGN.md, Note [LM head logits]).

    Attributes
    ----------
    weight : torch.Tensor
        The dense weights, or for Q8_0 the raw blocks as uint8 ``[V, d / 32 * 34]``
        (``"Q8_0_R16"``: the same bytes repacked by 16 ids).
    format : str
        ``"F32"``, ``"F16"``, ``"BF16"``, ``"Q8_0"`` (GGUF's block order) or
        ``"Q8_0_R16"`` (repacked by 16 ids: ``repacked``).
    vocab, dim : int
        ``V`` and ``d``.

    Raises
    ------
    TypeError
        ``weight`` or ``bias`` not a tensor, or of another dtype; ``softcap``
        not a real number.
    ValueError
        ``weight`` not 2-D or empty; ``bias`` not ``[V]``; ``softcap`` not
        positive and finite.

    Examples
    --------
    >>> import torch
    >>> head = LMHead(torch.eye(3))
    >>> reference_logits(head, torch.tensor([[0.0, 2.0, 1.0]])).tolist()
    [[0.0, 2.0, 1.0]]
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, softcap: float | None = None):
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if weight.dtype not in _DENSE_DTYPES:
            raise TypeError(f"weight must be float32, float16 or bfloat16, got {weight.dtype}")
        if weight.dim() != 2:
            raise ValueError(f"weight must have 2 dimensions [V, d], got shape {tuple(weight.shape)}")
        check_vocab("weight", weight.shape[0])
        if weight.shape[1] < 1:
            raise ValueError("weight must have a hidden size of at least 1 (d >= 1)")
        if weight.is_meta:
            raise ValueError("weight is a meta tensor: it has no values to read")
        # Rows read in place need unit stride inside each row (one copy otherwise).
        if weight.stride(1) != 1 or weight.stride(0) < weight.shape[1]:
            weight = weight.contiguous()
        self._init(weight, _DENSE_DTYPES[weight.dtype], weight.shape[0], weight.shape[1], bias, softcap)

    def _init(self, weight, fmt, vocab, dim, bias, softcap) -> None:
        self.weight, self.format, self.vocab, self.dim = weight, fmt, int(vocab), int(dim)
        self.bias = _check_bias(bias, self.vocab)
        self.softcap = _check_softcap(softcap)
        # Keeps the file mapping alive as long as a weight view of it (from_gguf).
        self._mapping = None

    @property
    def format_code(self) -> int:
        """The C++ op's ``weight_format``: 0 dense rows of ``weight.dtype``; 1 Q8_0 blocks; 2 repacked by 16."""
        return _FORMAT_CODES.get(self.format, DENSE)

    @property
    def is_q8_0(self) -> bool:
        """A Q8_0 head, in GGUF's block order or repacked (the same logits function)."""
        return self.format in _FORMAT_CODES

    @property
    def nbytes(self) -> int:
        """Bytes of weights one pass reads (the floor's size)."""
        return self.weight.numel() * self.weight.element_size()

    def __repr__(self) -> str:
        extra = "" if self.bias is None else ", bias"
        extra += "" if self.softcap is None else f", softcap={self.softcap}"
        return f"LMHead(V={self.vocab}, d={self.dim}, {self.format}{extra})"

    @classmethod
    def q8_0(cls, blocks: torch.Tensor, dim: int, bias=None, softcap=None) -> "LMHead":
        """A Q8_0 head from raw GGUF blocks: uint8 ``[V, d / 32 * 34]`` (or flat), ``d`` a multiple of 32.

        Raises
        ------
        TypeError
            ``blocks`` not a uint8 tensor.
        ValueError
            ``dim`` not a positive multiple of 32, or ``blocks`` not a whole number of rows.
        """
        if not isinstance(blocks, torch.Tensor) or blocks.dtype != torch.uint8:
            raise TypeError("Q8_0 blocks must be a uint8 torch.Tensor")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < Q8_0_BLOCK or dim % Q8_0_BLOCK:
            raise ValueError(f"a Q8_0 head needs d a positive multiple of 32, got {dim!r}")
        row_bytes = dim // Q8_0_BLOCK * Q8_0_BYTES
        if blocks.numel() % row_bytes or blocks.numel() == 0:
            raise ValueError(f"Q8_0 blocks hold {blocks.numel()} bytes: not a whole number of rows of {row_bytes}")
        head = cls.__new__(cls)
        vocab = check_vocab("weight", blocks.numel() // row_bytes)
        head._init(blocks.reshape(vocab, row_bytes).contiguous(), "Q8_0", vocab, dim, bias, softcap)
        return head

    def repacked(self) -> "LMHead":
        """This Q8_0 head with its blocks repacked by 16 ids: the same logits, read at the memory's pace.

        Per group of 16 ids and block, the 16 fp16 scales then, for k = 0..7, the
        16 ids' k-th 4 int8 values (544 bytes): the vectors the kernels would
        otherwise gather and transpose per call (DESIGN.md, Note [Q8_0 repacked
        by 16]). The last ``V % 16`` ids stay in GGUF's order. A copy of the
        weights (``nbytes`` more memory; the file's mapping is released), made
        once; a head already repacked is returned as it is.

        Raises
        ------
        ValueError
            The head is not Q8_0.

        See Also
        --------
        LMHead.from_gguf : repacks a Q8_0 head by default (``repack=False``: in place).
        LMHead.gguf_blocks : the blocks back in GGUF's order.

        Examples
        --------
        >>> import torch
        >>> head = LMHead.q8_0(torch.zeros(20, 34, dtype=torch.uint8), 32)
        >>> packed = head.repacked()
        >>> packed, packed.format_code, torch.equal(packed.gguf_blocks(), head.weight)
        (LMHead(V=20, d=32, Q8_0_R16), 2, True)
        """
        if self.format == "Q8_0_R16":
            return self
        if self.format != "Q8_0":
            raise ValueError(f"only a Q8_0 head can be repacked by 16, this one is {self.format}")
        head = type(self).__new__(type(self))
        head._init(_repack_q8_0(self.weight, self.dim), "Q8_0_R16", self.vocab, self.dim, self.bias, self.softcap)
        return head

    @classmethod
    def from_gguf(cls, path, tensor: str | None = None, *, softcap: float | None = None,
                  repack: bool = True) -> "LMHead":
        """The LM head of a GGUF file: dense types read in place (mmap, no copy), Q8_0 repacked by 16 ids.

        Parameters
        ----------
        path : str or os.PathLike
            A GGUF (v2 or v3) file.
        tensor : str, optional
            The tensor to read; default ``output.weight``, else the tied
            ``token_embd.weight``.
        softcap : float, optional
            As in ``LMHead`` (GGUF keeps it as ``<arch>.final_logit_softcapping``,
            which is not read: pass it).
        repack : bool, default True
            A Q8_0 tensor comes back ``repacked()`` (a copy of the head's
            bytes, whose one-row logits run ~3x faster on x86: DESIGN.md, Note
            [Q8_0 repacked by 16]); ``False`` reads it in place. Dense types
            are always read in place.

        Returns
        -------
        LMHead
            In F32, F16, BF16 or Q8_0 as stored, or Q8_0_R16.

        Raises
        ------
        TypeError
            ``repack`` not a bool.
        ValueError
            Not a GGUF file; no such tensor; a tensor that is not 2-D; a type
            other than F32, F16, BF16, Q8_0 (named).
        """
        if not isinstance(repack, bool):
            raise TypeError(f"repack must be a bool, got {type(repack).__name__}")
        path = str(path)
        meta, tensors, mapping = gguf.read_tensor_infos(path)
        names = [tensor] if tensor is not None else ["output.weight", "token_embd.weight"]
        info = next((tensors[n] for n in names if n in tensors), None)
        if info is None:
            raise ValueError(f"{path}: no tensor {' or '.join(repr(n) for n in names)} in the file")
        if len(info.dims) != 2:
            raise ValueError(f"{path}: tensor {info.name!r} has dims {info.dims}, not [d, V]")
        dim, vocab = info.dims
        if info.ggml_type in _GGUF_DENSE:
            dtype = _GGUF_DENSE[info.ggml_type]
            nbytes = dim * vocab * torch.empty((), dtype=dtype).element_size()
            raw = gguf.open_tensor(mapping, info, nbytes)
            head = cls(raw.view(dtype).view(vocab, dim), softcap=softcap)
        elif info.type_name == "Q8_0":
            if dim % Q8_0_BLOCK:
                raise ValueError(f"{path}: Q8_0 tensor {info.name!r} has rows of {dim}, not whole blocks")
            raw = gguf.open_tensor(mapping, info, vocab * (dim // Q8_0_BLOCK) * Q8_0_BYTES)
            head = cls.q8_0(raw, dim, softcap=softcap)
            if repack:
                return head.repacked()  # a copy: the mapping need not outlive this call
        else:
            raise ValueError(
                f"{path}: tensor {info.name!r} is {info.type_name}; LMHead reads F32, F16, BF16 or Q8_0 "
                "(other types' dequantization is not one exact product: DESIGN.md, Note [LM head logits])"
            )
        head._mapping = mapping
        return head

    def dequantized(self, begin: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows ``[begin, end)`` of the weights as float32 ``[n, d]``, exactly as GGUF defines them."""
        end = self.vocab if end is None else end
        if not self.is_q8_0:
            return self.weight[begin:end].float()
        blocks = self.gguf_blocks(begin, end).reshape(end - begin, self.dim // Q8_0_BLOCK, Q8_0_BYTES)
        scale = blocks[..., :2].contiguous().view(torch.float16).float()  # [n, nb, 1]
        q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [n, nb, 32]
        return torch.mul(scale, q).reshape(end - begin, self.dim)  # exact: 11 x 8 significant bits

    def gguf_blocks(self, begin: int = 0, end: int | None = None) -> torch.Tensor:
        """A Q8_0 head's rows ``[begin, end)`` as GGUF stores them: uint8 ``[n, d / 32 * 34]`` (a view if not repacked)."""
        end = self.vocab if end is None else end
        if self.format != "Q8_0_R16":
            return self.weight[begin:end]
        grouped = self.vocab // Q8_0_GROUP * Q8_0_GROUP
        g0, g1 = begin // Q8_0_GROUP, (min(end, grouped) + Q8_0_GROUP - 1) // Q8_0_GROUP
        rows = _unpack_q8_0(self.weight[g0 * Q8_0_GROUP:g1 * Q8_0_GROUP], self.dim)  # ids [16 g0, 16 g1)
        rows = torch.cat([rows, self.weight[max(grouped, g1 * Q8_0_GROUP):end]])  # the tail, as stored
        return rows[begin - g0 * Q8_0_GROUP:end - g0 * Q8_0_GROUP]


def _check_bias(bias, vocab: int):
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.dtype not in _DENSE_DTYPES:
        raise TypeError(f"bias must be float32, float16 or bfloat16, got {bias.dtype}")
    if tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias must have shape [V] = [{vocab}], got {tuple(bias.shape)}")
    return bias.float().contiguous()


def _check_softcap(softcap):
    if softcap is None:
        return None
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be a real number or None, got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be positive and finite, got {softcap}")
    return float(softcap)


def _repack_q8_0(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """GGUF-order Q8_0 rows uint8 ``[V, row_bytes]`` -> the same bytes repacked by 16 (Note [Q8_0 repacked by 16])."""
    vocab, nb = rows.shape[0], dim // Q8_0_BLOCK
    grouped = vocab // Q8_0_GROUP * Q8_0_GROUP
    if grouped == 0:  # all tail
        return rows.clone()
    blocks = rows[:grouped].reshape(grouped // Q8_0_GROUP, Q8_0_GROUP, nb, Q8_0_BYTES)  # [G, id, b, 34]
    # Moved as int16 scales and int32 dwords (the 2- and 4-byte units the layout keeps together): 4x fewer
    # elements to permute than bytes (Gemma 3 270M's head: 0.5 s against 2 s).
    scales = blocks[..., :2].contiguous().view(torch.int16)[..., 0].permute(0, 2, 1)  # [G, b, id]
    values = blocks[..., 2:].contiguous().view(torch.int32).permute(0, 2, 3, 1)  # [G, b, k, id]
    groups = torch.cat([scales.contiguous().view(torch.uint8).reshape(-1, nb, 32),
                        values.contiguous().view(torch.uint8).reshape(-1, nb, 512)], -1)  # [G, b, 544]
    return torch.cat([groups.reshape(grouped, nb * Q8_0_BYTES), rows[grouped:]]).contiguous()


def _unpack_q8_0(groups: torch.Tensor, dim: int) -> torch.Tensor:
    """Whole repacked groups uint8 ``[16 G, row_bytes]`` -> their rows in GGUF's order (``_repack_q8_0``'s inverse)."""
    nb = dim // Q8_0_BLOCK
    chunks = groups.reshape(-1, nb, Q8_0_GROUP * Q8_0_BYTES)  # [G, b, 544]
    scales = chunks[..., :32].reshape(-1, nb, Q8_0_GROUP, 2).permute(0, 2, 1, 3)  # [G, id, b, 2]
    values = chunks[..., 32:].reshape(-1, nb, 8, Q8_0_GROUP, 4).permute(0, 3, 1, 2, 4)  # [G, id, b, k, 4]
    blocks = torch.cat([scales, values.reshape(-1, Q8_0_GROUP, nb, 32)], -1)  # [G, id, b, 34]
    return blocks.reshape(-1, nb * Q8_0_BYTES)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 ``fma(a, b, c)``: ``a * b + c`` rounded once, exactly as the FMA instruction.

    In float64: ``a * b`` is exact (24 + 24 significant bits); the sum with
    ``c`` is rounded to float64 *to odd* (round to nearest, then, if inexact
    -- its exact error from TwoSum -- and the last bit is even, one ulp toward
    the exact value), and then to float32 to nearest. Round-to-odd at 53 bits
    followed by round-to-nearest at 24 (53 >= 24 + 2) is the correctly
    rounded float32 result (Boldo and Melquiond, "Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd", 2008).
    """
    p = torch.mul(a.double(), b.double())
    cd = c.double()
    s = torch.add(p, cd)
    bb = torch.sub(s, p)
    err = torch.add(torch.sub(p, torch.sub(s, bb)), torch.sub(cd, bb))  # TwoSum: s + err == p + c exactly
    even = torch.bitwise_and(s.view(torch.int64), 1) == 0
    fix = (err != 0) & even & torch.isfinite(s)
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    return torch.where(fix, torch.nextafter(s, toward), s).float()


def fixed_order_dot(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``w [m, d] . h [n, d]`` -> float32 ``[n, m]`` in the Note's order (16 lanes of fma, then the tree)."""
    d = w.shape[1]
    padded = (d + LANES - 1) // LANES * LANES
    if padded != d:  # zero elements: each lane adds fma(0, 0, s) = s (the Note's padding)
        w = torch.nn.functional.pad(w, (0, padded - d))
        h = torch.nn.functional.pad(h, (0, padded - d))
    wc = w.reshape(1, w.shape[0], padded // LANES, LANES)
    hc = h.reshape(h.shape[0], 1, padded // LANES, LANES)
    acc = torch.zeros(h.shape[0], w.shape[0], LANES, dtype=torch.float32, device=w.device)
    for c in range(padded // LANES):
        acc = fma32(wc[:, :, c, :], hc[:, :, c, :], acc)  # lane j: elements j, j + 16, ... in order
    for half in (8, 4, 2, 1):
        acc = torch.add(acc[..., :half], acc[..., half:2 * half])
    return acc[..., 0]


# ----------------------------------------------------------------------------
# Q8_0 heads: ggml's Q8_0 x Q8_0 dot
# ----------------------------------------------------------------------------


def quantize_rows_q8_0(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[n, d]`` (d a multiple of 32) quantized as ggml's ``quantize_row_q8_0_ref``.

    Per block of 32 of the float32 row: ``amax = max |x|``, ``d = amax / 127``,
    ``id = 1 / d`` (0 if ``d == 0``), ``q = roundf(x * id)`` (half away from
    zero), scale ``fp16(d)`` (to nearest even) widened. A block holding NaN or
    inf, or whose scale overflows fp16, gets ``q = 0`` and scale NaN (its row's
    logits are NaN, which the ops refuse); a zero scale gets ``q = 0`` (its
    terms are 0 whatever ``q``). DESIGN.md, Note [LM head logits].

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``q`` int8 ``[n, d / 32, 32]`` in ``[-127, 127]`` and the scales float32 ``[n, d / 32]``.
    """
    x = hidden.float().reshape(hidden.shape[0], -1, Q8_0_BLOCK)
    finite = torch.isfinite(x).all(-1)
    x = torch.where(finite[..., None], x, torch.zeros_like(x))
    d = torch.div(x.abs().amax(-1), 127.0)
    scale = d.to(torch.float16).float()
    refused = ~finite | ~torch.isfinite(scale)
    inv = torch.where(d != 0, torch.div(torch.ones_like(d), d), torch.zeros_like(d))
    v = torch.mul(x, inv[..., None]).double()  # float32 product, widened exactly
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)  # roundf, exact in float64 (|v| <= 127.00004)
    q = torch.where((refused | (scale == 0))[..., None], torch.zeros_like(q), q.clamp(-127, 127))
    return q.to(torch.int8), torch.where(refused, torch.full_like(scale, math.nan), scale)


def q8_0_dot(head: LMHead, begin: int, end: int, q: torch.Tensor, sx: torch.Tensor) -> torch.Tensor:
    """Ids ``[begin, end)`` of a Q8_0 head against quantized rows ``q, sx`` -> float32 ``[n, end - begin]``.

    Per id and row: ``acc = +0``, then for each block in order
    ``acc = acc + float(sumi) * (dw * dx)``, each float32 op rounded
    (``dw * dx`` and ``float(sumi)`` are exact); ``sumi`` is the block's 32
    int8 products, summed exactly (float64 of integers below 2^53).
    """
    blocks = head.gguf_blocks(begin, end).reshape(end - begin, head.dim // Q8_0_BLOCK, Q8_0_BYTES).to(q.device)
    dw = blocks[..., :2].contiguous().view(torch.float16).float()[..., 0]  # [m, nb]
    qw = blocks[..., 2:].contiguous().view(torch.int8)  # [m, nb, 32]
    sumi = torch.einsum("nbk,mbk->nmb", q.double(), qw.double()).float()  # exact: |sumi| < 2^20
    term = torch.mul(sumi, torch.mul(dw[None], sx[:, None]))  # [n, m, nb]
    acc = torch.zeros(q.shape[0], end - begin, dtype=torch.float32, device=q.device)
    for b in range(term.shape[-1]):
        acc = torch.add(acc, term[..., b])
    return acc


def reference_logits(head: LMHead, hidden: torch.Tensor, begin: int = 0, end: int | None = None) -> torch.Tensor:
    """The head's logits of ``hidden [n, d]`` for ids ``[begin, end)``: float32 ``[n, end - begin]``.

    Computed over V in chunks of 2048 ids (the products of one chunk at a
    time), as DESIGN.md, Note [LM head logits] defines them (dense: the fixed
    order float32 dot; Q8_0: ggml's Q8_0 x Q8_0 dot); then the bias, then the
    soft-cap (float32 ``cap * tanh(z / cap)``).
    """
    end = head.vocab if end is None else end
    h = hidden.float()
    out = torch.empty(h.shape[0], end - begin, dtype=torch.float32, device=h.device)
    if head.is_q8_0:
        q, sx = quantize_rows_q8_0(h)
    for a in range(begin, end, _CHUNK):
        b = min(a + _CHUNK, end)
        if head.is_q8_0:
            out[:, a - begin:b - begin] = q8_0_dot(head, a, b, q, sx)
        else:
            out[:, a - begin:b - begin] = fixed_order_dot(head.dequantized(a, b).to(h.device), h)
    if head.bias is not None:
        out = torch.add(out, head.bias[begin:end].to(h.device))
    return softcapped(out, head.softcap)


def softcapped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``logits`` (float32) with the final soft-cap ``cap * tanh(z / cap)`` in float32, or as they are."""
    if softcap is None:
        return logits
    cap = torch.tensor(softcap, dtype=torch.float32, device=logits.device)
    return torch.mul(torch.tanh(torch.div(logits, cap)), cap)
