"""``k="auto"``'s policy on measured cost curves, noise-free: what the estimator alone gains or loses.

    python -m benchmarks.bench_auto                 # every curve x prompt kind x mode, 5 seeds
    python -m benchmarks.bench_auto --seeds 20 --curve "transformers Gemma"
    python -m benchmarks.bench_auto --prompts 3 --k-max 16 --seeds 40   # a cold cell, as bench_spec's

A real-model bench row moves by up to ~15-25% from run to run in sampled mode
(the draws, hence the acceptances, change with the k chosen; a shared machine's
load moves the timings), which hides a change of the policy of that size.
Here the real ``sv.AutoCost`` is driven round by round (``choose`` then
``record``, as the decoder drives it) on a synthetic text whose acceptance
is known, priced by eval-cost curves measured in ``make bench-real``:

* **the text** switches between a *copy* stretch (the prompt lookup
  proposes every position; greedy accepts each with 0.97, sampled with a
  per-token ``p ~ Beta(6, 2)``, mean 0.75) and *prose* (it proposes the first
  position with 0.3 and each next with 0.5; greedy accepts with 0.25,
  sampled ``p ~ Beta(1, 4)``, mean 0.2), per emitted token: *grounded*
  prompts enter a copy with 0.08 and leave with 0.04 (about two thirds
  copied), *open* ones enter with 0.01 and leave with 0.2;
* **the cost** of an eval of ``n`` positions is ``c(n)`` of the curve times
  a lognormal factor (sigma 0.05), doubled for 2% of evals (a loaded machine);
* **a run** is 40 prompts of 64 new tokens on one shared ``AutoCost`` (a
  server's use: the curve is the engine's, the acceptance each prompt's own),
  against plain decoding (64 evals of one position per prompt) and every
  fixed k on the same text model; ``--prompts 3`` is a *cold cell*, as
  ``bench_spec`` runs one (3 prompts on a fresh ``AutoCost``): there the
  climb's tries are a larger share of the run. ``--k-max 16`` (the
  decoder's default) runs the curves measured to 17 positions only;
* **the policies**: ``auto, outcomes only`` (the estimate before
  2026-12-02's change: 0/1 outcomes, nothing learnt in a plain step);
  ``+ acceptance probabilities`` (a sampled judged position counts its
  acceptance probability, Rao-Blackwell; greedy has nothing else to count);
  ``+ the probe`` (a plain step asks the lookup for one token and judges it
  by the step's own row); ``+ looking ahead``, ``auto`` as shipped (the
  lookup is asked for all it may propose before ``k`` is chosen, ``k`` is
  chosen knowing the proposal's length, and the evidence is kept per
  match length (``PromptLookupDraft.context``): here a copy's match is 8+
  tokens long with 0.7, 4-7 with 0.2, else 3; prose's a 1-gram with 0.75, a
  2-gram with 0.2, a 3-gram with 0.05); ``the curve carried in``: auto
  as shipped on ``AutoCost(curve=...)`` with the whole curve (no size left
  to explore: the gap to auto is what exploring costs); fixed ``k = 1 ..
  k_max``.

The first three run on a key without a context, which since the tenth
session is a draft model's (positions sharing one rate, ``retry``); they are
ablations of the lookup's estimate, not replays of past code.

Figures are tokens per unit of cost over plain's, medians over seeds. What it
does not model: the decoder's own Python per round, draws that change with
``k``, a curve that drifts during a run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

# c(n) / c(1) for n = 1 .. 9: an eval of n positions with logits (or, with the
# head in our op, hidden states plus verify_hidden's pass) at all of them, one
# thread, Intel Xeon (Sapphire Rapids class, 480 MiB L3), 2026-12-02
# (docs/performance.md, "Eval-cost curves").
CURVES = {
    "llama.cpp Gemma": [1.0, 1.33, 2.23, 1.91, 2.81, 2.38, 3.29, 2.81, 3.68],
    "llama.cpp + head Gemma": [1.0, 1.12, 1.33, 1.41, 1.66, 1.68, 1.95, 2.05, 2.40],  # ours / ours at n = 1
    "transformers Gemma": [1.0, 1.08, 1.17, 1.94, 2.03, 2.08, 2.72, 2.80, 2.87],
    "llama.cpp SmolLM2": [1.0, 1.34, 1.84, 2.07, 2.38, 2.70, 3.29, 3.45, 3.92],
    "llama.cpp + head SmolLM2": [1.0, 1.27, 1.59, 1.95, 2.28, 2.69, 3.0, 3.23, 3.63],  # ours / ours at n = 1
    "transformers shipped": [1.0, 1.06, 1.13, 1.29, 1.31, 1.37, 1.52, 1.53, 1.63],
    # AMD EPYC (Zen 4, 32 MiB L3), 2026-12-03, the venv's AVX2 llama.cpp: steeper (a logits row of
    # Gemma's 262k head costs about a one-token eval there); docs/performance.md, "sixth session".
    "llama.cpp Gemma, EPYC": [1.0, 2.29, 3.82, 3.33, 4.93, 4.49, 5.69, 5.46, 6.51],
    "llama.cpp + head Gemma, EPYC": [1.0, 1.22, 1.27, 1.55, 2.14, 2.05, 2.27, 3.27, 3.52],  # ours / ours at n = 1
    "llama.cpp SmolLM2, EPYC": [1.0, 1.84, 2.77, 2.98, 3.74, 3.88, 4.91, 5.01, 5.59],
    # transformers' float32 forward there (2026-12-03, seventh session): 2 and 3 positions cost more than
    # 4 to 9 (each reads the 671 MB float32 head once per row; from 4 rows one GEMM reads it once).
    "transformers Gemma, EPYC": [1.0, 1.87, 2.53, 1.63, 1.92, 1.86, 2.23, 1.93, 2.15],
    # llama.cpp with our head there, the Q8_0 head repacked by 16 ids (2026-12-03, eighth session): one
    # row is cheap now (0.67x llama.cpp's own one-token eval), so the body's positions weigh more.
    "llama.cpp + head Gemma, EPYC, repacked": [1.0, 1.29, 1.58, 1.96, 2.12, 2.53, 3.53, 4.15, 4.77],  # ours / ours at 1
    # AMD EPYC (Zen 2: AVX2 only, 16 MiB L3), 2026-12-04 (ninth session; docs/performance.md): every curve
    # is steep at 2 positions (a second row costs 0.64-0.80 of a one-token eval) and flatter beyond.
    "llama.cpp Gemma, Zen 2": [1.0, 1.80, 3.46, 2.37, 3.53, 3.18, 4.30, 3.98, 5.12],
    "llama.cpp + head Gemma, Zen 2": [1.0, 1.64, 1.90, 2.09, 2.46, 2.68, 3.04, 3.40, 3.75],  # ours / ours at n = 1
    "transformers Gemma, Zen 2": [1.0, 1.79, 2.49, 2.30, 2.59, 2.52, 2.80, 2.59, 2.89],
    # AMD EPYC (Zen 4, 32 MiB L3), 2026-12-06 (sixteenth and seventeenth sessions): to 17 positions, for
    # k_max 16 (bench_auto_replay replays them whole; this bench reads their first 9). "native": llama.cpp's
    # -march=native build (bench_spec --llama-lib native), whose first step is its steepest.
    "llama.cpp Gemma, Zen 4": [1.0, 1.91, 3.44, 2.51, 3.87, 3.85, 5.46, 3.71, 5.76, 5.39, 7.20, 5.25, 8.10, 7.47,
                               8.91, 7.72, 9.12],
    "llama.cpp Gemma, Zen 4, native": [1.0, 2.55, 3.03, 3.20, 5.00, 5.54, 5.99, 4.78, 6.71, 7.23, 7.40, 6.20, 8.21,
                                       8.53, 9.08, 8.56, 10.82],
    "transformers Gemma, Zen 4": [1.0, 2.00, 2.82, 2.38, 2.29, 2.47, 2.53, 2.19, 2.55, 2.38, 2.64, 2.42, 3.08, 2.86,
                                  2.83, 2.80, 2.96],
    "llama.cpp SmolLM2, Zen 4": [1.0, 1.76, 2.57, 2.96, 3.80, 4.25, 3.99, 3.40, 4.30, 4.33, 5.28, 5.35, 6.03, 5.58,
                                 6.22, 6.42, 7.11],
    "llama.cpp SmolLM2, Zen 4, native": [1.0, 1.90, 2.68, 3.03, 3.77, 4.52, 4.92, 4.94, 5.82, 6.42, 7.16, 7.07, 8.99,
                                         9.39, 9.50, 9.84, 10.41],
}

# Per emitted token: (P(enter a copy), P(leave it)).
KINDS = {"grounded": (0.08, 0.04), "open": (0.01, 0.2)}

PROMPTS, NEW_TOKENS, K_MAX = 40, 64, 8


# ----------------------------------------------------------------------------
# The synthetic text
# ----------------------------------------------------------------------------


class Text:
    """The copy / prose state, and what a lookup proposes and the target accepts in each."""

    def __init__(self, kind: str, sampled: bool, rng: random.Random):
        self.enter, self.leave = KINDS[kind]
        self.sampled, self.rng = sampled, rng
        self.copy = rng.random() < self.enter / (self.enter + self.leave)  # the chain's stationary law

    def advance(self, tokens: int) -> None:
        for _ in range(tokens):
            flip = self.leave if self.copy else self.enter
            if self.rng.random() < flip:
                self.copy = not self.copy

    def proposes(self, i: int) -> bool:
        """Does the lookup propose position ``i`` (given it proposed ``i - 1``)?"""
        return self.copy or self.rng.random() < (0.3 if i == 0 else 0.5)

    def context(self) -> int:
        """The lookup's match length, bucketed as ``PromptLookupDraft.context`` (DESIGN.md, "k = auto")."""
        r = self.rng.random()
        if self.copy:
            return 8 if r < 0.7 else (4 if r < 0.9 else 3)
        return 1 if r < 0.75 else (2 if r < 0.95 else 3)

    def acceptance(self) -> float:
        """The target's acceptance probability of this proposal (greedy: of the argmax matching)."""
        if not self.sampled:
            return 0.97 if self.copy else 0.25
        return self.rng.betavariate(6, 2) if self.copy else self.rng.betavariate(1, 4)


