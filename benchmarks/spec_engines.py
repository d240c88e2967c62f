"""The two engines of ``benchmarks.bench_spec``: llama.cpp (llama-cpp-python) and transformers.

Each engine opens one model (a target file, and the shipped draft where the
model has one) and answers the same questions, so the bench can lay them side
by side:

* ``tokenize(text)``: token ids (llama.cpp's tokenizer for both engines, so
  both decode the very same ids; helper checks of the two tokenizers live in
  the real-model tests);
* ``target(temperature)`` / ``draft(temperature, generator)``: the
  ``target_step`` / ``draft_step`` adapters (``LlamaCppStep``,
  ``HFCausalLMStep``) the decoder drives;
* ``prefill(step, prompt)``: the prompt minus its last token fed to an
  adapter before the clock starts (every row's timing is decoding only);
* ``plain(prompt, max_new, temperature, generator)``: the plain loop
  baseline, one eval of one token per new token on the same adapter, timed;
* ``peers(...)``: the engine's own speculation (llama-cpp-python's
  ``LlamaPromptLookupDecoding``; transformers' ``prompt_lookup_num_tokens``),
  and the engine's own plain loop, timed from the first new token on; on
  llama.cpp also llama.cpp's own n-gram speculation and plain decoding from
  the native tools build (``own_ngram_rows``), when that build exists;
* ``eval_costs(sizes)``: the CPU milliseconds of one target eval of ``n``
  positions with logits at every position (what a round of ``k = n - 1``
  asks for), each size's calls in a row after a 64-token context.

Timing: process CPU seconds (one thread: waits for a core are left out, a
shared cache's slowdown is not) and wall seconds, both around the decoding
only. No row copies logits the others do not: ``LlamaCppStep`` hands the
verifier a view of llama.cpp's own output buffer; the plain loops read the
same view; the peers run as their libraries ship them.
"""

from __future__ import annotations

import os
import pathlib
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTEXT = 1536  # n_ctx: the longest prompt (~400 tokens) + max_new + k_max, with room


@dataclass
class ModelSpec:
    """One bench model: its files per engine, and whether the shipped draft applies."""

    name: str
    gguf: pathlib.Path  # the target on llama.cpp
    hf: object  # the target on transformers: a directory, or the GGUF path (dequantized)
    draft_gguf: pathlib.Path | None = None
    draft_hf: pathlib.Path | None = None
    family: str = "real"  # "real" (chat-capable public models) or "pair" (the shipped code pair)
    notes: list = field(default_factory=list)

    @property
    def has_draft(self) -> bool:
        return self.draft_gguf is not None


def real_dir() -> pathlib.Path:
    """``models/real/`` (``make real-models``); ``SV_REAL_DIR`` overrides it (a scratch copy)."""
    return pathlib.Path(os.environ.get("SV_REAL_DIR", ROOT / "models" / "real"))


def model_specs() -> dict:
    """Every model the bench knows, by name (files may still be missing: ``missing(spec)`` says)."""
    real = real_dir()
    gemma = real / "gemma-3-270m-q4_k_m.gguf"
    smol = real / "SmolLM2-135M-Instruct.Q4_1.gguf"
    padded = ROOT / ".cache" / "padded"
    return {
        "gemma": ModelSpec("Gemma 3 270M (Q4_K_M)", gemma, gemma),
        "smollm2": ModelSpec("SmolLM2-135M-Instruct (Q4_1)", smol, smol),
        "shipped": ModelSpec("shipped pair (f32)", ROOT / "models" / "gguf" / "target.gguf", ROOT / "models" / "target",
                             ROOT / "models" / "gguf" / "draft.gguf", ROOT / "models" / "draft", family="pair"),
        "padded": ModelSpec("padded target x32 (f32)", padded / "gguf" / "target.gguf", padded / "target",
                            padded / "gguf" / "draft.gguf", ROOT / "models" / "draft", family="pair"),
    }


