"""Speculative decoding on llama.cpp's forwards against llama.cpp's plain decoding, in one run.

    make bench ENGINE=llama_cpp        # = python -m benchmarks.bench --engine llama_cpp
    python -m integrations.llama_cpp.bench_llama [--repeats 3] [--max-new 64] [--threads 1]

The shipped pair as GGUF (``make gguf``), one thread, on the bench prompts and
two prompts not from the training corpus (code in another language, prose).
Rows, each the median of ``--repeats`` runs of the whole prompt set:

* ``llama.cpp plain (Llama.generate)``: llama-cpp-python's own loop and
  llama.cpp's sampler chain (greedy; temperature alone at T = 0.8);
* ``llama.cpp plain (lean loop)``: one ``llama_decode`` per token on the same
  context driver as the adapter, the token its argmax or a ``sample_draft``
  draw: the stricter baseline (less Python per token) and the one the
  speedups are taken against;
* ours, greedy and sampled (T = 0.8), k = 1..8, through ``llama_step_pair``.

Then the round anatomy at the fastest k of each mode: per round, the draft's
and the target's time inside ``llama_decode``, the adapters' Python, the
verify op, and the decoder loop's own Python.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch

from examples.e2e import BENCH_PROMPTS

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPERATURE = 0.8
# Not from the training corpus (the Python 3.11 standard library).
OTHER_PROMPTS = [
    "fn parse_config(path: &Path) -> Result<Config, Error> {\n",
    "The committee met on Tuesday to discuss the budget for next year. After a long debate,",
]


def _median_run(fn, repeats):
    """Median wall seconds of ``repeats`` runs, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(repeats: int = 3, max_new: int = 64, threads: int = 1, ks=range(1, 9), json_path=None) -> dict:
    """Every configuration once per pass, ``repeats`` passes (round robin: drifting load from
    other processes falls on all rows alike), medians per row; then the eval costs."""
    from tools.kernel_loader import load_kernel

    from .pair import ensure_gguf, generate_plain, open_llama, plain_decode
    from .spec_verify_llama import LlamaCppStep, llama_step_pair

    torch.set_num_threads(1)
    sv = load_kernel()
    gg = ensure_gguf()
    draft_llama = open_llama(gg / "draft.gguf", threads=threads)
    target_llama = open_llama(gg / "target.gguf", threads=threads)
    texts = list(BENCH_PROMPTS) + OTHER_PROMPTS
    prompts = [target_llama.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
    n_new = max_new * len(prompts)
    configs = []  # (name, mode, k, once() -> dict of figures)

    for mode, temp in (("greedy", 0.0), ("sampled", TEMPERATURE)):
        configs.append(("llama.cpp plain (Llama.generate)", mode, None,
                        lambda temp=temp: [generate_plain(target_llama, p, max_new, temp, seed=i)
                                           for i, p in enumerate(prompts)] and {}))
        step = LlamaCppStep(target_llama, temperature=temp, sv=sv)

        def lean(step=step, g=torch.Generator().manual_seed(0)):
            decode = 0.0
            for p in prompts:
                plain_decode(step, p, max_new, generator=g)
                decode += step.decode_seconds  # reset() per prompt zeroes it
            return dict(decode=decode)

        configs.append(("llama.cpp plain (lean loop)", mode, None, lean))

    for mode, temp in (("greedy", 0.0), ("sampled", TEMPERATURE)):
        g_draft, g_verify = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
        draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=temp,
                                                  generator=g_draft, sv=sv)
        for k in ks:
            dec = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=temp == 0, generator=g_verify)

            def once(dec=dec, d=draft_step.__self__, t=target_step.__self__):
                d.reset()
                t.reset()
                agg = dict(rounds=0, accepted=0, drafted=0, draft=0.0, target=0.0, verify=0.0, total=0.0)
                for p in prompts:
                    dec.generate(torch.tensor(p), max_new)
                    st = dec.stats
                    for key, v in (("rounds", st.rounds), ("accepted", st.accepted), ("drafted", st.drafted),
                                   ("draft", st.draft_seconds), ("target", st.target_seconds),
                                   ("verify", st.verify_seconds), ("total", st.total_seconds)):
                        agg[key] += v
                agg["draft_decode"], agg["target_decode"] = d.decode_seconds, t.decode_seconds
                return agg

            configs.append(("ours on llama.cpp", mode, k, once))

    runs = [[] for _ in configs]  # (wall, cpu, figures) per pass
    for _ in range(repeats):
        for i, (_, _, _, fn) in enumerate(configs):
            c0, t0 = time.process_time(), time.perf_counter()
            figures = fn()
            runs[i].append((time.perf_counter() - t0, time.process_time() - c0, figures))
    target_llama.reset()

    rows = []
    for (name, mode, k, _), rr in zip(configs, runs):
        wall = statistics.median(w for w, _, _ in rr)
        cpu = statistics.median(c for _, c, _ in rr)
        mid = sorted(rr, key=lambda x: x[1])[len(rr) // 2][2]  # the figures of the median-CPU pass
        r = dict(name=name, mode=mode, k=k, seconds=wall, tok_s=n_new / wall, cpu_seconds=cpu, cpu_tok_s=n_new / cpu)
        if "decode" in mid:
            r["decode_ms_per_token"] = 1e3 * mid["decode"] / n_new
        if "rounds" in mid:
            a = mid
            r.update(tokens_per_round=n_new / a["rounds"], acceptance=a["accepted"] / max(1, a["drafted"]))
            ms = lambda x, a=a: 1e3 * x / a["rounds"]  # noqa: E731
            r["anatomy_ms"] = dict(
                draft_decode=ms(a["draft_decode"]), draft_python=ms(a["draft"] - a["draft_decode"]),
                target_decode=ms(a["target_decode"]), target_python=ms(a["target"] - a["target_decode"]),
                verify=ms(a["verify"]), loop_python=ms(a["total"] - a["draft"] - a["target"] - a["verify"]),
                round=ms(a["total"]))
        rows.append(r)
    best = {mode: max((r for r in rows if r["mode"] == mode and r["k"] is not None), key=lambda r: r["cpu_tok_s"])
            for mode in ("greedy", "sampled")}
    costs = eval_costs(sv, draft_llama, target_llama, sizes=sorted({1, 2, *[k + 1 for k in ks]}))
    result = dict(threads=threads, max_new=max_new, prompts=texts, repeats=repeats, rows=rows, best=best,
                  eval_cpu_ms=costs)
    print_table(result)
    if json_path:
        pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(json_path).write_text(json.dumps(result, indent=1))
    return result


def eval_costs(sv, draft_llama, target_llama, sizes, context: int = 64, calls: int = 25) -> dict:
    """Median process-CPU ms of one ``llama_decode`` of ``n`` tokens after ``context``, per model,
    the sizes interleaved call by call (each eval rolled back by sequence removal)."""
    from .spec_verify_llama import LlamaCppStep

    out = {}
    for name, llama in (("draft", draft_llama), ("target", target_llama)):
        step = LlamaCppStep(llama, temperature=0, sv=sv)
        step._feed(list(range(1, context + 1)), rows=1)
        samples = {n: [] for n in sizes}
        for _ in range(calls):
            for n in sizes:
                c0 = time.process_time()
                step._feed(list(range(10, 10 + n)), rows=n)
                samples[n].append(time.process_time() - c0)
                step._rollback(context)
        out[name] = {n: 1e3 * statistics.median(v) for n, v in samples.items()}
        step.reset()
    return out


def demo(k_greedy: int = 5, k_sampled: int = 3, max_new: int = 128, threads: int = 1) -> dict:
    """``python -m examples.e2e demo --engine llama_cpp``: the demo prompt on llama.cpp's forwards.

    Greedy speculative decoding prints the text llama.cpp's plain greedy
    decoding prints (asserted), then sampled decoding at T = 0.8; each timed
    against the lean plain loop (best of 3).
    """
    from examples.e2e import DEMO_PROMPT
    from tools.kernel_loader import load_kernel

    from .pair import ensure_gguf, generate_plain, open_llama, plain_decode
    from .spec_verify_llama import LlamaCppStep, llama_step_pair

    torch.set_num_threads(1)
    sv = load_kernel()
    gg = ensure_gguf()
    draft_llama = open_llama(gg / "draft.gguf", threads=threads)
    target_llama = open_llama(gg / "target.gguf", threads=threads)
    prompt = target_llama.tokenize(DEMO_PROMPT.encode(), add_bos=False, special=False)
    out = {}
    for mode, temp, k in (("greedy", 0.0, k_greedy), ("sampled", TEMPERATURE, k_sampled)):
        plain_step = LlamaCppStep(target_llama, temperature=temp, sv=sv)
        g = torch.Generator().manual_seed(0)
        plain_s = min(_median_run(lambda: plain_decode(plain_step, prompt, max_new, generator=g), 1)[0]
                      for _ in range(3))
        reference = generate_plain(target_llama, prompt, max_new) if temp == 0 else None
        target_llama.reset()
        draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=temp,
                                                  generator=torch.Generator().manual_seed(1), sv=sv)
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=temp == 0,
                                    generator=torch.Generator().manual_seed(2))
        spec_s, new = min((_median_run(lambda: dec.generate(torch.tensor(prompt), max_new), 1)
                           for _ in range(3)), key=lambda x: x[0])
        new = new.tolist()[len(prompt):]
        if reference is not None:
            assert new == reference, "greedy speculative output differs from llama.cpp's plain greedy output"
        st = dec.stats
        print(f"\n--- llama.cpp engine, {mode} (k={k}, {max_new} tokens, {threads} thread) ---")
        print(DEMO_PROMPT + target_llama.detokenize(new).decode("utf-8", errors="replace"))
        same = " (== llama.cpp's plain greedy, token for token)" if reference is not None else ""
        print(f"plain {max_new / plain_s:.0f} tok/s, speculative {max_new / spec_s:.0f} tok/s: "
              f"{plain_s / spec_s:.2f}x{same}; {st.tokens_per_round:.2f} tokens/round")
        out[mode] = dict(plain_s=plain_s, spec_s=spec_s, speedup=plain_s / spec_s)
    return out


