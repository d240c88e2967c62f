"""Break the kernel on purpose and check that the tests notice.

Each mutant is one small source edit (a bug someone could plausibly write).
For each, the tree is copied to a temporary folder, the edit applied, the
kernel rebuilt there and the named test files run; a mutant the tests do not
kill is a hole in the suite. Run: `.venv/bin/python tools/mutants.py`
(about a minute per mutant on 2 cores; `--only NAME` for one). A mutant
counts as killed only if every test file it names fails on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: list[str]


MUTANTS = [
    Mutant("ties go to the highest id", "csrc/cpu/rows_impl.h",
           "if (block_max > best) {", "if (block_max >= best) {",
           ["tests/test_match_reference.py"]),
    Mutant("greedy reads every row (not lazy)", "csrc/decide.h",
           "    if (token != best) return {i, best};",
           "    if (token != best) { for (int64_t j = i + 1; j <= k; ++j) rows.target_argmax(seq, j); "
           "return {i, best}; }",
           ["tests/test_properties.py"]),
    Mutant("acceptance ignores its own uniform", "csrc/decide.h",
           "if (accepts(uniforms[i], w)) continue;",
           "if (accepts(uniforms[k], w)) continue;",
           ["tests/test_match_reference.py", "tests/test_conformance.py"]),
    Mutant("rejection resamples from p, not the residual", "csrc/decide.h",
           "  if (total > 0.0) {\n    return inverse_cdf(block_sums, total,",
           "  if (false) {\n    return inverse_cdf(block_sums, total,",
           ["tests/test_match_reference.py", "tests/test_conformance.py"]),
    Mutant("inverse CDF may land on a zero-mass token", "csrc/decide.h",
           "  return last_positive;\n}", "  return id(end - 1);\n}",
           ["tests/test_properties.py"]),
    Mutant("negative entries not screened", "csrc/ops_probs.cpp",
           "if (suspect || !std::isfinite(mass)) refuse_bad_entry",
           "if (!std::isfinite(mass)) refuse_bad_entry",
           ["tests/test_bad_input.py"]),
    Mutant("uniforms drawn one short", "csrc/checks.cpp",
           "    draw_uniforms(generator, out, count);",
           "    draw_uniforms(generator, out, count - 1); out[count - 1] = 0.5;",
           ["tests/test_properties.py"]),
    Mutant("fake output has the wrong shape", "torch-ext/spec_verify/_fake.py",
           "    return like.new_empty((batch,), dtype=torch.int64), like",
           "    return like.new_empty((batch + 1,), dtype=torch.int64), like",
           ["tests/test_registration.py"]),
    Mutant("block verification with h_i = p_i (no residual weight)", "csrc/decide.h",
           "if (block_stops(uniforms[i - 1], weight[i], total, w))",
           "if (total >= 0.0)",
           ["tests/test_law.py", "tests/test_match_reference.py"]),
    Mutant("row mass rounded to float32 per block", "csrc/cpu/rows_impl.h",
           "    return sum_lanes((s0 + s1) + (s2 + s3));",
           "    return static_cast<float>(sum_lanes((s0 + s1) + (s2 + s3)));",
           ["tests/test_match_reference.py"]),
    # The ragged layout (vLLM's flat rows): an offset off by one sequence.
    Mutant("ragged target rows skip no bonus rows", "csrc/checks.h",
           "return starts[b] + (given_bonus ? 0 : b); }", "return starts[b]; }",
           ["tests/test_ragged.py"]),
    Mutant("ragged uniforms read at the draft offset", "csrc/checks.h",
           "int64_t uniform_start(int64_t b) const { return starts[b] + b; }",
           "int64_t uniform_start(int64_t b) const { return starts[b]; }",
           ["tests/test_ragged.py"]),
    Mutant("ragged point-mass residual removes the wrong token", "csrc/ops_probs.cpp",
           "d_ = one_hot_.on(token, vocab_);", "d_ = one_hot_.on((token + 1) % vocab_, vocab_);",
           ["tests/test_ragged.py"]),
]


def run_mutant(mutant: Mutant, python: str) -> tuple[bool, str, float]:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sv-mutant-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", "build", "out", ".git", "__pycache__", ".cache"))
        target = tree / mutant.path
        text = target.read_text()
        if mutant.old not in text:
            return False, f"edit does not apply (source changed?): {mutant.old[:60]!r}", 0.0
        target.write_text(text.replace(mutant.old, mutant.new, 1))
        build = subprocess.run([python, "tools/build_kernel.py"], cwd=tree, capture_output=True, text=True)
        if build.returncode != 0:
            return True, "killed at build time", time.perf_counter() - start
        # Each named file on its own: every family it names must kill the mutant.
        verdicts = []
        for test_file in mutant.tests:
            tests = subprocess.run(
                [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test_file],
                cwd=tree, capture_output=True, text=True, timeout=1800,
            )
            tail = [line for line in tests.stdout.splitlines() if "passed" in line or "failed" in line]
            verdicts.append((tests.returncode != 0, f"{Path(test_file).name}: {tail[-1] if tail else '?'}"))
        killed = all(v for v, _ in verdicts)
        return killed, "; ".join(d for _, d in verdicts), time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run the mutant whose name contains this")
    args = parser.parse_args(argv)
    survivors = 0
    for mutant in MUTANTS:
        if args.only and args.only not in mutant.name:
            continue
        killed, detail, seconds = run_mutant(mutant, sys.executable)
        survivors += not killed
        print(f"{'KILLED ' if killed else 'SURVIVED'}  {mutant.name:48s} {seconds:5.0f} s  {detail}", flush=True)
    print(f"{survivors} mutant(s) survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
