"""The bad-input corpus: GGUF files, CLI flags, Python API calls and threads.

Each case asserts the whole outcome a user meets: one `error:` line and exit 2 on the CLI (no
traceback, no signal death), a `ValueError`-style error naming the Python argument in the API,
and, for threads, no crash and no wrong text. Checkpoints and signals during `convert` are in
tests/test_convert_hardening.py; HTTP bodies in tests/test_server.py.
"""

from __future__ import annotations

import threading

import pytest

from conftest import run_cli
from specgguf import SpecGGUF
from specgguf.errors import UserError
from specgguf.synthetic.qwen3 import QwenShape, write_dflash, write_eagle3, write_qwen3
from test_cli import assert_one_line_error


# -- GGUF files llama.cpp would abort on, refused before it sees them -------------------------

@pytest.fixture(scope="module")
def odd_ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd")
    return {
        "no-layers": write_qwen3(d / "no-layers.gguf", QwenShape(n_layer=0)),
        "too-many-layers": write_qwen3(d / "too-many-layers.gguf", QwenShape(n_layer=513, n_embd=16, n_head=1,
                                                                              n_head_kv=1, head_dim=16, n_ff=16,
                                                                              n_merges=8)),
        "eagle3": write_eagle3(d / "eagle3.gguf"),
        "dflash": write_dflash(d / "dflash.gguf"),
    }


@pytest.mark.parametrize("name,needle", [("no-layers", "declares 0 layers"),
                                         ("too-many-layers", "declares 513 layers")])
@pytest.mark.parametrize("role", ["target", "draft"])
def test_layer_count_out_of_range(odd_ggufs, qwen3_target, name, needle, role):
    if role == "target":
        proc = run_cli("generate", odd_ggufs[name], "-p", "hi", "-n", "2")
    else:
        proc = run_cli("generate", qwen3_target, "--draft", odd_ggufs[name], "-p", "hi", "-n", "2")
    assert_one_line_error(proc, needle)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_draft_file_as_target(odd_ggufs, kind):
    assert_one_line_error(run_cli("generate", odd_ggufs[kind], "-p", "hi", "-n", "2"), "is a draft", "--draft")


def test_inspect_names_the_problem(odd_ggufs):
    proc = run_cli("inspect", odd_ggufs["no-layers"])
    assert proc.returncode == 0 and "problem:" in proc.stdout and "0 layers" in proc.stdout


# -- CLI flags: refused, never clamped -------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--ctx", "100000"], "--ctx 100000 is larger than the 4096 tokens"),
    (["--ctx", "8"], "--ctx must be at least 16"),
    (["--ctx", "1e9"], "--ctx"),
    (["--gpu-layers", "-5"], "--gpu-layers must be"),
    (["--threads", "0"], "--threads must be"),
    (["--max-tokens", "-1"], "--max-tokens"),
    (["--draft", "ngram", "--draft-kind", "eagle3"], "--draft-kind eagle3"),
    (["--draft-max", "0"], "--draft-max"),
    (["--draft-p-min", "2"], "--draft-p-min"),
])
def test_out_of_range_flags(qwen3_target, args, needle):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "-n", "2", *args), needle)


