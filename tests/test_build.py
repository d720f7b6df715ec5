"""What a pip user gets: the wheel's contents, and `specgguf build-llama` up to the compile.

The compile itself (minutes) runs in .ci/run: a fresh venv installs specgguf's wheel, runs
`specgguf build-llama --patched --cpu` and then the patched tests against the installed package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from conftest import run_cli
from specgguf.runtime import building, patchprobe
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


def test_shipped_patches_are_the_repository_ones():
    shipped = building.patch_files()
    assert [name for name, _ in shipped] == sorted(p.name for p in (ROOT / "patches").glob("*.patch"))
    assert all(body == (ROOT / "patches" / name).read_bytes() for name, body in shipped)


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