def missing(spec: ModelSpec, engine: str) -> str | None:
    """What is missing to run ``spec`` on ``engine`` (None: nothing), with the command that makes it."""
    paths = [spec.gguf] + ([spec.draft_gguf] if spec.draft_gguf else [])
    if engine == "transformers":
        paths = [pathlib.Path(spec.hf)] + ([spec.draft_hf] if spec.draft_hf else [])
    lost = [p for p in paths if not pathlib.Path(p).exists()]
    if not lost:
        return None
    how = {"real": "make real-models", "pair": "make gguf; python -m integrations.llama_cpp.padded_target"}
    return f"{', '.join(map(str, lost))} missing ({how[spec.family]})"


def _timed(fn):
    """``(cpu seconds, wall seconds, result)`` of ``fn()``."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - t0, out


# ----------------------------------------------------------------------------
# llama.cpp
# ----------------------------------------------------------------------------


class LlamaEngine:
    """llama-cpp-python ``Llama`` objects for one model, one thread."""

    name = "llama.cpp"

    def __init__(self, spec: ModelSpec, sv, threads: int = 1):
        from integrations.llama_cpp.pair import open_llama

        self.spec, self.sv, self.threads = spec, sv, threads
        self.llama = open_llama(spec.gguf, n_ctx=CONTEXT, threads=threads)
        self.draft_llama = open_llama(spec.draft_gguf, n_ctx=CONTEXT, threads=threads) if spec.has_draft else None
        self._targets = {}

    def tokenize(self, text: str, chat: bool = False) -> list:
        """Token ids of ``text`` (BOS as the model's GGUF asks for it)."""
        return list(self.llama.tokenize(text.encode("utf-8"), add_bos=self.spec.family == "real", special=chat))

    def detokenize(self, ids) -> str:
        return self.llama.detokenize(list(ids)).decode("utf-8", errors="replace")

    def target(self, temperature: float):
        """The ``LlamaCppStep`` on the target, one per temperature (one context: never two in use at once)."""
        from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

        if temperature not in self._targets:
            self._targets[temperature] = LlamaCppStep(self.llama, temperature=temperature, sv=self.sv)
        return self._targets[temperature]

    def draft(self, temperature: float, generator):
        from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

        return LlamaCppStep(self.draft_llama, temperature=temperature, generator=generator, sv=self.sv)

    @staticmethod
    def prefill(step, prompt: list) -> None:
        step.reset()
        step._feed(list(prompt[:-1]), rows=1)
        step.bench_prefilled = step.decode_seconds  # eval_seconds counts from here

    @staticmethod
    def eval_seconds(*steps) -> float:
        """Seconds inside ``llama_decode`` since each adapter's prefill (``prefill``), summed: what the
        bench's ``loop us/tok`` column takes from a row's wall time (the loop's own time, without the
        evals' run-to-run noise)."""
        return sum(s.decode_seconds - getattr(s, "bench_prefilled", 0.0) for s in steps if s is not None)

    def plain(self, prompt: list, max_new: int, temperature: float, generator):
        """The plain loop on the target's adapter: ``(cpu s, wall s, new tokens)``, decoding only."""
        step = self.target(temperature)
        self.prefill(step, prompt)
        sv = self.sv
        sample = None if step.greedy else dict(step.warping.kwargs(), generator=generator)

        def loop():
            out = []
            logits = step._feed([prompt[-1]], rows=1)[0]
            for i in range(max_new):
                token = int(torch.argmax(logits)) if sample is None else int(sv.sample_draft(logits, **sample))
                out.append(token)
                if i + 1 < max_new:
                    logits = step._feed([token], rows=1)[0]
            return out

        return _timed(loop)

    def peers(self, prompt: list, max_new: int, temperature: float, seed: int, lookup_n: list):
        """``{row name: (cpu s, wall s, tokens timed, new tokens)}``: llama-cpp-python's ``Llama.generate``
        plain, and with its ``LlamaPromptLookupDecoding(num_pred_tokens=N)``, timed from the first new token."""
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        out = {"Llama.generate plain": self._generate(prompt, max_new, temperature, seed, None)}
        for n in lookup_n:
            out[f"LlamaPromptLookupDecoding N={n}"] = self._generate(
                prompt, max_new, temperature, seed, LlamaPromptLookupDecoding(num_pred_tokens=n))
        for step in self._targets.values():
            step.reset()  # Llama.generate used the context: the adapters' records are stale
        out.update(self.own_ngram_peers(prompt, max_new, temperature, seed, lookup_n))
        return out

    def own_ngram_peers(self, prompt: list, max_new: int, temperature: float, seed: int, lookup_n: list) -> dict:
        """llama.cpp's own n-gram speculation and plain decoding (``own_ngram_rows``) on this model, or ``{}``
        with the reason printed once (the native tools build is missing, or the binaries would read other
        prompt tokens than ``prompt``)."""
        from integrations.llama_cpp.bench_llama import NATIVE_BIN

        why = own_ngram_reason(NATIVE_BIN)
        text = None
        if why is None:
            text = self.detokenize(prompt)
            if list(self.llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)) != list(prompt):
                why = ("llama.cpp's binaries tokenize the prompt with BOS as the GGUF asks and special tokens "
                       "parsed, which gives other ids than this bench's")
        if why is not None:
            if not getattr(self, "_own_ngram_noted", False):
                print(f"llama.cpp's own n-gram speculation on {self.spec.name}: skipped: {why}")
                self._own_ngram_noted = True
            return {}
        return own_ngram_rows(NATIVE_BIN, self.spec.gguf, text, len(prompt), max_new, temperature, seed,
                              lookup_n, self.threads, self._retokenize)

    def _retokenize(self, text: str) -> list:
        return list(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _generate(self, prompt, max_new, temperature, seed, draft_model):
        llama = self.llama
        llama.draft_model = draft_model  # read by Llama.generate each round (logits_all is on already)
        llama.reset()
        llama.set_seed(seed)
        gen = llama.generate(list(prompt), temp=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                             repeat_penalty=1.0, reset=True)
        out = []
        try:
            out.append(int(next(gen)))  # after the prompt's eval: the clock starts here
            c0, t0 = time.process_time(), time.perf_counter()
            for token in gen:
                out.append(int(token))
                if len(out) == max_new:
                    break
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        finally:
            gen.close()
            llama.draft_model = None
        return cpu, wall, len(out) - 1, out

    def eval_costs(self, sizes, context: int = 64, calls: int = 12) -> dict:
        """``{"target": {n: cpu ms}, "draft": {1: cpu ms}}``: one eval of ``n`` positions, logits at each."""
        out = {"target": _llama_costs(self.target(0.0), sizes, context, calls)}
        if self.draft_llama is not None:
            out["draft"] = _llama_costs(self.draft(0.0, None), [1], context, calls)
        return out


class _HeadInOp:
    """What both head engines share: one hidden-state target per temperature on one head, the engine's
    own plain loop as a peer row (``own_plain``), and the cost curve beside the engine's own.

    A subclass gives ``_hidden_step(temperature)``, ``_costs`` (its engine's cost probe) and
    ``cost_calls``, ``own_plain``, ``draft_step_engine`` (the attribute holding the draft model, or
    None), and its ``plain``.
    """

    def target(self, temperature: float):
        if temperature not in self._targets:
            step = self._hidden_step(temperature)
            self.head = step.head  # one mapping (or copy) of the head for every temperature
            self._targets[temperature] = step
        return self._targets[temperature]

    def peers(self, prompt: list, max_new: int, temperature: float, seed: int, lookup_n: list):
        """The engine's own plain loop (its head, same adapter code) first, then the base engine's peers."""
        cpu, wall, new = self.base.plain(prompt, max_new, temperature, torch.Generator().manual_seed(seed))
        out = {self.own_plain: (cpu, wall, len(new), new)}
        out.update(self.base.peers(prompt, max_new, temperature, seed, lookup_n))
        return out

    def eval_costs(self, sizes, context: int = 64, calls: int | None = None) -> dict:
        """``{"target": {n: cpu ms}, "engine": {n: cpu ms}, ...}``: an eval of ``n`` positions ending at the
        norm plus our head's pass over its ``n`` rows (greedy ``verify_hidden``); ``engine``: the engine's
        own eval with logits at each position, measured in the same call."""
        calls = calls or self.cost_calls
        out = {"target": self._costs(self.target(0.0), sizes, context, calls, head=self.head, sv=self.sv),
               "engine": self._costs(self.base.target(0.0), sizes, context, calls)}
        if getattr(self, self.draft_step_engine) is not None:
            out["draft"] = self._costs(self.draft(0.0, None), [1], context, calls)
        return out


class LlamaHeadEngine(_HeadInOp, LlamaEngine):
    """llama.cpp with the LM head in our op: the target is ``LlamaCppStep(hidden=True)`` (issue 25).

    The same ``Llama`` objects as the ``LlamaEngine`` it wraps (its own context for the target: the
    graph ends at the final norm), the head read from the same GGUF. The ``plain loop`` is plain
    decoding on that head (one eval of one token, ``sample_hidden``); the engine's own plain loop
    (llama.cpp's head) is a peer row, ``llama.cpp plain loop``, beside ``Llama.generate``.
    """

    name = "llama.cpp + head in op"
    own_plain = "llama.cpp plain loop (its head)"
    draft_step_engine = "draft_llama"
    cost_calls = 12  # as LlamaEngine.eval_costs

    def __init__(self, base: LlamaEngine):
        self.spec, self.sv, self.threads = base.spec, base.sv, base.threads
        self.llama, self.draft_llama = base.llama, base.draft_llama
        self.base = base
        self._targets = {}
        self.head = None

    def _hidden_step(self, temperature: float):
        from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

        return LlamaCppStep(self.llama, temperature=temperature, sv=self.sv, hidden=True, head=self.head)

    @staticmethod
    def _costs(step, sizes, context, calls, **head):
        return _llama_costs(step, sizes, context, calls, **head)

    def plain(self, prompt: list, max_new: int, temperature: float, generator):
        """Plain decoding on our head: ``(cpu s, wall s, new tokens)``, decoding only."""
        step = self.target(temperature)
        self.prefill(step, prompt)
        feed = lambda token: step._feed([token], rows=1)  # noqa: E731
        return _timed(lambda: _head_plain_loop(self.sv, step, feed, prompt[-1], max_new, generator))


def _head_plain_loop(sv, step, feed, first: int, max_new: int, generator) -> list:
    """Plain decoding on ``step.head``: ``feed(token)`` gives its hidden row, ``sample_hidden`` the next token."""
    kw = dict(step.warping.kwargs(), generator=generator)
    out = []
    hidden = feed(first)
    for i in range(max_new):
        out.append(int(sv.sample_hidden(hidden, step.head, **kw)[0]))
        if i + 1 < max_new:
            hidden = feed(out[-1])
    return out


def _llama_costs(step, sizes, context, calls, head=None, sv=None):
    step.reset()
    step._feed(list(range(1, context + 1)), rows=1)
    costs = {}
    for n in sizes:  # each size's calls in a row: llama.cpp reuses its graph, as a decoding loop does
        v = []
        tokens = torch.arange(11, 10 + n)
        for _ in range(calls + 2):
            c0 = time.process_time()
            rows = step._feed(list(range(10, 10 + n)), rows=n)
            if head is not None:  # the head's pass is part of the eval when the head is ours
                sv.verify_hidden(rows, head, tokens, temperature=0.0)
            v.append(time.process_time() - c0)
            step._rollback(context)
        costs[n] = 1e3 * statistics.median(v[2:])
    step.reset()
    return costs


# ----------------------------------------------------------------------------
# llama.cpp's own n-gram speculation (the native tools build), as peers
# ----------------------------------------------------------------------------

# llama.cpp's two n-gram drafts, as its own C++ loops run them, and the same build's plain decoding:
# (row name, binary, extra arguments); {n} is the peer's N (--peer-n), the longest draft.
# * ngram-simple (llama-speculative-simple --spec-type ngram-simple): the tokens that followed the latest
#   earlier occurrence of the last OWN_NGRAM_SIZE tokens (as PromptLookupDraft's longest n-gram; no
#   shorter fallback), at most N of them and at least OWN_NGRAM_SIZE (so N >= OWN_NGRAM_SIZE);
# * llama-lookup: its n-gram cache of the context, token by token the most frequent follower of the
#   longest n-gram (4 down to 1) seen often enough, at most N tokens (--spec-draft-n-max); no cache files;
# * plain: llama-completion, and llama-speculative-simple with an n-gram it can never match (1024 tokens):
#   the ngram rows' own loop and clock with nothing drafted.
# At T > 0 both draft loops sample the target token and accept the draft token iff equal: a point-mass
# draft's rule, so their output follows the target's law.
OWN_NGRAM_SIZE = 3
OWN_NGRAM_BINS = ("llama-completion", "llama-speculative-simple", "llama-lookup")
OWN_NGRAM_ROWS = [
    ("llama.cpp native plain (llama-completion)", "llama-completion", ["-no-cnv"]),
    ("llama.cpp native plain (no draft)", "llama-speculative-simple",
     ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024", "--spec-ngram-simple-size-m", "1"]),
    ("llama.cpp native ngram-simple N={n}", "llama-speculative-simple",
     ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(OWN_NGRAM_SIZE),
      "--spec-ngram-simple-size-m", "{n}"]),
    ("llama.cpp native llama-lookup N={n}", "llama-lookup", ["--spec-draft-n-max", "{n}"]),
]
LOG_DIR = ROOT / ".cache" / "own-logs"  # each run's --log-file, deleted after the run
_LOG_LINE = re.compile(r"\n*\d+\.\d{2}\.\d{3}\.\d{3} [A-Z] ")  # a timestamped line of llama.cpp's log file
_PROMPT_COUNT = re.compile(r"encoded\s+(\d+) tokens|prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


def own_ngram_reason(bin_dir: pathlib.Path) -> str | None:
    """Why llama.cpp's own n-gram rows cannot run from ``bin_dir`` (None: they can)."""
    lost = [b for b in OWN_NGRAM_BINS if not (pathlib.Path(bin_dir) / b).is_file()]
    if lost:
        return f"{', '.join(lost)} not in {bin_dir} (tools/llama_native/build.sh, or make llama-native)"
    return None


def own_ngram_rows(bin_dir, gguf, text: str, n_prompt: int, max_new: int, temperature: float, seed: int,
                   lookup_n: list, threads: int, retokenize) -> dict:
    """llama.cpp's own n-gram speculation and plain decoding on one prompt, each a subprocess of the
    native build (``OWN_NGRAM_ROWS``): ``{row name: (seconds, seconds, tokens, new tokens[, rounds])}``.

    Parameters
    ----------
    bin_dir : pathlib.Path
        The native build's binaries (``tools/llama_native/build.sh``).
    gguf : pathlib.Path
        The model file, the one the bench's ``Llama`` reads.
    text : str
        The prompt's text; the binaries tokenize it with BOS as the GGUF asks (the caller checks the ids
        are the bench's), and read it verbatim (``--no-escape``). Their context is the bench's ``Llama``'s:
        ``n_ctx`` ``CONTEXT``, flash attention off (the binaries' ``auto`` turns it on, which moves
        near-ties: SmolLM2's first open prompt began " in a land" with it, " there was" without).
    n_prompt : int
        The bench's prompt length in tokens: each run's reported prompt length is checked against it.
    max_new : int
        New tokens (``-n``; the draft loops stop at the first round past it, so they decode up to N more).
        With ``--ignore-eos``, as ``bench_llama``'s rows: every run decodes them all, but it also sets the
        end-of-text logits to -inf, which the bench's own loops do not.
    temperature : float
        0: greedy; else temperature alone (top-k 0, top-p 1, min-p 0), seeded by ``seed``.
    seed : int
        The binaries' sampler seed.
    lookup_n : list of int
        The drafts' N; ngram-simple's below ``OWN_NGRAM_SIZE`` are left out (it never drafts there).
    threads : int
        ``-t`` and ``-tb``.
    retokenize : callable
        ``text -> token ids`` (no BOS): the binaries print text, and the rows' tokens are its ids.

    Returns
    -------
    dict
        Per row, the binary's own timing twice (the bench's CPU and wall slots; it is wall-clock time, one
        thread), the tokens it timed, and its first ``max_new`` new tokens (its printed text re-tokenized).
        Timed: the draft loops and the no-draft row, their ``decoded N tokens in S seconds`` (from the
        last prompt token's eval to the end: evals, drafting, sampling, printing; prompt eval excluded);
        llama-completion, its ``eval time = S ms / N runs`` (llama_decode of one token only: no sampling).
        The draft loops' rows (the no-draft row too) add their rounds, the target evals (``_own_rounds``).
    """
    from integrations.llama_cpp.bench_llama import _run_own

    common = ["-m", str(gguf), "-n", str(max_new), "-c", str(CONTEXT), "-t", str(threads), "-tb", str(threads),
              "--seed", str(seed), "--ignore-eos", "--temp", str(temperature), "--top-k", "0", "--top-p", "1",
              "--min-p", "0", "--no-escape", "--flash-attn", "off"]  # as the bench's Llama (the binaries': auto)
    out = {}
    for name, binary, extra in OWN_NGRAM_ROWS:
        for n in (lookup_n if "{n}" in name else [None]):
            if n is not None and "ngram-simple" in name and n < OWN_NGRAM_SIZE:
                continue
            args = common + [a.format(n=n) for a in extra]
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=LOG_DIR) as tmp:
                log_path = pathlib.Path(tmp) / "log.txt"
                tokens, seconds, _ = _run_own(bin_dir / binary, args + ["--log-file", str(log_path), "-p", text])
                log = log_path.read_text(errors="replace")
            _check_prompt_count(log, n_prompt, binary)
            new = retokenize(_generated_text(log, text))[:max_new]
            out[name.format(n=n)] = (seconds, seconds, tokens, new) + _own_rounds(log, binary, tokens)
    return out


_OWN_PREDICT = re.compile(r"n_predict\s*=\s*(\d+)\s*$", re.M)
_OWN_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)\s*$", re.M)


