"""Build the kernel without Nix: `make build` runs this.

Writes the `kernels` variant folder

    build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/
        __init__.py, reference.py, ...      the Python package (torch-ext/spec_verify)
        _ops.py                             binds `ops` to this build's namespace
        _spec_verify_cpu_<hash>.abi3.so     the C++ ops
        metadata.json                       what `kernels` 0.17 reads

so that `kernels.get_local_kernel(Path("."))` and
`LOCAL_KERNELS=phanerozoic/spec-verify=$PWD kernels.get_kernel(...)` load it.

What to build comes from build.toml, the one description kernel-builder
reads too: the kernel's name and version, and the sources (its [torch] and
[kernel.*] src lists). The .cpp files under csrc/cpu/ are compiled once per
instruction set (DEFAULT, AVX2, AVX512 on x86-64), each with
-DCPU_CAPABILITY=<ISA> -DCPU_CAPABILITY_<ISA> and that ISA's -m flags, as
ATen builds its native/cpu/ kernels; every other .cpp is compiled once.

Why not setuptools' build_ext: it cannot express flags per file. So we take
the include paths, the library paths and the C++ ABI from
torch.utils.cpp_extension and call the compiler ourselves, as ATen's own
build does.

The .so talks to torch only through the dispatcher (TORCH_LIBRARY) and never
to the Python C API, so it is Python-version independent: hence `.abi3.so`,
loaded with torch.ops.load_library.

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
import tomllib
from pathlib import Path

import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch-ext" / "spec_verify"
BUILD_TOML = ROOT / "build.toml"
# The sources compiled once per instruction set live here (as ATen's native/cpu/).
PER_ISA_DIR = ROOT / "csrc" / "cpu"
# Where --sanitize builds (git-ignored): a root of its own, loaded with SPEC_VERIFY_ROOT.
SANITIZE_ROOT = ROOT / ".cache" / "asan"


@dataclasses.dataclass(frozen=True)
class Description:
    """What build.toml says: the kernel's name, version and sources."""

    name: str
    version: int
    sources: list[Path]

    @property
    def compiled_once(self) -> list[Path]:
        return [p for p in self.sources if p.suffix == ".cpp" and PER_ISA_DIR not in p.parents]

    @property
    def compiled_per_isa(self) -> list[Path]:
        return [p for p in self.sources if p.suffix == ".cpp" and PER_ISA_DIR in p.parents]


def read_description(path: Path = BUILD_TOML) -> Description:
    config = tomllib.loads(path.read_text())
    listed = list(config.get("torch", {}).get("src", []))
    for kernel in config.get("kernel", {}).values():
        listed += kernel.get("src", [])
    sources = [ROOT / src for src in listed]
    missing = [str(p.relative_to(ROOT)) for p in sources if not p.is_file()]
    if missing:
        raise SystemExit(f"build: {path.name} lists missing sources: {', '.join(missing)}")
    # Every C++ file in csrc/ must be listed: the namespace hash covers only listed files.
    unlisted = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
                      if p.suffix in (".cpp", ".h") and p not in sources)
    if unlisted:
        raise SystemExit(f"build: {path.name} does not list {', '.join(unlisted)}")
    return Description(name=config["general"]["name"], version=config["general"]["version"], sources=sources)


# The row kernels start on a cache line, so their loops' placement (and speed:
# a few percent on the Zen 5 we measure on) does not shift with whatever else
# is linked before them.
PER_ISA_FLAGS = ["-falign-functions=64"]

# Per-ISA flags for the sources in csrc/cpu/, as ATen builds its CPU kernels.
X86_ISAS = {
    "DEFAULT": [],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
}


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


def isas_for_machine(machine: str) -> dict[str, list[str]]:
    # aarch64 and others: the DEFAULT build only (NEON on aarch64).
    return X86_ISAS if machine in ("x86_64", "AMD64") else {"DEFAULT": []}


def source_hash(description: Description, extra: str) -> str:
    """Every source, the build description and this script: a new hash, a new op namespace."""
    digest = hashlib.sha256(extra.encode())
    for path in description.sources + [BUILD_TOML, Path(__file__).resolve()]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def object_name(source: Path, isa: str | None = None) -> str:
    """csrc/cpu/rows.cpp, AVX2 -> csrc_cpu_rows_AVX2.o: unique across folders."""
    stem = "_".join(source.relative_to(ROOT).with_suffix("").parts)
    return f"{stem}_{isa}.o" if isa else f"{stem}.o"


