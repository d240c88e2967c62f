"""Batched speculative decoding for transformers' ``generate()``, verified by the spec-verify kernel.

    out = target.generate(**inputs, assistant_model=draft, custom_generate="phanerozoic/spec-verify-generate",
                          trust_remote_code=True, max_new_tokens=64, do_sample=True, temperature=0.8)

transformers calls ``generate`` below with every argument of ``generate()``.
It checks and resolves them (``generation_options.py``), loads the kernel with
``kernels.get_kernel`` and runs its ``BatchedSpeculativeDecoder`` over
``HFBatchedCausalLM`` adapters of the two models: one KV cache per model for
the whole batch, each sequence with its own accepted length per round, and
verification by the kernel's batched ops (``verify_greedy_batched``;
``verify_logits_batched`` under the warping, the draft drawn with
``sample_draft``). The draft runs on ``lean_llama.LeanLlama`` when it is a
Llama that runtime supports (``draft_runtime``). It returns what
``generate()`` returns: the ``[B, T]``
input ids followed by the new tokens, each finished row padded with
``pad_token_id`` after its eos.

With ``prompt_lookup_num_tokens=k`` (transformers' own argument, and
``max_matching_ngram_size``) and no ``assistant_model``, the draft is the
kernel's ``PromptLookupDraft``: the ``k`` tokens that followed the latest
earlier occurrence of the current n-gram in each row's prompt and output,
at no model cost; rounds with no match are plain steps. Unlike transformers'
prompt lookup, batches (``B > 1``) are served. Greedy output is plain
``generate()``'s; sampled output follows the target's law (point-mass drafts).

With ``prompt_lookup_num_tokens="auto"`` (or ``num_assistant_tokens="auto"``
beside a draft model) each round drafts the k in 0..16 that the kernel's
``k="auto"`` predicts fastest from the measured cost of the model's evals
and the rows' recent acceptance (``AutoCost``; 0 is a plain step), so a CPU
where speculation does not pay decodes at about plain ``generate()``'s pace.
The measured curve is kept per model for the process (``_auto_cost``): a
second call does not measure it again.

Randomness comes from torch's default generator, as in ``generate()``:
``torch.manual_seed`` / ``transformers.set_seed`` make sampled runs
reproducible.
"""

from __future__ import annotations

import functools
import weakref

import torch

from .generation_options import Options, resolve
from .lean_llama import lean_for, supports

KERNEL_REPO = "phanerozoic/spec-verify"
KERNEL_VERSION = 1


@functools.lru_cache(maxsize=1)
def load_kernel():
    """The spec-verify kernel; ``LOCAL_KERNELS=phanerozoic/spec-verify=<checkout>`` resolves it offline."""
    from kernels import get_kernel

    return get_kernel(KERNEL_REPO, version=KERNEL_VERSION, trust_remote_code=True)


