"""HTTP bodies a fair but hostile client sends, and server shutdown while it works: the right
status and OpenAI's error shape, never a 500, never a dead server."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from conftest import run_cli
from serverproc import start_server
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
from test_cli import assert_one_line_error
from test_server import assert_openai_error, health, raw

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(qwen3_target):
    with start_server(qwen3_target, "--draft", "ngram", "--draft-max", 4) as srv:
        yield srv


BAD_BODIES = {
    # JSON's \ud800 escape decodes to a lone surrogate: text no tokenizer can take
    "lone_surrogate_message": (CHAT, b'{"messages": [{"role": "user", "content": "caf\\ud800"}]}',
                               "messages[0].content", "invalid_value"),
    "lone_surrogate_prompt": ("/v1/completions", b'{"prompt": "x\\udfff", "max_tokens": 2}', "prompt",
                              "invalid_value"),
    "lone_surrogate_stop": ("/v1/completions", b'{"prompt": "hi", "stop": ["\\ud83d"], "max_tokens": 2}', "stop",
                            "invalid_value"),
    "role_robot": (CHAT, b'{"messages": [{"role": "robot", "content": "beep"}]}', "messages[0].role",
                   "invalid_value"),
    "user_content_null": (CHAT, b'{"messages": [{"role": "user", "content": null}]}', "messages[0].content",
                          "invalid_type"),
    "invalid_utf8_bytes": ("/v1/completions", b'{"prompt": "caf\xe9", "max_tokens": 2}', None, "invalid_json"),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_bodies_get_400(server, name):
    path, body, param, code = BAD_BODIES[name]
    status, _, payload = raw(server, "POST", path, body)
    assert status == 400, payload
    assert_openai_error(payload, param, code)


def test_client_that_hangs_up_while_sending_its_body(server):
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 4000\r\n\r\n{\"prompt\": \"hel")
        time.sleep(0.2)
        sock.close()
    time.sleep(0.5)
    assert server.alive()
    queue = health(server)["queue"]
    assert queue["failed"] == 0, queue
    assert not any("Traceback" in line for line in server.log), "".join(server.log)


def test_nothing_above_counted_as_a_failure(server):
    status, _, body = raw(server, "POST", "/v1/completions", {"prompt": "one two one two", "max_tokens": 4})
    assert status == 200 and body["choices"][0]["text"] is not None
    assert health(server)["queue"]["failed"] == 0


def test_ctrl_c_during_a_long_prefill_stops_cleanly(tmp_path):
    target = write_qwen3(tmp_path / "long.gguf", QwenShape(n_ctx_train=8192))
    with start_server(target, "--ctx", 8192) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        body = ('{"prompt": "' + "alpha beta gamma " * 2000 + '", "max_tokens": 500}').encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(1.0)  # the worker is prefilling or generating now
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGINT)
        code = srv.proc.wait(60)
        sock.close()
        assert time.monotonic() - t0 < 30
        assert code in (0, 130), "".join(srv.log)
        assert not any("Traceback" in line or "Segmentation" in line for line in srv.log), "".join(srv.log)


def test_serve_refuses_a_target_llama_cpp_would_abort_on(tmp_path):
    bad = write_qwen3(tmp_path / "no-layers.gguf", QwenShape(n_layer=0))
    assert_one_line_error(run_cli("serve", bad, "--port", "0"), "declares 0 layers")
