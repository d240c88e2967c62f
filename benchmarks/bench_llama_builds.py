"""llama.cpp's builds side by side: the venv's wheel (AVX2), native, and runtime CPU dispatch (issue 23).

    python -m benchmarks.bench_llama_builds                         # wheel, native, dispatch x Gemma 3 270M, SmolLM2
    python -m benchmarks.bench_llama_builds --builds wheel,dispatch --repeats 5 --calls 16
    python -m benchmarks.bench_llama_builds --python pip-dispatch=/tmp/llvenv/bin/python   # another venv's wheel too

The question: does llama.cpp's runtime CPU dispatch (``GGML_BACKEND_DL=ON
GGML_CPU_ALL_VARIANTS=ON``, as llama.cpp's own releases ship: one
``libggml-cpu-<level>.so`` per x86 level, the best this CPU runs picked at
load time) give the ``-march=native`` build's speed while staying portable,
as the venv's AVX2 wheel is? Builds, all from the source llama-cpp-python
0.3.36 vendors:

* ``wheel``: the venv's llama-cpp-python (the Makefile's ``LLAMA_CMAKE_ARGS``,
  AVX2);
* ``native``: ``tools/llama_native/build.sh`` (``-march=native``), in
  ``.cache/llama-native/bin``;
* ``dispatch``: ``tools/llama_native/build.sh dispatch``, in
  ``.cache/llama-dispatch/bin``;
* ``--python NAME=PYTHON``: whatever libllama another interpreter's
  llama-cpp-python loads (a scratch venv's pip build with other
  ``CMAKE_ARGS``), run with its own wheel.

Each build runs in its own subprocess (the bindings load one libllama per
process; ``LLAMA_CPP_LIB_PATH`` chooses it). llama-cpp-python 0.3.36 never
calls ``ggml_backend_load_all_from_path``, and ``llama_backend_init``'s
``ggml_backend_load_all()`` searches only the executable's folder (Python's)
and the working directory, so for a ``GGML_BACKEND_DL`` build the child loads
the CPU modules itself from the library's folder (``load_backends``) before
the first ``Llama``; the table names the module picked (from
``/proc/self/maps``) and ggml's system-info line.

Figures, per build and model (one thread, ``n_ctx`` 1536, ``logits_all``):
``benchmarks.spec_engines``' cost probe (``LlamaEngine.eval_costs``): the
process-CPU ms of one eval of ``n`` positions with logits at each, after a
64-token context, each size's calls in a row (llama.cpp reuses its graph, as
a decoding loop does); ``c(1)`` and the curve ``c(n)/c(1)`` for n = 1..9.
And greedy tokens: the plain loop's first ``--greedy`` tokens on the bench's
prompts (``--greedy-prompts`` of each kind, ``bench_prompts.spread``), against
the wheel's and the native build's (the instruction set may move a near-tie:
llama.cpp's AVX2 and AVX-512 kernels sum in different orders). ``--repeats``
passes, the builds round robin (the order rotated each pass) so drifting load
from other processes falls on all alike; each figure is the median over
passes, ``c(1) / native's`` the median of per-pass ratios.

A pip build of llama-cpp-python with ``CMAKE_ARGS`` for dispatch puts the
modules where CMake's ``CMAKE_INSTALL_BINDIR`` says (``bin``: a top-level
``site-packages/bin/``; ``-DCMAKE_INSTALL_BINDIR=llama_cpp/lib`` puts them
beside libllama), and a wheel holds no symbolic links, so ``libggml.so``,
``.so.0`` and ``.so.0.25.3`` are three copies of one library: the loader
registers the modules through the copy libllama loaded (``load_backends``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILDS = {"wheel": None,  # the venv's own llama_cpp/lib
          "native": ROOT / ".cache" / "llama-native" / "bin",
          "dispatch": ROOT / ".cache" / "llama-dispatch" / "bin"}
HOW = {"native": "tools/llama_native/build.sh", "dispatch": "tools/llama_native/build.sh dispatch"}
MODELS = ("gemma", "smollm2")
SIZES = range(1, 10)
RESULT_TAG = "BENCH_LLAMA_BUILDS_RESULT "  # the child's one line of JSON on stdout


# ----------------------------------------------------------------------------
# In the child: one libllama, its CPU backend, the figures
# ----------------------------------------------------------------------------


def backend_modules(folder: pathlib.Path) -> list:
    """The ``libggml-cpu-<level>.so`` modules of a ``GGML_BACKEND_DL`` build in ``folder`` (sorted names)."""
    return sorted(p.name for p in pathlib.Path(folder).glob("libggml-cpu-*.so"))


def load_backends(lib_dir: pathlib.Path) -> list:
    """Register a ``GGML_BACKEND_DL`` build's backends from ``lib_dir``, before the first ``Llama``.

    ``ggml_backend_load_all_from_path(lib_dir)`` through the libggml that libllama loaded (the very file
    this process has mapped, so the same registry: a wheel holds ``libggml.so``, ``.so.0`` and
    ``.so.0.25.3`` as three copies, not links, and libllama loads ``.so.0``): ggml scores every
    ``libggml-cpu-*.so`` there and keeps the best this CPU runs. ``llama_backend_init`` (called by
    ``Llama()``) then finds a backend registered and loads nothing more. Returns the modules found; none
    (a build with its CPU backend linked in): a no-op.

    Parameters
    ----------
    lib_dir : pathlib.Path
        The folder holding ``libllama.so``, ``libggml.so`` and the modules.

    Returns
    -------
    list of str
        The module file names in ``lib_dir``.
    """
    import ctypes

    modules = backend_modules(lib_dir)
    if modules:
        ggml = ctypes.CDLL(_mapped("libggml.so"))
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
        ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
        if ggml.ggml_backend_reg_count() == 0:
            raise RuntimeError(f"no ggml backend registered from {lib_dir} ({', '.join(modules)})")
    return modules


def _mapped_paths() -> set:
    """The files this process has mapped (``/proc/self/maps``)."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split(maxsplit=5)) == 6}


