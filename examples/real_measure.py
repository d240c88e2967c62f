"""Two measurements of the real models on transformers' forward (one thread), for issue 23.

``costs``: the target's eval-cost curve ``c(n) / c(1)``, n = 1..9: a forward
of ``n`` tokens with logits at every position (what ``target_step`` asks
for) on a KV cache holding a ~200-token prefix, cropped back after each
forward; the sizes interleaved in a shuffled order each repeat; medians.

``identity``: greedy decoding by prompt lookup (single adapter, ``k`` fixed
or ``"auto"``; and the batched adapter through ``custom_generate`` with
``prompt_lookup_num_tokens``) against plain greedy decoding over ``N`` new
tokens (1,000+: past Gemma 3's 512-token sliding window). A difference is
reported with plain's top-2 logit gap there (a near-tie when tiny); after it
the two texts diverge, so the first difference is the one counted.

    python -m examples.real_measure costs [--model NAME] [--repeats 15]
    python -m examples.real_measure identity [--model NAME] [--max-new 1100] [--prompt NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

import torch

from examples import prompts, real_models
from examples.real_demo import first_difference, lookup_greedy, plain_greedy, top2_gap


def machine() -> str:
    """CPU model, cores and load average: named beside every figure."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}"


@torch.inference_mode()
def cost_curve(model, prefix: torch.Tensor, sizes=range(1, 10), repeats: int = 15, seed: int = 0) -> dict:
    """``{n: median seconds}`` of an ``n``-token forward (all logits) on a cache holding ``prefix``."""
    out = model(prefix.view(1, -1), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    vocab = model.config.vocab_size
    rng = random.Random(seed)
    times = {n: [] for n in sizes}
    for _ in range(2):  # warm-up: every size once
        for n in sizes:
            model(torch.randint(vocab, (1, n)), past_key_values=cache, use_cache=True)
            cache.crop(-n)
    for _ in range(repeats):
        order = list(sizes)
        rng.shuffle(order)
        for n in order:
            ids = torch.randint(vocab, (1, n))
            t0 = time.perf_counter()
            logits = model(ids, past_key_values=cache, use_cache=True).logits
            times[n].append(time.perf_counter() - t0)
            assert logits.shape[1] == n
            cache.crop(-n)
            assert cache.get_seq_length() == len(prefix)
    return {n: statistics.median(t) for n, t in times.items()}


def run_costs(args) -> dict:
    tokenizer, model = real_models.load_hf(args.model, threads=1)
    text = " ".join(p.text for p in prompts.of_kind("grounded"))
    prefix = tokenizer(text, return_tensors="pt").input_ids[0][:200]
    curve = cost_curve(model, prefix, repeats=args.repeats)
    c1 = curve[1]
    print(f"{args.model}: c(n)/c(1), n = 1..9, prefix {len(prefix)} tokens, medians of {args.repeats} "
          f"(sizes interleaved); c(1) = {1e3 * c1:.1f} ms; {machine()}")
    print("  " + "  ".join(f"n={n}: {c / c1:.2f}" for n, c in curve.items()))
    return dict(model=args.model, c1_ms=1e3 * c1, ratios={n: c / c1 for n, c in curve.items()}, machine=machine())


def run_identity(args) -> list:
    from tools.kernel_loader import load_kernel

    sv = load_kernel()
    tokenizer, model = real_models.load_hf(args.model, threads=1)
    rows = []
    for name in args.prompt:
        ids = tokenizer(prompts.BY_NAME[name].text, return_tensors="pt").input_ids[0]
        with torch.inference_mode():
            t0 = time.perf_counter()
            plain = plain_greedy(model, ids, args.max_new)
            plain_s = time.perf_counter() - t0
        runs = [("single", k) for k in args.k] + ([("batched", args.batched_k)] if args.batched_k else [])
        for adapter, k in runs:
            t0 = time.perf_counter()
            with torch.inference_mode():
                if adapter == "single":
                    k = k if k == "auto" else int(k)
                    out, stats = lookup_greedy(sv, model, ids, args.max_new, k=k)
                    extra = f"{stats.accepted}/{stats.drafted} accepted, {stats.rounds} rounds"
                else:
                    out, extra = _batched(model, tokenizer, ids, args.max_new, int(k))
            seconds = time.perf_counter() - t0
            at = first_difference(plain, out)
            gap = None if at is None else top2_gap(model, plain[:at])
            row = dict(model=args.model, prompt=name, adapter=adapter, k=k, new=args.max_new,
                       prompt_tokens=len(ids), identical=at is None,
                       first_difference=None if at is None else at - len(ids), top2_gap=gap,
                       plain_tps=args.max_new / plain_s, spec_tps=args.max_new / seconds, detail=extra)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(machine())
    return rows


def _batched(model, tokenizer, ids, max_new, k):
    """The batched adapter through custom_generate, B = 2 (the prompt twice, the second left-padded by 3)."""
    from examples import hf_generate

    hf_generate.use_local_kernel()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = torch.stack([ids, torch.cat([torch.full((3,), pad), ids[:-3]])])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    stats = []
    out = model.generate(input_ids=batch, attention_mask=mask, custom_generate=hf_generate.INTEGRATION,
                         trust_remote_code=True, max_new_tokens=max_new, do_sample=False,
                         prompt_lookup_num_tokens=k, decode_stats=stats, eos_token_id=None, pad_token_id=pad)
    return torch.cat([ids, out[0, len(ids):]]), f"{stats[0].accepted}/{stats[0].drafted} accepted (B = 2, row 0)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["costs", "identity"])
    parser.add_argument("--model", default="gemma3-270m", choices=real_models.NAMES)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--max-new", type=int, default=1100)
    parser.add_argument("--prompt", nargs="+", default=["summarize-bees"], choices=list(prompts.BY_NAME))
    parser.add_argument("--k", nargs="+", default=["auto"], help="single-adapter runs: 'auto' or ints")
    parser.add_argument("--batched-k", type=int, default=0, help="also the batched adapter at this k (0: not)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    (run_costs if args.what == "costs" else run_identity)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
