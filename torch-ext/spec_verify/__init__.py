"""spec-verify: the verification step of speculative decoding, on the CPU.

A cheap draft model proposes K tokens; the target scores them in one
``[K+1, V]`` forward; these ops decide, exactly, which to keep:

    n_accepted, next_token = verify_greedy(target_probs, draft_tokens)
    n_accepted, next_token = verify_sampled(target_probs, draft_probs, draft_tokens)

Keep ``draft_tokens[:n_accepted]`` and append ``next_token`` (the correction
token after a rejection, the bonus token after a full acceptance).

This file is the package's face: it re-exports, nothing else. Where things live:

* ``verify.py``     probability rows in: ``verify_greedy``, ``verify_sampled``, batched and ragged forms
* ``logits.py``     logits in: ``verify_logits`` (batched, ragged), ``sample_draft``, ``warp_probs``
* ``reference.py``  the pure-torch reference of every op (one decision stack)
* ``warping.py``    the definition of the warping (temperature, top-k, top-p, min-p)
* ``law.py``        the exact law of speculative sampling
* ``decoder.py``    the draft / verify loop; ``hf_adapter.py`` Hugging Face models as callbacks
* ``batched_decoder.py``  B sequences per round (the one loop); ``hf_batched.py`` one KV cache per batch
* ``hf_hidden.py``  ``HiddenStatesLM``: a Hugging Face model without its head (``hidden=True`` adapters)
* ``prompt_lookup.py``  ``PromptLookupDraft``, a draft read from the prefix; ``cost_model.py`` ``k="auto"``
* ``lm_head.py``    ``LMHead`` (weights, ``from_gguf``) and its logits function; ``gguf.py`` the reader
* ``hidden.py``     hidden states in: ``verify_hidden`` (batched), ``sample_hidden``; ``hidden_reference.py`` their reference
* ``_fake.py``      fake implementations (torch.compile); ``_ops.py`` the build's op namespace

CPU tensors run the vectorized C++ kernel (``ops``); tensors on any other
device run the reference, which implements the same contract (DESIGN.md).
"""

from __future__ import annotations

from . import _fake  # noqa: F401  (registers the fake implementations)
from . import law, reference, warping
from ._ops import ops
from .batched_decoder import BatchedSpeculativeDecoder
from .cost_model import AutoCost
from .decoder import DecodeStats, LogitsWarping, SpeculativeDecoder
from .hf_adapter import HFCausalLMStep, hf_step_pair
from .hf_batched import HFBatchedCausalLM, hf_batched_step_pair
from .hf_hidden import HiddenStatesLM
from .hidden import sample_hidden, verify_hidden, verify_hidden_batched
from .lm_head import LMHead
from .law import (
    acceptance_rates,
    accepted_length_pmf,
    accepted_length_variance,
    emitted_token_law,
    expected_accepted,
    block_joint_law,
    expected_accepted_block,
    joint_law,
)
from .prompt_lookup import PromptLookupDraft
from .logits import sample_draft, verify_logits, verify_logits_batched, verify_logits_ragged, warp_probs
from .verify import (
    build_info,
    verify_block,
    verify_block_batched,
    verify_greedy,
    verify_greedy_batched,
    verify_greedy_ragged,
    verify_sampled,
    verify_sampled_batched,
    verify_sampled_ragged,
)

__all__ = [
    # Probability rows in
    "verify_greedy",
    "verify_sampled",
    "verify_greedy_batched",
    "verify_sampled_batched",
    "verify_block",
    "verify_block_batched",
    "verify_greedy_ragged",
    "verify_sampled_ragged",
    # Logits in
    "verify_logits",
    "verify_logits_batched",
    "verify_logits_ragged",
    "sample_draft",
    "warp_probs",
    # Hidden states in (the LM head inside the op)
    "LMHead",
    "verify_hidden",
    "verify_hidden_batched",
    "sample_hidden",
    # The exact law
    "acceptance_rates",
    "accepted_length_pmf",
    "accepted_length_variance",
    "expected_accepted",
    "expected_accepted_block",
    "block_joint_law",
    "emitted_token_law",
    "joint_law",
    # The decode loop
    "SpeculativeDecoder",
    "DecodeStats",
    "LogitsWarping",
    "HFCausalLMStep",
    "hf_step_pair",
    "BatchedSpeculativeDecoder",
    "HFBatchedCausalLM",
    "hf_batched_step_pair",
    "HiddenStatesLM",
    "PromptLookupDraft",
    "AutoCost",
    # Introspection, the raw ops, the reference path
    "build_info",
    "ops",
    "reference",
    "warping",
    "law",
]