def _own_rounds(log: str, binary: str, tokens: int) -> tuple:
    """``(target evals,)`` of a draft loop's run, or ``()`` (llama-completion: one a token, not counted).

    Each round of llama.cpp's draft loops emits its accepted tokens plus one, so its rounds are
    ``n_predict - n_accept`` (the closing statistics both loops print); the bench's ``tok/round``
    column then holds the peer's beside ours. A log without them (the logger's lost closing lines,
    ``bench_llama._run_own``) reports none rather than a guess.
    """
    if binary == "llama-completion":
        return ()
    predict, accept = _OWN_PREDICT.findall(log), _OWN_ACCEPT.findall(log)
    if not predict or not accept:
        return ()
    rounds = int(predict[-1]) - int(accept[-1])
    if rounds <= 0 or int(predict[-1]) != tokens:
        raise RuntimeError(f"{binary}: n_predict {predict[-1]}, n_accept {accept[-1]}, {tokens} tokens decoded: "
                           "not a draft loop's counts")
    return (rounds,)


def _check_prompt_count(log: str, n_prompt: int, binary: str) -> None:
    """The binary read a prompt of the bench's length (its ``encoded`` / ``prompt eval`` count)."""
    m = _PROMPT_COUNT.search(log)
    if m is None:
        raise RuntimeError(f"{binary}: no prompt token count in its log")
    count = int(m.group(1) or m.group(2))
    if count != n_prompt:
        raise RuntimeError(f"{binary} read {count} prompt tokens, the bench {n_prompt}: not the same prompt")


