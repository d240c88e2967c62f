"""The aarch64 emulated run's selection: its marker expression, taken from
tools/aarch64/test.sh, names only markers that pytest.ini declares, and
collects the suite with transformers unimportable (as in the arm64 root,
which does not install it)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# pytest, in a process where `import transformers` fails.
# Nor llama_cpp / gguf (the llama.cpp integration's packages), which the root lacks as well.
WITHOUT_TRANSFORMERS = ("import sys; sys.modules['transformers'] = None; sys.modules['llama_cpp'] = None; "
                        "sys.modules['gguf'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))")


@pytest.mark.native_only  # the point is the collection without transformers; emulated, it just re-collects
def test_emulated_selection_collects_without_transformers(request):
    found = re.search(r'^MARKERS="([^"]+)"$', (REPO / "tools" / "aarch64" / "test.sh").read_text(), re.M)
    assert found, "tools/aarch64/test.sh sets no MARKERS"
    expression = found.group(1)
    # A misspelt marker in -m matches nothing, silently: every name must be declared.
    declared = {line.split(":", 1)[0].strip() for line in request.config.getini("markers")}
    assert set(re.findall(r"\w+", expression)) - {"and", "or", "not"} <= declared, expression
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRANSFORMERS, "tests", "-m", expression, "--collect-only", "-q",
         "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", out.stdout), out.stdout[-3000:]
