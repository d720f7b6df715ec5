"""scripts/gpu_check.sh end to end on the CPU (--cpu --small): the rehearsal of the one-try GPU
check. It reuses the C++ tools build (scripts/build_llama_cpp_tools.sh; no compile of its own),
writes the real-shaped synthetic models at small widths with the real 151936-token vocabulary,
and must produce the table's JSON with every measurement in it. Timing values are not judged
(benchmarks are not tests); their presence and sanity are."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cpp_baseline

ROOT = cpp_baseline.REPO


@pytest.mark.slow  # 40 s: the whole CPU rehearsal of scripts/gpu_check.sh (the GPU check's script runs end to end)
def test_gpu_check_cpu_small_writes_the_table_json(tmp_path):
    cpp_baseline.require_tool()
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHON=sys.executable, CMAKE_ARGS="", SPECGGUF_GPU_CARRY=str(tmp_path / "no-carry"),
               TMPDIR=str(tmp_path))  # the models are written to a temporary folder there
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--small", "--threads", "2",
                           "--trace", "--out", str(out)], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["small"] and r["backend"] == "cpu" and r["n_vocab"] == 151936 and r["batch"] == 512
    assert os.path.dirname(os.path.realpath(r["library"])) == os.path.realpath(cpp_baseline.lib_dir())
    assert r["plain_tokens_per_second"] > 0
    assert [int(w) for w in r["verify_ms"]] == [1, 2, 4, 8, 16, 32, 64]
    assert all(ms > 0 for ms in r["verify_ms"].values())
    assert {row["kind"] for row in r["rows"]} == {"ngram", "suffix", "dspark", "dflash", "eagle3", "hybrid", "mtp"}
    assert {row["draft_max"] for row in r["rows"]} == {4, 16}
    for row in r["rows"]:
        assert row["ours_tokens_per_second"] > 0 and row["python_us_per_round"] > 0, row
        if row["kind"] in ("suffix", "hybrid"):  # no C++ counterpart
            assert row["cpp_tokens_per_second"] is None and row["ratio"] is None, row
        else:
            assert row["cpp_tokens_per_second"] > 0 and row["ratio"] > 0, row
        # the per-phase breakdown (--trace): every phase, wall and thread CPU time, per round
        t = row["trace"]
        assert t["rounds"] > 0 and set(t["cpu"]) == set(t["wall"]) >= {"draft", "batch", "decode", "logits",
                                                                        "verify", "process", "bookkeeping"}, t
        assert all(v >= 0 for v in t["cpu"].values()), t
    # the backend-sampling probe ran (what it found is a measurement, not judged here)
    bs = r["backend_sampling"]
    assert "error" not in bs, bs
    for name in ("one_row", "block"):
        assert "error" in bs[name] or (bs[name]["n"] > 0 and bs[name]["logits_ms"] > 0), bs
    ngram = [row for row in r["rows"] if row["kind"] == "ngram"]
    assert any(row["cpp_drafted"] > 0 for row in ngram), "C++ ngram-simple drafted nothing: unequal work"
    # the printed table carries the same numbers
    assert "ratio" in proc.stdout and "verify ms by width" in proc.stdout and "plain:" in proc.stdout
    assert "Python us per round by phase" in proc.stdout and "backend sampling" in proc.stdout
    assert not list(tmp_path.glob("specgguf-gpucheck-*")), "the models were left behind"


@pytest.mark.slow  # 30 s: models, plain, the probe and one kind, specgguf's side only
def test_a_part_that_dies_inside_llama_cpp_is_a_note_and_the_table_still_prints(tmp_path):
    """Each part runs in a child process; one that dies by a signal (as llama.cpp did on lavapipe)
    is run once more, and dying again it becomes a note beside the rows it measured first."""
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, SPECGGUF_GPU_CHECK_CRASH="ngram", TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--small", "--no-cpp",
                           "--kinds", "ngram,suffix", "--gpu-layers", "0", "--threads", "2", "--out", str(out),
                           "--buffer-limit", str(128 << 20)],  # lavapipe's maxStorageBufferRange
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["plain_tokens_per_second"] > 0 and r["failed_parts"] == ["ngram"]
    assert r["batch"] == 128 and "batch: 128" in proc.stderr  # 512 rows of logits would not fit 128 MiB
    assert [(row["kind"], row["draft_max"]) for row in r["rows"]] == [("ngram", 4), ("suffix", 4), ("suffix", 16)]
    assert len(r["notes"]) == 2 and all("SIGSEGV" in n for n in r["notes"]), r["notes"]
    assert "specgguf ngram: run 2 died (SIGSEGV" in proc.stdout and "suffix" in proc.stdout
    assert not list(tmp_path.glob("specgguf-gpucheck-*")), "the models were left behind"


@pytest.mark.parametrize("args, says", [
    (["--batch", "64"], "--batch 64 is below 65, the widest verify pass"),
    (["--batch", "512", "--buffer-limit", str(128 << 20)], "--batch 512: its logits (512 x 151936 floats) exceed"),
    (["--buffer-limit", "1000000"], "cannot hold 65 rows of 151936 logits"),
])
def test_a_batch_that_cannot_work_is_one_line_before_any_model_is_written(args, says, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--small", "--no-cpp", *args,
                           "--out", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir()), "nothing is written for a refused check"
