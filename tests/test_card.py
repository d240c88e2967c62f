"""The card (README.md, also the Hub card) is held to what it claims.

* Every number-bearing row of its headline table names the command that
  prints the figure, and that command exists: a target the Makefile defines,
  or a ``python -m`` module whose ``--help`` exits 0 (run with this
  interpreter, the venv's, in a subprocess). The row also names the machine.
* The card is at most 250 lines.
* Every relative link in README.md and docs/*.md points to a file that
  exists; every ``make X`` the docs show names a target the Makefile defines.
* ``make help`` lists every target with its ``## `` line.

Each checker is also run on made-up input it must reject (negative controls).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The emulated aarch64 root stages the tests, the kernel and tools/, not README.md, docs/ or the
# Makefile: the card's checks are the same on every architecture, so they run natively only.
pytestmark = pytest.mark.native_only

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"
MAX_CARD_LINES = 250
HELP_TIMEOUT_S = 120

# A machine is named by its CPU family or architecture, not by "here".
MACHINE = re.compile(r"x86-64|x86_64|aarch64|arm64|Zen|Xeon|EPYC|Cortex|Raspberry Pi|Apple M", re.I)
TARGET_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):(?!=)", re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
MAKE_MENTION = re.compile(r"(?<![\w-])make ([a-z][a-z0-9-]*)")


def make_targets(makefile_text: str) -> set[str]:
    """The plain ``name:`` rules of a Makefile (not variables, not ``$(VAR):`` rules)."""
    return set(TARGET_LINE.findall(makefile_text))


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after ``heading``, as one dict per row keyed by the header cells."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    except StopIteration:
        raise ValueError(f"no heading {heading!r}") from None
    # the table: the first run of consecutive "|" lines after the heading
    first = next((i for i, line in enumerate(lines[start + 1:], start + 1) if line.startswith("|")), None)
    if first is None:
        raise ValueError(f"no table after {heading!r}")
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]
    return [dict(zip((h.lower() for h in header), cells)) for cells in body]


def command_problem(command: str, targets: set[str], root: Path, python: str) -> str | None:
    """Why ``command`` is not a runnable make target or ``python -m`` module, or None."""
    words = command.split()
    if words[:1] == ["make"]:
        names = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        if not names:
            return f"{command!r}: no target named"
        if names[0] not in targets:
            return f"{command!r}: no target {names[0]!r} in the Makefile"
        return None
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1] == "-m":
        module = words[2]
        path = root.joinpath(*module.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            return f"{command!r}: no module {module} in the repository"
        try:
            run = subprocess.run([python, "-m", module, "--help"], cwd=root, capture_output=True,
                                 text=True, timeout=HELP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{command!r}: `python -m {module} --help` took over {HELP_TIMEOUT_S} s"
        if run.returncode != 0:
            last = (run.stderr or run.stdout).strip().splitlines()[-1:] or [""]
            return f"{command!r}: `python -m {module} --help` exited {run.returncode}: {last[0]}"
        return None
    return f"{command!r}: neither `make TARGET` nor `python -m MODULE`"


def row_problems(rows: list[dict[str, str]], targets: set[str], root: Path, python: str) -> list[str]:
    """Every number-bearing row's missing or broken command, and its missing machine."""
    problems = []
    for row in rows:
        figure = row.get("figure", "")
        if not re.search(r"\d", figure):
            continue
        commands = re.findall(r"`([^`]+)`", row.get("command", ""))
        if not commands:
            problems.append(f"{figure!r}: no command in backticks")
        for command in commands:
            problem = command_problem(command, targets, root, python)
            if problem:
                problems.append(f"{figure!r}: {problem}")
        if not MACHINE.search(row.get("machine", "")):
            problems.append(f"{figure!r}: no machine named ({row.get('machine', '')!r})")
    return problems


def broken_links(doc: Path, text: str, root: Path) -> list[str]:
    """The relative links in ``text`` (a file at ``doc``) that point to no file or folder."""
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, a mailto:, an anchor in the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            bad.append(f"{doc.relative_to(root)}: {target}")
    return bad


def undefined_make_mentions(text: str, targets: set[str]) -> set[str]:
    """The ``make X`` in code spans and blocks of ``text`` whose X the Makefile does not define."""
    mentioned = {m for span in CODE_SPAN.findall(text) for m in MAKE_MENTION.findall(span)}
    return mentioned - targets


def docs() -> list[Path]:
    return [CARD, *sorted((ROOT / "docs").glob("*.md"))]