def _mapped(stem: str) -> str:
    """The one file named ``stem`` or ``stem.<version>`` this process has mapped."""
    files = sorted(p for p in _mapped_paths()
                   if os.path.basename(p) == stem or os.path.basename(p).startswith(stem + "."))
    if len(files) != 1:
        raise RuntimeError(f"expected one {stem} mapped, found {files or 'none'}")
    return files[0]


def mapped_cpu_backend() -> str:
    """The file of ggml's CPU backend this process has mapped (the dispatch build's pick)."""
    files = {os.path.realpath(p) for p in _mapped_paths() if "libggml-cpu" in os.path.basename(p)}
    return ", ".join(sorted(files)) or "(none mapped)"


def child(models: list, sizes: list, calls: int, context: int, greedy: int, greedy_prompts: int) -> dict:
    """Figures of the libllama this process loads (``LLAMA_CPP_LIB_PATH`` set by the parent)."""
    import torch

    from integrations.llama_cpp.bench_llama import library_info

    from . import bench_prompts
    from .spec_engines import LlamaEngine, model_specs

    torch.set_num_threads(1)
    import llama_cpp

    lib_dir = pathlib.Path(llama_cpp.llama_cpp._lib._name).resolve().parent
    modules = load_backends(lib_dir)
    sv = _load_kernel_waiting()
    out = dict(lib_dir=str(lib_dir), modules=modules, llama_cpp=llama_cpp.__version__, models={})
    specs = model_specs()
    texts = [t for kind in bench_prompts.KINDS
             for t in bench_prompts.spread(bench_prompts.prompts("real", kind), greedy_prompts)]
    for key in models:
        engine = LlamaEngine(specs[key], sv, threads=1)  # n_ctx 1536, logits_all, one thread
        costs = engine.eval_costs(sizes, context=context, calls=calls)["target"]
        tokens = [engine.plain(engine.tokenize(text), greedy, 0.0, None)[2] for text in texts] if greedy else []
        out["models"][key] = dict(costs=costs, greedy=tokens)
        del engine
    out.update(library_info())  # after the first Llama: the system info names the CPU backend loaded
    out["cpu_backend"] = mapped_cpu_backend()
    return out