def common_flags(namespace: str, isas: dict[str, list[str]], target: Target) -> list[str]:
    abi = int(target.cxx11_abi)
    flags = [
        "-O3",
        "-std=c++17",
        "-fPIC",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        # Bit-exact agreement with the reference needs IEEE a*b - c*d, not FMA.
        "-ffp-contract=off",
        # at::parallel_for is inline OpenMP: without this the batch runs serially.
        "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DSV_OPS_NAMESPACE={namespace}",
        "-Wall",
        "-Wno-unused-parameter",
    ]
    flags += [f"-DSV_HAVE_{isa}" for isa in isas if isa != "DEFAULT"]
    flags += [f"-I{p}" for p in target.include_paths]
    return flags


def compile_one(cxx: str, source: Path, obj: Path, flags: list[str]) -> tuple[Path, float]:
    import time

    start = time.perf_counter()
    cmd = [cxx, *flags, "-c", str(source), "-o", str(obj)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(cmd) + "\n" + result.stdout + result.stderr)
        raise SystemExit(f"build: compiling {source.name} failed")
    return obj, time.perf_counter() - start


# --sanitize: AddressSanitizer + UBSan on every object (make test-asan). -O1
# and frame pointers for readable reports; UBSan errors abort (no recovery),
# so a report cannot scroll by unnoticed.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def build_library(description: Description, namespace: str, out_dir: Path, isas: dict[str, list[str]],
                  target: Target, build_root: Path, sanitize: bool = False) -> Path:
    cxx = target.cxx
    obj_dir = build_root / "obj" / namespace
    obj_dir.mkdir(parents=True, exist_ok=True)
    base = common_flags(namespace, isas, target)
    if sanitize:
        base = [f for f in base if f != "-O3"] + ["-O1", *SANITIZE_FLAGS]
    jobs = [(source, obj_dir / object_name(source), base) for source in description.compiled_once]
    for isa, isa_flags in isas.items():
        defines = [f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}"]
        for source in description.compiled_per_isa:
            jobs.append((source, obj_dir / object_name(source, isa), base + defines + PER_ISA_FLAGS + isa_flags))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for obj, seconds in pool.map(lambda job: compile_one(cxx, *job), jobs):
            print(f"build: compiled {obj.name} in {seconds:.1f} s")
    library = out_dir / f"{namespace}.abi3.so"
    # Link order matters: the objects compiled once (base flags) come first,
    # then the DEFAULT ones, so an inline function emitted by several ISA
    # objects resolves to a generic (safe) copy.
    objects = [str(job[1]) for job in jobs]
    # -fopenmp records libgomp.so.1, which resolves to the copy torch loaded.
    link = [cxx, "-shared", "-fopenmp", *(SANITIZE_FLAGS if sanitize else []), "-o", str(library), *objects]
    link += [f"-L{p}" for p in target.library_paths]
    link += ["-lc10", "-ltorch_cpu", "-ltorch"]
    result = subprocess.run(link, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(link) + "\n" + result.stdout + result.stderr)
        raise SystemExit("build: linking failed")
    return library


OPS_PY = '''\
"""Binds `ops` to this build's op namespace (written by tools/build_kernel.py)."""

import pathlib

import torch

_NAMESPACE = "{namespace}"

# Loading the library runs its TORCH_LIBRARY registration.
torch.ops.load_library(str(pathlib.Path(__file__).with_name(_NAMESPACE + ".abi3.so")))
ops = getattr(torch.ops, _NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """`verify_greedy` -> `{namespace}::verify_greedy`."""
    return f"{{_NAMESPACE}}::{{op_name}}"
'''


def write_variant(description: Description, namespace: str, variant_dir: Path) -> None:
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
    }
    (variant_dir / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")


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
    isas = isas_for_machine(target.machine)
    description = read_description()
    flavour = "asan" if args.sanitize else ""
    namespace = f"_spec_verify_cpu_{source_hash(description, target.torch_version + ','.join(isas) + flavour)}"
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
        library = build_library(description, namespace, variant_dir, isas, target, build_root, args.sanitize)
        print(f"build: wrote {library.relative_to(ROOT)} (ISAs: {', '.join(isas)})")
    # The Python files are copied every time: editing them needs no recompile.
    write_variant(description, namespace, variant_dir)
    print(f"build: variant {variant_dir.relative_to(ROOT)} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
