"""Speculative decoding on llama.cpp's forwards against llama.cpp's plain decoding, in one run.

    make bench ENGINE=llama_cpp        # = python -m benchmarks.bench --engine llama_cpp
    python -m integrations.llama_cpp.bench_llama [--repeats 3] [--max-new 64] [--threads 1]
        [--llama-lib wheel|native|DIR] [--own-bins auto|off|DIR] [--own-draft-max 5] [--gguf DIR]

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
verify op, and the decoder loop's own Python; and the cost of one eval of n
tokens, target(n) / target(1), which bounds what any speculative decoder on
these forwards can gain.

Which libllama: the venv wheel's (portable AVX2, the default) or, with
``--llama-lib native``, the ``-march=native`` build of the same llama.cpp
source by ``tools/llama_native/build.sh`` (``LLAMA_CPP_LIB_PATH``, honoured as
set otherwise); the table's header prints the file loaded and llama.cpp's
system info line. When ``.cache/llama-native/bin/`` holds llama.cpp's own
binaries (the same build), llama.cpp's own speculative decoding
(``llama-speculative-simple``, ``llama-speculative``) and plain decoding
(``llama-completion``, ``llama-bench``) run as subprocesses on the same GGUF
files, prompts and token counts, one thread, round robin, medians; otherwise
the reason they were skipped is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import torch

from examples.e2e import BENCH_PROMPTS

ROOT = pathlib.Path(__file__).resolve().parents[2]
NATIVE_BIN = ROOT / ".cache" / "llama-native" / "bin"  # tools/llama_native/build.sh
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


def use_llama_lib(choice: str | None) -> None:
    """Point llama-cpp-python at a libllama before it is first imported: ``"wheel"`` (the venv's,
    portable AVX2), ``"native"`` (``tools/llama_native/build.sh``) or a directory; ``None`` leaves
    ``LLAMA_CPP_LIB_PATH`` as the environment has it."""
    if choice is None:
        return
    path = None if choice == "wheel" else NATIVE_BIN if choice == "native" else pathlib.Path(choice)
    if path is not None and not (path / "libllama.so").is_file():
        raise SystemExit(f"--llama-lib {choice}: no libllama.so in {path} (tools/llama_native/build.sh builds it)")
    if "llama_cpp" in sys.modules:
        raise SystemExit(f"--llama-lib {choice}: llama_cpp is already imported ({library_info()['path']})")
    if path is None:
        os.environ.pop("LLAMA_CPP_LIB_PATH", None)
    else:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(path.resolve())


def library_info() -> dict:
    """The libllama file llama-cpp-python loaded, and llama.cpp's system info line (its ISA flags)."""
    import llama_cpp

    return dict(path=os.path.realpath(llama_cpp.llama_cpp._lib._name),
                system_info=llama_cpp.llama_print_system_info().decode(errors="replace").strip())


# llama.cpp's own binaries: (row name, binary, extra arguments); {target}/{draft}/{k} filled in.
OWN_PLAIN = ("llama.cpp plain (llama-completion)", "llama-completion", ["-no-cnv", "--no-display-prompt"])
OWN_SPEC = [("llama-speculative-simple", "llama-speculative-simple",
             ["-md", "{draft}", "--spec-type", "draft-simple", "--spec-draft-n-max", "{k}"]),
            ("llama-speculative", "llama-speculative", ["-md", "{draft}", "--spec-draft-n-max", "{k}"])]
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s*=\s*([\d.]+)%")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")


def own_bins_reason(bin_dir: pathlib.Path) -> str | None:
    """Why llama.cpp's own binaries cannot run from ``bin_dir`` (None: they can)."""
    missing = [b for b in ("llama-completion", "llama-speculative-simple", "llama-speculative", "llama-bench")
               if not (bin_dir / b).is_file()]
    if missing:
        return f"{', '.join(missing)} not in {bin_dir} (tools/llama_native/build.sh, or make llama-native)"
    return None


LOST_LOGS = []  # runs whose closing lines llama.cpp's log lost, rerun (see _run_own)


def _run_own(binary: pathlib.Path, args: list, tries: int = 5) -> tuple[int, float, float | None]:
    """One run of a llama.cpp binary: (tokens decoded, seconds decoding, acceptance or None).

    llama.cpp's logger prints from a worker thread that nothing joins at exit (``common_log_main``
    is never destroyed), so a run sometimes exits 0 with its closing timing lines unprinted: such a
    run is rerun, at most ``tries`` times in all, and counted in ``LOST_LOGS``."""
    for _ in range(tries):
        p = subprocess.run([str(binary), *args], capture_output=True, text=True, errors="replace", timeout=600,
                           stdin=subprocess.DEVNULL)
        log = p.stdout + p.stderr
        if p.returncode != 0:
            raise RuntimeError(f"{binary.name} exited {p.returncode}:\n{log[-2000:]}")
        if m := _DECODED.search(log):
            acc = _ACCEPT.search(log)
            return int(m.group(1)), float(m.group(2)), (float(acc.group(1)) / 100 if acc else None)
        if m := _EVAL.search(log):
            return int(m.group(2)), float(m.group(1)) / 1e3, None
        LOST_LOGS.append(binary.name)
    raise RuntimeError(f"{binary.name}: no decode timing in its output, {tries} runs:\n{log[-2000:]}")


