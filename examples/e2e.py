"""End-to-end speculative decoding with the shipped draft / target pair.

    python -m examples.e2e demo     # one prompt: greedy (identical text) and sampled, with statistics
    python -m examples.e2e bench    # speedup for k = 1..8, greedy and sampled, measured vs predicted

Library use (what ``make demo`` / ``make bench`` call)::

    from examples.e2e import demo_section, bench_rows
    demo_section(sv)          # prints; returns a dict of the figures
    rows = bench_rows(sv)     # prints; returns one dict per (mode, k)

The pair in ``models/`` is trained by ``examples/train_pair.py`` (recipe in
``models/README.md``). The plain baseline is a manual KV-cached loop over the
same target (one forward of one token per new token, argmax or a seeded draw
with the kernel's ``sample_draft``), so the speedup is not flattered by
``generate()``'s per-step overhead. Speculative decoding uses the kernel's
``SpeculativeDecoder`` with ``hf_step_pair`` (KV caches cropped on rejection):
greedy runs verify with ``verify_greedy`` on the target's logits, sampled runs
with ``verify_logits`` under the adapters' warping (the draft draws with
``sample_draft`` under the same warping).

Runtimes: the target -- in the baseline and in speculative decoding alike --
runs on transformers' own ``LlamaForCausalLM`` forward, the reference for what
its greedy text is. The draft runs on ``lean_llama.LeanLlama``, the same
weights through a forward with a fifth of the ops: a draft this small costs
its per-op overhead, not its arithmetic (0.28 vs 0.54 ms per token), and
that overhead is a third of a round. The draft only decides speed, never the
output. The demo also prints the speedup with the draft on transformers'
forward, and ``make bench`` the four draft x target runtime combinations.

Timing: models run in float32 on ``THREADS`` torch thread(s) (one: on a small,
shared 2-core machine a second thread costs more in synchronisation than it
gains); every figure is the median of ``repeats`` runs, plain and speculative
interleaved so that load from other processes hits both alike.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = pathlib.Path(os.environ.get("SV_MODELS", ROOT / "models"))
THREADS = int(os.environ.get("SV_E2E_THREADS", "1"))

DEMO_PROMPT = '''def read_config(path, defaults=None):
    """Read a configuration file and return a dict of its settings."""
'''
DEMO_MAX_NEW = 128
# k = 5: the fastest greedy k in `make bench`'s rows for this pair (4-6 are
# within noise of each other; see models/README.md).
DEMO_K = 5
TEMPERATURE = 0.8
SEED = 1234

# The bench's fixed prompt set: starts of functions of different kinds.
BENCH_PROMPTS = [
    "def read_config(path, defaults=None):\n",
    "class Queue:\n    def __init__(self, maxsize=0):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
]
BENCH_MAX_NEW = 64
BENCH_KS = range(1, 9)


# ============================================================================
# Loading
# ============================================================================

_PAIR_CACHE: dict = {}


def load_pair(models_dir: pathlib.Path = MODELS):
    """``(tokenizer, draft, target)`` from ``models/``, float32, eval mode."""
    key = str(models_dir)
    if key not in _PAIR_CACHE:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars inside the demo

        if not (models_dir / "target" / "model.safetensors").is_file():
            raise SystemExit(f"no trained pair in {models_dir}: run `python -m examples.train_pair`")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(models_dir / "tokenizer")
        # bf16 on disk, float32 in memory: CPU bf16 matmuls are not faster at this size.
        draft, target = (
            AutoModelForCausalLM.from_pretrained(models_dir / name, dtype=torch.float32).eval()
            for name in ("draft", "target")
        )
        _PAIR_CACHE[key] = (tokenizer, draft, target)
    return _PAIR_CACHE[key]


def lean(model):
    """``LeanLlama(model)``, made once per model: the draft's runtime (see the module docstring)."""
    from integrations.transformers.custom_generate.lean_llama import lean_for

    return lean_for(model)


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with ``n`` torch threads, restoring the caller's count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ============================================================================
# Plain decoding (the baseline) and speculative decoding
# ============================================================================


