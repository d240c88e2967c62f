"""A Hugging Face causal LM without its head: the last hidden states, and its ``LMHead``.

``HiddenStatesLM(model)`` is called as the model is (``input_ids``,
``past_key_values``, ``use_cache``, ``attention_mask``, ``position_ids``,
``logits_to_keep``) but runs only the decoder (``model.get_decoder()``, the
model without its LM head) and answers with an object whose ``.logits`` are
the decoder's last hidden states ``[n, T, d]`` -- after the final norm, what
the head multiplies -- and whose ``.past_key_values`` is the decoder's cache,
the very cache the full model keeps. ``head`` is the model's output
projection as an ``LMHead`` (``get_output_embeddings().weight``, tied or not,
its bias, and ``config.final_logit_softcapping`` when set), so
``verify_hidden(hidden, head, ...)`` computes the model's logits inside the
op (DESIGN.md, Note [LM head logits]: a defined float32 function of these
weights, not torch's matmul bit for bit).

The adapters take it with ``hidden=True`` (``HFCausalLMStep``,
``HFBatchedCausalLM``): their ``target_step`` then returns hidden states,
they carry ``head``, and the decoders verify with ``verify_hidden``
(``head=``). Everything the adapters do with the cache (crops, sliding
windows, masks, positions) is unchanged: only the last matmul moves.

transformers is never imported here (the kernel package imports torch alone):
the model is duck-typed.
"""

from __future__ import annotations

import torch

from .lm_head import LMHead

__all__ = ["HiddenStatesLM"]


class _Output:
    __slots__ = ("logits", "past_key_values")

    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class HiddenStatesLM:
    """A causal LM called for its last hidden states; ``head`` is its LM head.

    Parameters
    ----------
    model : transformers-style causal LM
        With ``get_decoder()`` (the model without its head; transformers'
        ``*ForCausalLM``), whose output has ``.last_hidden_state`` and
        ``.past_key_values``, and ``get_output_embeddings()`` (the head, a
        linear layer with ``.weight [V, d]``).
    head : LMHead, optional
        The head to carry instead of the model's own (e.g. a bfloat16 copy:
        half the bytes, other logits -- plain decoding with the same head
        reads the same ones).

    Attributes
    ----------
    head : LMHead
        The model's output projection (float32, float16 or bfloat16 as stored).
    config
        The model's ``config`` (read by the adapters for its sliding window).

    Raises
    ------
    TypeError
        A model without ``get_decoder`` / ``get_output_embeddings``, or a head
        that is not an ``LMHead``.
    """

    def __init__(self, model, head: LMHead | None = None) -> None:
        get_decoder = getattr(model, "get_decoder", None)
        get_head = getattr(model, "get_output_embeddings", None)
        if not callable(get_decoder) or not callable(get_head):
            raise TypeError(f"{type(model).__name__} has no get_decoder() / get_output_embeddings(): hidden states "
                            "need a transformers-style causal LM")
        self.model = model
        self.decoder = get_decoder()
        self.config = getattr(model, "config", None)
        if head is None:
            linear = get_head()
            weight = getattr(linear, "weight", None)
            if not isinstance(weight, torch.Tensor):
                raise TypeError(f"{type(model).__name__}.get_output_embeddings() has no weight tensor")
            bias = getattr(linear, "bias", None)
            softcap = getattr(self.config, "final_logit_softcapping", None)
            head = LMHead(weight.detach(), None if bias is None else bias.detach(), softcap=softcap or None)
        elif not isinstance(head, LMHead):
            raise TypeError(f"head must be an LMHead or None, got {type(head).__name__}")
        self.head = head

    @property
    def device(self) -> torch.device:
        return getattr(self.model, "device", torch.device("cpu"))

    def parameters(self):
        return self.model.parameters()

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, **kwargs):
        """The decoder's forward: ``.logits`` its last hidden states (the last ``logits_to_keep``, 0 = all)."""
        out = self.decoder(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return _Output(hidden, out.past_key_values)

    __call__ = forward