def _load_kernel_waiting(tries: int = 30, wait_s: float = 10.0):
    """The kernel (only the adapters' warping uses it here), waiting while ``build/`` is being rewritten
    (a ``make build`` elsewhere in this checkout empties the variant folder for a while)."""
    from tools.kernel_loader import load_kernel

    for i in range(tries):
        try:
            return load_kernel()
        except OSError:
            if i + 1 == tries:
                raise
            print(f"build/ is being rewritten: waiting {wait_s:.0f} s for the kernel", file=sys.stderr, flush=True)
            time.sleep(wait_s)


# ----------------------------------------------------------------------------
# In the parent: one subprocess per build per pass
# ----------------------------------------------------------------------------


def build_reason(name: str, lib_dir) -> str | None:
    """Why build ``name`` cannot run (None: it can)."""
    if lib_dir is not None and not (pathlib.Path(lib_dir) / "libllama.so").is_file():
        return f"no libllama.so in {lib_dir} ({HOW.get(name, 'build it')})"
    return None


def run_child(python: str, lib_dir, args, greedy: bool) -> dict:
    """One pass of one build: a subprocess of ``python`` with ``LLAMA_CPP_LIB_PATH`` = ``lib_dir``; the
    greedy check too when ``greedy``."""
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if lib_dir is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(pathlib.Path(lib_dir).resolve())
    cmd = [python, "-m", "benchmarks.bench_llama_builds", "--child", "--models", ",".join(args.models),
           "--calls", str(args.calls), "--context", str(args.context), "--greedy", str(args.greedy if greedy else 0),
           "--greedy-prompts", str(args.greedy_prompts)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
                       stdin=subprocess.DEVNULL)
    line = next((x for x in p.stdout.splitlines() if x.startswith(RESULT_TAG)), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return json.loads(line[len(RESULT_TAG):])


def run(args) -> dict:
    """Every build once per pass, ``args.repeats`` passes round robin; medians."""
    from .bench_spec import machine

    info = machine()
    builds, skipped = {}, {}
    for name in args.builds:
        why = build_reason(name, BUILDS[name])
        if why:
            skipped[name] = why
        else:
            builds[name] = (sys.executable, BUILDS[name])
    for name, python in args.python:
        builds[name] = (python, None)
    passes = {name: [] for name in builds}
    names = list(builds)
    for p in range(args.repeats):
        order = names[p % len(names):] + names[:p % len(names)]
        for name in order:
            python, lib_dir = builds[name]
            passes[name].append(run_child(python, lib_dir, args, greedy=p == 0))
            print(f"pass {p + 1}/{args.repeats}: {name} done, load {_load()}", file=sys.stderr, flush=True)
    info["load_end"] = _load()
    result = dict(machine=info, args={k: v for k, v in vars(args).items() if k != "child"}, skipped=skipped,
                  builds={name: summarize(pp, passes.get("native")) for name, pp in passes.items()})
    return result


def summarize(pp: list, native: list | None) -> dict:
    """One build's passes: the library facts (from the first pass) and per model the median figures."""
    first = pp[0]
    out = {k: first[k] for k in ("path", "system_info", "cpu_backend", "modules", "llama_cpp")}
    out["models"] = {}
    for key in first["models"]:
        costs = [{int(n): v for n, v in x["models"][key]["costs"].items()} for x in pp]
        c1 = [c[1] for c in costs]
        m = dict(c1=statistics.median(c1), c1_passes=c1,
                 curve={n: statistics.median(c[n] / c[1] for c in costs) for n in costs[0]},
                 greedy=first["models"][key]["greedy"])
        if native:
            m["x_native"] = statistics.median(c[1] / x["models"][key]["costs"]["1"] for c, x in zip(costs, native))
        out["models"][key] = m
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------


def _features(system_info: str) -> str:
    """ggml's system-info line as one Markdown cell: ``CPU : SSE3 = 1 | AVX = 1 |`` -> ``CPU: SSE3 AVX``."""
    return system_info.replace(" = 1", "").replace(" |", "").replace(" : ", ": ").strip()


def _same(outputs: list, reference: list) -> str:
    """``k/n`` prompts whose greedy tokens equal the reference's, and where the others first differ."""
    diffs = [(i, next((j for j, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r))))
             for i, (o, r) in enumerate(zip(outputs, reference)) if o != r]
    where = "; differ: " + ", ".join(f"prompt {i} at {j}" for i, j in diffs) if diffs else ""
    return f"{len(outputs) - len(diffs)}/{len(outputs)}{where}"