def own_rows(bin_dir: pathlib.Path, gg: pathlib.Path, texts: list, max_new: int, threads: int, k: int,
             repeats: int) -> dict:
    """llama.cpp's own plain and speculative decoding, greedy and sampled (temperature alone, as ours),
    every configuration once per prompt per pass, ``repeats`` passes round robin; per row the median
    over passes of (tokens decoded / seconds decoding) summed over the prompts, and per pass the ratio
    to llama-completion's plain decoding in the same mode and pass (its median is the row's x plain).
    Plus ``llama-bench -p 0 -n max_new`` (greedy, no prompt) as a second plain figure."""
    common = ["-m", str(gg / "target.gguf"), "-n", str(max_new), "-c", "1024", "-t", str(threads),
              "-tb", str(threads), "--seed", "1", "--ignore-eos", "--top-k", "0", "--top-p", "1",
              "--min-p", "0"]
    spec_threads = ["-td", str(threads), "-tbd", str(threads)]
    configs = []
    for mode, temp in (("greedy", 0.0), ("sampled", TEMPERATURE)):
        for name, binary, extra in [OWN_PLAIN, *OWN_SPEC]:
            extra = [a.format(draft=gg / "draft.gguf", k=k) for a in extra]
            if binary != OWN_PLAIN[1]:
                extra += spec_threads
            configs.append((name, mode, binary, common + ["--temp", str(temp)] + extra))
    passes = [[] for _ in configs]  # per config: (tokens, seconds, acceptances) per pass
    for _ in range(repeats):
        for i, (_, _, binary, args) in enumerate(configs):
            n = s = 0
            acc = []
            for text in texts:
                tok, sec, a = _run_own(bin_dir / binary, args + ["-p", text])
                n, s = n + tok, s + sec
                if a is not None:
                    acc.append(a)
            passes[i].append((n, s, acc))
    by_row = {(name, mode): pp for (name, mode, _, _), pp in zip(configs, passes)}
    rows = []
    for (name, mode, binary, _), pp in zip(configs, passes):
        plain = by_row[OWN_PLAIN[0], mode]
        rate = [n / s for n, s, _ in pp]
        x = [(n / s) / (pn / ps) for (n, s, _), (pn, ps, _) in zip(pp, plain)]
        acc = [statistics.mean(a) for _, _, a in pp if a]
        rows.append(dict(name=name, mode=mode, k=None if binary == OWN_PLAIN[1] else k,
                         tok_s=statistics.median(rate), x_plain=statistics.median(x),
                         tokens=statistics.median(n for n, _, _ in pp),
                         acceptance=statistics.median(acc) if acc else None))
    bench = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gg / "target.gguf"), "-t", str(threads),
                            "-p", "0", "-n", str(max_new), "-r", str(max(repeats, 3)), "-o", "json"],
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if bench.returncode != 0:
        raise RuntimeError(f"llama-bench exited {bench.returncode}:\n{bench.stderr[-2000:]}")
    b = json.loads(bench.stdout)[0]
    llama_bench = dict(tok_s=b["avg_ts"], stddev=b["stddev_ts"], n_gen=b["n_gen"], cpu_info=b.get("cpu_info"),
                       build=b.get("build_commit"))
    return dict(k=k, rows=rows, reruns_lost_log=len(LOST_LOGS), llama_bench=llama_bench)


def print_own(own: dict) -> None:
    print(f"\nllama.cpp's own binaries ({NATIVE_BIN.relative_to(ROOT)}/, the same GGUF files, prompts and tokens, "
          f"draft max {own['k']}, llama.cpp's default speculative parameters otherwise); "
          "tok/s over decoding (after the prompt), median of passes; x plain = over llama-completion, same mode, "
          "same pass (median)")
    print(f"| {'run':34} | {'mode':7} | {'k':>2} | tok/s | x plain | tokens | accept |")
    print(f"|{'-' * 36}|{'-' * 9}|{'-' * 4}|{'-' * 7}|{'-' * 9}|{'-' * 8}|{'-' * 8}|")
    for r in own["rows"]:
        k = "" if r["k"] is None else str(r["k"])
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"| {r['name']:34} | {r['mode']:7} | {k:>2} | {r['tok_s']:5.0f} | {r['x_plain']:6.2f}x "
              f"| {r['tokens']:6.0f} | {acc:>6} |")
    b = own["llama_bench"]
    print(f"llama-bench -p 0 -n {b['n_gen']} (plain greedy, empty context): {b['tok_s']:.0f} +- {b['stddev']:.0f} tok/s")
    if own["reruns_lost_log"]:
        print(f"({own['reruns_lost_log']} runs rerun: llama.cpp's log lost their closing timing lines at exit)")


