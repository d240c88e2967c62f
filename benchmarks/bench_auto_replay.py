"""``k="auto"`` replayed on real models' greedy text: the policy alone, on what the models really write.

    python -m benchmarks.bench_auto_replay            # records the traces once (llama.cpp, make real-models)
    python -m benchmarks.bench_auto_replay --contexts ngram,match

``bench_auto`` drives the policy on a synthetic text; this drives it on
plain greedy output of Gemma 3 270M and SmolLM2-135M (llama.cpp, the bench's
prompts), recorded once into ``out/auto_traces.json``. Greedy speculation
emits exactly plain greedy's tokens, so a round is replayed without the
engine: at position ``t`` the real ``sv.PromptLookupDraft`` proposes from
prompt + output[:t], the proposal's accepted length is its common prefix
with output[t:], and the round is priced by an eval-cost curve measured in
``make bench-real`` (``bench_auto.CURVES``: c(n)/c(1), times a lognormal
factor, sigma 0.05, doubled for 2% of evals). The real ``sv.AutoCost`` is
driven as the decoder drives it (looking ahead, the probe, contexts), one
per curve for the whole run, the input-grounded prompts first and then the
open ones (the order and sharing of ``bench_spec``'s rows).

Runs: ``bench`` is ``bench_spec``'s cell (2 prompts of each kind, 64 new
tokens: a cold start is a large share of it); ``all`` is every prompt, 128
tokens. ``--contexts`` compares what the evidence is keyed by: ``match``
(``PromptLookupDraft.context``, the match length bucketed, as shipped) and
``ngram`` (the matched n-gram size, before 2026-12-02's fifth session).
``--carried`` adds two columns that start from what an earlier process
left: ``from a run``, an ``AutoCost`` saved after an earlier run (another
seed) over the *other* prompts (those the run does not replay; the ``all``
run has none, so there the same prompts) and loaded (``AutoCost.save`` /
``load``: the sizes that run measured and the draft's acceptance pools per
match context); ``full``, ``AutoCost(curve=...)`` with the whole curve
``c(1) .. c(k_max + 1)`` and no pools (what ``bench_spec``'s ``lookup k=auto
carried`` row is given, from the cell's measured eval costs).
A curve is replayed with ``k_max`` = its length - 1: 8 for the 9-position
curves, 16 (the default since the sixteenth session) for the Zen 4's.
Figures: tokens per unit of cost over plain's, medians over seeds. Not
modelled: the decoder's Python, sampled mode (its draws change with k).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import tempfile

import torch

from .bench_auto import CURVES, _eval_cost

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = ROOT / "out" / "auto_traces.json"
LOOK = 16  # what the recorded lookup is asked for: the longest curve's k_max
# Which curves each model's text is priced by (bench_auto.CURVES).
PRICED = {"gemma": ("llama.cpp Gemma", "llama.cpp + head Gemma", "transformers Gemma",
                   "llama.cpp Gemma, EPYC", "llama.cpp + head Gemma, EPYC", "transformers Gemma, EPYC",
                   "llama.cpp + head Gemma, EPYC, repacked", "llama.cpp Gemma, Zen 2", "llama.cpp + head Gemma, Zen 2",
                   "transformers Gemma, Zen 2", "llama.cpp Gemma, Zen 4", "llama.cpp Gemma, Zen 4, native",
                   "transformers Gemma, Zen 4"),
          "smollm2": ("llama.cpp SmolLM2", "llama.cpp + head SmolLM2", "llama.cpp SmolLM2, EPYC",
                      "llama.cpp SmolLM2, Zen 4", "llama.cpp SmolLM2, Zen 4, native")}
RUNS = {"bench": (2, 64), "all": (None, 128)}


# ----------------------------------------------------------------------------
# The traces
# ----------------------------------------------------------------------------


def record(sv, path: pathlib.Path, max_new: int = 160) -> dict:
    """Plain greedy output of each real model on each bench prompt (llama.cpp, one thread)."""
    from . import bench_prompts
    from .spec_engines import LlamaEngine, missing, model_specs

    out = {}
    for model in PRICED:
        spec = model_specs()[model]
        why = missing(spec, "llama_cpp")
        if why:
            raise SystemExit(f"cannot record {model}'s traces: {why}")
        engine = LlamaEngine(spec, sv, 1)
        for kind in ("grounded", "open"):
            for text in bench_prompts.prompts("real", kind):
                prompt = engine.tokenize(text)
                _, _, new = engine.plain(prompt, max_new, 0.0, torch.Generator().manual_seed(0))
                out.setdefault(model, {}).setdefault(kind, []).append(dict(prompt=prompt, new=new))
        del engine
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def steps(sv, trace: dict, context: str) -> list:
    """Per position ``t``: ``(proposal length, accepted length, context)`` of a lookup asked for ``LOOK``."""
    draft = sv.PromptLookupDraft()
    seq, prompt, new = trace["prompt"] + trace["new"], len(trace["prompt"]), trace["new"]
    out = []
    for t in range(len(new)):
        tokens = draft(torch.tensor(seq[: prompt + t]), LOOK)[0].tolist()
        accepted = next((i for i, (a, b) in enumerate(zip(tokens, new[t:])) if a != b), min(len(tokens), len(new) - t))
        # "ngram": the matched n-gram size (max_ngram = 3), recovered from the match length's bucket.
        ctx = draft.context if context == "match" else min(draft.context, 3)
        out.append((len(tokens), accepted, ctx))
    return out


# ----------------------------------------------------------------------------
# Replaying a policy
# ----------------------------------------------------------------------------


def replay(model, text: list, max_new: int, curve: list, rng: random.Random, k=None) -> tuple:
    """``(tokens, cost)`` of one prompt: fixed ``k``, or ``model`` (an ``AutoCost``) as the decoder drives it."""
    if model is not None:
        model.new_run()
    t = cost = 0
    while t < max_new:
        got, accepted, ctx = text[t]
        cap = min(len(curve) - 1, max_new - t - 1)
        got = min(got, cap)
        key = (0, ctx if got else 0)
        if k is not None:
            m = min(k, got)
        else:
            m = min(model.choose([key], [got])[0], got) if cap else 0
        seconds = _eval_cost(curve, m + 1, rng)  # bench_auto's noise: the two benches price alike
        hit = min(accepted, m)
        if model is not None:
            if cap == 0:
                outcomes = []
            elif m:
                outcomes = [(key, m, m, hit)]
            else:  # a plain step: the probe judges the proposal's first token by the step's own row
                outcomes = [(key, 1, min(1, got), int(got > 0 and accepted > 0))]
            model.record(1, cap, m, (0.0, seconds, 0.0), outcomes)
        t += hit + 1
        cost += seconds
    return t, cost


def run_curve(sv, texts: dict, curve: list, max_new: int, seed: int, auto=None, fixed: bool = True) -> tuple:
    """``({(kind, policy): x plain}, the AutoCost)`` for one seed: one AutoCost over the grounded then the
    open prompts (``auto`` if given, else a cold one); ``fixed``: the fixed k too."""
    rng = random.Random(seed)
    auto, out = auto or sv.AutoCost(k_max=_k_max(curve)), {}
    for kind in ("grounded", "open"):
        plain = len(texts[kind]) * max_new * curve[0]
        for policy in ["auto"] + (list(range(1, _k_max(curve) + 1)) if fixed else []):
            tokens = cost = 0
            for text in texts[kind]:
                got = replay(auto if policy == "auto" else None, text, max_new, curve, rng,
                             None if policy == "auto" else policy)
                tokens, cost = tokens + got[0], cost + got[1]
            out[(kind, policy)] = (tokens / cost) / (len(texts[kind]) * max_new / plain)
    return out, auto


def _k_max(curve: list) -> int:
    """The k_max a curve is replayed with: its length - 1 (9 positions: 8; 17: 16, the default since the
    sixteenth session)."""
    return len(curve) - 1


def _saved_and_loaded(sv, auto, k_max: int):
    """``auto`` through ``save`` and ``AutoCost.load``: what a later process starts from."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "auto.json"
        auto.save(path)
        return sv.AutoCost.load(path, k_max=k_max)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=pathlib.Path, default=TRACES, help="recorded traces (made if missing)")
    ap.add_argument("--seeds", type=int, default=9)
    ap.add_argument("--contexts", default="match", help="comma list of: match (as shipped), ngram")
    ap.add_argument("--carried", action="store_true", help="also the curve carried in: from an earlier run, and full")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tools.kernel_loader import load_kernel

    from .bench_prompts import spread

    torch.set_num_threads(1)
    sv = load_kernel()
    traces = json.loads(args.traces.read_text()) if args.traces.exists() else record(sv, args.traces)
    contexts = args.contexts.split(",")
    print("k=auto replayed on recorded greedy text (bench: 2 prompts x 64 tokens per kind; all: every prompt "
          f"x 128), medians of {args.seeds} seeds; x plain by the curve's cost\n")
    extra = ["auto, curve carried from a run (/ best)", "auto, full curve carried (/ best)"] if args.carried else []
    print("| curve | run | prompts | best fixed k | " + " | ".join(f"auto, contexts by {c} (/ best)" for c in contexts)
          + "".join(f" | {e}" for e in extra) + " |")
    print("|---|---|---|---|" + "---|" * (len(contexts) + len(extra)))
    for model, curves in PRICED.items():
        for run_name, (n_prompts, max_new) in RUNS.items():
            picked = {kind: spread(traces[model][kind], n_prompts) if n_prompts else traces[model][kind]
                      for kind in ("grounded", "open")}
            texts = {c: {kind: [steps(sv, tr, c) for tr in picked[kind]] for kind in ("grounded", "open")}
                     for c in contexts}
            # The earlier process's prompts: the others (none left in the "all" run: the same ones).
            others = {kind: [steps(sv, tr, contexts[0]) for tr in traces[model][kind] if tr not in picked[kind]]
                      or texts[contexts[0]][kind] for kind in ("grounded", "open")} if args.carried else None
            for name in curves:
                runs = {c: [run_curve(sv, texts[c], CURVES[name], max_new, s) for s in range(args.seeds)]
                        for c in contexts}
                per_seed = {c: [r for r, _ in runs[c]] for c in contexts}
                if args.carried:  # later processes: other seeds' noise, the first context's texts
                    c0, full = contexts[0], {1: dict(enumerate(CURVES[name], start=1))}
                    earlier = [run_curve(sv, others, CURVES[name], max_new, 500 + s, fixed=False)[1]
                               for s in range(args.seeds)]
                    per_seed["from a run"] = [run_curve(sv, texts[c0], CURVES[name], max_new, 1000 + s,
                                                        _saved_and_loaded(sv, a, _k_max(CURVES[name])),
                                                        fixed=False)[0]
                                              for s, a in enumerate(earlier)]
                    per_seed["full"] = [run_curve(sv, texts[c0], CURVES[name], max_new, 1000 + s,
                                                  sv.AutoCost(k_max=_k_max(CURVES[name]), curve=full),
                                                  fixed=False)[0]
                                        for s in range(args.seeds)]
                for kind in ("grounded", "open"):
                    first = per_seed[contexts[0]]
                    fixed = {k: statistics.median(r[(kind, k)] for r in first)
                             for k in range(1, _k_max(CURVES[name]) + 1)}
                    best_k = max(fixed, key=fixed.get)
                    cells = []
                    for c in contexts + (["from a run", "full"] if args.carried else []):
                        a = statistics.median(r[(kind, "auto")] for r in per_seed[c])
                        cells.append(f"{a:.2f}x ({a / fixed[best_k]:.2f})")
                    print(f"| {name} | {run_name} | {kind} | {fixed[best_k]:.2f}x (k={best_k}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