def _generated_text(log: str, prompt_text: str) -> str:
    """The text a binary printed after echoing the prompt, up to its next timestamped log line (its
    closing blank lines dropped)."""
    start = log.find(prompt_text)
    if start < 0:
        raise RuntimeError("the prompt's echo is not in the binary's log")
    rest = log[start + len(prompt_text):]
    m = _LOG_LINE.search(rest)
    return (rest[:m.start()] if m else rest).rstrip("\n")


# ----------------------------------------------------------------------------
# transformers
# ----------------------------------------------------------------------------


def load_hf(path, dtype=torch.float32):
    """A transformers causal LM in eval mode: a model directory, or a GGUF file dequantized to float32.

    A real model's GGUF: ``examples.real_models.load_hf`` (it caches the
    dequantized weights in ``.cache/real-hf/``) when it is there, else
    ``from_pretrained(dir, gguf_file=name)``.
    """
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(path)
    if path.suffix == ".gguf":
        try:
            from examples import real_models
        except ImportError:
            real_models = None
        if real_models is not None and hasattr(real_models, "load_hf"):
            try:
                return real_models.load_hf(real_models.path_name(path), threads=None)[1].eval()
            except Exception as e:  # noqa: BLE001 -- the shared loader failing must not stop the bench: say so, read the GGUF
                print(f"examples.real_models.load_hf failed ({type(e).__name__}: {str(e)[:120]}); "
                      "reading the GGUF with from_pretrained(gguf_file=...)", flush=True)
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