# ----------------------------------------------------------------------------
# One policy over one run
# ----------------------------------------------------------------------------


def _eval_cost(curve: list, n: int, rng: random.Random) -> float:
    cost = curve[n - 1] * rng.lognormvariate(0.0, 0.05)
    return 2 * cost if rng.random() < 0.02 else cost


# The old estimate; + acceptance probabilities; + the probe; + looking ahead (shipped); shipped, with the
# whole curve carried in (AutoCost(curve=...): no size to explore, what exploring costs is the difference).
AUTOS = ("outcomes", "rb", "probe", "auto", "carried")


def run(sv, curve: list, kind: str, sampled: bool, policy, seed: int) -> float:
    """Tokens per unit cost over plain's, for ``policy`` = an int k or one of ``AUTOS``."""
    rng = random.Random(seed)
    carried = {1: {n: c for n, c in enumerate(curve[: K_MAX + 1], start=1)}} if policy == "carried" else None
    model = sv.AutoCost(k_max=K_MAX, curve=carried) if policy in AUTOS else None
    tokens = cost = plain_cost = 0.0
    for _ in range(PROMPTS):
        text = Text(kind, sampled, rng)
        if model is not None:
            model.new_run()
        left = NEW_TOKENS
        while left:
            cap = min(K_MAX, left - 1)
            key = 0
            if policy in ("auto", "carried") and cap > 0:
                # Looking ahead: the whole proposal first, then k chosen knowing it (and its match).
                m = 0
                while m < cap and text.proposes(m):
                    m += 1
                key = (0, text.context() if m else 0)
                k = model.choose([key], [m])[0]
                probe = k == 0 and m > 0  # a plain step judges the proposal's first token
                asked, m = (1, 1) if probe else (k, min(k, m))
            else:
                k = min(policy, cap) if model is None else model.choose([0], [cap])[0]
                # A plain step of "probe" asks the lookup for one token, judged by the step's own row.
                probe = policy == "probe" and k == 0 and cap > 0
                asked = 1 if probe else k
                m = 0
                while m < asked and text.proposes(m):
                    m += 1
            accepted, probs = 0, []
            while accepted < m:  # judged positions: each until the first rejection
                p = text.acceptance()
                probs.append(p)
                if rng.random() >= p:
                    break
                accepted += 1
            width = 0 if probe else m
            seconds = _eval_cost(curve, width + 1, rng)
            if model is not None:
                evidence = probs if sampled and policy != "outcomes" and probs else None
                outcomes = [(key, asked, m, accepted, evidence)] if cap > 0 else []
                model.record(1, asked, width, (0.0, seconds, 0.0), outcomes)
            if probe:
                accepted = 0  # the probe is never verified: the step emits one token
            emitted = min(accepted + 1, left)
            text.advance(emitted)
            left -= emitted
            tokens += emitted
            cost += seconds
        plain_cost += sum(_eval_cost(curve, 1, rng) for _ in range(NEW_TOKENS))
    return (tokens / cost) / (PROMPTS * NEW_TOKENS / plain_cost)


