"""Build llama-cpp-python (the pinned version) for this machine: `specgguf build-llama`.

What the build can add to the stock wheel from PyPI:
- `patched`: specgguf's llama.cpp patches (shipped in the package as `specgguf.patches`, the
  repository's `patches/`; docs/ explains them), needed only by DeepSpec Eagle3 drafts
  (5 target layers, per-head q/k norms);
- a backend: CUDA, Metal, Vulkan (AMD, Intel and other GPUs; also Mesa's lavapipe on a CPU), or
  the CPU alone. A Vulkan build also gets `patches/vulkan-*.patch` (it compiles with Vulkan
  headers older than the vendored ggml-vulkan expects, e.g. Debian 12's) and first checks that
  the headers, glslc and SPIRV-Headers are there (`vulkan_missing`);
- `rpc`: llama.cpp's RPC backend (GGML_RPC), for `--rpc HOST:PORT` (target layers on
  `ggml-rpc-server` processes on other machines).

A CUDA build is checked first too (`cuda_setup`): nvcc, a GPU architecture (`--cuda-arch`; CMake's
`native` needs a visible GPU), cuBLAS (the toolkit's, else PyPI's `nvidia-cublas` wheel in this
environment, linked through `.so` names made in the build's temp folder), and libcuda to link
against (a driver or the toolkit's stub; without one, GGML_CUDA_NO_VMM drops that link). So a
machine with the toolkit and no GPU builds a wheel for another machine's GPU.

Steps: download the sdist with pip (or take a local one), apply the patches, `pip wheel` it
with CMAKE_ARGS (one llama.cpp compile: minutes), cache the wheel, install it into the running
interpreter's environment. The cache, <user cache>/wheels/<key>/ (runtime/paths.py), is
keyed by everything that changes the compiled library (version, patches, CMake arguments,
Python tag and platform): a second build with the same inputs installs in seconds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

from ..errors import UserError
from . import toolchain
from .paths import cache_dir

VERSION = "0.3.36"  # the llama-cpp-python that specgguf pins (pyproject.toml)
BACKENDS = ("cpu", "cuda", "metal", "vulkan")
# where a Vulkan build's headers, loader library and SPIRV-Headers are looked for, besides
# $VULKAN_SDK and $CMAKE_PREFIX_PATH (CMake's FindVulkan and find_package search the same places)
VULKAN_PREFIXES = ("/usr", "/usr/local", "/opt/homebrew")


class BuildError(UserError):
    """The build could not be done (no network, no compiler, a failed compile): one line."""


# a visible NVIDIA GPU (or nvidia-smi on $PATH): then CMake's `native` architecture can be used
GPU_DEVICE = "/dev/nvidia0"
# where a CUDA build looks for libcuda.so to link against, besides the toolkit (its lib64/stubs)
LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/wsl/lib")
# what --cuda-arch takes: CMAKE_CUDA_ARCHITECTURES values (89, 86-real, 120a, "86;89", all-major)
_ARCH = re.compile(r"^(native|all|all-major|\d+[af]?(-real|-virtual)?([;,]\d+[af]?(-real|-virtual)?)*)$")


def command(patched: bool = True, backend: str | None = None, rpc: bool = False) -> str:
    """The command line that builds what a refusal asks for (messages name it)."""
    parts = ["specgguf build-llama"]
    if patched:
        parts.append("--patched")
    if rpc:
        parts.append("--rpc")
    parts.append(f"--{backend}" if backend else "[--cuda|--metal|--vulkan|--cpu]")
    return " ".join(parts)


def patch_files(backend: str | None = None) -> list[tuple[str, bytes]]:
    """(name, contents) of llama.cpp patches shipped in the package, in apply order: without a
    backend the `--patched` set (NNNN-*.patch); with one, the patches every build for that
    backend gets (<backend>-NNNN-*.patch; [] for a backend that needs none)."""
    root = resources.files("specgguf.patches")
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".patch"))
    if backend is None:
        picked = [n for n in names if n[:1].isdigit()]
        if not picked:
            raise BuildError("this specgguf install ships no llama.cpp patches (specgguf/patches/*.patch); "
                             "reinstall specgguf")
    else:
        picked = [n for n in names if n.startswith(f"{backend}-")]
    return [(n, root.joinpath(n).read_bytes()) for n in picked]


# what a Vulkan build needs besides a C/C++ compiler and CMake: (what, where it is looked for,
# the Debian/Ubuntu package that has it)
_VULKAN_PARTS = (
    ("the Vulkan headers (vulkan/vulkan.hpp)", ("include/vulkan/vulkan.hpp",), "libvulkan-dev"),
    ("the Vulkan loader library (libvulkan.so)",
     ("lib/libvulkan.so", "lib64/libvulkan.so", "lib/*/libvulkan.so", "lib/libvulkan.dylib"), "libvulkan-dev"),
    ("the glslc shader compiler", ("bin/glslc",), "glslc"),
    ("SPIRV-Headers' CMake package",
     ("share/cmake/SPIRV-Headers*/SPIRV-HeadersConfig.cmake", "lib*/cmake/SPIRV-Headers*/SPIRV-HeadersConfig.cmake",
      "lib/*/cmake/SPIRV-Headers*/SPIRV-HeadersConfig.cmake", "share/SPIRV-Headers*/cmake/SPIRV-HeadersConfig.cmake"),
     "spirv-headers"),
)


def vulkan_missing(prefixes: list[str] | None = None, which: Callable[[str], str | None] = shutil.which,
                   env: dict | None = None) -> list[tuple[str, str]]:
    """(what, Debian package) for each part of a Vulkan build that this machine lacks; [] when
    all are found. Searched: $VULKAN_SDK, $CMAKE_PREFIX_PATH, VULKAN_PREFIXES (`prefixes`
    replaces all three), and $PATH for glslc."""
    env = os.environ if env is None else env
    if prefixes is None:
        prefixes = [p for p in [env.get("VULKAN_SDK", ""), *env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep),
                                *VULKAN_PREFIXES] if p]
    missing = []
    for what, patterns, package in _VULKAN_PARTS:
        if what.startswith("the glslc") and which("glslc"):
            continue
        if not any(next(Path(p).glob(pat), None) for p in prefixes for pat in patterns):
            missing.append((what, package))
    return missing


def vulkan_check(missing: list[tuple[str, str]] | None = None) -> None:
    """Refuse a Vulkan build that would fail in CMake minutes later: one line, what is missing
    and how to install it."""
    missing = vulkan_missing() if missing is None else missing
    if not missing:
        return
    packages = " ".join(dict.fromkeys(pkg for _, pkg in missing))
    raise BuildError(f"the Vulkan build needs {', '.join(what for what, _ in missing)}, not found on this machine: "
                     f"install them (Debian/Ubuntu: apt install {packages}; elsewhere the LunarG Vulkan SDK, "
                     "with VULKAN_SDK set) and run the command again")


@dataclass(frozen=True)
class CudaSetup:
    """What a CUDA build found on this machine (`cuda_setup`)."""

    root: Path  # the CUDA toolkit
    version: int  # its major version (13 for CUDA 13.0)
    cublas: Path | None = None  # PyPI's nvidia/cu13 (CUDA 12: nvidia/cublas) folder, when the toolkit has no cuBLAS
    no_vmm: bool = False  # no libcuda.so to link against: GGML_CUDA_NO_VMM

    def cmake_args(self, scratch: Path) -> list[str]:
        """The machine-specific arguments (paths: not part of the cache key) for PyPI's cuBLAS.

        The link names the wheel's own files (they carry only `.so.13` names, which FindCUDAToolkit's
        search would not find), so that the library's RUNPATH holds this environment's cuBLAS
        folder and not a build folder: a RUNPATH into a deleted /tmp folder finds nothing, and
        whoever creates that folder later chooses the library loaded. A relative entry
        ($ORIGIN/../../nvidia/cu13/lib, from site-packages/llama_cpp/lib) finds cuBLAS in any
        environment the cached wheel is installed into. `scratch` gets links to cuBLAS's own
        headers: the wheels' shared include/ (nvidia/cu13) may also hold other CUDA headers, of
        another version than the toolkit's."""
        if self.cublas is None:
            return []
        headers = scratch / "cublas" / "include"
        headers.mkdir(parents=True, exist_ok=True)
        for header in (self.cublas / "include").glob("cublas*.h"):
            (headers / header.name).symlink_to(header)
        libs = [f"-DCUDA_{lib}_LIBRARY={sorted((self.cublas / 'lib').glob(f'lib{lib}.so.{self.version}*'))[0]}"
                for lib in ("cublas", "cublasLt")]
        beside = f"$ORIGIN/../../{self.cublas.parent.name}/{self.cublas.name}/lib"
        return libs + [f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={headers}",
                       f"-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,'{beside}'"]


