"""Build the kernel without Nix: `make build` runs this.

Writes the `kernels` variant folder

    build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/
        __init__.py, reference.py, ...      the Python package (torch-ext/spec_verify)
        _ops.py                             imports the .so, binds `ops` to its namespace
        _spec_verify_cpu_<hash>.abi3.so     the C++ ops (a Python module, limited API)
        metadata.json                       what `kernels` 0.17 reads, digest included

so that `kernels.get_local_kernel(Path("."))` and
`LOCAL_KERNELS=phanerozoic/spec-verify=$PWD kernels.get_kernel(...)` load it.

What to build comes from build.toml, the one description kernel-builder
reads too: the kernel's name and version, and its sections ([torch] and each
[kernel.*]: sources, include dirs, cxx-flags). Each section's .cpp files are
compiled with that section's flags on top of what kernel-builder's CMake for
a CPU kernel gives every file (the template followed is named in README,
"Publishing to the Hub"): -O3 -DNDEBUG (CMake's Release), -std=c++17, -fPIC,
-DCPU_KERNEL, -DTORCH_EXTENSION_NAME=<ops name>, -DPy_LIMITED_API (abi3),
torch's and Python's include paths. The per-ISA code is one small wrapper
per instruction set (csrc/cpu/isa_*.cpp), each its own section.

Why not CMake or setuptools here: neither is needed to express per-section
flags for a dozen files, and this way the include paths, library paths and
C++ ABI can come from another machine's torch (cross builds, below).

The .so talks to torch through the dispatcher (TORCH_LIBRARY); its one use
of the Python C API is REGISTER_EXTENSION's module init, under the limited
API: hence one `.abi3.so`, imported as a module by `_ops.py`, as
kernel-builder's `_ops.py` does. kernel-builder's registration.h is
generated into build/gen/ (kernel-builder writes its own next to the
binding; it never enters git).

glibc: tools/abi/single_threaded.cpp is linked into every build so the .so
needs nothing newer than GLIBC_2.28 (manylinux_2_28); it says why that is
sound. `make abi-check` runs kernel-abi-check on the variants.

Cross builds (tools/aarch64/build.sh): `--arch aarch64 --cxx
aarch64-linux-gnu-g++ --torch-dir <arm64 root>/.../site-packages/torch`
compiles against another machine's torch (its headers, libraries, version and
C++ ABI read from that folder) and names the variant after --arch. Without
these options the build is for the running torch on this machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch-ext" / "spec_verify"
BUILD_TOML = ROOT / "build.toml"
GLIBC_COMPAT = ROOT / "tools" / "abi" / "single_threaded.cpp"
# Where --sanitize builds (git-ignored): a root of its own, loaded with SPEC_VERIFY_ROOT.
SANITIZE_ROOT = ROOT / ".cache" / "asan"
# --sanitize: AddressSanitizer + UBSan on every object (make test-asan). -O1
# and frame pointers for readable reports; UBSan errors abort (no recovery),
# so a report cannot scroll by unnoticed.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]
# The oldest Python whose stable ABI the .so keeps to (kernel-abi-check --python-abi).
PYTHON_ABI = (3, 9)


# ---------------------------------------------------------------------------
# build.toml
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Section:
    """One section of build.toml: [torch] or one [kernel.*]."""

    name: str
    sources: list[Path]
    cxx_flags: list[str]
    include_dirs: list[Path]

    @property
    def compiled(self) -> list[Path]:
        return [p for p in self.sources if p.suffix == ".cpp"]


@dataclasses.dataclass(frozen=True)
class Description:
    """What build.toml says: the kernel's name, version and sections, in file order."""

    name: str
    version: int
    sections: list[Section]

    @property
    def sources(self) -> list[Path]:
        return [p for section in self.sections for p in section.sources]


def _section(name: str, table: dict) -> Section:
    return Section(name=name, sources=[ROOT / s for s in table.get("src", [])],
                   cxx_flags=list(table.get("cxx-flags", [])),
                   include_dirs=[ROOT / d for d in table.get("include", [])])


def read_description(path: Path = BUILD_TOML) -> Description:
    config = tomllib.loads(path.read_text())
    general = config.get("general", {})
    if general.get("edition") != 5:
        raise SystemExit(f"build: {path.name} must say edition = 5 in [general] (kernel-builder's format)")
    sections = [_section("torch", config.get("torch", {}))]
    # tomllib keeps the file's order, which is the link order (see build.toml).
    for name, kernel in config.get("kernel", {}).items():
        if kernel.get("backend") != "cpu":
            raise SystemExit(f"build: [kernel.{name}] is not backend = \"cpu\"; this tool builds CPU kernels only")
        sections.append(_section(name, kernel))
    description = Description(name=general["name"], version=general["version"], sections=sections)
    missing = [str(p.relative_to(ROOT)) for p in description.sources if not p.is_file()]
    if missing:
        raise SystemExit(f"build: {path.name} lists missing sources: {', '.join(missing)}")
    # Every C++ file in csrc/ must be listed: the namespace hash covers only listed files.
    unlisted = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
                      if p.suffix in (".cpp", ".h") and p not in description.sources)
    if unlisted:
        raise SystemExit(f"build: {path.name} does not list {', '.join(unlisted)}")
    return description