class _Clock:
    """A generate() streamer: the time of the first new tokens' arrival, and their count."""

    def __init__(self):
        self.calls = 0
        self.first_new = 0
        self.c0 = self.t0 = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # the first put is the prompt; the second, the first round's new tokens
            self.c0, self.t0 = time.process_time(), time.perf_counter()
            self.first_new = int(value.numel())

    def end(self):
        pass


# Our decoder as a transformers user calls it: generate(..., custom_generate=..., prompt_lookup_num_tokens="auto")
# (the batched adapter at B = 1; its AutoCost kept per model across the run's calls, as the lookup k=auto
# rows share theirs). A row of ours, shown beside the peers, not judged as one.
CUSTOM_AUTO = "custom_generate k=auto"


class HFEngine:
    """One transformers model (float32, the GGUF dequantized for the real models), and the shipped draft."""

    name = "transformers"

    def __init__(self, spec: ModelSpec, sv, tokenizer_engine):
        self.spec, self.sv = spec, sv
        self.model = load_hf(spec.hf)
        self.draft_model = load_hf(spec.draft_hf) if spec.draft_hf else None
        self.tokenizer_engine = tokenizer_engine  # llama.cpp's tokenization: the same ids on both engines
        self._targets = {}
        gc = self.model.generation_config
        gc.eos_token_id = None  # every row decodes max_new tokens
        if gc.pad_token_id is None:
            gc.pad_token_id = 0

    def tokenize(self, text: str, chat: bool = False) -> list:
        return self.tokenizer_engine.tokenize(text, chat)

    def target(self, temperature: float):
        if temperature not in self._targets:
            self._targets[temperature] = self.sv.HFCausalLMStep(self.model, temperature=temperature)
        return self._targets[temperature]

    def draft(self, temperature: float, generator):
        return self.sv.HFCausalLMStep(self.draft_model, temperature=temperature, generator=generator)

    @staticmethod
    def prefill(step, prompt: list) -> None:
        step.reset()
        with torch.inference_mode():
            step._feed(torch.tensor(prompt[:-1], dtype=torch.int64), rows=1)

    def plain(self, prompt: list, max_new: int, temperature: float, generator):
        step = self.target(temperature)
        self.prefill(step, prompt)
        sv = self.sv
        sample = None if step.greedy else dict(step.warping.kwargs(), generator=generator)

        def loop():
            out = []
            with torch.inference_mode():
                logits = step._feed(torch.tensor(prompt[-1:]), rows=1)[0]
                for i in range(max_new):
                    token = int(torch.argmax(logits)) if sample is None else int(sv.sample_draft(logits, **sample))
                    out.append(token)
                    if i + 1 < max_new:
                        logits = step._feed(torch.tensor([token]), rows=1)[0]
            return out

        return _timed(loop)

    def peers(self, prompt: list, max_new: int, temperature: float, seed: int, lookup_n: list):
        """transformers' ``generate``: plain, and with ``prompt_lookup_num_tokens=N`` (temperature alone
        when sampling: top_k=0, top_p=1), timed from the first new tokens' arrival: ``{row name: (cpu s,
        wall s, tokens timed, new tokens, rounds timed)}`` (a round: one forward of the model)."""
        out = {"generate() plain": self._generate(prompt, max_new, temperature, seed, None)}
        for n in lookup_n:
            out[f"generate(prompt_lookup_num_tokens={n})"] = self._generate(prompt, max_new, temperature, seed, n)
        out[CUSTOM_AUTO] = self._generate(prompt, max_new, temperature, seed, "auto", custom=True)
        return out

    def _generate(self, prompt, max_new, temperature, seed, lookup, custom=False):
        """One ``generate()`` call; ``custom``: through our ``custom_generate`` (``integrations/transformers``)."""
        torch.manual_seed(seed)
        clock = _Clock()
        kw = dict(max_new_tokens=max_new, streamer=clock)
        if custom:  # its eos is off (the model's generation config): every row decodes max_new tokens
            from examples.hf_generate import INTEGRATION, use_local_kernel

            use_local_kernel()
            kw.update(custom_generate=INTEGRATION, trust_remote_code=True)
        else:
            kw["min_new_tokens"] = max_new  # refused by custom_generate (it changes the output)
        if temperature > 0:
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if lookup is not None:
            kw["prompt_lookup_num_tokens"] = lookup
        ids = torch.tensor([prompt])
        forwards = [0]  # the model's forward calls: the prompt's (with the first proposal), then one a round
        hook = self.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            with torch.inference_mode():
                res = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        finally:
            hook.remove()
        cpu, wall = time.process_time() - clock.c0, time.perf_counter() - clock.t0
        new = res[0, len(prompt):].tolist()
        # Timed: the tokens after the first forward's, in the rounds after it.
        return cpu, wall, len(new) - clock.first_new, new, forwards[0] - 1

    def eval_costs(self, sizes, context: int = 64, calls: int = 8) -> dict:
        out = {"target": _hf_costs(self.target(0.0), sizes, context, calls)}
        if self.draft_model is not None:
            out["draft"] = _hf_costs(self.draft(0.0, None), [1], context, calls)
        return out