def print_result(result: dict) -> None:
    m = result["machine"]
    print(f"# bench_llama_builds -- {m['date']}")
    print(f"CPU: {m.get('Model name')} ({m.get('CPU(s)')} CPUs, {m['isa']}), L3 {m.get('L3 cache')}; load average "
          f"(1/5/15 min) at start {m['load']}, at the end {m['load_end']} (other agents share the machine)")
    a = result["args"]
    print(f"one thread, n_ctx 1536, logits_all; {a['repeats']} passes round robin, {a['calls']} calls per size per "
          f"pass (medians); context {a['context']} tokens; greedy check: {a['greedy']} tokens on "
          f"{a['greedy_prompts']} prompts of each kind (the first pass's)")
    for name, why in result["skipped"].items():
        print(f"{name}: skipped: {why}")
    builds = result["builds"]
    print("\n| build | libllama | CPU backend | ggml system info (flags set) |\n|---|---|---|---|")
    for name, b in builds.items():
        backend = b["cpu_backend"] if not b["modules"] else (
            f"{pathlib.Path(b['cpu_backend']).name} (of {len(b['modules'])} modules)")
        print(f"| {name} | {_short(b['path'])} | {_short(backend)} | {_features(b['system_info'])} |")
    sizes = list(next(iter(next(iter(builds.values()))["models"].values()))["curve"])
    print("\nOne eval of n positions, logits at each, after the context (CPU ms, median):")
    print("| model | build | c(1) ms (passes' range) | c(1) / native's | " + " | ".join(f"n={n}" for n in sizes[1:])
          + " | greedy == wheel's | == native's |")
    print("|---" * (6 + len(sizes) - 1) + "|")
    ref, nat = builds.get("wheel"), builds.get("native")
    for key in MODELS:
        for name, b in builds.items():
            if key not in b["models"]:
                continue
            x = b["models"][key]
            xn = f"{x['x_native']:.2f}" if "x_native" in x else "-"
            same = _same(x["greedy"], ref["models"][key]["greedy"]) if ref and name != "wheel" else "-"
            same_n = _same(x["greedy"], nat["models"][key]["greedy"]) if nat and name != "native" else "-"
            spread = f"{min(x['c1_passes']):.1f}-{max(x['c1_passes']):.1f}"
            curve = " | ".join(f"{x['curve'][n]:.2f}" for n in sizes[1:])
            print(f"| {key} | {name} | {x['c1']:.2f} ({spread}) | {xn} | {curve} | {same} | {same_n} |")


def _short(path: str) -> str:
    return path.replace(str(ROOT) + "/", "")


# ----------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------


def _named_python(value: str) -> tuple:
    name, sep, python = value.partition("=")
    if not sep or not name or not python:
        raise argparse.ArgumentTypeError(f"--python NAME=PYTHON, got {value!r}")
    return name, python


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default="wheel,native,dispatch", help="comma list of wheel, native, dispatch")
    parser.add_argument("--python", type=_named_python, action="append", default=[], metavar="NAME=PYTHON",
                        help="also run another interpreter's llama-cpp-python (its own libllama), named NAME")
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of gemma, smollm2")
    parser.add_argument("--repeats", type=int, default=3, help="passes, builds round robin (default 3)")
    parser.add_argument("--calls", type=int, default=12, help="evals per size per pass (default 12, as bench_spec)")
    parser.add_argument("--context", type=int, default=64, help="tokens in the context before each eval")
    parser.add_argument("--greedy", type=int, default=64, help="greedy tokens compared with the wheel's")
    parser.add_argument("--greedy-prompts", type=int, default=3, help="prompts of each kind for the greedy check")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench_llama_builds.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown model {', '.join(bad)}; known: {', '.join(MODELS)}")
    if args.child:
        out = child(args.models, list(SIZES), args.calls, args.context, args.greedy, args.greedy_prompts)
        print(RESULT_TAG + json.dumps(out))
        return
    args.builds = [b.strip() for b in args.builds.split(",") if b.strip()]
    bad = [b for b in args.builds if b not in BUILDS]
    if bad:
        raise SystemExit(f"unknown build {', '.join(bad)}; known: {', '.join(BUILDS)}")
    result = run(args)
    result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    print_result(result)
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
