"""A lean forward for a small transformers Llama draft, batched: the draft's runtime here and in ``examples/e2e.py``.

    lean = LeanLlama(hf_llama)                   # same weights, no copy of the model's code
    out = lean(input_ids=ids, use_cache=True)    # ids [n, T]: .logits [n, T, V], .past_key_values
    out = lean(input_ids=next_ids, attention_mask=mask, position_ids=pos,
               past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)

Why: a one-token forward of the 1.2 M-parameter draft through transformers'
``LlamaForCausalLM`` costs ~0.54 ms, nearly all of it per-op Python and
dispatch, not arithmetic. A speculative round runs k of them, so the draft's
runtime, not its weights, sets a third of the round's cost. This forward
computes the same function with ~20 ops per layer (~0.28 ms):

* q, k, v in one matmul and gate, up in one (weights concatenated once);
* ``F.rms_norm`` for transformers' RMSNorm; rotary tables for every position
  taken once from the model's own ``rotary_emb``, so they are its values;
* its own KV cache (``LeanCache``): appending writes in place into a buffer
  grown by doubling, ``crop`` moves a length, ``batch_select_indices`` keeps
  rows.

It answers the calls both adapters of the kernel package make -- ``model(
input_ids [n, W], attention_mask [n, S + W], position_ids [n, W],
past_key_values=cache, use_cache=True, logits_to_keep=keep)``, the mask and
positions optional (``HFBatchedCausalLM``, Note [Holes in the lean
forward]), and ``model(input_ids [1, T], past_key_values=cache,
use_cache=True)`` (``HFCausalLMStep``) -- so they run it unchanged.

Only the draft runs here, never the target: the draft's numbers decide speed,
never the output (greedy output is the target's argmax; sampled output follows
the target's law for any draft, because the rows returned are the very rows
the draft tokens were drawn from). The logits equal transformers' to float32
rounding (``tests/test_lean_llama.py``, holes, crops and row selection
included).

Scope (checked by ``LeanLlama``, a ``ValueError`` otherwise; ``supports``
says it without raising): ``LlamaForCausalLM`` without attention or MLP
biases, SiLU, the default rope (no scaling), on the CPU; any float dtype
(computed in float32); at most ``max_position_embeddings`` positions.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import torch
import torch.nn.functional as F

__all__ = ["LeanCache", "LeanLlama", "lean_for", "supports"]


# ----------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------


class LeanCache:
    """Keys and values ``[layers, n, kv_heads, capacity, head_dim]`` and a length in slots.

    ``crop(n)`` with ``n < 0`` forgets the last ``-n`` slots (transformers'
    ``DynamicCache.crop`` convention); ``n >= 0`` keeps the first ``n``.
    ``batch_select_indices(index)`` keeps the rows ``index``, in that order.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int) -> None:
        self.keys = torch.zeros(layers, batch, kv_heads, capacity, head_dim)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        keep = self.length + n if n < 0 else n
        if not 0 <= keep <= self.length:
            raise ValueError(f"crop({n}) on a cache of {self.length} positions: keep must lie in [0, {self.length}]")
        self.length = keep

    def batch_select_indices(self, index) -> None:
        index = torch.as_tensor(index, dtype=torch.int64).view(-1)
        if len(index) and not 0 <= int(index.min()) <= int(index.max()) < self.batch:
            raise IndexError(f"batch_select_indices: rows {index.tolist()} outside [0, {self.batch})")
        self.keys, self.values = self.keys[:, index], self.values[:, index]

    def reserve(self, end: int) -> None:
        """Room for ``end`` slots (doubling: appends stay amortized O(1) copies)."""
        capacity = self.keys.shape[3]
        if end <= capacity:
            return
        grown = max(end, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[:3] + (grown,) + old.shape[4:])
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------