def cublas_package(version: int) -> str:
    """PyPI's cuBLAS for CUDA `version`: `nvidia-cublas` from CUDA 13 on, `nvidia-cublas-cu12` before."""
    return "nvidia-cublas" if version >= 13 else f"nvidia-cublas-cu{version}"


def _toolkit_version(nvcc: str) -> int | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+)\.", out)
    return int(found.group(1)) if found else None


def _first(root: Path, patterns: tuple[str, ...]) -> Path | None:
    return next((hit for pat in patterns for hit in root.glob(pat)), None)


def cuda_setup(arch: str | None, *, extra_cmake_args: str = "", which: Callable[[str], str | None] = shutil.which,
               env: dict | None = None, search: list[str] | None = None, gpu_visible: bool | None = None,
               version: int | None = None, libcuda_dirs: tuple[str, ...] = LIBCUDA_DIRS) -> CudaSetup:
    """Check a CUDA build before its compile and say what it links against; refuse, in one
    line, what CMake would fail on minutes later: no nvcc, no architecture to compile for (no
    --cuda-arch and no GPU for `native`), no cuBLAS. `search` (default sys.path) is where PyPI's
    nvidia-cublas is looked for; the other keywords replace what is detected (tests)."""
    env = os.environ if env is None else env
    nvcc = which("nvcc")
    if nvcc is None:
        raise BuildError("the CUDA build needs nvcc, not found on PATH: install the CUDA toolkit (or put its bin/ "
                         "on PATH) and run the command again")
    # where CMake's FindCUDAToolkit looks: $CUDAToolkit_ROOT, $CUDA_PATH, nvcc's folder, /usr/local/cuda
    candidates = [env.get("CUDAToolkit_ROOT"), env.get("CUDA_PATH"), env.get("CUDA_HOME"),
                  str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda"]
    root = next((Path(c) for c in candidates if c and _first(Path(c), ("include/cuda_runtime.h",
                                                                          "targets/*/include/cuda_runtime.h"))),
                Path(Path(nvcc).resolve().parent.parent))
    version = _toolkit_version(nvcc) if version is None else version
    if version is None:
        raise BuildError(f"cannot read the CUDA version from `{nvcc} --version`: check the CUDA toolkit install")
    if gpu_visible is None:
        gpu_visible = Path(GPU_DEVICE).exists() or which("nvidia-smi") is not None
    native = arch == "native" or (arch is None and "CMAKE_CUDA_ARCHITECTURES" not in extra_cmake_args)
    if native and not gpu_visible:
        raise BuildError("no NVIDIA GPU is visible here to compile for (CMake's `native`): name the GPU's "
                         "architecture with --cuda-arch, e.g. --cuda-arch 89 for an RTX 4090 (86: RTX 30xx, 120: RTX 50xx)")
    libs = ("lib64/libcublas.so", "lib/libcublas.so", "targets/*/lib/libcublas.so", "lib/*/libcublas.so")
    headers = ("include/cublas_v2.h", "targets/*/include/cublas_v2.h")
    cublas = None
    if not (_first(root, libs) and _first(root, headers)):
        for site in (sys.path if search is None else search):
            # the wheels' layout: nvidia/cu13/{include,lib} from CUDA 13 on, nvidia/cublas/ before
            for pkg in (Path(site or ".") / "nvidia" / f"cu{version}", Path(site or ".") / "nvidia" / "cublas"):
                if (pkg / "include" / "cublas_v2.h").is_file() and all(
                        next((pkg / "lib").glob(f"lib{lib}.so.{version}*"), None) for lib in ("cublas", "cublasLt")):
                    cublas = pkg.resolve()
                    break
            if cublas is not None:
                break
        else:
            raise BuildError(f"the CUDA build needs cuBLAS, which the CUDA {version} toolkit in {root} lacks: "
                             f"pip install {cublas_package(version)} (into this environment: {sys.executable}), "
                             "or install the toolkit's cuBLAS, and run the command again")
    stubs = ("lib64/stubs/libcuda.so", "lib/stubs/libcuda.so", "targets/*/lib/stubs/libcuda.so", "lib64/libcuda.so")
    no_vmm = not (_first(root, stubs) or any((Path(d) / "libcuda.so").exists() for d in libcuda_dirs))
    return CudaSetup(root=root, version=version, cublas=cublas, no_vmm=no_vmm)


@dataclass
class Plan:
    """What to build: the CMake arguments follow from the options; `key` names the cache entry."""

    patched: bool = True
    backend: str | None = None  # None: llama.cpp's default (Metal on Apple Silicon, else the CPU)
    rpc: bool = False
    extra_cmake_args: str = ""  # the user's own $CMAKE_ARGS, appended
    patches: list[tuple[str, bytes]] = field(default_factory=list)
    # what this machine's compiler needs (toolchain.amx_flags); None: detect it
    compiler_flags: list[str] | None = None
    cuda_arch: str | None = None  # CMAKE_CUDA_ARCHITECTURES (89 for an RTX 4090); None: llama.cpp's choice
    cuda: CudaSetup | None = None  # what the CUDA build links against (cuda_setup; build() fills it in)

    def __post_init__(self):
        if self.backend is not None and self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}", param="backend")
        if self.patched and not self.patches:
            self.patches = patch_files()
        if self.backend is not None:  # what every build for this backend gets (vulkan: old headers)
            have = {name for name, _ in self.patches}
            self.patches = self.patches + [p for p in patch_files(self.backend) if p[0] not in have]
        try:
            shlex.split(self.extra_cmake_args)
        except ValueError as exc:
            raise UserError(f"CMAKE_ARGS cannot be split into arguments ({exc}): check its quotes",
                            param="extra_cmake_args") from None
        if self.compiler_flags is None:
            self.compiler_flags = toolchain.amx_flags()
        if self.cuda_arch is not None:
            if self.backend != "cuda":
                raise UserError("--cuda-arch is for a CUDA build: add --cuda", param="cuda_arch")
            if not _ARCH.match(self.cuda_arch):
                raise UserError(f"--cuda-arch {self.cuda_arch!r} is not a CUDA architecture: give its number, "
                                "e.g. 89 for an RTX 4090 (or a list: 86;89)", param="cuda_arch")
            self.cuda_arch = self.cuda_arch.replace(",", ";")

    @property
    def cmake_args(self) -> list[str]:
        args = {"cuda": ["-DGGML_CUDA=on"], "metal": ["-DGGML_METAL=on"], "vulkan": ["-DGGML_VULKAN=on"],
                "cpu": ["-DGGML_METAL=off"] if sys.platform == "darwin" else [], None: []}[self.backend]
        if self.backend == "cuda" and self.cuda_arch:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={self.cuda_arch}")
        if self.cuda is not None and self.cuda.no_vmm:
            args.append("-DGGML_CUDA_NO_VMM=on")
        if self.rpc:
            args.append("-DGGML_RPC=on")
        return toolchain.merge(args + shlex.split(self.extra_cmake_args), self.compiler_flags or [])

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        cublas = "" if self.cuda is None else ("cublas: pypi, linked by file" if self.cuda.cublas else "cublas: toolkit")
        for part in (VERSION, " ".join(self.cmake_args), sys.implementation.cache_tag, sysconfig.get_platform(), cublas):
            h.update(part.encode() + b"\0")
        for name, body in self.patches:
            h.update(name.encode() + b"\0" + body)
        return h.hexdigest()[:16]


