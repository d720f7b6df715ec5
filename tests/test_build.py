"""What a pip user gets: the wheel's contents, and `specgguf build-llama` up to the compile.

The compile itself (minutes) runs in .ci/run: a fresh venv installs specgguf's wheel, runs
`specgguf build-llama --patched --cpu` and then the patched tests against the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from conftest import run_cli
from specgguf.runtime import building, patchprobe, toolchain
from test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # from a copy: setuptools writes build/ and *.egg-info next to the sources
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", "bench", ".gpu-carry"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(out.glob("specgguf-*.whl"))


def test_wheel_holds_what_a_pip_user_needs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    patches = sorted(p.name for p in (ROOT / "patches").glob("*.patch"))
    assert len(patches) >= 2
    for p in patches:
        assert f"specgguf/patches/{p}" in names
    for module in ("specgguf/runtime/building.py", "specgguf/cli/build.py", "specgguf/models/deepspec.json",
                   "specgguf/converters/convert.py", "specgguf/server/app.py", "specgguf/drafters/base.py"):
        assert module in names, module
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert any(n.startswith(f"{dist_info}/") and Path(n).name.startswith("LICENSE") for n in names)
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode())
    assert "License :: OSI Approved :: MIT License" in meta.get_all("Classifier")
    assert meta["Author"] or meta["Author-email"]
    assert meta["Keywords"] and meta["Requires-Python"]
    assert "llama-cpp-python==0.3.36" in meta.get_all("Requires-Dist")
    entry = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "specgguf = specgguf.cli:main" in entry
    assert not any(n.startswith(("tests/", "scripts/")) for n in names)


def _shipped_from_this_checkout():
    from importlib import resources
    shipped = Path(str(resources.files("specgguf.patches")))
    if shipped.resolve() != (ROOT / "patches").resolve():
        pytest.skip(f"specgguf.patches is {shipped}, not this checkout's patches/ (an editable install of another "
                    "checkout is first on the path)")


def test_shipped_patches_are_the_repository_ones():
    _shipped_from_this_checkout()
    shipped = building.patch_files()
    assert [name for name, _ in shipped] == sorted(p.name for p in (ROOT / "patches").glob("[0-9]*.patch"))
    assert all(body == (ROOT / "patches" / name).read_bytes() for name, body in shipped)
    vulkan = building.patch_files("vulkan")
    assert [name for name, _ in vulkan] == sorted(p.name for p in (ROOT / "patches").glob("vulkan-*.patch"))
    assert vulkan and all(body == (ROOT / "patches" / name).read_bytes() for name, body in vulkan)
    assert building.patch_files("cuda") == []


def test_vulkan_plan_gets_its_flag_and_its_patch_only_there():
    """--vulkan: -DGGML_VULKAN=on and the old-headers patch, in the cache key; no other backend
    gets that patch, and --patched --vulkan applies the eagle3 set first."""
    _shipped_from_this_checkout()
    vk = building.Plan(patched=False, backend="vulkan")
    assert "-DGGML_VULKAN=on" in vk.cmake_args and "-DGGML_CUDA=on" not in vk.cmake_args
    assert [n for n, _ in vk.patches] == ["vulkan-0001-headers-before-layer-settings.patch"]
    both = building.Plan(patched=True, backend="vulkan")
    assert [n for n, _ in both.patches] == [n for n, _ in building.patch_files()] + [n for n, _ in vk.patches]
    for backend in (None, "cpu", "cuda", "metal"):
        assert not any(n.startswith("vulkan-") for n, _ in building.Plan(patched=True, backend=backend).patches)
    keys = {vk.key, both.key, building.Plan(patched=False, backend="cpu").key,
            building.Plan(patched=False, backend="vulkan", rpc=True).key}
    assert len(keys) == 4
    # the patch is part of the key: another patch body, another cache entry
    other = building.Plan(patched=False, backend="vulkan", patches=[(vk.patches[0][0], vk.patches[0][1] + b"\n")])
    assert other.key != vk.key
    assert building.command(patched=False, backend="vulkan") == "specgguf build-llama --vulkan"


def test_vulkan_patch_guards_only_the_layer_settings_block():
    body = (ROOT / "patches" / "vulkan-0001-headers-before-layer-settings.patch").read_text()
    added = [ln[1:].strip() for ln in body.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in body.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert not removed  # additive: with new headers the code is what it was
    assert added[0] == "#if VK_HEADER_VERSION >= 272" and added[1] == "#else" and added[-1] == "#endif"
    assert "+++ b/ggml/src/ggml-vulkan/ggml-vulkan.cpp" in body


def _fake_vulkan(root: Path, skip: tuple = ()) -> Path:
    files = {"headers": "include/vulkan/vulkan.hpp", "loader": "lib/x86_64-linux-gnu/libvulkan.so",
             "glslc": "bin/glslc", "spirv": "share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake"}
    for part, rel in files.items():
        if part not in skip:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("")
    return root


def test_vulkan_missing_names_each_part_and_its_package(tmp_path):
    none = lambda name: None  # noqa: E731  (no glslc on $PATH)
    assert building.vulkan_missing([str(_fake_vulkan(tmp_path / "all"))], which=none) == []
    assert [pkg for _, pkg in building.vulkan_missing([str(tmp_path / "empty")], which=none)] == [
        "libvulkan-dev", "libvulkan-dev", "glslc", "spirv-headers"]
    some = _fake_vulkan(tmp_path / "some", skip=("glslc", "spirv"))
    assert building.vulkan_missing([str(some)], which=none) == [
        ("the glslc shader compiler", "glslc"), ("SPIRV-Headers' CMake package", "spirv-headers")]
    assert building.vulkan_missing([str(some)], which=lambda name: "/x/glslc")[0][1] == "spirv-headers"
    # $VULKAN_SDK (the LunarG SDK's layout) and $CMAKE_PREFIX_PATH are searched as CMake does
    sdk = _fake_vulkan(tmp_path / "sdk")
    assert building.vulkan_missing(which=none, env={"VULKAN_SDK": str(sdk)}) == []
    assert building.vulkan_missing(which=none, env={"CMAKE_PREFIX_PATH": f"/nonexistent:{sdk}"}) == []


def test_vulkan_build_without_its_packages_is_one_line_before_any_download(tmp_path):
    """Run as a user would, with /usr and /usr/local taken out of the search (they may hold the
    packages): the refusal names what is missing and the apt command, and nothing is cached."""
    code = ("from specgguf.runtime import building; building.VULKAN_PREFIXES = (); "
            "from specgguf.cli import main; main()")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), CMAKE_ARGS="", PATH=str(tmp_path / "bin"),
               CMAKE_PREFIX_PATH="", VULKAN_SDK="")
    (tmp_path / "bin").mkdir()
    proc = subprocess.run([sys.executable, "-c", code, "build-llama", "--vulkan", "--no-install"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert_one_line_error(proc, "the Vulkan build needs", "vulkan/vulkan.hpp", "glslc",
                          "apt install libvulkan-dev glslc spirv-headers", "VULKAN_SDK")
    assert "downloading" not in proc.stderr
    assert not (tmp_path / "cache" / "specgguf" / "wheels").exists()


def test_messages_name_the_command():
    assert patchprobe.BUILD_COMMAND == "specgguf build-llama --patched"
    assert building.command(patched=True, backend="cuda", rpc=True) == "specgguf build-llama --patched --rpc --cuda"
    for path in ("specgguf/runtime/compat.py", "specgguf/inspection.py", "models/deepspec.json", "README.md",
                 "converters/deepspec_eagle3.py"):
        assert "build_patched" not in (ROOT / path).read_text(), path


def test_cache_key_follows_what_changes_the_library():
    cpu = building.Plan(patched=True, backend="cpu")
    assert cpu.key == building.Plan(patched=True, backend="cpu").key
    others = [building.Plan(patched=False, backend="cpu"), building.Plan(patched=True, backend="cuda"),
              building.Plan(patched=True, backend="cpu", rpc=True),
              building.Plan(patched=True, backend="cpu", extra_cmake_args="-DGGML_AVX2=off")]
    assert len({cpu.key, *(p.key for p in others)}) == 5
    assert "-DGGML_CUDA=on" in others[1].cmake_args and "-DGGML_RPC=on" in others[2].cmake_args


def test_cached_wheel_is_reused_without_a_compile(tmp_path):
    """A cache entry for the same plan is found (the compile would take minutes); --no-install
    prints its path on stdout."""
    env = {"XDG_CACHE_HOME": str(tmp_path), "CMAKE_ARGS": ""}
    plan = building.Plan(patched=True, backend="cpu")
    entry = tmp_path / "specgguf" / "wheels" / plan.key
    entry.mkdir(parents=True)
    fake = entry / f"llama_cpp_python-{building.VERSION}-cp3-cp3-linux_x86_64.whl"
    fake.write_bytes(b"")
    proc = run_cli("build-llama", "--patched", "--cpu", "--no-install", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(fake)
    assert "using the cached wheel" in proc.stderr


@pytest.mark.parametrize("args, needles", [
    (["--cuda", "--cpu"], ["--cuda and --cpu", "pick one backend"]),
    (["--vulkan", "--cuda"], ["--cuda and --vulkan", "pick one backend"]),
    (["--patched", "--cpu", "--sdist", "missing.tar.gz"], ["sdist not found", "missing.tar.gz"]),
    (["--patched", "--cpu", "--sdist", "{notatar}"], ["cannot unpack"]),
    (["--patched", "--cpu", "--sdist", "{nollama}"], ["not a llama-cpp-python sdist"]),
])
def test_bad_input_is_one_line_and_leaves_no_cache_entry(tmp_path, args, needles):
    notatar = tmp_path / "x.tar.gz"
    notatar.write_text("not a tar file")
    nollama = tmp_path / "other.tar.gz"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "setup.py").write_text("")
    with tarfile.open(nollama, "w:gz") as tar:
        tar.add(tmp_path / "pkg", arcname="pkg")
    args = [a.format(notatar=notatar, nollama=nollama) for a in args]
    cache = tmp_path / "cache"
    proc = run_cli("build-llama", *args, env={"XDG_CACHE_HOME": str(cache), "CMAKE_ARGS": ""})
    assert_one_line_error(proc, *needles)
    assert not (cache / "specgguf" / "wheels").exists() or not any((cache / "specgguf" / "wheels").iterdir())


def test_unbalanced_cmake_args_are_refused(tmp_path):
    proc = run_cli("build-llama", "--cpu", "--no-install",
                   env={"XDG_CACHE_HOME": str(tmp_path), "CMAKE_ARGS": "-DFOO='bar"})
    assert_one_line_error(proc, "CMAKE_ARGS", "quotes")


def test_doctor_names_the_build_variant_from_the_backends():
    from specgguf.runtime import doctor

    def regs(*names):
        return [{"name": n, "devices": []} for n in names]

    assert doctor.build_variant(regs("CPU")) == "cpu"
    assert doctor.build_variant(regs("Vulkan", "CPU")) == "vulkan"
    assert doctor.build_variant(regs("CUDA", "RPC", "CPU")) == "cuda+rpc"
    assert doctor.build_variant(regs("Metal", "BLAS", "CPU")) == "metal"
    assert doctor.offload_text({"offloaded": 5, "layers": 5, "buffers": ["Vulkan0"], "graph_splits": 2}).endswith(
        "put 5/5 layers on Vulkan0; 2 graph splits (the token-embedding lookup stays on the CPU, as llama.cpp always "
        "keeps it)")
    assert doctor.offload_text({"offloaded": 5, "layers": 5, "buffers": ["Vulkan0"], "graph_splits": 3}) == (
        "a probe model with --gpu-layers 99 put 5/5 layers on Vulkan0; 3 graph splits: some ops run on another backend")


def _fake_toolkit(root: Path, cublas: bool = False, stub: bool = False) -> Path:
    """A CUDA toolkit's layout, as far as the CUDA checks read it: cuda_runtime.h, and cuBLAS and
    libcuda's stub where asked."""
    files = ["include/cuda_runtime.h"]
    files += ["include/cublas_v2.h", "lib64/libcublas.so"] if cublas else []
    files += ["lib64/stubs/libcuda.so"] if stub else []
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    return root


