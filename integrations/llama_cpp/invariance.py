"""Is llama.cpp batch-invariant here, and what does that do to greedy speculative output?

    python -m integrations.llama_cpp.invariance [--models gemma,smollm2,shipped] [--max-new 64]
    python -m benchmarks.bench_spec --invariance      # the same, from the bench

Per model, one thread, the venv's libllama:

1. **Deviation.** Along each prompt's plain greedy continuation, a block of
   ``n = 5`` tokens is evaluated once as one batch (logits at all 5
   positions, as a speculative round's target eval) and once as five
   one-token evals (as the plain loop); the largest ``|logit difference|``
   over every position and vocabulary entry is the engine's deviation ``d``.
   (The logits' standard deviation is printed beside it for scale.)
2. **Differences from plain greedy.** Greedy speculative decoding (prompt
   lookup, ``k="auto"`` and a fixed ``k``) is compared token by token with
   the plain loop's greedy output. At each difference the plain stream's
   top-2 logit gap at that position is read; then decoding resumes from the
   plain stream's prefix (one more token of it), so *every* difference along
   the plain stream is counted, not just the first. A batched eval can flip
   the argmax only where the gap is at most ``2 d`` (each of the two logits
   moves by at most ``d``): each difference is checked against that.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def plain_greedy(step, prompt: list, max_new: int) -> tuple[list, list]:
    """The plain loop (one-token evals): ``(tokens, top-2 gap at each step)``."""
    step.reset()
    logits = step._feed(list(prompt), rows=1)[0]
    out, gaps = [], []
    for i in range(max_new):
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        out.append(int(torch.argmax(logits)))
        if i + 1 < max_new:
            logits = step._feed([out[-1]], rows=1)[0]
    return out, gaps


def deviation(step, prompt: list, continuation: list, n: int = 5) -> tuple[float, float]:
    """``(max |batched - one-token| logit difference, logit std)`` over blocks of ``n`` along ``continuation``."""
    worst, stds = 0.0, []
    seq = list(prompt) + list(continuation)
    step.reset()
    step._feed(seq[: len(prompt)], rows=1)
    for start in range(len(prompt), len(seq) - n + 1, n):  # the cache holds seq[:start] here
        batched = step._feed(seq[start:start + n], rows=n).clone()  # the next eval overwrites the buffer
        step._rollback(start)
        for i in range(n):
            one = step._feed([seq[start + i]], rows=1)[0]
            worst = max(worst, float((batched[i] - one).abs().max()))
            stds.append(float(one.std()))
    return worst, statistics.mean(stds) if stds else 0.0


def differences(sv, step, prompt: list, plain: list, gaps: list, k) -> list:
    """Every position where greedy speculative decoding (prompt lookup, ``k``) leaves the plain stream:
    ``[(position, plain's top-2 gap there)]``, resuming from the plain prefix after each."""
    found = []
    pos = 0
    while pos < len(plain):
        kw = dict(k_max=8) if k == "auto" else {}
        dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), step.target_step, k=k, greedy=True, **kw)
        start = list(prompt) + plain[:pos]
        out = dec.generate(torch.tensor(start), len(plain) - pos).tolist()[len(start):]
        j = next((i for i, (a, b) in enumerate(zip(out, plain[pos:])) if a != b), None)
        if j is None:
            break
        found.append((pos + j, gaps[pos + j]))
        pos += j + 1
    return found


def run(models=("gemma", "smollm2", "shipped"), max_new: int = 64, ks=("auto", 4), n: int = 5,
        json_path=None) -> dict:
    from benchmarks import bench_prompts
    from benchmarks.spec_engines import LlamaEngine, missing, model_specs
    from tools.kernel_loader import load_kernel

    torch.set_num_threads(1)
    sv = load_kernel()
    specs = model_specs()
    result = {}
    for key in models:
        spec = specs[key]
        why = missing(spec, "llama_cpp")
        if why:
            print(f"{spec.name}: skipped: {why}")
            continue
        engine = LlamaEngine(spec, sv)
        step = engine.target(0.0)
        texts = [t for kind in bench_prompts.KINDS for t in bench_prompts.prompts(spec.family, kind)]
        rows = []
        dev, stds = 0.0, []
        for text in texts:
            prompt = engine.tokenize(text)
            plain, gaps = plain_greedy(step, prompt, max_new)
            d, s = deviation(step, prompt, plain, n)
            dev, stds = max(dev, d), stds + [s]
            for k in ks:
                for position, gap in differences(sv, step, prompt, plain, gaps, k):
                    rows.append(dict(prompt=text[:40], k=k, position=position, gap=gap))
        for r in rows:
            r["within_2d"] = r["gap"] <= 2 * dev
        result[key] = dict(model=spec.name, deviation=dev, logit_std=statistics.mean(stds), n=n,
                           prompts=len(texts), max_new=max_new, differences=rows)
        print_model(result[key])
        del engine
    if json_path:
        pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(json_path).write_text(json.dumps(result, indent=1))
    return result


def print_model(r: dict) -> None:
    diffs = r["differences"]
    print(f"\n{r['model']} on llama.cpp: max |batched (n={r['n']}) - one-token| logit difference d = "
          f"{r['deviation']:.4f} (logit std {r['logit_std']:.2f}); {r['prompts']} prompts x {r['max_new']} greedy tokens")
    by_k = {}
    for x in diffs:
        by_k.setdefault(x["k"], []).append(x)
    for k, xs in by_k.items():
        print(f"  lookup k={k}: {len(xs)} differences from plain greedy; within 2d: "
              f"{sum(x['within_2d'] for x in xs)}/{len(xs)}")
    if not diffs:
        print("  no difference from plain greedy at any k measured")
        return
    print("  | k | prompt | position | plain top-2 gap | gap <= 2d |")
    print("  |---|---|---|---|---|")
    for x in diffs:
        print(f"  | {x['k']} | {x['prompt']!r} | {x['position']} | {x['gap']:.4f} | {'yes' if x['within_2d'] else 'NO'} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma,smollm2,shipped")
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--json", default=str(ROOT / "out" / "llama_invariance.json"))
    args = parser.parse_args(argv)
    run([m for m in args.models.split(",") if m], args.max_new, json_path=args.json)


if __name__ == "__main__":
    main()