# --- the card itself ---------------------------------------------------------


def test_card_is_at_most_250_lines():
    n = len(CARD.read_text().splitlines())
    assert n <= MAX_CARD_LINES, f"README.md has {n} lines; the card's limit is {MAX_CARD_LINES}"


def test_every_headline_figure_names_a_command_that_exists_and_a_machine():
    rows = table_after(CARD.read_text(), "## Headline figures")
    numbered = [r for r in rows if re.search(r"\d", r.get("figure", ""))]
    assert len(numbered) >= 5, f"the headline table has {len(numbered)} number-bearing rows"
    problems = row_problems(rows, make_targets(MAKEFILE.read_text()), ROOT, sys.executable)
    assert not problems, "\n".join(problems)


def test_relative_links_in_the_card_and_docs_resolve():
    bad = [b for doc in docs() for b in broken_links(doc, doc.read_text(), ROOT)]
    assert not bad, "links to no file:\n" + "\n".join(bad)


def test_every_make_target_the_docs_show_exists():
    targets = make_targets(MAKEFILE.read_text())
    pages = docs() + sorted(ROOT.glob("integrations/*/README.md")) + [ROOT / "tools/aarch64/README.md"]
    missing = {f"{p.relative_to(ROOT)}: make {m}" for p in pages for m in undefined_make_mentions(p.read_text(), targets)}
    assert not missing, "documented targets the Makefile lacks:\n" + "\n".join(sorted(missing))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_help_lists_every_target_with_its_line():
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    listed = {}
    for line in out.splitlines():
        words = line.split(None, 2)
        if words[:1] == ["make"] and len(words) == 3:
            listed[words[1]] = words[2]
    assert set(listed) == make_targets(MAKEFILE.read_text())
    undocumented = sorted(t for t, d in listed.items() if d == "(no ## comment)")
    assert not undocumented, f"targets without a `## ` line (Makefile header): {undocumented}"


# --- negative controls: the checkers reject made-up input --------------------


def test_row_checker_reports_a_missing_target_a_missing_module_a_failing_help_and_no_machine(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "fails.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "tools" / "works.py").write_text("import sys\nsys.exit(0)\n")
    card = """## Headline figures

| figure | what it measures | command | machine |
|---|---|---|---|
| 1.5x | a | `make bench` | x86-64 Zen 5 |
| 2.0x | b | `make no-such-target` | x86-64 Zen 5 |
| 3 µs | c | `python -m tools.no_such_module` | x86-64 Zen 5 |
| 4x | d | `python -m tools.fails` | x86-64 Zen 5 |
| 5x | e | `python -m tools.works --flag` | here |
| 6x | f | none | aarch64 Cortex-A72 |
| no number | g | `make absent` | |
"""
    problems = row_problems(table_after(card, "## Headline figures"), {"bench"}, tmp_path, sys.executable)
    joined = "\n".join(problems)
    assert "no target 'no-such-target'" in joined
    assert "no module tools.no_such_module" in joined
    assert "exited 3" in joined
    assert "'5x': no machine named" in joined
    assert "'6x': no command in backticks" in joined
    assert len(problems) == 5, joined  # the good row and the row without a number report nothing


def test_link_checker_reports_a_link_to_no_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("x")
    doc = tmp_path / "README.md"
    text = ("[ok](docs/here.md) [ok](docs/here.md#a) [web](https://example.org/x.md) [anchor](#top) "
            "[bad](docs/missing.md)")
    assert broken_links(doc, text, tmp_path) == ["README.md: docs/missing.md"]


def test_make_mention_checker_reports_an_undefined_target():
    text = "Run `make demo`, then\n```sh\nmake no-such-target   # x\n```\nand make sure (prose, not code)."
    assert undefined_make_mentions(text, {"demo"}) == {"no-such-target"}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_help_flags_a_target_without_its_line(tmp_path):
    # The real help rule, reading a made-up Makefile given first (help reads the first one).
    extra = tmp_path / "extra.mk"
    extra.write_text("documented: ## says what it does\n\ttrue\n\nbare:\n\ttrue\n\n## from the line above\nabove:\n\ttrue\n")
    out = subprocess.run(["make", "-s", "-f", str(extra), "-f", str(MAKEFILE), "help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = {line.split(None, 2)[1]: line.split(None, 2)[2] for line in out.splitlines() if line.strip()}
    assert lines == {"documented": "says what it does", "bare": "(no ## comment)", "above": "from the line above"}