def cache_root() -> Path:
    return cache_dir(create=False) / "wheels"


def cached_wheel(plan: Plan) -> Path | None:
    hits = sorted((cache_root() / plan.key).glob(f"llama_cpp_python-{VERSION}-*.whl"))
    return hits[0] if hits else None


def build(plan: Plan, *, rebuild: bool = False, sdist: str | os.PathLike | None = None,
          python: str = sys.executable, log: Callable[[str], None] = print) -> Path:
    """The wheel for `plan`: from the cache, or built (and cached) now."""
    if plan.backend == "cuda" and plan.cuda is None:  # before the cache: what it finds is in the key
        plan.cuda = cuda_setup(plan.cuda_arch, extra_cmake_args=plan.extra_cmake_args)
    wheel = None if rebuild else cached_wheel(plan)
    if wheel is not None:
        log(f"using the cached wheel {wheel}")
        return wheel
    if plan.backend == "vulkan":
        vulkan_check()
    if plan.patches and shutil.which("patch") is None:
        raise BuildError("applying the llama.cpp patches needs the `patch` tool; install it (apt install patch)")
    with tempfile.TemporaryDirectory(prefix="specgguf-build-") as tmp:
        work = Path(tmp)
        src = _unpack(_sdist(sdist, work, python, log), work)
        for name, body in plan.patches:
            log(f"applying {name}")
            _apply(src / "vendor" / "llama.cpp", name, body)
        entry = cache_root() / plan.key
        entry.mkdir(parents=True, exist_ok=True)
        logfile = entry / "build.log"
        local = [] if plan.cuda is None else plan.cuda.cmake_args(work)
        env = dict(os.environ, CMAKE_ARGS=shlex.join(toolchain.merge(plan.cmake_args, local)))
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        log(f"building the wheel: one llama.cpp compile, minutes (CMAKE_ARGS='{env['CMAKE_ARGS']}'; log: {logfile})")
        start = time.monotonic()
        with open(logfile, "wb") as out:
            proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-v", str(src), "-w", str(work / "dist")],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            tail = logfile.read_text(errors="replace").splitlines()[-30:]
            sys.stderr.write("\n".join(tail) + "\n")
            raise BuildError(f"building llama-cpp-python {VERSION} failed (a C/C++ compiler and CMake are needed; "
                             f"the last lines are above, the full log is {logfile})")
        built = next((work / "dist").glob(f"llama_cpp_python-{VERSION}-*.whl"))
        partial = entry / ".partial"  # copy, then rename: a cache entry is complete or absent
        shutil.copyfile(built, partial)
        wheel = entry / built.name
        os.replace(partial, wheel)
        log(f"built {wheel} in {time.monotonic() - start:.0f} s")
    return wheel