class HFHeadEngine(_HeadInOp, HFEngine):
    """transformers with the LM head in our op: the target is ``HFCausalLMStep(hidden=True)`` (issue 25).

    The same model as the ``HFEngine`` it wraps; the head is the model's own (float32, tied for the
    real models). ``plain loop``: plain decoding on that head (``sample_hidden``); the engine's own
    plain loop (torch's head) is a peer row, ``transformers plain loop (its head)``.
    """

    name = "transformers + head in op"
    own_plain = "transformers plain loop (its head)"
    draft_step_engine = "draft_model"
    cost_calls = 8  # as HFEngine.eval_costs

    def __init__(self, base: HFEngine):
        self.spec, self.sv, self.model, self.draft_model = base.spec, base.sv, base.model, base.draft_model
        self.tokenizer_engine = base.tokenizer_engine
        self.base = base
        self._targets = {}
        self.head = None

    def _hidden_step(self, temperature: float):
        return self.sv.HFCausalLMStep(self.model, temperature=temperature, hidden=True, head=self.head)

    @staticmethod
    def _costs(step, sizes, context, calls, **head):
        return _hf_costs(step, sizes, context, calls, **head)

    def plain(self, prompt: list, max_new: int, temperature: float, generator):
        step = self.target(temperature)
        self.prefill(step, prompt)
        feed = lambda token: step._feed(torch.tensor([token]), rows=1)  # noqa: E731

        def loop():
            with torch.inference_mode():
                return _head_plain_loop(self.sv, step, feed, prompt[-1], max_new, generator)

        return _timed(loop)


def _hf_costs(step, sizes, context, calls, head=None, sv=None):
    costs = {}
    with torch.inference_mode():
        step.reset()
        step._feed(torch.arange(1, context + 1), rows=1)
        for n in sizes:
            v = []
            for _ in range(calls + 2):
                c0 = time.process_time()
                rows = step._feed(torch.arange(10, 10 + n), rows=n)
                if head is not None:  # the head's pass is part of the eval when the head is ours
                    sv.verify_hidden(rows, head, torch.arange(11, 10 + n), temperature=0.0)
                v.append(time.process_time() - c0)
                step._rollback(context)
            costs[n] = 1e3 * statistics.median(v[2:])
        step.reset()
    return costs
