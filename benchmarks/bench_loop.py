"""The decode loop's own cost per round, against a plain loop on the same stand-in target.

    python -m benchmarks.bench_loop               # greedy and T = 0.8, k = 0 and k = "auto", V = 4096
    python -m benchmarks.bench_loop --vocab 32000 --eval-mb 80
    python -m benchmarks.bench_loop --prompt-tokens 3000    # a long input: the lookup's share

Why: on a tiny model a token costs ~2 ms (the shipped pair on llama.cpp), so
the loop's Python per round is a few percent of decoding, and it is paid after
the target's eval has evicted the caches, where each torch call costs tens of
microseconds (measured here: ~25 us for the first ``x[0]`` after the eval,
against ~1 us warm). The stand-in target therefore sums ``--eval-mb`` of
float32 (one pass, like an eval's weight read) and returns rows from a pool
of random ones, picked by the prefix's length (so greedy writes no repeats a
lookup would find: with one fixed row every greedy token was the same, the
lookup matched from the third token on, and ``k="auto"``'s "per round" was a
round of up to 9 tokens -- its greedy figures before 2026-12-04's tenth
session counted those), so a round's time is that sum plus the loop's own
work.

Rows, each the median of ``--repeats`` runs of ``--tokens`` tokens, interleaved:

* ``plain``: ``argmax`` (or ``sample_draft``) of the row in a bare Python loop:
  the least a loop can do;
* ``k=0``: ``SpeculativeDecoder`` with a prompt lookup at ``k = 0`` (plain
  decoding through the loop: draft nothing, verify one row, commit);
* ``k=auto``: the same with ``k="auto"`` (the cost model's choice every round,
  the lookup looked ahead, a plain step's probe, resting), on a random prompt:
  the lookup rarely matches, so nearly every round is a plain step (the
  table says how many tokens a round emitted), and what a look costs: the
  draft phase's seconds (the lookup and the decoder's checks of its
  proposal) per lookup call, on a ``--prompt-tokens`` prompt.

The figures are microseconds per round over ``plain``, and each row's own
microseconds a round *outside the eval* (its wall time less the time spent
inside the stand-in target): the first include the eval's own noise (a 40 MB
sum moves by ±10% run to run on a shared machine, ~±200 us), the second do
not, so two builds' loops compare by them. No model, so no machine figure
applies beyond the CPU named in the header.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--eval-mb", type=float, default=40.0, help="float32 megabytes the stand-in eval sums")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=150, help="the random prompt's length (the lookup searches it)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    from tools.kernel_loader import load_kernel

    torch.set_num_threads(1)
    sv = load_kernel()
    weights = torch.randn(int(args.eval_mb * 2**20 / 4))
    pool = torch.randn(256, args.vocab, generator=torch.Generator().manual_seed(2))

    inside = [0.0]  # seconds spent inside the stand-in eval, summed (the rows' "outside" columns subtract it)

    def target(prefix, proposed):
        t0 = time.perf_counter()
        weights.sum()  # the eval's pass over its weights: evicts the caches as an engine's does
        start = len(prefix) % (len(pool) - 9)  # a row per position: greedy output does not repeat
        rows = pool[start: start + len(proposed) + 1]
        inside[0] += time.perf_counter() - t0
        return rows

    prompt = torch.randint(0, args.vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(1))

    def plain(temperature):
        g = torch.Generator().manual_seed(0)
        inside[0] = 0.0
        start = time.perf_counter()
        for i in range(args.tokens):
            row = target(range(len(prompt) + i), ())[0]
            int(torch.argmax(row)) if temperature == 0 else int(sv.sample_draft(row, temperature=temperature,
                                                                                  generator=g))
        wall = time.perf_counter() - start
        return wall / args.tokens, (wall - inside[0]) / args.tokens

    per_round = collections.defaultdict(list)  # k -> tokens a round, per run
    per_look = collections.defaultdict(list)  # k -> seconds of a look-ahead, per run

    def ours(temperature, k):
        kw = dict(greedy=temperature == 0, generator=torch.Generator().manual_seed(0))
        if temperature:
            kw["warping"] = dict(temperature=temperature)
        draft = sv.PromptLookupDraft()
        dec = sv.SpeculativeDecoder(draft, target, k=k, **kw)
        inside[0] = 0.0
        start = time.perf_counter()
        dec.generate(prompt, args.tokens)
        wall = time.perf_counter() - start
        per_round[k].append(dec.stats.new_tokens / dec.stats.rounds)
        if draft.calls:  # the draft phase's seconds (the lookup and the decoder's checks of it) per look
            per_look[k].append(dec.stats.draft_seconds / draft.calls)
        return wall / dec.stats.rounds, (wall - inside[0]) / dec.stats.rounds

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU") if os.path.exists("/proc/cpuinfo") else "unknown CPU"
    print(f"decode loop per round over a bare plain loop; {cpu}, 1 thread, V = {args.vocab}, "
          f"stand-in eval: one sum over {args.eval_mb:g} MB; a {args.prompt_tokens}-token prompt; medians of {args.repeats}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| mode | plain us/round | k=0: over plain | k=auto: over plain | outside the eval: plain / k=0 / k=auto "
          "| k=auto: tokens a round | k=auto: a look |")
    print("|---|---|---|---|---|---|---|")
    for temperature in (0.0, 0.8):
        per_round.clear()
        per_look.clear()
        times = {"plain": [], "k0": [], "auto": []}
        outside = {"plain": [], "k0": [], "auto": []}
        for _ in range(args.repeats):  # interleaved: the machine's drift hits every row alike
            for name, run in (("plain", lambda: plain(temperature)), ("k0", lambda: ours(temperature, 0)),
                              ("auto", lambda: ours(temperature, "auto"))):
                total, own = run()
                times[name].append(total)
                outside[name].append(own)
        med = {name: statistics.median(v) * 1e6 for name, v in times.items()}
        own = {name: statistics.median(v) * 1e6 for name, v in outside.items()}
        mode = "greedy" if temperature == 0 else f"T = {temperature}"
        print(f"| {mode} | {med['plain']:.0f} | {med['k0'] - med['plain']:+.0f} us | "
              f"{med['auto'] - med['plain']:+.0f} us | {own['plain']:.0f} / {own['k0']:.0f} / {own['auto']:.0f} us | "
              f"{statistics.median(per_round['auto']):.2f} | "
              f"{statistics.median(per_look['auto']) * 1e6:.0f} us |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