def _unsupported(model) -> str | None:
    """Why ``LeanLlama`` cannot run ``model``, or None."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) != "llama":
        return f"LeanLlama runs Llama models, got model_type {getattr(cfg, 'model_type', None)!r}"
    # transformers 5 keeps the rope settings in rope_parameters (4.x: rope_scaling).
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"LeanLlama supports the default rope only, got {rope}"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False) or cfg.hidden_act != "silu":
        return "LeanLlama supports bias-free SwiGLU (silu) Llama layers only"
    if any(p.device.type != "cpu" for p in model.parameters()):
        return "LeanLlama runs on the CPU only"
    return None


def supports(model) -> bool:
    """Whether ``LeanLlama(model)`` would run (see the module docstring's scope)."""
    try:
        return _unsupported(model) is None
    except AttributeError:
        return False


class LeanLlama:
    """``LlamaForCausalLM``'s forward with fewer ops, batched; see the module docstring.

    Parameters
    ----------
    model : transformers ``LlamaForCausalLM``
        Its weights are read once (copied to float32, q/k/v and gate/up
        concatenated); later changes to them are not seen.
    """

    def __init__(self, model) -> None:
        reason = _unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        cfg = model.config
        self.config = cfg
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.max_len = cfg.max_position_embeddings
        self.hidden = cfg.hidden_size

        def f32(t):
            return t.detach().to(torch.float32).contiguous()

        inner = model.model
        self.embed = f32(inner.embed_tokens.weight)
        self.lm_head = f32(model.lm_head.weight)
        self.final_norm = f32(inner.norm.weight)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(SimpleNamespace(
                input_norm=f32(layer.input_layernorm.weight),
                qkv=f32(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                o=f32(attn.o_proj.weight),
                post_norm=f32(layer.post_attention_layernorm.weight),
                gate_up=f32(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                down=f32(mlp.down_proj.weight),
            ))
        # The model's own rotary tables for every position: [max_len, head_dim].
        with torch.no_grad():
            positions = torch.arange(self.max_len).view(1, -1)
            cos, sin = inner.rotary_emb(self.embed[:1].view(1, 1, -1), positions)
        self.cos, self.sin = f32(cos[0]), f32(sin[0])

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def new_cache(self, batch: int = 1, capacity: int = 256) -> LeanCache:
        return LeanCache(len(self.layers), batch, self.kv_heads, min(capacity, self.max_len), self.head_dim)

    # -- forward -----------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: LeanCache | None = None,
                use_cache: bool = True, logits_to_keep: int = 0):
        """Logits ``[n, W, V]`` float32 (the last ``logits_to_keep`` columns when > 0) and the cache."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a [n, W] tensor, got {getattr(input_ids, 'shape', input_ids)!r}")
        n, width = input_ids.shape
        cache = past_key_values if past_key_values is not None else self.new_cache(n)
        if not isinstance(cache, LeanCache):
            raise TypeError(f"past_key_values must be a LeanCache from this model, got {type(cache).__name__}")
        if cache.batch != n:
            raise ValueError(f"input_ids has {n} rows and the cache {cache.batch}")
        start = cache.length
        end = start + width
        if attention_mask is not None and tuple(attention_mask.shape) != (n, end):
            raise ValueError(f"attention_mask must be [n, cache + W] = [{n}, {end}], got "
                             f"{tuple(attention_mask.shape)}")
        if position_ids is None:
            if end > self.max_len:
                raise ValueError(f"{end} positions exceed max_position_embeddings = {self.max_len}")
            cos, sin = self.cos[start:end], self.sin[start:end]  # [W, hd]: one position per column
        else:
            if tuple(position_ids.shape) != (n, width):
                raise ValueError(f"position_ids must be [n, W] = [{n}, {width}], got {tuple(position_ids.shape)}")
            if width and not 0 <= int(position_ids.min()) <= int(position_ids.max()) < self.max_len:
                raise ValueError(f"position_ids outside [0, max_position_embeddings = {self.max_len})")
            cos, sin = self.cos[position_ids], self.sin[position_ids]  # [n, W, hd]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
        mask = _attention_mask(attention_mask, width, start, end)
        cache.reserve(end)
        x = self.embed[input_ids]  # [n, W, d]
        for index, layer in enumerate(self.layers):
            x = x + self._attention(index, layer, F.rms_norm(x, (self.hidden,), layer.input_norm, self.eps),
                                    cache, start, end, cos, sin, mask)
            h = F.rms_norm(x, (self.hidden,), layer.post_norm, self.eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        cache.length = end
        if 0 < logits_to_keep < width:
            x = x[:, -logits_to_keep:]  # the lm head is a fifth of the draft: only the rows read
        logits = F.linear(F.rms_norm(x, (self.hidden,), self.final_norm, self.eps), self.lm_head)
        return SimpleNamespace(logits=logits, past_key_values=cache)

    __call__ = forward

    def _attention(self, index, layer, h, cache, start, end, cos, sin, mask):
        n, width, hd = h.shape[0], h.shape[1], self.head_dim
        qkv = F.linear(h, layer.qkv).view(n, width, self.heads + 2 * self.kv_heads, hd)
        # Rotary on q and k together (transformers' rotate_half convention).
        qk = qkv[:, :, : self.heads + self.kv_heads]
        half = hd // 2
        rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
        qk = qk * cos + rotated * sin
        q = qk[:, :, : self.heads].transpose(1, 2)  # [n, H, W, hd]
        cache.keys[index, :, :, start:end] = qk[:, :, self.heads :].transpose(1, 2)
        cache.values[index, :, :, start:end] = qkv[:, :, self.heads + self.kv_heads :].transpose(1, 2)
        keys, values = cache.keys[index, :, :, :end], cache.values[index, :, :, :end]  # [n, KV, S + W, hd]
        if self.kv_heads != self.heads:  # grouped-query attention: share each kv head
            repeat = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(repeat, 1), values.repeat_interleave(repeat, 1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [n, H, W, hd]
        return F.linear(out.transpose(1, 2).reshape(n, width, self.heads * hd), layer.o)


# One LeanLlama per model, with the weights it copied: made again when a
# parameter was replaced or written in place (its tensor or its version moved).
_MADE = weakref.WeakKeyDictionary()


def lean_for(model) -> LeanLlama:
    """``LeanLlama(model)``, made once per model and again when its weights change."""
    weights = tuple((p.data_ptr(), p._version) for p in model.parameters())
    made = _MADE.get(model)
    if made is None or made[1] != weights:
        made = (LeanLlama(model), weights)  # raises, naming the reason, for a model out of scope
        _MADE[model] = made
    return made[0]


# Note [Holes in the lean forward]
# --------------------------------
# HFBatchedCausalLM keeps a rejected token's slot (and a prompt's left
# padding) in the cache and masks it out: ``attention_mask [n, S + W]`` is 1
# at the slots that hold a row's sequence, and causality runs over slots. A
# query column that is itself a hole may then see no key at all (a
# left-padded prompt's first columns); softmax over nothing is NaN, and a NaN
# in a hole's keys or values would reach every later query through
# ``0 * NaN`` in the attention product, masked or not. So a query that sees
# nothing is let see everything, as transformers' SDPA masks do: its output
# is finite and, being a hole's, never read.


def _attention_mask(attention_mask, width: int, start: int, end: int):
    """SDPA's boolean mask (True = attend): ``None``, ``[W, S + W]`` or ``[n, 1, W, S + W]``."""
    if attention_mask is None:
        if width == 1:
            return None  # one new token sees every cached one: no mask at all
        return torch.ones(width, end, dtype=torch.bool).tril(diagonal=start)
    causal = torch.ones(width, end, dtype=torch.bool).tril(diagonal=start)
    mask = causal & attention_mask.to(torch.bool)[:, None, :]  # [n, W, S + W]
    blind = ~mask.any(dim=-1, keepdim=True)  # Note [Holes in the lean forward]
    return (mask | blind).unsqueeze(1)
