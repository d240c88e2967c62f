"""What a ``generate()`` call asks for, resolved and checked before any forward.

transformers hands ``custom_generate`` every argument of ``generate()``:
``resolve`` merges them with the model's generation config exactly as
``generate()`` does (user kwargs > ``generation_config`` > the model's >
transformers' global defaults), keeps what this method honours, and raises a
``ValueError`` naming every option it would otherwise have to ignore.

Honoured: ``max_new_tokens`` / ``max_length``, ``do_sample``,
``temperature``, ``top_k``, ``top_p``, ``min_p``, ``eos_token_id``,
``pad_token_id``, ``num_assistant_tokens`` (the draft length k),
``prompt_lookup_num_tokens`` with ``max_matching_ngram_size`` (prompt lookup
instead of a draft model: k and the longest n-gram, transformers' names and
default of 2; 3 with ``"auto"``), either k as ``"auto"`` (the kernel's cost-aware ``k="auto"``:
k chosen each round from the measured cost curve), ``return_dict_in_generate`` (``sequences`` only),
``streamer`` (batch size 1); and this method's own ``verification``
(``"token"`` or ``"block"``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

# k when nobody set num_assistant_tokens: transformers' default of 20 suits
# its own schedule, which shrinks k after rejections; this method drafts a
# fixed k every round. Greedy, 5 is the fastest k on the shipped pair
# (examples/e2e.py, `make bench`: 4-6 within noise); sampling at temperature
# 0.8 the draft's distribution overlaps the target's less, and k = 3 beats 5
# (examples/hf_generate.py: 1.25-1.35x plain batched generate() at B = 4,
# against 1.0-1.15x at k = 5).
DEFAULT_K = {"greedy": 5, "sampled": 3}

# Options that would change the output and that this method does not
# implement, with the values at which they are off. Any other value raises.
_OFF = {
    "num_beams": (None, 1),
    "num_beam_groups": (None, 1),
    "num_return_sequences": (None, 1),
    "penalty_alpha": (None,),
    "dola_layers": (None,),
    "diversity_penalty": (None, 0.0),
    "output_scores": (None, False),
    "output_logits": (None, False),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "force_words_ids": (None,),
    "constraints": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "top_h": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "stop_strings": (None,),
    "max_time": (None,),
    "token_healing": (None, False),
    "assistant_early_exit": (None,),
    "low_memory": (None, False),
    "cache_implementation": (None, "dynamic"),
    "num_assistant_tokens_schedule": (None, "constant"),
}

# generate()'s own arguments that this method does not implement, off when None / empty.
_ARGUMENTS_OFF = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "negative_prompt_ids",
                  "negative_prompt_attention_mask")

# Model kwargs that are accepted and need nothing (use_cache: the method always caches).
_HARMLESS_KWARGS = {"use_cache", "tokenizer", "assistant_tokenizer"}


@dataclass
class Options:
    """A checked ``generate()`` call: the prompts, the decoding rule, the output format."""

    input_ids: torch.Tensor  # [B, T] int64, as given (left-padded)
    attention_mask: torch.Tensor  # [B, T], 1 = token
    max_new: int
    k: int | str  # the draft length, or "auto" (chosen each round: the kernel's k="auto")
    greedy: bool
    warping: dict  # temperature, top_k, top_p, min_p for the kernel's LogitsWarping
    eos_token_id: list  # possibly empty
    pad_token_id: int | None  # fills finished rows; None only when nothing can finish early
    return_dict: bool
    verification: str  # "token" or "block": the kernel's sampled verifier
    prompt_lookup: bool = False  # the draft is prompt lookup (k = prompt_lookup_num_tokens), no assistant model
    max_ngram: int = 2  # prompt lookup's longest n-gram (max_matching_ngram_size, else DEFAULT_NGRAM)


VERIFICATIONS = ("token", "block")


def resolve(model, assistant_model, input_ids, attention_mask, generation_config, arguments: dict,
            kwargs: dict, verification: str = "token") -> Options:
    """Check and resolve one call; ``arguments`` are generate()'s named ones, ``kwargs`` the rest."""
    if not isinstance(verification, str) or verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" or "block", got {verification!r}')
    off = [name for name in _ARGUMENTS_OFF if arguments.get(name) not in (None, [], ())]
    if arguments.get("synced_gpus"):
        off.append("synced_gpus")
    _check_tokenizers(kwargs.get("tokenizer"), kwargs.get("assistant_tokenizer"))
    config, model_kwargs = _generation_config(model, generation_config, kwargs)
    lookup = _prompt_lookup(config, assistant_model)
    _check_models(model, assistant_model, lookup)
    unknown = sorted(set(model_kwargs) - _HARMLESS_KWARGS)
    off += [f"{name}={getattr(config, name)!r}" for name, values in _OFF.items()
            if getattr(config, name, None) not in values]
    if off or unknown:
        raise ValueError(
            "spec-verify's batched speculative decoding does not support "
            + "; ".join(([f"these generation options: {', '.join(off)}"] if off else [])
                        + ([f"these model keyword arguments: {', '.join(unknown)}"] if unknown else []))
            + ". It decodes greedily or samples under temperature / top-k / top-p / min-p; drop them, "
            "or call generate() without custom_generate"
        )
    ids = _input_ids(input_ids)
    eos = _id_list(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    mask = _attention_mask(attention_mask, ids, pad, eos)
    max_new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - ids.shape[1]
    greedy = not config.do_sample or config.temperature == 0
    warping = dict(temperature=0.0 if greedy else float(config.temperature if config.temperature is not None else 1.0),
                   top_k=int(config.top_k or 0), top_p=float(config.top_p if config.top_p is not None else 1.0),
                   min_p=float(config.min_p or 0.0))
    k = lookup if lookup is not None else _draft_length(kwargs, generation_config, assistant_model, greedy)
    return Options(input_ids=ids, attention_mask=mask, max_new=max(0, int(max_new)),
                   k=k, greedy=greedy, warping=warping,
                   eos_token_id=eos, pad_token_id=pad, return_dict=bool(config.return_dict_in_generate),
                   verification=verification, prompt_lookup=lookup is not None,
                   max_ngram=_max_ngram(config, lookup) if lookup is not None else 2)


# ----------------------------------------------------------------------------
# The pieces
# ----------------------------------------------------------------------------


def _prompt_lookup(config, assistant_model):
    """k of prompt lookup (``prompt_lookup_num_tokens``), or None when a draft model drafts."""
    value = getattr(config, "prompt_lookup_num_tokens", None)
    if value is None:
        return None
    value = _draft_k("prompt_lookup_num_tokens", value)
    if assistant_model is not None:
        raise ValueError("pass assistant_model or prompt_lookup_num_tokens, not both: the draft is either a "
                         "model or prompt lookup")
    return value


# Prompt lookup's longest n-gram when max_matching_ngram_size is not set: transformers' 2 with a fixed k (its
# prompt lookup's default), the kernel's PromptLookupDraft default of 3 with "auto". Why 3 there: k="auto" keeps
# its acceptance per match length, and a 3-token match is a copy more often than a 2-token one; Gemma 3 270M on
# transformers, input-grounded greedy, 3 prompts x 2 passes (AMD EPYC Zen 4): "auto" 2.92x plain generate()
# with 2, 3.18x with 3 (6.0 against 6.8 tokens a round), the kernel's decoder 3.86x with 3 (docs/performance.md,
# eighteenth session). A fixed k keeps transformers' default: the same call, the same proposals.
DEFAULT_NGRAM = {"fixed": 2, "auto": 3}


def _max_ngram(config, k) -> int:
    """Prompt lookup's longest n-gram: ``max_matching_ngram_size``, else ``DEFAULT_NGRAM`` for ``k``."""
    value = getattr(config, "max_matching_ngram_size", None)
    if value is None:
        return DEFAULT_NGRAM["auto" if k == "auto" else "fixed"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_matching_ngram_size must be an int >= 1, got {value!r}")
    return value


def _check_models(model, assistant_model, lookup=None) -> None:
    if assistant_model is None and lookup is None:
        raise ValueError("assistant_model is required: pass the draft model, "
                         "generate(..., assistant_model=draft, custom_generate=...), or draft by prompt lookup "
                         "with prompt_lookup_num_tokens=k")
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError("model is an encoder-decoder model: this method decodes decoder-only causal LMs")
    if assistant_model is None:
        return
    for name, m in (("model", model), ("assistant_model", assistant_model)):
        if getattr(getattr(m, "config", None), "is_encoder_decoder", False):
            raise ValueError(f"{name} is an encoder-decoder model: this method decodes decoder-only causal LMs")
    sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in (model, assistant_model)]
    if None not in sizes and sizes[0] != sizes[1]:
        raise ValueError(
            f"assistant_model has a vocabulary of {sizes[1]} tokens and the model {sizes[0]}: speculative "
            f"decoding needs one tokenizer and one vocabulary for both (different tokenizers -- universal "
            f"assisted decoding -- are not supported)"
        )


def _check_tokenizers(tokenizer, assistant_tokenizer) -> None:
    if assistant_tokenizer is None:
        return
    if tokenizer is None or tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
        raise ValueError(
            "assistant_tokenizer differs from tokenizer (or tokenizer is missing): this method verifies the "
            "draft's token ids against the target's, so both models must share one tokenizer; universal "
            "assisted decoding (different tokenizers) is not supported"
        )


def _generation_config(model, generation_config, kwargs: dict):
    """The merged config, as generate() builds it, and the kwargs it did not consume."""
    prepare = getattr(model, "_prepare_generation_config", None)
    if callable(prepare):
        config, model_kwargs = prepare(generation_config, **kwargs)
        return config, model_kwargs
    # Fallback for a transformers without the private helper: same priorities.
    config = copy.deepcopy(generation_config or model.generation_config)
    return config, config.update(**kwargs)


def _input_ids(input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a [batch, length] integer tensor, got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be a [batch, length] integer tensor, got shape "
                         f"{tuple(input_ids.shape)} and dtype {input_ids.dtype}")
    return input_ids


def _attention_mask(attention_mask, ids: torch.Tensor, pad, eos: list) -> torch.Tensor:
    if attention_mask is None:
        # As generate() infers it: from padding, when the pad id is not also an eos id.
        if pad is not None and pad not in eos and bool((ids == pad).any()):
            return ids.ne(pad).long()
        return torch.ones_like(ids)
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(f"attention_mask has shape {shape}, but input_ids has shape {tuple(ids.shape)}: "
                         f"one mask entry per token of the batch")
    return attention_mask


def _id_list(ids) -> list:
    if ids is None:
        return []
    if isinstance(ids, torch.Tensor):
        return ids.flatten().tolist()
    return [ids] if isinstance(ids, int) else list(ids)


def _draft_length(kwargs: dict, generation_config, assistant_model, greedy: bool) -> int:
    """k: num_assistant_tokens as passed to generate(), else set in the configs, else DEFAULT_K."""
    sources = (kwargs, vars(generation_config) if generation_config is not None else {},
               vars(assistant_model.generation_config))
    for source in sources:
        value = source.get("num_assistant_tokens")
        if value is not None:
            return _draft_k("num_assistant_tokens", value)
    return DEFAULT_K["greedy" if greedy else "sampled"]


def _draft_k(name: str, value):
    """A draft length as given: an int >= 1, or ``"auto"`` (the kernel's ``k="auto"``, ``k_max`` 16)."""
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be an int >= 1 (the draft length k) or "auto", got {value!r}')
    return value
