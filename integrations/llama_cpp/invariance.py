"""Is llama.cpp batch-invariant here, and what does that do to greedy speculative output?

    python -m integrations.llama_cpp.invariance [--models gemma,smollm2,shipped] [--max-new 64]
    python -m benchmarks.bench_spec --invariance      # the same, from the bench

Per model, one thread, the venv's libllama:

1. **Deviation.** Along each prompt's plain greedy continuation, a block of
   ``n = 5`` tokens is evaluated once as one batch (logits at all 5
   positions, as a speculative round's target eval) and once as five
   one-token evals (as the plain loop); the largest ``|logit difference|``
   over every position and vocabulary entry is the engine's deviation ``d``,
   and the largest change of the one-token eval's top-2 gap is ``g`` (the
   logits' standard deviation is printed beside them for scale).
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


def deviation(step, prompt: list, continuation: list, n: int = 5) -> dict:
    """Batched (``n`` positions, one eval) against one-token logits along ``continuation``, blocks of ``n``.

    Returns ``max`` (the largest ``|logit difference|`` over every position and
    vocabulary entry), ``gap_max`` / ``gap_p99`` (the largest and the 99th
    percentile change of the top-2 gap, ``|(b_a - b_b) - (s_a - s_b)|`` for the
    one-token eval's top-2 tokens ``a, b``: what decides whether a batched
    eval's argmax can differ) and ``std`` (the logits' mean standard deviation).
    """
    worst, stds, gap_moves = 0.0, [], []
    seq = list(prompt) + list(continuation)
    step.reset()
    step._feed(seq[: len(prompt)], rows=1)
    for start in range(len(prompt), len(seq) - n + 1, n):  # the cache holds seq[:start] here
        batched = step._feed(seq[start:start + n], rows=n).clone()  # the next eval overwrites the buffer
        step._rollback(start)
        for i in range(n):
            one = step._feed([seq[start + i]], rows=1)[0]
            worst = max(worst, float((batched[i] - one).abs().max()))
            a, b = torch.topk(one, 2).indices.tolist()
            gap_moves.append(abs(float((batched[i, a] - batched[i, b]) - (one[a] - one[b]))))
            stds.append(float(one.std()))
    gap_moves.sort()
    p99 = gap_moves[min(len(gap_moves) - 1, int(0.99 * len(gap_moves)))] if gap_moves else 0.0
    return dict(max=worst, gap_max=max(gap_moves, default=0.0), gap_p99=p99,
                std=statistics.mean(stds) if stds else 0.0, positions=len(gap_moves))


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
        devs = []
        for text in texts:
            prompt = engine.tokenize(text)
            plain, gaps = plain_greedy(step, prompt, max_new)
            devs.append(deviation(step, prompt, plain, n))
            for k in ks:
                for position, gap in differences(sv, step, prompt, plain, gaps, k):
                    rows.append(dict(prompt=text[:40], k=k, position=position, gap=gap))
        dev = max(d["max"] for d in devs)
        gap_dev = max(d["gap_max"] for d in devs)
        for r in rows:
            r["within_2d"] = r["gap"] <= 2 * dev
            r["within_gap_dev"] = r["gap"] <= gap_dev
        result[key] = dict(model=spec.name, deviation=dev, gap_deviation=gap_dev,
                           gap_deviation_p99=max(d["gap_p99"] for d in devs),
                           logit_std=statistics.mean(d["std"] for d in devs), n=n, positions=sum(d["positions"] for d in devs),
                           prompts=len(texts), max_new=max_new, ks=[str(k) for k in ks], differences=rows)
        print_model(result[key])
        del engine
    if json_path:
        pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(json_path).write_text(json.dumps(result, indent=1))
    return result


def print_model(r: dict) -> None:
    diffs = r["differences"]
    print(f"\n{r['model']} on llama.cpp, {r['prompts']} prompts x {r['max_new']} greedy tokens, "
          f"{r['positions']} positions: batched (n={r['n']}) vs one-token evals: max |logit difference| "
          f"d = {r['deviation']:.4f} (logit std {r['logit_std']:.2f}); top-2 gap moved by up to "
          f"g = {r['gap_deviation']:.4f} (99th percentile {r['gap_deviation_p99']:.4f})")
    for k in r["ks"]:
        xs = [x for x in diffs if str(x["k"]) == k]
        print(f"  lookup k={k}: {len(xs)} differences from plain greedy; plain's top-2 gap there <= g: "
              f"{sum(x['within_gap_dev'] for x in xs)}/{len(xs)}, <= 2d: {sum(x['within_2d'] for x in xs)}/{len(xs)}"
              + (f"; largest gap {max(x['gap'] for x in xs):.4f}" if xs else ""))
    if not diffs:
        return
    print("  | k | prompt | position | plain top-2 gap | <= g | <= 2d |")
    print("  |---|---|---|---|---|---|")
    for x in diffs:
        print(f"  | {x['k']} | {x['prompt']!r} | {x['position']} | {x['gap']:.4f} | "
              f"{'yes' if x['within_gap_dev'] else 'NO'} | {'yes' if x['within_2d'] else 'NO'} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma,smollm2,shipped")
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--ks", default="auto,4", help="lookup k values compared with plain greedy ('' : deviations only)")
    parser.add_argument("--json", default=str(ROOT / "out" / "llama_invariance.json"))
    args = parser.parse_args(argv)
    ks = [k if k == "auto" else int(k) for k in args.ks.split(",") if k]
    run([m for m in args.models.split(",") if m], args.max_new, ks=ks, json_path=args.json)


if __name__ == "__main__":
    main()
