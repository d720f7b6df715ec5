"""The CLI as a user meets it: subprocesses, exit codes, one-line errors, the JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import run_cli

STATS_KEYS = {"prompt_tokens", "generated_tokens", "rounds", "drafted", "accepted", "acceptance_rate", "tau",
              "accepted_by_position", "prefill_s", "draft_s", "verify_s", "tokens_per_second"}


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], lines[0]


def test_generate_json_schema(qwen3_target):
    proc = run_cli("generate", qwen3_target, "-p", "The quick brown fox", "-n", "20", "--draft", "ngram", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"text", "tokens", "finish_reason", "stats"}
    assert STATS_KEYS <= set(out["stats"])
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 20
    assert out["stats"]["generated_tokens"] == 20


def test_generate_default_model_with_compare(gemma_path):
    proc = run_cli("generate", "--draft", "ngram", "--compare", "-n", "24")
    assert proc.returncode == 0, proc.stderr
    assert "Preheat" in proc.stdout or proc.stdout.strip()
    assert "output identical to plain decoding" in proc.stderr
    assert "[plain]" in proc.stderr and "[ngram]" in proc.stderr


def test_missing_file(tmp_path):
    assert_one_line_error(run_cli("generate", tmp_path / "nope.gguf", "-p", "hi"), "not found")


def test_text_file_named_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model\n")
    assert_one_line_error(run_cli("generate", fake, "-p", "hi"), "not a GGUF")


def test_truncated_gguf(tmp_path, qwen3_target):
    cut = tmp_path / "cut.gguf"
    data = qwen3_target.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("generate", cut, "-p", "hi"), "truncated")


def test_truncated_header(tmp_path, qwen3_target):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(qwen3_target.read_bytes()[:3000])
    assert_one_line_error(run_cli("generate", cut, "-p", "hi"))


def test_draft_with_other_vocabulary(gemma_path, qwen3_target):
    assert_one_line_error(run_cli("generate", gemma_path, "-p", "hi", "--draft", qwen3_target), "tokenizer")


def test_truncated_draft(tmp_path, qwen3_target):
    cut = tmp_path / "draft.gguf"
    data = qwen3_target.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", cut), "draft", "truncated")


@pytest.mark.parametrize("value", ["0", "-3", "lots"])
def test_bad_draft_max(qwen3_target, value):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", "ngram", "--draft-max", value),
                          "--draft-max")


def test_unknown_draft_word(qwen3_target):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", "eagle"), "--draft")


def test_prompt_longer_than_context(qwen3_target):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hello world " * 200, "--ctx", "64"),
                          "context", "--ctx")


def test_unknown_option_is_one_line(qwen3_target):
    assert_one_line_error(run_cli("generate", qwen3_target, "--no-such-option"))


def test_inspect(qwen3_target, qwen3_draft):
    proc = run_cli("inspect", qwen3_draft, "--target", qwen3_target)
    assert proc.returncode == 0, proc.stderr
    assert "architecture: qwen3" in proc.stdout
    assert "fits target" in proc.stdout


def test_inspect_mismatch(gemma_path, qwen3_draft):
    proc = run_cli("inspect", qwen3_draft, "--target", gemma_path)
    assert proc.returncode == 0
    assert "does NOT fit" in proc.stdout


def test_chat_fallback_and_commands(gemma_path):
    proc = subprocess.run([sys.executable, "-m", "specgguf", "chat", str(gemma_path), "--draft", "ngram", "-n", "16"],
                          input="Hello there\n/stats\n/reset\n/exit\n", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no chat template" in proc.stderr and "User:/Assistant:" in proc.stderr
    assert "tok/s" in proc.stderr  # the stats line after the answer, and /stats
    assert "conversation cleared" in proc.stderr
