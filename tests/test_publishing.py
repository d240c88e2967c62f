"""What the Hub's tooling reads: build.toml, metadata.json, the .so and _ops.py.

build.toml is parsed by the `kernels` package's own config parser (the Rust
one it bundles: kernels._rust.Build, the code kernel-builder shares), not by
our tomllib reader; metadata.json's digest is checked by `kernels`' own
Digest against the files on disk.
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import sys
from pathlib import Path

import pytest
from kernels._rust import Backend, Build, Digest, DigestAlgorithm, DigestValidationError, Metadata

ROOT = Path(__file__).resolve().parents[1]


def _variant(sv) -> Path:
    return Path(sv.__file__).parent


# ---------------------------------------------------------------------------
# build.toml
# ---------------------------------------------------------------------------

def test_build_toml_is_edition_5_for_kernels_parser(capfd):
    build = Build.open(ROOT)
    assert build.general.backends == [Backend.CPU]
    # A legacy (v4) file parses too, but with an upgrade warning: ours must not need one.
    assert "legacy" not in capfd.readouterr().err


def test_kernels_parser_rejects_a_broken_build_toml(tmp_path):
    # The control: the parser does reject what kernel-builder would.
    text = (ROOT / "build.toml").read_text().replace('backend = "cpu"', 'backend = "cpux"', 1)
    (tmp_path / "build.toml").write_text(text)
    with pytest.raises(ValueError):
        Build.open(tmp_path)


def test_every_isa_wrapper_is_its_own_section():
    # kernel-builder compiles a source once, with its section's flags: each
    # ISA needs its own section, and every kernel section the numerics flags.
    import tomllib

    config = tomllib.loads((ROOT / "build.toml").read_text())
    kernels = config["kernel"]
    owners = {src: name for name, k in kernels.items() for src in k["src"] if src.endswith(".cpp")}
    for isa in ("default", "avx2", "avx512"):
        assert f"csrc/cpu/isa_{isa}.cpp" in owners
    assert len({owners[f"csrc/cpu/isa_{isa}.cpp"] for isa in ("default", "avx2", "avx512")}) == 3
    for name, k in kernels.items():
        assert {"-ffp-contract=off", "-fopenmp"} <= set(k["cxx-flags"]), name
        assert not any(f.startswith("-m") for f in k["cxx-flags"]), f"{name}: ISA flags break the aarch64 build"


def test_kernel_builder_generated_files_stay_out_of_the_repo():
    for generated in ("setup.py", "pyproject.toml", "CMakeLists.txt", "cmake", "torch-ext/registration.h"):
        assert not (ROOT / generated).exists(), generated


# ---------------------------------------------------------------------------
# The built variant
# ---------------------------------------------------------------------------

def test_metadata_parses_and_its_digest_matches_the_files(sv, tmp_path):
    variant = _variant(sv)
    metadata = Metadata.read_from_file(variant / "metadata.json")
    assert metadata.digest is not None and metadata.digest.algorithm == DigestAlgorithm.SHA256
    listed = set(metadata.digest.files)
    on_disk = {p.name for p in variant.iterdir() if p.is_file() and p.name != "metadata.json"}
    assert listed == on_disk
    # Hash a copy (the loaded variant may gain a __pycache__): equal, then a tampered one is not.
    copy = tmp_path / variant.name
    shutil.copytree(variant, copy, ignore=shutil.ignore_patterns("__pycache__"))
    metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, copy))
    (copy / "reference.py").write_text((copy / "reference.py").read_text() + "\n# tampered\n")
    with pytest.raises(DigestValidationError):
        metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, copy))


def test_one_abi3_module_that_ops_py_imports(sv):
    variant = _variant(sv)
    libraries = sorted(variant.glob("*.so"))
    assert [p.name.endswith(".abi3.so") for p in libraries] == [True]
    module_name = libraries[0].name.split(".")[0]
    metadata = json.loads((variant / "metadata.json").read_text())
    assert metadata["id"] == module_name
    # _ops.py imports the .so as a Python module (kernel-builder's layout) and the
    # module is what the loaded kernel's ops live under.
    assert f"from . import {module_name}" in (variant / "_ops.py").read_text()
    assert ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES
    assert sv.ops.name == module_name
    # The extension module is what holds the ops: it was imported, not dlopen'ed.
    assert any(m.endswith("." + module_name) for m in sys.modules), module_name