def write_mamba(path, n_embd=32, n_layer=2, d_inner=64, d_state=8, d_conv=4, dt_rank=4):
    """A tiny Mamba GGUF (random weights, the synthetic BPE tokenizer): a target whose memory
    is a recurrent state, not a KV cache."""
    import gguf
    import numpy as np

    from specgguf.synthetic.qwen3 import add_tokenizer, finish_gguf

    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_context_length(1024)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    n_vocab = add_tokenizer(w, 64)
    rng = np.random.default_rng(0)

    def r(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"token_embd.weight": r(n_vocab, n_embd), "output_norm.weight": np.ones(n_embd, np.float32),
               "output.weight": r(n_vocab, n_embd)}
    for i in range(n_layer):  # numpy shapes: ggml's dimensions reversed
        tensors.update({f"blk.{i}.attn_norm.weight": np.ones(n_embd, np.float32),
                        f"blk.{i}.ssm_in.weight": r(2 * d_inner, n_embd),
                        f"blk.{i}.ssm_conv1d.weight": r(d_inner, d_conv), f"blk.{i}.ssm_conv1d.bias": r(d_inner),
                        f"blk.{i}.ssm_x.weight": r(dt_rank + 2 * d_state, d_inner),
                        f"blk.{i}.ssm_dt.weight": r(d_inner, dt_rank), f"blk.{i}.ssm_dt.bias": r(d_inner),
                        f"blk.{i}.ssm_a": -np.abs(r(d_inner, d_state)) - 0.5,
                        f"blk.{i}.ssm_d": np.ones(d_inner, np.float32),
                        f"blk.{i}.ssm_out.weight": r(n_embd, d_inner)})
    return finish_gguf(w, tensors, path)


def test_recurrent_target_speculates_through_checkpoints(tmp_path):
    """A pure recurrent state (Mamba; not among the archs llama.cpp keeps snapshots for) takes a
    rejected tail back through a checkpoint restore and re-decode (decoding/rollback.py): it used
    to be refused with "recurrent state"; now every draft gives plain decoding's tokens."""
    target = write_mamba(tmp_path / "mamba.gguf")
    prompt = "hello hello hello hello world hello hello hello hello world hello hello"
    with SpecGGUF(target, n_ctx=256) as plain:
        want = plain.generate(prompt, max_tokens=24).tokens
    for draft in ("ngram", "suffix"):
        with SpecGGUF(target, draft=draft, draft_max=4, n_ctx=256) as spec:
            got = spec.generate(prompt, max_tokens=24)
            assert got.tokens == want
            assert got.stats.rollback["mode"] == "checkpoint" and got.stats.rollback["restores"] > 0


def test_profile_tokens_zero(qwen3_target):
    assert_one_line_error(run_cli("profile", qwen3_target, "--tokens", "0"), "--tokens")


def test_invalid_utf8_prompt(qwen3_target):
    # A shell hands Python invalid UTF-8 bytes as lone surrogates (surrogateescape).
    proc = run_cli("generate", qwen3_target, "-p", b"caf\xe9 au lait".decode("utf-8", "surrogateescape"), "-n", "2",
                   env={"PYTHONUTF8": "1"})
    assert_one_line_error(proc, "--prompt is not valid UTF-8")


def test_invalid_utf8_stop_string(qwen3_target):
    # the stream compares stop strings as UTF-8 bytes with the drafts' text: checked first
    proc = run_cli("generate", qwen3_target, "-p", "hello", "-n", "2", "--draft", "ngram",
                   "--stop", b"\xff".decode("utf-8", "surrogateescape"), env={"PYTHONUTF8": "1"})
    assert_one_line_error(proc, "--stop is not valid UTF-8")


def test_chat_survives_invalid_utf8_on_stdin(qwen3_target):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "specgguf", "chat", str(qwen3_target), "-n", "4"],
                          input=b"caf\xe9\n/exit\n", capture_output=True, timeout=300)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "not valid UTF-8" in err


# -- the Python API: Python argument names, clear errors after close --------------------------

@pytest.mark.parametrize("kwargs,needle", [
    ({"n_threads": 0}, "n_threads"),
    ({"n_gpu_layers": 1.5}, "n_gpu_layers"),
    ({"n_gpu_layers": -5}, "n_gpu_layers"),
    ({"n_ctx": 10**9}, "n_ctx"),
    ({"n_ctx": "big"}, "n_ctx"),
])
def test_api_settings_refused(qwen3_target, kwargs, needle):
    with pytest.raises(UserError) as err:
        SpecGGUF(qwen3_target, **kwargs)
    assert needle in str(err.value) and "--" not in str(err.value)


@pytest.fixture(scope="module")
def llm(qwen3_target):
    with SpecGGUF(qwen3_target, draft="ngram", draft_max=4) as model:
        yield model


