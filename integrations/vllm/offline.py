"""One offline vLLM engine on the shipped pair: generate, print one JSON line.

    python -m integrations.vllm.offline --spec probabilistic --temperature 0.8

One engine per process: a vLLM engine does not give its memory back when
deleted, so the tests and the bench start this once per configuration.
Whether spec-verify verifies is the plugin's switch (``SPEC_VERIFY_VLLM=0``
for stock vLLM). The models are laid out for vLLM by ``models_for_vllm``.

The JSON: ``token_ids`` / ``texts`` per prompt, ``seconds`` (generate only,
engine start excluded), ``new_tokens``, and vLLM's speculative counters
(``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
``accepted_per_pos``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

# Before vLLM is imported: a small KV cache (the CPU worker would reserve most
# of the machine by default) and no reach for the Hub.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from examples.e2e import BENCH_PROMPTS  # noqa: E402
from integrations.llama_cpp.bench_llama import OTHER_PROMPTS  # noqa: E402
from integrations.vllm.models_for_vllm import layout  # noqa: E402

PROMPTS = list(BENCH_PROMPTS) + list(OTHER_PROMPTS)


def make_llm(spec: str, k: int, max_model_len: int = 512):
    """An ``LLM`` on the shipped target; ``spec``: none, greedy (vLLM's greedy draft) or probabilistic."""
    from vllm import LLM

    paths = layout()
    speculative_config = None
    if spec != "none":
        speculative_config = {"method": "draft_model", "model": str(paths["draft"]),
                              "num_speculative_tokens": k, "draft_sample_method": spec}
    return LLM(model=str(paths["target"]), dtype="float32", max_model_len=max_model_len,
               speculative_config=speculative_config, enforce_eager=True, disable_log_stats=False,
               seed=0)


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters (zeros without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "num_drafts",
             "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
             "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos"}
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] = m.values if hasattr(m, "values") else m.value
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", choices=["none", "greedy", "probabilistic"], default="none")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="each prompt this many times (sampled runs)")
    ap.add_argument("--seed", type=int, default=None, help="per-request seed base (sampled runs)")
    args = ap.parse_args(argv)

    from vllm import SamplingParams

    llm = make_llm(args.spec, args.k)
    prompts = [p for p in PROMPTS for _ in range(args.repeat)]
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True,
                             seed=None if args.seed is None else args.seed + i)
              for i in range(len(prompts))]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up: first-call costs out of the timing
    before = spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = spec_counters(llm)
    counters = {key: (after[key] - before[key] if key != "accepted_per_pos" else
                      [a - b for a, b in zip(after[key], before[key] or [0] * len(after[key]))])
                for key in after}
    token_ids = [list(o.outputs[0].token_ids) for o in outs]
    print(json.dumps({"spec": args.spec, "k": args.k, "temperature": args.temperature,
                      "plugin": os.environ.get("SPEC_VERIFY_VLLM", "1") != "0",
                      "prompts": prompts, "prompt_token_ids": [list(o.prompt_token_ids) for o in outs], "texts": [o.outputs[0].text for o in outs],
                      "token_ids": token_ids, "new_tokens": sum(map(len, token_ids)),
                      "seconds": seconds, **counters}))


if __name__ == "__main__":
    main()
