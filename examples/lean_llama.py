"""A lean forward for a small transformers Llama: the draft's runtime in ``examples/e2e.py``.

    lean = LeanLlama(hf_llama)                 # same weights, no copy of the model's code
    out = lean(ids[None], use_cache=True)      # .logits [1, T, V], .past_key_values
    out = lean(next_ids[None], past_key_values=out.past_key_values, use_cache=True)

Why: a one-token forward of the 1.2 M-parameter draft through transformers'
``LlamaForCausalLM`` costs ~0.54 ms, nearly all of it per-op Python and
dispatch, not arithmetic. A speculative round runs k of them, so
the draft's runtime, not its weights, sets a third of the round's cost. This
forward computes the same function with ~20 ops per layer (0.28 ms):

* q, k, v in one matmul and gate, up in one (weights concatenated once);
* ``F.rms_norm`` for transformers' RMSNorm; rotary tables for every position
  taken once from the model's own ``rotary_emb``, so they are its values;
* a preallocated KV cache: appending writes in place, ``crop`` moves a length.

It answers the call ``HFCausalLMStep`` makes, ``model(input_ids [1, T],
past_key_values=cache, use_cache=True)``, so the adapter runs it unchanged.
Only the draft runs here: the draft's numbers decide speed, never the output
(greedy output is the target's argmax; sampled output follows the target's
law for any draft), and the target stays on transformers, like the baseline.
The logits equal transformers' to float32 rounding (``tests/test_model_pair.py``).

Scope (checked, with a clear error otherwise): ``LlamaForCausalLM`` without
attention or MLP biases, default rope (no scaling), batch size 1, at most
``max_position_embeddings`` positions, float32.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F


class LeanCache:
    """Preallocated keys and values ``[layers, kv_heads, max_len, head_dim]`` and a length.

    ``crop(n)`` with ``n < 0`` forgets the last ``-n`` positions (transformers'
    ``DynamicCache.crop`` convention); ``n >= 0`` keeps the first ``n``.
    """

    def __init__(self, layers: int, kv_heads: int, max_len: int, head_dim: int) -> None:
        self.keys = torch.zeros(layers, kv_heads, max_len, head_dim)
        self.values = torch.zeros(layers, kv_heads, max_len, head_dim)
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        keep = self.length + n if n < 0 else n
        if not 0 <= keep <= self.length:
            raise ValueError(f"crop({n}) on a cache of {self.length} positions: keep must lie in [0, {self.length}]")
        self.length = keep


class LeanLlama:
    """``LlamaForCausalLM``'s forward with fewer ops; see the module docstring."""

    def __init__(self, model) -> None:
        cfg = model.config
        if getattr(cfg, "model_type", None) != "llama":
            raise ValueError(f"LeanLlama runs Llama models, got model_type {getattr(cfg, 'model_type', None)!r}")
        # transformers 5 keeps the rope settings in rope_parameters (4.x: rope_scaling).
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"LeanLlama supports the default rope only, got {rope}")
        if cfg.attention_bias or cfg.mlp_bias or cfg.hidden_act != "silu":
            raise ValueError("LeanLlama supports bias-free SwiGLU (silu) Llama layers only")
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

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.max_len, self.head_dim)

    # -- forward -----------------------------------------------------------------

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, past_key_values: LeanCache | None = None, use_cache: bool = True):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, T] (batch size 1), got shape {tuple(input_ids.shape)}")
        cache = past_key_values if past_key_values is not None else self.new_cache()
        if not isinstance(cache, LeanCache):
            raise TypeError(f"past_key_values must be a LeanCache from this model, got {type(cache).__name__}")
        steps, start = input_ids.shape[1], cache.length
        end = start + steps
        if end > self.max_len:
            raise ValueError(f"{end} positions exceed max_position_embeddings = {self.max_len}")
        x = self.embed[input_ids[0]]  # [T, d]
        cos, sin = self.cos[start:end].unsqueeze(1), self.sin[start:end].unsqueeze(1)  # [T, 1, hd]
        # Causal within the new tokens; every cached position is visible. One
        # new token sees everything, so it needs no mask.
        mask = None
        if steps > 1:
            mask = torch.ones(steps, end, dtype=torch.bool).tril(diagonal=start)
        for index, layer in enumerate(self.layers):
            x = x + self._attention(index, layer, F.rms_norm(x, (self.hidden,), layer.input_norm, self.eps),
                                    cache, start, end, cos, sin, mask)
            h = F.rms_norm(x, (self.hidden,), layer.post_norm, self.eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        cache.length = end
        logits = F.linear(F.rms_norm(x, (self.hidden,), self.final_norm, self.eps), self.lm_head)
        return SimpleNamespace(logits=logits.unsqueeze(0), past_key_values=cache)

    def _attention(self, index, layer, h, cache, start, end, cos, sin, mask):
        steps, hd = h.shape[0], self.head_dim
        qkv = F.linear(h, layer.qkv).view(steps, self.heads + 2 * self.kv_heads, hd)
        # Rotary on q and k together (transformers' rotate_half convention).
        qk = qkv[:, : self.heads + self.kv_heads]
        half = hd // 2
        rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
        qk = qk * cos + rotated * sin
        q = qk[:, : self.heads].transpose(0, 1)  # [H, T, hd]
        cache.keys[index, :, start:end] = qk[:, self.heads :].transpose(0, 1)
        cache.values[index, :, start:end] = qkv[:, self.heads + self.kv_heads :].transpose(0, 1)
        keys, values = cache.keys[index, :, :end], cache.values[index, :, :end]
        if self.kv_heads != self.heads:  # grouped-query attention: share each kv head
            repeat = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(repeat, 0), values.repeat_interleave(repeat, 0)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [H, T, hd]
        return F.linear(out.transpose(0, 1).reshape(steps, self.heads * hd), layer.o)