@torch.no_grad()
def plain_decode(model, prompt_ids: torch.Tensor, max_new: int, sample=None) -> torch.Tensor:
    """Prompt + ``max_new`` tokens, one cached forward per token.

    ``sample`` None: greedy (argmax). Else a function from a float32 logits
    row ``[V]`` to a token id (``sampler`` makes one).
    """
    out = model(prompt_ids.view(1, -1), use_cache=True)
    cache, logits = out.past_key_values, out.logits[0, -1]
    tokens = prompt_ids.tolist()
    for i in range(max_new):
        token = int(torch.argmax(logits)) if sample is None else sample(logits.float())
        tokens.append(token)
        if i + 1 < max_new:  # the last token needs no forward
            out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[0, -1]
    return torch.tensor(tokens, dtype=torch.int64)


def sampler(sv, temperature: float, generator: torch.Generator):
    """Plain sampling at ``temperature``: a logits row to a token drawn from its
    warped distribution, by the kernel's ``sample_draft`` (the law speculative
    sampling reproduces)."""
    return lambda logits: int(sv.sample_draft(logits, temperature=temperature, generator=generator))


def speculative_decode(sv, draft, target, prompt_ids, max_new, k, greedy, seed=SEED, temperature=TEMPERATURE,
                       method="token"):
    """``(output ids, stats)`` of one speculative run with fresh KV caches."""
    temperature = 0.0 if greedy else temperature
    # Two generators: the draft's token draws and the verifier's uniforms.
    draft_gen = torch.Generator().manual_seed(seed)
    verify_gen = torch.Generator().manual_seed(seed + 1)
    draft_step, target_step = sv.hf_step_pair(draft, target, temperature=temperature, generator=draft_gen)
    decoder = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=greedy, generator=verify_gen, method=method)
    out = decoder.generate(prompt_ids, max_new)
    return out, decoder.stats