def _fake_pypi_cublas(site: Path, version: int = 13) -> Path:
    """PyPI's cuBLAS wheel as installed: nvidia/cu13/{include,lib} (nvidia/cublas/ for CUDA 12),
    with versioned library names only."""
    pkg = site / "nvidia" / (f"cu{version}" if version >= 13 else "cublas")
    for rel in ("include/cublas_v2.h", "include/cublas_api.h", "include/cuda_runtime.h",
                f"lib/libcublas.so.{version}", f"lib/libcublasLt.so.{version}"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("")
    return pkg


def _setup(tmp_path, arch="89", **kw):
    kw.setdefault("which", lambda name: "/x/nvcc" if name == "nvcc" else None)
    kw.setdefault("env", {"CUDAToolkit_ROOT": str(tmp_path / "cuda")})
    kw.setdefault("search", [])
    kw.setdefault("gpu_visible", False)
    kw.setdefault("version", 13)
    kw.setdefault("libcuda_dirs", ())
    return building.cuda_setup(arch, **kw)


def test_cuda_setup_takes_cublas_from_the_toolkit_or_from_pypi(tmp_path):
    """The toolkit's cuBLAS first; else PyPI's wheel on sys.path; GGML_CUDA_NO_VMM exactly when
    there is no libcuda.so (driver or stub) to link against."""
    full = _setup(tmp_path, env={"CUDAToolkit_ROOT": str(_fake_toolkit(tmp_path / "full", cublas=True, stub=True))})
    assert full.cublas is None and not full.no_vmm and full.root == tmp_path / "full"
    _fake_toolkit(tmp_path / "cuda")
    pypi = _fake_pypi_cublas(tmp_path / "site")
    got = _setup(tmp_path, search=[str(tmp_path / "nothing"), str(tmp_path / "site")])
    assert got.cublas == pypi.resolve() and got.no_vmm
    driver = tmp_path / "driver"
    (driver / "libcuda.so").parent.mkdir()
    (driver / "libcuda.so").write_text("")
    assert not _setup(tmp_path, search=[str(tmp_path / "site")], libcuda_dirs=(str(driver),)).no_vmm
    # CUDA 12's wheels: nvidia/cublas/, libcublas.so.12; a cuBLAS of another major version is no match
    _fake_pypi_cublas(tmp_path / "site12", version=12)
    assert _setup(tmp_path, search=[str(tmp_path / "site12")], version=12).cublas.name == "cublas"
    with pytest.raises(building.BuildError, match="pip install nvidia-cublas "):
        _setup(tmp_path, search=[str(tmp_path / "site12")], version=13)


def test_cuda_setup_refusals_are_one_line_and_say_what_to_do(tmp_path):
    _fake_toolkit(tmp_path / "cuda")
    _fake_pypi_cublas(tmp_path / "site")
    site = [str(tmp_path / "site")]
    cases = [
        (dict(which=lambda name: None), ["needs nvcc", "install the CUDA toolkit"]),
        (dict(arch=None, search=site), ["no NVIDIA GPU is visible", "--cuda-arch 89", "RTX 4090"]),
        (dict(arch="native", search=site), ["--cuda-arch"]),
        (dict(), ["needs cuBLAS", "pip install nvidia-cublas ", str(tmp_path / "cuda")]),
        (dict(version=12), ["pip install nvidia-cublas-cu12 "]),
    ]
    for kw, needles in cases:
        with pytest.raises(building.BuildError) as err:
            _setup(tmp_path, **kw)
        text = str(err.value)
        assert "\n" not in text and all(n in text for n in needles), text
    # a visible GPU, or an architecture in $CMAKE_ARGS, lets CMake's choice stand
    assert _setup(tmp_path, arch=None, search=site, gpu_visible=True).cublas is not None
    assert _setup(tmp_path, arch=None, search=site, extra_cmake_args="-DCMAKE_CUDA_ARCHITECTURES=86").cublas


def test_cuda_plan_names_the_arch_and_no_vmm_and_keys_by_both(tmp_path):
    pypi = building.CudaSetup(root=tmp_path, version=13, cublas=_fake_pypi_cublas(tmp_path / "site"), no_vmm=True)
    toolkit = building.CudaSetup(root=tmp_path, version=13)
    plan = building.Plan(patched=False, backend="cuda", cuda_arch="89", cuda=pypi)
    args = plan.cmake_args
    assert {"-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89", "-DGGML_CUDA_NO_VMM=on"} <= set(args)
    assert not any(str(tmp_path) in a for a in args)  # the key holds no machine path
    stock = building.Plan(patched=False, backend="cuda", cuda_arch="89", cuda=toolkit)
    assert "-DGGML_CUDA_NO_VMM=on" not in stock.cmake_args
    assert "CMAKE_CUDA_ARCHITECTURES" not in " ".join(building.Plan(patched=False, backend="cuda").cmake_args)
    keys = {plan.key, stock.key, building.Plan(patched=False, backend="cuda", cuda_arch="86", cuda=pypi).key,
            building.Plan(patched=True, backend="cuda", cuda_arch="89", cuda=pypi).key}
    assert len(keys) == 4
    assert building.Plan(patched=False, backend="cuda", cuda_arch="86,89").cuda_arch == "86;89"
    # the link names the wheel's own files, so that no build folder lands in the RUNPATH; one
    # relative entry finds cuBLAS beside llama_cpp/lib in whatever environment installs the wheel
    scratch = tmp_path / "scratch"
    extra = pypi.cmake_args(scratch)
    assert extra == [f"-DCUDA_cublas_LIBRARY={pypi.cublas / 'lib' / 'libcublas.so.13'}",
                     f"-DCUDA_cublasLt_LIBRARY={pypi.cublas / 'lib' / 'libcublasLt.so.13'}",
                     f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={scratch / 'cublas' / 'include'}",
                     "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,'$ORIGIN/../../nvidia/cu13/lib'"]
    assert not any(str(scratch) in a for a in extra if "LIBRARY" in a or "LINKER" in a)
    assert sorted(p.name for p in (scratch / "cublas" / "include").iterdir()) == ["cublas_api.h", "cublas_v2.h"]
    # the user's own linker flags stay, ours appended
    merged = toolchain.merge(["-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--as-needed"], extra)
    assert "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--as-needed -Wl,-rpath,'$ORIGIN/../../nvidia/cu13/lib'" in merged
    assert toolkit.cmake_args(scratch / "other") == [] and not (scratch / "other").exists()


@pytest.mark.parametrize("setup, args, needles", [
    ("none", ["--cuda"], ["needs nvcc"]),
    ("toolkit", ["--cuda"], ["no NVIDIA GPU is visible", "--cuda-arch 89"]),
    ("toolkit", ["--cuda", "--cuda-arch", "89"], ["needs cuBLAS", "pip install nvidia-cublas "]),
    ("none", ["--cpu", "--cuda-arch", "89"], ["--cuda-arch is for a CUDA build"]),
    ("none", ["--cuda", "--cuda-arch", "sm_89"], ["not a CUDA architecture", "89"]),
])
def test_cuda_build_refusals_come_before_any_download(tmp_path, setup, args, needles):
    """As a user would run it, on a machine with no GPU (GPU_DEVICE moved away, no nvidia-smi)
    and no cuBLAS on sys.path: one line, nothing downloaded, nothing cached."""
    (tmp_path / "bin").mkdir()
    if setup == "toolkit":
        nvcc = tmp_path / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
        nvcc.chmod(0o755)
    code = ("import functools; from specgguf.runtime import building; building.GPU_DEVICE = '/nonexistent'; "
            "building.cuda_setup = functools.partial(building.cuda_setup, search=[]); "
            "from specgguf.cli import main; main()")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), CMAKE_ARGS="", PATH=str(tmp_path / "bin"),
               CUDAToolkit_ROOT=str(_fake_toolkit(tmp_path / "cuda")), CUDA_PATH="", CUDA_HOME="")
    proc = subprocess.run([sys.executable, "-c", code, "build-llama", *args, "--no-install"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert_one_line_error(proc, *needles)
    assert "downloading" not in proc.stderr
    assert not (tmp_path / "cache" / "specgguf" / "wheels").exists()
