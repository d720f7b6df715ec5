"""`--rpc HOST:PORT,...`: target layers on llama.cpp RPC servers, tested on loopback.

Two `ggml-rpc-server` processes (built with the C++ tools by scripts/build_llama_cpp_tools.sh,
GGML_RPC on) are started here; specgguf runs on that build's libllama (LLAMA_CPP_LIB_PATH), in
a subprocess as a user runs it. Greedy output with every target layer on the two servers must
equal the local run token for token, for a prompt-lookup draft and for a DSpark draft (whose
hidden states come out of the remote layers); a dead, foreign or busy server is one `error:`
line, quickly, and a server that dies mid-generation ends the run with one line, not a hang.
The stock wheel (no GGML_RPC) refuses --rpc naming the build command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import cpp_baseline
from conftest import run_cli
from specgguf.runtime import rpc
from specgguf.errors import UserError
from test_cli import assert_one_line_error

SERVER = "ggml-rpc-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int) -> subprocess.Popen:
    exe = cpp_baseline.lib_dir() / SERVER
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=dict(os.environ, LD_LIBRARY_PATH=str(cpp_baseline.lib_dir())))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{SERVER} exited with {proc.returncode}: {proc.stdout.read().decode()[-2000:]}")
        try:
            rpc.greet(f"127.0.0.1:{port}", timeout=5)
            return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{SERVER} did not start listening on port {port}")


@pytest.fixture(scope="module")
def servers():
    cpp_baseline.require_tool()
    if not (cpp_baseline.lib_dir() / SERVER).is_file():
        pytest.fail(f"{SERVER} is missing from {cpp_baseline.lib_dir()}: rebuild with scripts/build_llama_cpp_tools.sh")
    procs, endpoints = [], []
    try:
        for _ in range(2):
            port = _free_port()
            procs.append(_start_server(port))
            endpoints.append(f"127.0.0.1:{port}")
        yield ",".join(endpoints)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _rpc_env() -> dict:
    return {"LLAMA_CPP_LIB_PATH": str(cpp_baseline.lib_dir())}


def _generate(target, *extra, timeout=600):
    proc = run_cli("generate", target, "-p", "The quick brown fox jumps over the lazy dog. The quick", "-n", "32",
                   "--threads", "2", "--json", *extra, env=_rpc_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("draft", ["ngram", "dspark-counting"])
def test_greedy_output_on_two_rpc_servers_equals_the_local_run(servers, draft, counting_target, hidden_drafts):
    spec = "ngram" if draft == "ngram" else str(hidden_drafts[draft])
    common = ("--draft", spec, "--draft-max", "4")
    local = _generate(counting_target, *common)
    remote = _generate(counting_target, *common, "--rpc", servers, "--gpu-layers", "99")
    assert remote["tokens"] == local["tokens"]
    assert remote["stats"]["rounds_detail"] == local["stats"]["rounds_detail"]
    if draft != "ngram":  # the counting text never repeats in 32 tokens: nothing for n-grams to find
        assert remote["stats"]["accepted"] > 0  # drafting really ran against the remote target


def test_plain_decoding_on_rpc_servers_equals_the_local_run(servers, qwen3_target):
    """No draft, a second (random, non-counting) target."""
    local = _generate(qwen3_target)
    remote = _generate(qwen3_target, "--rpc", servers, "--gpu-layers", "99")
    assert remote["tokens"] == local["tokens"]


def test_dead_server_is_one_line_and_fast(qwen3_target):
    cpp_baseline.require_tool()
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli("generate", qwen3_target, "-p", "hi", "-n", "4", "--rpc", f"127.0.0.1:{port}", "--gpu-layers", "99",
                   env=_rpc_env(), timeout=120)
    assert_one_line_error(proc, f"127.0.0.1:{port}", "ggml-rpc-server")
    assert time.monotonic() - t0 < 60


def test_silent_server_is_one_line_not_a_hang():
    """A listener that never answers the greeting (a busy or foreign server) times out."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(UserError) as err:
            rpc.greet(f"127.0.0.1:{port}", timeout=2)
        assert "did not answer within 2 s" in str(err.value)
        assert time.monotonic() - t0 < 10


def test_server_dying_mid_run_ends_with_one_line(qwen3_target, tmp_path):
    cpp_baseline.require_tool()
    port = _free_port()
    server = _start_server(port)
    try:
        cmd = [sys.executable, "-m", "specgguf", "generate", str(qwen3_target), "-p", "Numbers: 0 1 2", "-n", "3000",
               "--ctx", "4096", "--threads", "2", "--rpc", f"127.0.0.1:{port}", "--gpu-layers", "99"]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **_rpc_env()))
        first = client.stdout.read(1)  # generation is under way: the model is on the server
        assert first, client.stderr.read()
        server.send_signal(signal.SIGKILL)
        _, err = client.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    assert client.returncode == 3, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: llama.cpp stopped") and "RPC" in lines[-1], err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("value, needle", [
    ("localhost", "is not HOST:PORT"),
    ("127.0.0.1:99999", "is not HOST:PORT"),
    ("127.0.0.1:5000,", "empty entry"),
    ("127.0.0.1:5000,127.0.0.1:5000", "names a server twice"),
    ("[::1]:5000", "not IPv6"),
])
def test_bad_rpc_values_are_one_line(qwen3_target, value, needle):
    proc = run_cli("generate", qwen3_target, "-p", "hi", "-n", "2", "--rpc", value, "--gpu-layers", "99")
    assert_one_line_error(proc, "--rpc", needle)


def test_rpc_without_gpu_layers_is_refused(servers, qwen3_target):
    proc = run_cli("generate", qwen3_target, "-p", "hi", "-n", "2", "--rpc", servers, env=_rpc_env())
    assert_one_line_error(proc, "--gpu-layers is 0", "RPC servers")


def test_stock_build_refuses_rpc_with_the_build_command(qwen3_target):
    """The pip wheel is built without GGML_RPC: --rpc names the command that adds it."""
    probe = subprocess.run([sys.executable, "-c", "from specgguf.runtime import native; print(native.supports_rpc())"],
                           capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                            if k != "LLAMA_CPP_LIB_PATH"})
    if probe.stdout.strip() == "True":
        pytest.skip("this environment's llama-cpp-python was built with GGML_RPC")
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    proc = subprocess.run([sys.executable, "-m", "specgguf", "generate", str(qwen3_target), "-p", "hi", "-n", "2",
                           "--rpc", "127.0.0.1:50052", "--gpu-layers", "99"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert_one_line_error(proc, "no RPC backend", "specgguf build-llama --rpc")
