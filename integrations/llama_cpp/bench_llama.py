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
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(repeats: int = 3, max_new: int = 64, threads: int = 1, ks=range(1, 9), json_path=None) -> dict:
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
    rows = []

    def row(name, mode, k, seconds, extra=None):
        r = dict(name=name, mode=mode, k=k, seconds=seconds, tok_s=n_new / seconds, **(extra or {}))
        rows.append(r)
        return r

    # -- plain baselines --------------------------------------------------------
    for mode, temp in (("greedy", 0.0), ("sampled", TEMPERATURE)):
        s, _ = _median_run(lambda: [generate_plain(target_llama, p, max_new, temp, seed=i)
                                    for i, p in enumerate(prompts)], repeats)
        row("llama.cpp plain (Llama.generate)", mode, None, s)
        step = LlamaCppStep(target_llama, temperature=temp, sv=sv)
        g = torch.Generator().manual_seed(0)
        decode = []

        def lean():
            for p in prompts:
                plain_decode(step, p, max_new, generator=g)
                decode.append(step.decode_seconds)  # reset() per prompt zeroes it

        s, _ = _median_run(lean, repeats)
        row("llama.cpp plain (lean loop)", mode, None, s, dict(decode_s=sum(decode)))
    target_llama.reset()

    # -- ours -------------------------------------------------------------------
    anatomy = {}
    for mode, temp in (("greedy", 0.0), ("sampled", TEMPERATURE)):
        g_draft, g_verify = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
        draft_step, target_step = llama_step_pair(draft_llama, target_llama, temperature=temp,
                                                  generator=g_draft, sv=sv)
        d, t = draft_step.__self__, target_step.__self__
        for k in ks:
            dec = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=temp == 0, generator=g_verify)
            per_repeat = []

            def once():
                d.reset()
                t.reset()
                agg = dict(rounds=0, accepted=0, drafted=0, draft=0.0, target=0.0, verify=0.0, total=0.0)
                for p in prompts:
                    dec.generate(torch.tensor(p), max_new)
                    st = dec.stats
                    agg["rounds"] += st.rounds
                    agg["accepted"] += st.accepted
                    agg["drafted"] += st.drafted
                    agg["draft"] += st.draft_seconds
                    agg["target"] += st.target_seconds
                    agg["verify"] += st.verify_seconds
                    agg["total"] += st.total_seconds
                agg["draft_decode"], agg["target_decode"] = d.decode_seconds, t.decode_seconds
                per_repeat.append(agg)

            s, _ = _median_run(once, repeats)
            a = sorted(per_repeat, key=lambda x: x["total"])[len(per_repeat) // 2]
            r = row("ours on llama.cpp", mode, k, s, dict(
                tokens_per_round=n_new / a["rounds"], acceptance=a["accepted"] / max(1, a["drafted"])))
            ms = lambda x: 1e3 * x / a["rounds"]  # noqa: E731
            r["anatomy_ms"] = dict(
                draft_decode=ms(a["draft_decode"]), draft_python=ms(a["draft"] - a["draft_decode"]),
                target_decode=ms(a["target_decode"]), target_python=ms(a["target"] - a["target_decode"]),
                verify=ms(a["verify"]), loop_python=ms(a["total"] - a["draft"] - a["target"] - a["verify"]),
                round=ms(a["total"]))
        best = max((r for r in rows if r["mode"] == mode and r["k"] is not None), key=lambda r: r["tok_s"])
        anatomy[mode] = best
    result = dict(threads=threads, max_new=max_new, prompts=texts, repeats=repeats, rows=rows, best=anatomy)
    print_table(result)
    if json_path:
        pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(json_path).write_text(json.dumps(result, indent=1))
    return result


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
    print(f"| {'run':34} | {'mode':7} | {'k':>2} | {'tok/s':>6} | {'vs lean plain':>13} | {'vs generate':>11} "
          f"| tok/round | accept |")
    print(f"|{'-' * 36}|{'-' * 9}|{'-' * 4}|{'-' * 8}|{'-' * 15}|{'-' * 13}|{'-' * 11}|{'-' * 8}|")
    for r in rows:
        k = "" if r["k"] is None else str(r["k"])
        tpr = f"{r['tokens_per_round']:.2f}" if "tokens_per_round" in r else ""
        acc = f"{r['acceptance']:.2f}" if "acceptance" in r else ""
        print(f"| {r['name']:34} | {r['mode']:7} | {k:>2} | {r['tok_s']:6.0f} | "
              f"{r['tok_s'] / base[r['mode']]['tok_s']:12.2f}x | {r['tok_s'] / gen[r['mode']]['tok_s']:10.2f}x "
              f"| {tpr:>9} | {acc:>6} |")
    print("\nRound anatomy at the fastest k (ms per round):")
    print("| mode    | k | draft decode | draft python | target decode | target python | verify | loop python | round |")
    print("|---------|---|---|---|---|---|---|---|---|")
    for mode, r in result["best"].items():
        a = r["anatomy_ms"]
        print(f"| {mode:7} | {r['k']} | {a['draft_decode']:.3f} | {a['draft_python']:.3f} | {a['target_decode']:.3f} "
              f"| {a['target_python']:.3f} | {a['verify']:.3f} | {a['loop_python']:.3f} | {a['round']:.3f} |")
    for mode in ("greedy", "sampled"):
        b = base[mode]
        if "decode_s" in b:
            per_tok = 1e3 * b["decode_s"] / (result["repeats"] * n * result["max_new"])
            print(f"plain {mode}: {per_tok:.3f} ms of llama_decode per token, "
                  f"{1e3 * b['seconds'] / (n * result['max_new']):.3f} ms per token in all")


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