def print_table(result: dict) -> None:
    rows = result["rows"]
    base = {r["mode"]: r for r in rows if r["name"] == "llama.cpp plain (lean loop)"}
    gen = {r["mode"]: r for r in rows if r["name"] == "llama.cpp plain (Llama.generate)"}
    n = len(result["prompts"])
    print(f"\nllama.cpp engine: {n} prompts x {result['max_new']} new tokens, {result['threads']} thread(s), "
          f"median of {result['repeats']}; sampled = temperature {TEMPERATURE}")
    print("tok/s by process CPU time (one thread: leaves out waits for a core, not shared-cache slowdowns) "
          "and by wall time; "
          "x = speedup over llama.cpp's plain decoding (lean loop / Llama.generate), same mode")
    print(f"| {'run':34} | {'mode':7} | {'k':>2} | cpu tok/s | x lean | x generate | wall tok/s | x lean "
          f"| tok/round | accept |")
    print(f"|{'-' * 36}|{'-' * 9}|{'-' * 4}|{'-' * 11}|{'-' * 8}|{'-' * 12}|{'-' * 12}|{'-' * 8}|{'-' * 11}|{'-' * 8}|")
    for r in rows:
        k = "" if r["k"] is None else str(r["k"])
        tpr = f"{r['tokens_per_round']:.2f}" if "tokens_per_round" in r else ""
        acc = f"{r['acceptance']:.2f}" if "acceptance" in r else ""
        b, g = base[r["mode"]], gen[r["mode"]]
        print(f"| {r['name']:34} | {r['mode']:7} | {k:>2} | {r['cpu_tok_s']:9.0f} | "
              f"{r['cpu_tok_s'] / b['cpu_tok_s']:5.2f}x | {r['cpu_tok_s'] / g['cpu_tok_s']:9.2f}x | "
              f"{r['tok_s']:10.0f} | {r['tok_s'] / b['tok_s']:5.2f}x | {tpr:>9} | {acc:>6} |")
    print("\nRound anatomy at the fastest k (wall ms per round, the median-CPU pass):")
    print("| mode    | k | draft decode | draft python | target decode | target python | verify | loop python | round |")
    print("|---------|---|---|---|---|---|---|---|---|")
    for mode, r in result["best"].items():
        a = r["anatomy_ms"]
        print(f"| {mode:7} | {r['k']} | {a['draft_decode']:.3f} | {a['draft_python']:.3f} | {a['target_decode']:.3f} "
              f"| {a['target_python']:.3f} | {a['verify']:.3f} | {a['loop_python']:.3f} | {a['round']:.3f} |")
    for mode in ("greedy", "sampled"):
        b = base[mode]
        if "decode_ms_per_token" in b:
            print(f"plain {mode} (lean loop): {b['decode_ms_per_token']:.3f} ms of llama_decode per token (wall), "
                  f"{1e3 * b['cpu_seconds'] / (n * result['max_new']):.3f} ms CPU per token in all")
    c = result["eval_cpu_ms"]
    print("\nOne llama_decode of n tokens after 64 (CPU ms, median, sizes interleaved):")
    print("| model  | " + " | ".join(f"n={n}" for n in c["target"]) + " |")
    print("|---" * (len(c["target"]) + 1) + "|")
    for name in ("draft", "target"):
        print(f"| {name:6} | " + " | ".join(f"{v:.3f}" for v in c[name].values()) + " |")
    t1 = c["target"][1]
    print("target(n) / target(1): " + ", ".join(f"n={n}: {v / t1:.2f}" for n, v in c["target"].items()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    parser.add_argument("--ks", default="1-8", help="draft lengths, e.g. 1-8 or 3,5")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench_llama_cpp.json"))
    args = parser.parse_args(argv)
    if "-" in args.ks:
        lo, hi = map(int, args.ks.split("-"))
        ks = range(lo, hi + 1)
    else:
        ks = [int(x) for x in args.ks.split(",")]
    run(args.repeats, args.max_new, args.threads, ks, args.json)


if __name__ == "__main__":
    main()
