"""What an eval costs after the eval before it: the aftermath of a try, per engine and model.

    python -m benchmarks.bench_evals                                  # the shipped pair on llama.cpp
    python -m benchmarks.bench_evals --engine llama_cpp,transformers --model shipped,smollm2 --evals 1500

A decode with ``k="auto"`` mixes plain steps (one position) with tries
(``k + 1`` positions). ``AutoCost`` prices a try by the measured cost of its
eval; this bench asks whether the eval *after* it costs more too. Evals of
1, 2, 3 and 5 positions in a random order (half the time the size before
again, as a copy in progress repeats its size; else a random size, plain
most often), each on a fixed 100-token context (rolled back after each
eval, as a rejected round is), timed one by one and grouped by (the size
before, the size): random order, so the machine's drift hits every group
alike. ``after n`` is the plain eval's median right after an eval of ``n``
positions, over its median after a plain one: what ``AutoCost._aftermath``
charges a try of ``n`` (DESIGN.md, "k = auto": the aftermath of a try).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import time

import torch

SIZES = (1, 1, 1, 2, 3, 5)  # a random size: plain three times in six
CONTEXT = 100


def measure(engine, evals: int, seed: int = 0) -> dict:
    """``{(size before, size): [seconds]}`` of ``evals`` evals in a random order on ``engine``'s target."""
    step = engine.target(0.0)
    prompt = list(range(10, 10 + CONTEXT))
    engine.prefill(step, prompt + [7])
    feed = step._feed if engine.name == "llama.cpp" else (lambda tokens, rows: step._feed(torch.tensor(tokens), rows))
    rng = random.Random(seed)
    out = collections.defaultdict(list)
    previous = 1
    for _ in range(evals):
        n = previous if rng.random() < 0.5 else rng.choice(SIZES)
        start = time.perf_counter()
        feed([5] * n, rows=n)
        out[(previous, n)].append(time.perf_counter() - start)
        step._rollback(CONTEXT)  # back to the context: a round that kept none of it
        previous = n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="llama_cpp", help="comma list of llama_cpp, transformers")
    ap.add_argument("--model", default="shipped", help="comma list of shipped, smollm2, gemma, padded")
    ap.add_argument("--evals", type=int, default=3000)
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tools.kernel_loader import load_kernel

    from .bench_spec import machine
    from .spec_engines import HFEngine, LlamaEngine, missing, model_specs

    torch.set_num_threads(1)
    sv = load_kernel()
    info = machine()
    print(f"evals in random order, one thread; {info.get('Model name', 'unknown CPU')} ({info['isa']}), "
          f"L3 {info.get('L3 cache', '?')}; load average {info['load']}")
    print("| engine | model | c(1) after a plain eval | after 2 | after 3 | after 5 | "
          "c(2) after 1 / after 2 | c(5) after 1 / after 5 |")
    print("|---|---|---|---|---|---|---|---|")
    for key in args.model.split(","):
        spec = model_specs()[key]
        llama = None
        for name in args.engine.split(","):
            why = missing(spec, name)
            if why:
                print(f"| {name} | {spec.name} | skipped: {why} |")
                continue
            llama = llama or LlamaEngine(spec, sv)
            engine = llama if name == "llama_cpp" else HFEngine(spec, sv, llama)
            with torch.inference_mode():
                got = measure(engine, args.evals)
            med = {pair: statistics.median(v) for pair, v in got.items()}
            base = med[(1, 1)]

            def ratio(pair):
                return f"{med[pair] / base:.2f}" if pair in med else "-"

            print(f"| {engine.name} | {spec.name} | {base * 1e3:.2f} ms | " +
                  " | ".join(f"{ratio((m, 1))}" for m in (2, 3, 5)) +
                  f" | {ratio((1, 2))} / {ratio((2, 2))} | {ratio((1, 5))} / {ratio((5, 5))} |")
    print("\nratios to c(1) after a plain eval (the median of each group of evals)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