def install(wheel: Path, python: str = sys.executable, log: Callable[[str], None] = print) -> None:
    """Install `wheel` into `python`'s environment, replacing the llama-cpp-python there."""
    proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise BuildError(f"pip could not install {wheel} with {python} (see pip's message above)")
    log(f"installed {wheel.name} into the environment of {python}")


def _sdist(sdist, work: Path, python: str, log) -> Path:
    if sdist is not None:
        path = Path(sdist)
        if not path.is_file():
            raise UserError(f"sdist not found: {path} (give the llama_cpp_python-{VERSION}.tar.gz file)", param="sdist")
        return path
    log(f"downloading the llama-cpp-python {VERSION} source (pip download, 76 MB)")
    # --no-binary names the one package: ":all:" would also build pip's build dependencies
    # (scikit-build-core, cmake, ...) from source on a machine with no pip cache
    proc = subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
                           f"llama-cpp-python=={VERSION}", "-d", str(work / "dl")], capture_output=True, text=True)
    hits = list((work / "dl").glob("llama_cpp_python-*.tar.gz"))
    if proc.returncode != 0 or not hits:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"could not download the llama-cpp-python {VERSION} source with pip ({last}); "
                         "check the network, or pass a downloaded sdist with --sdist")
    return hits[0]


def _unpack(sdist: Path, work: Path) -> Path:
    try:
        with tarfile.open(sdist) as tar:
            top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
            if len(top) != 1:
                raise BuildError(f"{sdist} is not a llama-cpp-python sdist (several top-level folders)")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(work, filter="data")
            else:  # pragma: no cover - Python < 3.10.12
                tar.extractall(work)
    except (tarfile.TarError, OSError) as exc:
        raise BuildError(f"cannot unpack {sdist}: {exc}") from None
    src = work / top.pop()
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist} is not a llama-cpp-python sdist (no vendor/llama.cpp)")
    return src


def _apply(tree: Path, name: str, body: bytes) -> None:
    """Apply one patch; a dry run first, so that a patch that does not fit changes nothing."""
    for extra in (["--dry-run"], []):
        proc = subprocess.run(["patch", "-p1", "--forward", "--quiet", *extra, "-d", str(tree)], input=body,
                              capture_output=True)
        if proc.returncode != 0:
            raise BuildError(f"patch {name} does not apply to llama-cpp-python {VERSION}: "
                             f"{proc.stdout.decode(errors='replace').strip().splitlines()[:1]}")