def timed(fn):
    """``(result, seconds)``."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def compare(sv, draft, target, prompt_ids, max_new, k, greedy, repeats):
    """Plain vs speculative, interleaved, ``repeats`` times; medians.

    Every repeat uses the same seeds, so it does the same work and emits the
    same tokens (asserted): only the timing varies, and the printed text and
    statistics are reproducible. Returns a dict with both outputs, the
    speculative statistics (of the median-time repeat), median seconds and the
    speedup.
    """
    plain_s, spec_s, outputs = [], [], []
    # inference_mode for both sides alike: it trims autograd bookkeeping from
    # every forward (~0.1 ms of a 0.6 ms draft call).
    with torch.inference_mode():
        for _ in range(repeats):
            _one_repeat(sv, draft, target, prompt_ids, max_new, k, greedy, plain_s, spec_s, outputs)
    plain, spec, _ = outputs[0]
    # Same tokens every repeat; the time split is taken from the median repeat.
    stats = outputs[sorted(range(repeats), key=spec_s.__getitem__)[repeats // 2]][2]
    for other_plain, other_spec, _ in outputs[1:]:
        assert torch.equal(other_plain, plain) and torch.equal(other_spec, spec), "a seeded repeat differed"
    plain_med, spec_med = statistics.median(plain_s), statistics.median(spec_s)
    return dict(plain=plain, spec=spec, stats=stats, plain_s=plain_med, spec_s=spec_med,
                speedup=plain_med / spec_med, new=len(spec) - len(prompt_ids))


def _one_repeat(sv, draft, target, prompt_ids, max_new, k, greedy, plain_s, spec_s, outputs):
    """One plain run then one speculative run, both seeded; appends to the lists."""
    sample = None if greedy else sampler(sv, TEMPERATURE, torch.Generator().manual_seed(SEED + 100))
    plain, seconds = timed(lambda: plain_decode(target, prompt_ids, max_new, sample))
    plain_s.append(seconds)
    (spec, stats), seconds = timed(
        lambda: speculative_decode(sv, draft, target, prompt_ids, max_new, k, greedy, seed=SEED)
    )
    spec_s.append(seconds)
    outputs.append((plain, spec, stats))


# ============================================================================
# Statistics
# ============================================================================


def per_token_acceptance(stats) -> float:
    """Per-token acceptance α: accepted / (accepted + rejections).

    Each judged draft token is either accepted or (at most once a round,
    where a correction token is emitted) rejected, so this is the
    maximum-likelihood α of the i.i.d. model behind
    E[tokens/round] = (1 - α^(k+1)) / (1 - α).
    """
    judged = stats.accepted + stats.corrections
    return stats.accepted / judged if judged else 0.0


def stats_lines(stats, plain_s, spec_s, new) -> list[str]:
    round_s = stats.draft_seconds + stats.target_seconds + stats.verify_seconds
    share = lambda s: 100.0 * s / round_s if round_s else 0.0  # noqa: E731
    hist = "  ".join(f"{j}:{c}" for j, c in enumerate(stats.histogram))
    return [
        f"  plain target decoding  {new / plain_s:7.1f} tokens/s   ({1e3 * plain_s:.0f} ms)",
        f"  speculative (k={stats.k})     {new / spec_s:7.1f} tokens/s   ({1e3 * spec_s:.0f} ms)"
        f"   speedup {plain_s / spec_s:.2f}x",
        f"  acceptance rate {stats.acceptance_rate:.3f} (accepted {stats.accepted} of {stats.drafted} drafted; "
        f"per-token α {per_token_acceptance(stats):.3f}), "
        f"{stats.tokens_per_round:.2f} tokens/round over {stats.rounds} rounds "
        f"({stats.corrections} ended by a correction token, {stats.bonuses} by a bonus token)",
        f"  accepted-length histogram  {hist}",
        f"  round time: draft {share(stats.draft_seconds):.1f}%, target {share(stats.target_seconds):.1f}%, "
        f"verification {share(stats.verify_seconds):.2f}% "
        f"({1e6 * stats.verify_seconds / max(stats.rounds, 1):.0f} us/round)",
    ]


# ============================================================================
# Demo
# ============================================================================


def demo_section(sv, repeats: int = 7, max_new: int = DEMO_MAX_NEW, k: int = DEMO_K) -> dict:
    """Print the end-to-end demo; return its figures.

    Greedy: the speculative text must equal plain greedy decoding (asserted).
    Sampled (temperature 0.8): seeded, so the printed text is reproducible;
    its law is the target's own (the kernel's ``verify_logits``, under the
    warping the draft sampled from).
    """
    tokenizer, hf_draft, target = load_pair()
    draft = lean(hf_draft)
    prompt_ids = tokenizer(DEMO_PROMPT, return_tensors="pt").input_ids[0]
    out = {}
    with torch_threads(THREADS):
        print(f"End-to-end: draft {_n(hf_draft)} / target {_n(target)} parameters (models/), "
              f"k={k}, {max_new} new tokens, medians of {repeats} runs, {THREADS} thread(s).")
        print("Plain baseline: a KV-cached loop over the target, one token per forward. The target runs on\n"
              "transformers' forward in both; the draft on integrations/transformers/custom_generate/lean_llama.py (same weights, fewer ops).\n")

        greedy = compare(sv, draft, target, prompt_ids, max_new, k, True, repeats)
        assert torch.equal(greedy["plain"], greedy["spec"]), "speculative greedy text differs from plain greedy"
        print("Greedy (temperature 0) -- plain and speculative text, identical:")
        print(_indent(tokenizer.decode(greedy["spec"])))
        print("\n".join(stats_lines(greedy["stats"], greedy["plain_s"], greedy["spec_s"], greedy["new"])))
        out["greedy"] = _figures(greedy)
        # The same run with the draft on transformers' forward: what the lean runtime adds.
        hf = compare(sv, hf_draft, target, prompt_ids, max_new, k, True, repeats)
        assert torch.equal(hf["plain"], hf["spec"]), "speculative greedy text differs from plain greedy"
        print(f"  with the draft on transformers' forward instead: {hf['new'] / hf['spec_s']:.1f} tokens/s, "
              f"speedup {hf['speedup']:.2f}x")
        out["greedy_hf_draft"] = _figures(hf)

        sampled = compare(sv, draft, target, prompt_ids, max_new, k, False, repeats)
        print(f"\nSampled (temperature {TEMPERATURE}, seed {SEED}) -- speculative text:")
        print(_indent(tokenizer.decode(sampled["spec"])))
        print("\n".join(stats_lines(sampled["stats"], sampled["plain_s"], sampled["spec_s"], sampled["new"])))
        out["sampled"] = _figures(sampled)
    print(f"\nToken-wise vs block verification (k={k}, {BENCH_MAX_NEW} tokens x {len(BENCH_PROMPTS)} prompts x "
          f"{len(METHOD_SEEDS)} seeds per row):")
    out["methods"] = method_rows(sv, k=k)
    return out


# ============================================================================
# Token-wise against block verification (Sun et al. 2024), sampled
# ============================================================================

METHOD_TEMPERATURES = (0.8, 1.0)
METHOD_SEEDS = range(6)


def method_rows(sv, k: int = DEMO_K, max_new: int = BENCH_MAX_NEW, seeds=METHOD_SEEDS,
                temperatures=METHOD_TEMPERATURES, quiet: bool = False) -> list[dict]:
    """Token-wise vs block verification on the shipped pair: tokens per round,
    acceptance and speedup over plain sampling, pooled over BENCH_PROMPTS x seeds
    (the same seeds for both methods: the same draft draws until they diverge)."""
    tokenizer, hf_draft, target = load_pair()
    draft = lean(hf_draft)
    prompts = [tokenizer(p, return_tensors="pt").input_ids[0] for p in BENCH_PROMPTS]
    rows = []
    with torch_threads(THREADS), torch.inference_mode():
        for temperature in temperatures:
            plain_s = 0.0
            for seed in seeds:
                sample = sampler(sv, temperature, torch.Generator().manual_seed(seed + 100))
                for ids in prompts:
                    plain_s += timed(lambda: plain_decode(target, ids, max_new, sample))[1]
            for method in ("token", "block"):
                spec_s, rounds, new, accepted, drafted = 0.0, 0, 0, 0, 0
                for seed in seeds:
                    for ids in prompts:
                        (out, stats), seconds = timed(lambda: speculative_decode(
                            sv, draft, target, ids, max_new, k, False, seed=seed, temperature=temperature,
                            method=method))
                        spec_s += seconds
                        rounds, new = rounds + stats.rounds, new + stats.new_tokens
                        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
                rows.append(dict(temperature=temperature, method=method, k=k, tokens_per_round=new / rounds,
                                 acceptance=accepted / drafted, speedup=plain_s / spec_s, rounds=rounds))
                if not quiet:
                    r = rows[-1]
                    print(f"  T={temperature} {method:5s}: {r['tokens_per_round']:.3f} tokens/round, acceptance "
                          f"{r['acceptance']:.3f} ({rounds} rounds), speedup over plain sampling {r['speedup']:.2f}x")
    return rows


def _figures(run) -> dict:
    stats = run["stats"]
    return dict(speedup=run["speedup"], plain_tok_s=run["new"] / run["plain_s"],
                spec_tok_s=run["new"] / run["spec_s"], acceptance=stats.acceptance_rate,
                tokens_per_round=stats.tokens_per_round, histogram=list(stats.histogram),
                verify_share=stats.verify_seconds / max(stats.total_seconds, 1e-12))


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.splitlines())


def _n(model) -> str:
    return f"{sum(t.numel() for t in model.parameters()) / 1e6:.2f} M"


# ============================================================================
# Bench: per-call costs and the predicted speedup
# ============================================================================


@torch.inference_mode()
def forward_costs_ms(model, sizes, context: int = 64, calls: int = 25) -> dict:
    """Median ms of one cached forward over ``n`` new tokens after ``context``, per n.

    The sizes are measured in interleaved rounds after a warm-up, so a burst
    of load from other processes hits every size alike.
    """
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, model.config.vocab_size, (1, context), generator=gen)
    cache = model(ctx, use_cache=True).past_key_values
    times = {n: [] for n in sizes}
    for rep in range(calls + 3):
        for n in sizes:
            new = torch.randint(0, model.config.vocab_size, (1, n), generator=gen)
            start = time.perf_counter()
            model(new, past_key_values=cache, use_cache=True)
            seconds = time.perf_counter() - start
            cache.crop(-n)  # back to the context (negative: remove that many)
            if rep >= 3:  # the first rounds warm caches and allocators
                times[n].append(seconds)
    return {n: 1e3 * statistics.median(ts) for n, ts in times.items()}


def forward_ms(model, n_tokens: int, context: int = 64, calls: int = 25) -> float:
    """Median ms of one cached forward over ``n_tokens`` after ``context`` tokens."""
    return forward_costs_ms(model, [n_tokens], context, calls)[n_tokens]


@torch.inference_mode()
def draft_in_round_ms(draft, target, k: int, context: int = 64, calls: int = 25) -> float:
    """Median ms per draft token of ``k`` one-token draft forwards run right after
    a (k+1)-token target forward, as in a speculative round.

    Alone, the draft's forward runs with its weights in cache; in a round the
    target's ~40 MB of weights have just streamed through and evicted them,
    so the first draft forward after the target costs about twice as much.
    """
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, target.config.vocab_size, (1, context), generator=gen)
    draft_cache = draft(ctx, use_cache=True).past_key_values
    target_cache = target(ctx, use_cache=True).past_key_values
    times = []
    for rep in range(calls + 3):
        target(torch.randint(0, target.config.vocab_size, (1, k + 1), generator=gen),
               past_key_values=target_cache, use_cache=True)
        target_cache.crop(-(k + 1))
        start = time.perf_counter()
        for _ in range(k):
            token = torch.randint(0, target.config.vocab_size, (1, 1), generator=gen)
            draft(token, past_key_values=draft_cache, use_cache=True)
        seconds = time.perf_counter() - start
        draft_cache.crop(-k)
        if rep >= 3:
            times.append(seconds / k)
    return 1e3 * statistics.median(times)


def call_costs(draft, target, ks) -> dict:
    """Measured per-call costs: draft per token (alone and inside a round of k),
    target per 1 and per k+1 tokens."""
    return dict(
        draft=forward_ms(draft, 1),
        draft_in_round={k: draft_in_round_ms(draft, target, k) for k in ks},
        target=forward_costs_ms(target, sorted({1, *[k + 1 for k in ks]})),
    )


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens/round] = (1 - α^(k+1)) / (1 - α): accepted prefix plus one token."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c_plain: float, c_draft: float, c_round_target: float,
                      c_verify: float) -> float:
    """E[tokens/round] · c_plain / (k·c_draft + c_target(k+1) + c_verify)."""
    return expected_tokens_per_round(alpha, k) * c_plain / (k * c_draft + c_round_target + c_verify)


def bench_rows(sv, repeats: int = 2, ks=BENCH_KS, max_new: int = BENCH_MAX_NEW) -> list[dict]:
    """End-to-end speedup over plain decoding, k = 1..8, greedy and sampled.

    Each row sums the medians over the fixed prompt set (``BENCH_PROMPTS``,
    ``max_new`` tokens each). Beside the measured speedup, two predictions from
    the measured per-token acceptance α (``per_token_acceptance``):

        E[tokens/round] = (1 - α^(k+1)) / (1 - α)
        predicted       = E[tokens/round] · c_target(1) / (k·c_draft + c_target(k+1) + c_verify)

    * ``pred(calls)``: c_target(n) from isolated forward calls
      (``forward_costs_ms``), c_draft from k draft calls right after a target
      call (``draft_in_round_ms``: the target evicts the draft's weights, which
      isolated draft calls would miss), c_verify from the run -- the textbook
      estimate from per-call costs;
    * ``pred(run)``: every cost as the run saw it (draft time per drafted
      token and target time per round, both including the adapter's own
      Python, and plain time per token) -- what is left is the acceptance model.
    """
    tokenizer, hf_draft, target = load_pair()
    draft = lean(hf_draft)
    prompts = [tokenizer(text, return_tensors="pt").input_ids[0] for text in BENCH_PROMPTS]
    rows = []
    with torch_threads(THREADS):
        costs = call_costs(draft, target, ks)
        print(f"End-to-end speedup ({len(prompts)} prompts x {max_new} tokens, medians of {repeats}, "
              f"{THREADS} thread(s)); plain = KV-cached target loop, one token per forward.")
        print(f"  forward calls: draft {costs['draft']:.2f} ms/token alone, in a round of k "
              + ", ".join(f"{k}: {ms:.2f}" for k, ms in costs["draft_in_round"].items())
              + "; target " + ", ".join(f"{n} tok {ms:.2f}" for n, ms in costs["target"].items()) + " ms")
        print("  predicted = E·c_target(1) / (k·c_draft + c_target(k+1) + c_verify), "
              "E = (1-α^(k+1))/(1-α), α = per-token acceptance")
        print(f"  {'mode':8} {'k':>2} {'α':>6} {'accept':>7} {'tok/round':>9} {'E':>5} {'verify%':>8} "
              f"{'speedup':>8} {'pred(calls)':>11} {'pred(run)':>9}")
        for greedy in (True, False):
            for k in ks:
                row = _bench_row(sv, draft, target, prompts, max_new, k, greedy, repeats, costs)
                rows.append(row)
                print(f"  {row['mode']:8} {k:>2} {row['alpha']:6.3f} {row['acceptance']:7.3f} "
                      f"{row['tokens_per_round']:9.2f} {row['expected_tokens_per_round']:5.2f} "
                      f"{100 * row['verify_share']:7.2f}% {row['speedup']:7.2f}x "
                      f"{row['predicted_calls']:10.2f}x {row['predicted_run']:8.2f}x", flush=True)
    return rows


def runtime_rows(sv, k: int = DEMO_K, repeats: int = 5, max_new: int = DEMO_MAX_NEW) -> list[dict]:
    """Greedy speedup on the demo prompt for each draft x target runtime.

    Runtimes: transformers' ``LlamaForCausalLM`` forward, or ``LeanLlama``
    (same weights, fewer ops). The plain baseline always runs the same target
    runtime as the speculative run, so each row compares like with like; the
    demo's configuration is draft lean, target transformers.
    """
    tokenizer, hf_draft, hf_target = load_pair()
    prompt_ids = tokenizer(DEMO_PROMPT, return_tensors="pt").input_ids[0]
    rows = []
    with torch_threads(THREADS):
        print(f"Runtimes (greedy, demo prompt, k={k}, {max_new} tokens, medians of {repeats}):")
        print(f"  {'draft':12} {'target':12} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>8}")
        for draft_name, draft in (("lean", lean(hf_draft)), ("transformers", hf_draft)):
            for target_name, target in (("transformers", hf_target), ("lean", lean(hf_target))):
                run = compare(sv, draft, target, prompt_ids, max_new, k, True, repeats)
                assert torch.equal(run["plain"], run["spec"]), "speculative greedy text differs from plain greedy"
                row = dict(draft=draft_name, target=target_name, speedup=run["speedup"],
                           plain_tok_s=run["new"] / run["plain_s"], spec_tok_s=run["new"] / run["spec_s"])
                rows.append(row)
                print(f"  {draft_name:12} {target_name:12} {row['plain_tok_s']:11.1f} {row['spec_tok_s']:10.1f} "
                      f"{row['speedup']:7.2f}x", flush=True)
    return rows


def _bench_row(sv, draft, target, prompts, max_new, k, greedy, repeats, costs) -> dict:
    totals = dict(plain_s=0.0, spec_s=0.0, accepted=0, drafted=0, rounds=0, new=0, rejections=0,
                  draft_s=0.0, target_s=0.0, verify_s=0.0, total_s=0.0)
    for prompt_ids in prompts:
        run = compare(sv, draft, target, prompt_ids, max_new, k, greedy, repeats)
        if greedy:
            assert torch.equal(run["plain"], run["spec"]), f"greedy k={k}: speculative text differs"
        stats = run["stats"]
        for key, value in dict(
            plain_s=run["plain_s"], spec_s=run["spec_s"], accepted=stats.accepted, drafted=stats.drafted,
            rounds=stats.rounds, new=stats.new_tokens,
            rejections=stats.corrections,
            draft_s=stats.draft_seconds, target_s=stats.target_seconds,
            verify_s=stats.verify_seconds, total_s=stats.total_seconds,
        ).items():
            totals[key] += value
    t = totals
    judged = t["accepted"] + t["rejections"]
    alpha = t["accepted"] / judged if judged else 0.0
    rounds = max(t["rounds"], 1)
    c_verify = 1e3 * t["verify_s"] / rounds
    predicted_calls = predicted_speedup(alpha, k, costs["target"][1], costs["draft_in_round"][k],
                                        costs["target"][k + 1], c_verify)
    predicted_run = predicted_speedup(
        alpha, k, 1e3 * t["plain_s"] / t["new"], 1e3 * t["draft_s"] / max(t["drafted"], 1),
        1e3 * t["target_s"] / rounds, c_verify,
    )
    return dict(mode="greedy" if greedy else "sampled", k=k, alpha=alpha,
                acceptance=t["accepted"] / max(t["drafted"], 1), tokens_per_round=t["new"] / rounds,
                expected_tokens_per_round=expected_tokens_per_round(alpha, k),
                verify_share=t["verify_s"] / max(t["total_s"], 1e-12), speedup=t["plain_s"] / t["spec_s"],
                predicted_calls=predicted_calls, predicted_run=predicted_run,
                plain_tok_s=t["new"] / t["plain_s"], spec_tok_s=t["new"] / t["spec_s"])


# ============================================================================
# Standalone
# ============================================================================


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[1:] == ["--engine", "llama_cpp"] and argv[0] in ("demo", "bench"):
        # The shipped pair as GGUF on llama.cpp's forwards (integrations/llama_cpp/).
        from integrations.llama_cpp import bench_llama

        bench_llama.demo() if argv[0] == "demo" else bench_llama.run()
        return
    if argv[1:] == ["--engine", "torch"]:
        argv = argv[:1]
    if argv not in (["demo"], ["bench"], ["methods"]):
        raise SystemExit("usage: python -m examples.e2e demo|bench|methods [--engine torch|llama_cpp]")
    from tools.kernel_loader import load_kernel

    sv = load_kernel()
    if argv == ["demo"]:
        demo_section(sv)
    elif argv == ["methods"]:
        method_rows(sv)
    else:
        bench_rows(sv)
        runtime_rows(sv)


if __name__ == "__main__":
    main()
