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
3. **The head in our op** (``--head``; ``LlamaCppStep(hidden=True)``, the
   GGUF's head in ``verify_hidden``). Our logits against llama.cpp's, both
   from one-token evals along llama.cpp's plain stream: the largest
   ``|difference|`` ``e`` (llama.cpp quantizes each hidden row to Q8_0 for
   its head; ours is ggml's Q8_0 dot too, in another order). Plain greedy on
   our head against llama.cpp's plain greedy: every difference, with
   llama.cpp's top-2 gap there (at most ``2 e`` if only the head differs).
   Then parts 1 and 2 through our head: its batched-vs-one-token deviation
   ``d_h`` (llama.cpp's hidden states are not batch-invariant either), and
   every difference of greedy prompt lookup with the head in the op from
   plain greedy on the same head, against ``2 d_h``.
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
    vocabulary entry), ``gap_max`` / ``gap_moves`` (the largest and every
    position's change of the top-2 gap, ``|(b_a - b_b) - (s_a - s_b)|`` for the
    one-token eval's top-2 tokens ``a, b``: what decides whether a batched
    eval's argmax can differ), ``std`` (the logits' mean standard deviation)
    and ``positions``.
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
    return dict(max=worst, gap_max=max(gap_moves, default=0.0), gap_moves=gap_moves,
                std=statistics.mean(stds) if stds else 0.0, positions=len(gap_moves))


class HeadLogits:
    """A ``hidden=True`` ``LlamaCppStep`` read through its head: ``_feed`` gives our logits rows."""

    def __init__(self, sv, step):
        self.sv, self.step, self.head = sv, step, step.head

    def reset(self):
        self.step.reset()

    def _rollback(self, keep: int):
        self.step._rollback(keep)

    def _feed(self, tokens: list, rows: int) -> torch.Tensor:
        h = self.step._feed(tokens, rows)
        return self.sv.ops.hidden_logits(h, self.head.weight, self.head.bias, self.head.format_code, self.head.dim)


def head_deviation(step, ours: HeadLogits, prompt: list, continuation: list) -> float:
    """The largest ``|our logit - llama.cpp's|`` over one-token evals along ``continuation``."""
    worst = 0.0
    step.reset()
    ours.reset()
    theirs, mine = step._feed(list(prompt), rows=1)[0].clone(), ours._feed(list(prompt), rows=1)[0]
    for token in continuation:
        worst = max(worst, float((theirs - mine).abs().max()))
        theirs, mine = step._feed([token], rows=1)[0].clone(), ours._feed([token], rows=1)[0]
    return worst


def every_difference(continue_from, plain: list, gaps: list) -> list:
    """``[(position, plain's top-2 gap there)]`` wherever ``continue_from(pos)`` -- a decode from the plain
    stream's first ``pos`` tokens to its end -- leaves the plain stream, resuming from the plain prefix after each."""
    found, pos = [], 0
    while pos < len(plain):
        out = continue_from(pos)
        j = next((i for i, (a, b) in enumerate(zip(out, plain[pos:])) if a != b), None)
        if j is None:
            break
        found.append((pos + j, gaps[pos + j]))
        pos += j + 1
    return found


def plain_differences(ours: HeadLogits, prompt: list, plain: list, gaps: list) -> list:
    """Every position where plain greedy on our head leaves llama.cpp's plain greedy stream."""
    return every_difference(lambda pos: plain_greedy(ours, list(prompt) + plain[:pos], len(plain) - pos)[0],
                            plain, gaps)


def differences(sv, step, prompt: list, plain: list, gaps: list, k) -> list:
    """Every position where greedy speculative decoding (prompt lookup, ``k``) leaves the plain stream."""
    kw = dict(k_max=8) if k == "auto" else {}

    def continue_from(pos):
        dec = sv.SpeculativeDecoder(sv.PromptLookupDraft(), step.target_step, k=k, greedy=True, **kw)
        start = list(prompt) + plain[:pos]
        return dec.generate(torch.tensor(start), len(plain) - pos).tolist()[len(start):]

    return every_difference(continue_from, plain, gaps)


def run_head(sv, engine, texts: list, max_new: int, ks, n: int) -> dict:
    """Part 3 (module docstring): the head in our op against llama.cpp's head, and against itself batched."""
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    step = engine.target(0.0)
    hstep = LlamaCppStep(engine.llama, temperature=0.0, sv=sv, hidden=True)
    ours = HeadLogits(sv, hstep)
    e, plain_rows, spec_rows, devs = 0.0, [], [], []
    for text in texts:
        prompt = engine.tokenize(text)
        plain, gaps = plain_greedy(step, prompt, max_new)
        e = max(e, head_deviation(step, ours, prompt, plain))
        plain_rows += [dict(prompt=text[:40], position=p, gap=g)
                       for p, g in plain_differences(ours, prompt, plain, gaps)]
        plain_h, gaps_h = plain_greedy(ours, prompt, max_new)
        devs.append(deviation(ours, prompt, plain_h, n))
        for k in ks:
            spec_rows += [dict(prompt=text[:40], k=k, position=p, gap=g)
                          for p, g in differences(sv, hstep, prompt, plain_h, gaps_h, k)]
    d_h = max(d["max"] for d in devs)
    for r in plain_rows:
        r["within_2e"] = r["gap"] <= 2 * e
    for r in spec_rows:
        r["within_2d"] = r["gap"] <= 2 * d_h
    return dict(head=str(hstep.head), head_deviation=e, deviation=d_h, plain_differences=plain_rows,
                differences=spec_rows, ks=[str(k) for k in ks])


def print_head(r: dict, max_new: int, prompts: int) -> None:
    pd, sd = r["plain_differences"], r["differences"]
    gaps = " (gaps " + ", ".join(f"{x['gap']:.4f}" for x in pd) + ")" if pd else ""
    print(f"  head in our op ({r['head']}): |ours - llama.cpp's logits| <= e = {r['head_deviation']:.3g}; "
          f"plain greedy on our head differs from llama.cpp's plain greedy at {len(pd)} of {prompts} x {max_new} "
          f"positions, llama.cpp's top-2 gap there <= 2e: {sum(x['within_2e'] for x in pd)}/{len(pd)}{gaps}")
    print(f"  through our head, batched vs one-token: d_h = {r['deviation']:.4f}")
    for k in r["ks"]:
        xs = [x for x in sd if str(x["k"]) == k]
        print(f"  lookup k={k} with the head in the op: {len(xs)} differences from plain greedy on the same head; "
              f"its top-2 gap there <= 2 d_h: {sum(x['within_2d'] for x in xs)}/{len(xs)}"
              + (f"; largest gap {max(x['gap'] for x in xs):.4f}" if xs else ""))


def run(models=("gemma", "smollm2", "shipped"), max_new: int = 64, ks=("auto", 4), n: int = 5,
        json_path=None, head: bool = False) -> dict:
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
        moves = sorted(m for d in devs for m in d["gap_moves"])  # pooled over the prompts
        result[key] = dict(model=spec.name, deviation=dev, gap_deviation=gap_dev,
                           gap_deviation_p99=moves[int(0.99 * (len(moves) - 1))] if moves else 0.0,
                           logit_std=statistics.mean(d["std"] for d in devs), n=n, positions=sum(d["positions"] for d in devs),
                           prompts=len(texts), max_new=max_new, ks=[str(k) for k in ks], differences=rows)
        print_model(result[key])
        if head:
            result[key]["head"] = run_head(sv, engine, texts, max_new, ks, n)
            print_head(result[key]["head"], max_new, len(texts))
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
    parser.add_argument("--head", action="store_true", help="also part 3: the head in our op (hidden=True)")
    args = parser.parse_args(argv)
    ks = [k if k == "auto" else int(k) for k in args.ks.split(",") if k]
    run([m for m in args.models.split(",") if m], args.max_new, ks=ks, json_path=args.json, head=args.head)


if __name__ == "__main__":
    main()