# ---------------------------------------------------------------------------
# The target: this machine's torch, or another machine's (cross build)
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """The torch and machine the kernel is built for."""

    torch_version: str
    cxx11_abi: bool
    machine: str
    include_paths: list[str]
    library_paths: list[str]
    cxx: str


def host_target(cxx: str | None) -> Target:
    """The running torch on this machine (the default build)."""
    return Target(
        torch_version=torch.__version__,
        cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        machine=platform.machine(),
        include_paths=cpp_extension.include_paths(),
        library_paths=cpp_extension.library_paths(),
        cxx=cxx or os.environ.get("CXX", "g++"),
    )


def cross_target(torch_dir: Path, machine: str, cxx: str | None) -> Target:
    """Another machine's torch package folder, read without importing it."""
    version_py = (torch_dir / "version.py").read_text()
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", version_py, re.M)
    if not match:
        raise SystemExit(f"build: no __version__ in {torch_dir / 'version.py'}")
    # The C++ ABI: libc10 exports std::__cxx11 symbols only when built with it.
    cxx11_abi = b"__cxx11" in (torch_dir / "lib" / "libc10.so").read_bytes()
    return Target(
        torch_version=match.group(1),
        cxx11_abi=cxx11_abi,
        machine=machine,
        include_paths=[str(torch_dir / "include"), str(torch_dir / "include" / "torch" / "csrc" / "api" / "include")],
        library_paths=[str(torch_dir / "lib")],
        cxx=cxx or os.environ.get("CXX", "g++"),
    )


def variant_name(target: Target) -> str:
    major, minor = target.torch_version.split("+")[0].split(".")[:2]
    abi = "cxx11" if target.cxx11_abi else "cxx98"
    return f"torch{major}{minor}-{abi}-cpu-{target.machine}-linux"


def source_hash(description: Description, extra: str) -> str:
    """Every source, the build description and this script: a new hash, a new op namespace."""
    digest = hashlib.sha256(extra.encode())
    for path in description.sources + [BUILD_TOML, GLIBC_COMPAT, Path(__file__).resolve()]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


# ---------------------------------------------------------------------------
# Compile and link, as kernel-builder's CMake does for a CPU kernel
# ---------------------------------------------------------------------------

# kernel-builder's registration.h (build2cmake/src/templates/registration.h),
# re-stated: the macros the binding uses. Written into build/gen/.
REGISTRATION_H = """\
// Generated by tools/build_kernel.py: the macros of kernel-builder's
// registration.h, which kernel-builder writes next to torch_binding.cpp.
#pragma once

#include <Python.h>

#define SV_CONCAT_(a, b) a##b
#define SV_CONCAT(a, b) SV_CONCAT_(a, b)
#define SV_STR_(a) #a
#define SV_STR(a) SV_STR_(a)

// TORCH_LIBRARY / TORCH_LIBRARY_IMPL with the namespace macro expanded first.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// A module init, so that `import <NAME>` loads the library (and registers its ops).
#define REGISTER_EXTENSION(NAME)                                                         \\
  PyMODINIT_FUNC SV_CONCAT(PyInit_, NAME)() {                                            \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, SV_STR(NAME), nullptr, 0, \\
                                        nullptr};                                        \\
    return PyModule_Create(&module);                                                     \\
  }
"""


def object_name(source: Path) -> str:
    """csrc/cpu/isa_avx2.cpp -> csrc_cpu_isa_avx2.o: unique across folders."""
    return "_".join(source.relative_to(ROOT).with_suffix("").parts) + ".o"


def base_flags(namespace: str, target: Target, gen_dir: Path) -> list[str]:
    """What every file gets: kernel-builder's CMake flags for a CPU kernel."""
    flags = [
        "-O3", "-DNDEBUG",  # CMAKE_BUILD_TYPE=Release
        "-std=c++17",
        "-fPIC",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(target.cxx11_abi)}",
        "-DCPU_KERNEL",
        f"-DTORCH_EXTENSION_NAME={namespace}",
        # USE_SABI: the Python limited API, as of the oldest Python supported.
        f"-DPy_LIMITED_API=0x{PYTHON_ABI[0]:02x}{PYTHON_ABI[1]:02x}0000",
        "-Wall",
        "-Wno-unused-parameter",
    ]
    # Python.h: the host's headers serve any LP64 Linux target under the limited API.
    include_paths = [str(gen_dir), *target.include_paths, sysconfig.get_paths()["include"]]
    return flags + [f"-I{p}" for p in include_paths]


def compile_one(cxx: str, source: Path, obj: Path, flags: list[str]) -> tuple[Path, float]:
    start = time.perf_counter()
    cmd = [cxx, *flags, "-c", str(source), "-o", str(obj)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(cmd) + "\n" + result.stdout + result.stderr)
        raise SystemExit(f"build: compiling {source.name} failed")
    return obj, time.perf_counter() - start