@pytest.mark.parametrize("call,needle", [
    (lambda m: m.generate("hi", max_tokens=2.5), "max_tokens"),
    (lambda m: m.generate("hi", max_tokens=-1), "max_tokens"),
    (lambda m: m.generate("caf\udce9"), "not valid UTF-8"),
    (lambda m: m.tokenize("\ud800"), "not valid UTF-8"),
    (lambda m: m.create_chat_completion(messages=[{"role": "robot", "content": "hi"}]), "not a chat role"),
    (lambda m: m.create_chat_completion(messages=[{"role": "user", "content": None}]), "content is missing"),
    (lambda m: m.generate("hi", stop=["\udc80"]), "stop"),
])
def test_api_calls_refused(llm, call, needle):
    with pytest.raises(ValueError if needle != "max_tokens" else UserError) as err:
        call(llm)
    assert needle in str(err.value) and "--" not in str(err.value)


def test_calls_after_close_are_errors_not_crashes(qwen3_target):
    m = SpecGGUF(qwen3_target, draft="ngram")
    target = m.target
    m.close()
    m.close()  # idempotent
    with pytest.raises(UserError, match="closed"):
        m.generate("hi", max_tokens=2)
    with pytest.raises(UserError, match="closed"):
        m.tokenize("hi")
    from specgguf.errors import LlamaError

    with pytest.raises(LlamaError, match="closed"):  # the handles themselves refuse, not segfault
        target.model.tokenize("hi")
    with pytest.raises(LlamaError, match="closed"):
        target.ctx.seq_rm(0)


def test_closing_a_model_closes_its_contexts_first(qwen3_target):
    from specgguf.runtime import native

    model = native.Model(qwen3_target)
    ctx = native.Context(model, n_ctx=256)
    batch = native.Batch(ctx)
    model.close()
    assert ctx.closed and batch.closed


# -- threads and interleaved streams -----------------------------------------------------------

def test_two_threads_on_one_model_twenty_times(llm):
    prompts = ["The quick brown fox jumps over the lazy dog. The quick brown",
               "one two three four five six seven eight one two three"]
    expected = {p: llm.generate(p, max_tokens=12).tokens for p in prompts}
    failures = []

    def work(prompt):
        try:
            got = llm.generate(prompt, max_tokens=12).tokens
            if got != expected[prompt]:
                failures.append(("wrong text", prompt, got))
        except Exception as exc:  # noqa: BLE001 - any error is a failure here
            failures.append((type(exc).__name__, str(exc)))

    for _ in range(20):
        threads = [threading.Thread(target=work, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures[:3]


def test_interleaved_streams_refuse_the_second_and_keep_the_first(llm):
    from specgguf.runtime.target import BusyError

    expected = llm.generate("alpha beta gamma alpha beta", max_tokens=8).text
    first = llm.stream("alpha beta gamma alpha beta", max_tokens=8)
    text = next(first).text
    second = llm.stream("other words", max_tokens=4)
    with pytest.raises(BusyError, match="already generating"):
        next(second)
    text += "".join(c.text for c in first)
    assert text == expected
    assert llm.generate("other words", max_tokens=4).finish_reason in ("length", "stop")  # free again


def test_close_during_an_unfinished_stream(qwen3_target):
    m = SpecGGUF(qwen3_target, draft="ngram")
    stream = m.stream("alpha beta gamma alpha beta", max_tokens=32)
    next(stream)
    m.close()  # ends the stream's generation first, then frees
    last = next(stream)  # what is left: the closing chunk, no decode on freed memory
    assert last.finish_reason == "cancelled" and last.text == ""
    with pytest.raises(StopIteration):
        next(stream)


def test_cancelled_prefill_stops_between_chunks(llm):
    tokens = llm.tokenize("word " * 600)
    gen, text = llm.stream_tokens(tokens, 8, cancelled=lambda: True)
    assert "".join(text) == "" and gen.finish_reason == "cancelled"