def generate(model, input_ids=None, attention_mask=None, assistant_model=None, generation_config=None,
             streamer=None, inputs=None, decode_stats=None, verification="token", draft_runtime="auto",
             lm_head_in_op=False, **kwargs):
    """``generate()`` with batched speculative decoding; see the module docstring and the README.

    Parameters
    ----------
    model : transformers causal LM
        The target (transformers passes the model ``generate`` was called on).
    input_ids : torch.Tensor
        ``[B, T]`` prompt ids, left-padded (``tokenizer.padding_side = "left"``).
    attention_mask : torch.Tensor, optional
        ``[B, T]``, 1 = token, 0 = padding; inferred from ``pad_token_id`` as
        ``generate()`` infers it when absent.
    assistant_model : transformers causal LM, optional
        The draft: same tokenizer, same vocabulary. Leave it out to draft
        by prompt lookup (``prompt_lookup_num_tokens``).
    generation_config, **kwargs
        As for ``generate()``; honoured: ``max_new_tokens`` / ``max_length``,
        ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``min_p``,
        ``eos_token_id``, ``pad_token_id``, ``num_assistant_tokens`` (k),
        ``prompt_lookup_num_tokens`` (k, drafting by prompt lookup) with
        ``max_matching_ngram_size`` (default 2; 3 with ``"auto"``), ``return_dict_in_generate``; either k
        may be ``"auto"`` (module docstring). Anything that would change the output and is not implemented
        raises ``ValueError`` naming it.
    streamer : transformers streamer, optional
        Gets the prompt, then each round's new tokens (batch size 1 only).
    inputs : torch.Tensor, optional
        ``generate()``'s first positional argument: the same as ``input_ids``.
    decode_stats : list, optional
        If given, the kernel's ``DecodeStats`` of the run is appended to it.
    verification : {"token", "block"}
        How sampled rounds are verified: token-wise rejection sampling
        (``"token"``, the default) or block verification (``"block"``, Sun et
        al. 2024: the same law, never fewer accepted tokens in expectation).
        Greedy decoding ignores it.
    draft_runtime : {"auto", "lean", "transformers"}
        What runs the draft's forwards: ``"lean"`` is ``lean_llama.LeanLlama``
        on the draft's weights (the same function with ~20 ops per layer,
        ~2x faster for a small draft; Llama drafts on the CPU only, else
        ``ValueError``), ``"transformers"`` the model's own forward, and
        ``"auto"`` (the default) the lean one where it runs. The draft decides
        speed, never the output: greedy rows are the target's argmaxes and
        sampled rows follow the target's law for any draft.
    lm_head_in_op : bool, default False
        The target's LM head inside verification: the target's forwards stop
        at its last hidden states and ``verify_hidden`` computes the logits
        of every verified row in one pass over the head's weights
        (``HFBatchedCausalLM(hidden=True)``; DESIGN.md, "Hidden states in the
        decoder"). Greedy output then equals plain greedy decoding on that
        head, which may differ from ``generate()``'s at a near-tie (another
        float32 dot order). Greedy rounds read the head once for the whole
        batch; sampled rounds once per sequence.

    Returns
    -------
    torch.LongTensor or GenerateDecoderOnlyOutput
        ``[B, T + N]``: ``input_ids`` then the new tokens (``N`` the longest
        row's count), rows that ended at an eos padded with ``pad_token_id``;
        wrapped as ``GenerateDecoderOnlyOutput(sequences=...)`` when
        ``return_dict_in_generate``.
    """
    if inputs is not None and input_ids is not None:
        raise ValueError("pass the prompt ids once: as inputs (positional) or as input_ids, not both")
    named = {name: kwargs.pop(name, None) for name in ("logits_processor", "stopping_criteria", "synced_gpus",
                                                          "prefix_allowed_tokens_fn", "negative_prompt_ids",
                                                          "negative_prompt_attention_mask")}
    options = resolve(model, assistant_model, input_ids if input_ids is not None else inputs, attention_mask,
                      generation_config, named, kwargs, verification)
    if streamer is not None and options.input_ids.shape[0] > 1:
        raise ValueError(f"streamer with a batch of {options.input_ids.shape[0]}: streamers take one sequence "
                         f"(transformers' TextStreamer refuses batches too); stream one prompt at a time")
    if options.max_new == 0:
        return _output(options, options.input_ids)
    draft = None if options.prompt_lookup else _draft_runtime(assistant_model, draft_runtime)
    if not isinstance(lm_head_in_op, bool):
        raise TypeError(f"lm_head_in_op must be True or False, got {type(lm_head_in_op).__name__}")
    new_tokens, stats = _decode(model, draft, options, streamer, lm_head_in_op)
    if decode_stats is not None:
        decode_stats.append(stats)
    return _output(options, _concatenate(options, new_tokens))


# ----------------------------------------------------------------------------
# The draft's runtime
# ----------------------------------------------------------------------------


def _draft_runtime(assistant_model, runtime):
    """The callable that runs the draft's forwards (see ``generate``'s ``draft_runtime``)."""
    if runtime not in ("auto", "lean", "transformers"):
        raise ValueError(f"draft_runtime must be 'auto', 'lean' or 'transformers', got {runtime!r}")
    if runtime == "transformers" or (runtime == "auto" and not supports(assistant_model)):
        return assistant_model
    return lean_for(assistant_model)  # "lean" out of scope raises, naming why