def build_library(description: Description, namespace: str, out_dir: Path, target: Target,
                  build_root: Path, sanitize: bool = False) -> Path:
    obj_dir = build_root / "obj" / namespace
    gen_dir = obj_dir / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    (gen_dir / "registration.h").write_text(REGISTRATION_H)
    base = base_flags(namespace, target, gen_dir)
    if sanitize:
        base = [f for f in base if f != "-O3"] + ["-O1", *SANITIZE_FLAGS]
    jobs = []
    for section in description.sections:
        flags = base + [f"-I{d}" for d in section.include_dirs] + section.cxx_flags
        jobs += [(source, obj_dir / object_name(source), flags) for source in section.compiled]
    jobs.append((GLIBC_COMPAT, obj_dir / object_name(GLIBC_COMPAT), base))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for obj, seconds in pool.map(lambda job: compile_one(target.cxx, *job), jobs):
            print(f"build: compiled {obj.name} in {seconds:.1f} s")
    library = out_dir / f"{namespace}.abi3.so"
    # Link order is build.toml's order (the generic objects, then DEFAULT, then
    # the wider ISAs), so an inline function emitted by several objects
    # resolves to a copy any CPU can run.
    objects = [str(job[1]) for job in jobs]
    # -fopenmp records libgomp.so.1, which resolves to the copy torch loaded.
    link = [target.cxx, "-shared", "-fopenmp", *(SANITIZE_FLAGS if sanitize else []), "-o", str(library), *objects]
    link += [f"-L{p}" for p in target.library_paths]
    link += ["-lc10", "-ltorch_cpu", "-ltorch"]
    result = subprocess.run(link, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(link) + "\n" + result.stdout + result.stderr)
        raise SystemExit("build: linking failed")
    return library


# ---------------------------------------------------------------------------
# The variant folder: Python package, _ops.py, metadata.json
# ---------------------------------------------------------------------------

OPS_PY = '''\
"""Binds `ops` to this build's op namespace (written by tools/build_kernel.py)."""

import torch

# Importing the extension module runs its TORCH_LIBRARY registration.
from . import {namespace}  # noqa: F401

ops = torch.ops.{namespace}


def add_op_namespace_prefix(op_name: str) -> str:
    """`verify_greedy` -> `{namespace}::verify_greedy`."""
    return f"{namespace}::{{op_name}}"
'''


def write_variant(description: Description, namespace: str, variant_dir: Path) -> None:
    shutil.rmtree(variant_dir / "__pycache__", ignore_errors=True)  # not part of the variant
    for py in sorted(PACKAGE.glob("*.py")):
        if py.name != "_ops.py":
            shutil.copy2(py, variant_dir / py.name)
    (variant_dir / "_ops.py").write_text(OPS_PY.format(namespace=namespace))
    metadata = {
        "id": namespace,
        "name": description.name,
        "version": description.version,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": variant_digest(variant_dir),
    }
    (variant_dir / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")


def variant_digest(variant_dir: Path) -> dict:
    """`digest` as kernels verifies it: its own hash of every file but metadata.json."""
    from kernels._rust import Digest, DigestAlgorithm  # the project venv has kernels (requirements.txt)

    (variant_dir / "metadata.json").unlink(missing_ok=True)
    digest = Digest.hash_variant(DigestAlgorithm.SHA256, variant_dir)
    return {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild the C++ even if up to date")
    parser.add_argument("--cxx", help="the C++ compiler (default: $CXX, else g++)")
    parser.add_argument("--torch-dir", type=Path, help="cross build: the target machine's torch package folder")
    parser.add_argument("--arch", help="cross build: the target machine, as platform.machine() there (with --torch-dir)")
    parser.add_argument("--sanitize", action="store_true",
                        help=f"AddressSanitizer + UBSan build into {SANITIZE_ROOT.relative_to(ROOT)}/build/ "
                             "(load it with SPEC_VERIFY_ROOT; never mixed with build/)")
    args = parser.parse_args(argv)
    if (args.torch_dir is None) != (args.arch is None):
        parser.error("--torch-dir and --arch go together")

    target = host_target(args.cxx) if args.torch_dir is None else cross_target(args.torch_dir.resolve(), args.arch, args.cxx)
    description = read_description()
    flavour = "asan" if args.sanitize else ""
    namespace = f"_spec_verify_cpu_{source_hash(description, target.torch_version + target.machine + flavour)}"
    # The sanitized build lives under its own root, so build/ never holds it.
    build_root = (SANITIZE_ROOT if args.sanitize else ROOT) / "build"
    variant_dir = build_root / variant_name(target)
    library = variant_dir / f"{namespace}.abi3.so"
    if library.exists() and not args.force:
        print(f"build: {library.relative_to(ROOT)} is up to date")
    else:
        # A new namespace means new C++: start the variant folder afresh.
        if variant_dir.exists():
            shutil.rmtree(variant_dir)
        variant_dir.mkdir(parents=True)
        library = build_library(description, namespace, variant_dir, target, build_root, args.sanitize)
        print(f"build: wrote {library.relative_to(ROOT)}")
    # The Python files are copied every time: editing them needs no recompile.
    write_variant(description, namespace, variant_dir)
    print(f"build: variant {variant_dir.relative_to(ROOT)} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