def main(argv=None) -> int:
    global PROMPTS, K_MAX  # run() reads them: set once here, before any run
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--curve", default=None, help="one of: " + ", ".join(CURVES))
    ap.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per run, on one AutoCost (3: a cold cell)")
    ap.add_argument("--k-max", type=int, default=K_MAX, help="auto's k_max and the longest fixed k (16: curves to 17)")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.k_max < 1:
        raise SystemExit("--prompts and --k-max must be >= 1")
    PROMPTS, K_MAX = args.prompts, args.k_max
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from tools.kernel_loader import load_kernel

    sv = load_kernel()
    curves = {args.curve: CURVES[args.curve]} if args.curve else CURVES
    curves = {name: curve for name, curve in curves.items() if len(curve) > K_MAX}
    if not curves:
        raise SystemExit(f"no curve measured to {K_MAX + 1} positions")
    autos_all, carried_all = [], []  # auto as shipped, and carried, over plain, every row: the summary line
    print(f"k=auto's policy, simulated: {PROMPTS} prompts x {NEW_TOKENS} tokens per run, "
          f"medians of {args.seeds} seeds; x plain by the curve's cost\n")
    print("| curve | prompts | mode | best fixed k | auto, outcomes only (/ best) | + acceptance probabilities "
          "| + the probe | + looking ahead: auto as shipped (/ best) | the curve carried in (/ best) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, curve in curves.items():
        for kind in KINDS:
            for sampled in (False, True):
                def med(policy):
                    return statistics.median(run(sv, curve, kind, sampled, policy, s) for s in range(args.seeds))
                fixed = {k: med(k) for k in range(1, K_MAX + 1)}
                best_k = max(fixed, key=fixed.get)
                best = fixed[best_k]
                values = {policy: med(policy) for policy in AUTOS}
                autos_all.append(values["auto"])
                carried_all.append(values["carried"])
                autos = " | ".join(f"{x:.2f}x ({x / best:.2f})" for x in values.values())
                mode = "sampled" if sampled else "greedy"
                print(f"| {name} | {kind} | {mode} | {best:.2f}x (k={best_k}) | {autos} |")
    print(f"\nover plain, {len(autos_all)} rows: auto as shipped lowest {min(autos_all):.3f}x, geometric mean "
          f"{statistics.geometric_mean(autos_all):.3f}x; the curve carried in lowest {min(carried_all):.3f}x, "
          f"geometric mean {statistics.geometric_mean(carried_all):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