# ----------------------------------------------------------------------------
# Decoding and the output
# ----------------------------------------------------------------------------


def _decode(model, draft, options: Options, streamer, hidden: bool = False):
    """Each row's new tokens (1-D int64 CPU tensors) and the run's statistics (``hidden``: the head in the op)."""
    sv = load_kernel()
    pad = options.pad_token_id if options.pad_token_id is not None else 0
    if options.prompt_lookup:
        # No draft model: the proposals are read from each row's own prefix.
        draft_step = sv.PromptLookupDraft(max_ngram=options.max_ngram).batched
        target_step = sv.HFBatchedCausalLM(model, **options.warping, pad_token_id=pad, hidden=hidden).target_step
        # Point masses (rows None) carry no warping: the target's is the run's.
        warping = None if options.greedy else target_step.__self__.warping
    else:
        draft_step, target_step = sv.hf_batched_step_pair(draft, model, **options.warping, pad_token_id=pad,
                                                          hidden=hidden)
        warping = None
    k = _auto_cost(sv, model, draft, options, hidden) if options.k == "auto" else options.k
    decoder = sv.BatchedSpeculativeDecoder(draft_step, target_step, k=k, greedy=options.greedy,
                                           eos_token_id=options.eos_token_id, method=options.verification,
                                           warping=warping)
    on_commit = None
    if streamer is not None:
        streamer.put(options.input_ids.cpu())
        on_commit = lambda row, tokens: streamer.put(tokens.view(1, -1))  # noqa: E731
    ids, mask = options.input_ids.cpu(), options.attention_mask.cpu()
    outputs = decoder.generate(ids, options.max_new, attention_mask=mask, on_commit=on_commit)
    if streamer is not None:
        streamer.end()
    lengths = mask.sum(dim=1).tolist()
    return [out[length:] for out, length in zip(outputs, lengths)], decoder.stats


# Per target model: {(the draft's runtime object, or the lookup's n-gram; head in op; greedy): (its weakref, AutoCost)}.
_AUTO_COSTS = weakref.WeakKeyDictionary()


def _auto_cost(sv, model, draft, options: Options, hidden: bool):
    """The ``AutoCost`` behind ``"auto"``: one per target model, draft, head and mode, kept for the process.

    Why kept: the cost curve (an eval of n positions against one) is the model's on this machine,
    and measuring it from cold costs a call its first rounds (3 plain steps, then a climb through
    k = 1, 2, 4, ...); a server calling ``generate()`` per request would pay that every time. The
    kernel's decoders take a shared ``AutoCost`` for this (``k=AutoCost``), and start each call's
    acceptance estimates afresh (``AutoCost.new_run``). Keyed weakly by the model (freed with it);
    the draft by the identity of what runs it (the model, or its lean runtime, whose forwards cost
    less), checked alive (a freed draft's id may be reused), or a lookup's longest n-gram (its
    matches' record is its own); greedy and sampled apart (their acceptance pools differ).
    Not for concurrent ``generate()`` calls on one model from several threads (an ``AutoCost`` is
    one decoder's at a time).
    """
    per_model = _AUTO_COSTS.setdefault(model, {})
    key = (("lookup", options.max_ngram) if draft is None else id(draft), hidden, options.greedy)
    entry = per_model.get(key)
    if entry is None or (draft is not None and entry[0]() is not draft):
        entry = per_model[key] = (weakref.ref(draft) if draft is not None else None, sv.AutoCost())
    return entry[1]


def _concatenate(options: Options, new_tokens: list) -> torch.Tensor:
    """``[B, T + N]``: the input ids as given, then each row's new tokens, padded after an eos."""
    ids = options.input_ids
    width = max(len(t) for t in new_tokens)
    tail = torch.full((ids.shape[0], width), options.pad_token_id if options.pad_token_id is not None else 0,
                      dtype=ids.dtype)
    for b, tokens in enumerate(new_tokens):
        tail[b, : len(tokens)] = tokens
    return torch.cat([ids, tail.to(ids.device)], dim=1)


def _output(options: Options, sequences: torch.Tensor):
    if not options.return_dict:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=sequences)