def run(repeats: int = 3, max_new: int = 64, threads: int = 1, ks=range(1, 9), json_path=None,
        own_bins: str = "auto", own_k: int = 5, gguf_dir=None) -> dict:
    """Every configuration once per pass, ``repeats`` passes (round robin: drifting load from
    other processes falls on all rows alike), medians per row; then the eval costs."""
    from tools.kernel_loader import load_kernel

    from .pair import ensure_gguf, generate_plain, open_llama, plain_decode
    from .spec_verify_llama import LlamaCppStep, llama_step_pair

    torch.set_num_threads(1)
    sv = load_kernel()
    gg = pathlib.Path(gguf_dir) if gguf_dir else ensure_gguf()
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
                  eval_cpu_ms=costs, library=library_info(), gguf=str(gg))
    print_table(result)
    _save(result, json_path)  # now, and again with llama.cpp's own rows (a failure there keeps these)
    if own_bins == "off":
        print("\nllama.cpp's own binaries: not run (--own-bins off)")
    else:
        bin_dir = NATIVE_BIN if own_bins == "auto" else pathlib.Path(own_bins)
        reason = own_bins_reason(bin_dir)
        if reason:
            print(f"\nllama.cpp's own binaries: skipped: {reason}")
        else:
            result["own"] = own_rows(bin_dir, gg, texts, max_new, threads, own_k, repeats)
            print_own(result["own"])
            _save(result, json_path)
    return result


def _save(result: dict, json_path) -> None:
    if json_path:
        pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(json_path).write_text(json.dumps(result, indent=1))


def eval_costs(sv, draft_llama, target_llama, sizes, context: int = 64, calls: int = 25) -> dict:
    """Median process-CPU ms of one ``llama_decode`` of ``n`` tokens after ``context``, per model,
    the sizes interleaved call by call (each eval rolled back by sequence removal); and for the
    target, ``target_same``: each size's calls in a row, as the plain loop (n = 1) and a round's
    target eval (n = k + 1) run them. Interleaved, every call changes the batch's shape, so
    llama.cpp cannot reuse its last graph, which can add milliseconds to every size alike and
    flatten target(n) / target(1); the same-size figures are closer to what a decoding loop sees."""
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
        if name == "target":
            same = {}
            for n in sizes:
                v = []
                for _ in range(calls + 3):
                    c0 = time.process_time()
                    step._feed(list(range(10, 10 + n)), rows=n)
                    v.append(time.process_time() - c0)
                    step._rollback(context)
                same[n] = 1e3 * statistics.median(v[3:])  # the first calls build the graph
            out["target_same"] = same
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
    lib = result["library"]
    print(f"\nlibllama: {lib['path']}\nsystem info: {lib['system_info']}\nGGUF pair: {result['gguf']}")
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
    if "target_same" in c:  # older JSON files lack it
        s1 = c["target_same"][1]
        print("the same, each size's calls in a row (llama.cpp reuses its graph, as in a decoding loop), target: "
              + ", ".join(f"n={n}: {v:.3f}" for n, v in c["target_same"].items()) + " ms")
        print("target(n) / target(1), each size in a row: "
              + ", ".join(f"n={n}: {v / s1:.2f}" for n, v in c["target_same"].items()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    parser.add_argument("--ks", default="1-8", help="draft lengths, e.g. 1-8 or 3,5")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench_llama_cpp.json"))
    parser.add_argument("--llama-lib", default=None,
                        help="wheel (the venv's AVX2 library), native (tools/llama_native/build.sh) or a directory "
                             "holding libllama.so; default: LLAMA_CPP_LIB_PATH if set, else the wheel's")
    parser.add_argument("--own-bins", default="auto",
                        help="llama.cpp's own binaries: auto (.cache/llama-native/bin/ when built), off, or a directory")
    parser.add_argument("--own-draft-max", type=int, default=5, help="--spec-draft-n-max for llama.cpp's own binaries")
    parser.add_argument("--gguf", default=None, help="folder with target.gguf and draft.gguf (default: models/gguf, "
                                                     "made by make gguf; e.g. hf_to_gguf --dtype f16 --out DIR)")
    args = parser.parse_args(argv)
    use_llama_lib(args.llama_lib)
    if "-" in args.ks:
        lo, hi = map(int, args.ks.split("-"))
        ks = range(lo, hi + 1)
    else:
        ks = [int(x) for x in args.ks.split(",")]
    run(args.repeats, args.max_new, args.threads, ks, args.json, args.own_bins, args.own_draft_max, args.gguf)


if __name__ == "__main__":
    main()
