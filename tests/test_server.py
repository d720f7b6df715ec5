"""`specgguf serve` as clients meet it: a real server in a subprocess on a loopback port, the real
`openai` client, raw HTTP for what a client library would never send.

One server per model and settings (module scope): the Gemma 3 270M with `ngram` and with a
`model` draft, the synthetic qwen3 target with a `model` draft (plus --api-key and a queue of
one), and the synthetic counting target with eagle3 / dflash / dspark drafts. Greedy output
must equal the Python API's and the CLI's for the same prompt and settings.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import openai
import pytest

from conftest import run_cli
from serverproc import start_server
from specgguf.api import SpecGGUF

PROMPT = "Copy exactly: alpha beta gamma delta epsilon. Copy: alpha beta"
N = 24
CTX = 512
KEY = "sk-test-specgguf"


def client(server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def raw(server, method: str, path: str, body=None, headers: dict | None = None):
    """(status, headers, parsed JSON body) of one plain HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, resp.headers, json.loads(payload) if payload else None  # headers: case-insensitive


def assert_openai_error(body, param=None, code=None):
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body


def health(server, key=None) -> dict:
    status, _, body = raw(server, "GET", "/health", headers={"Authorization": f"Bearer {key}"} if key else None)
    assert status == 200, body
    return body


def served_by_server(server, prompt=PROMPT, n=N, key="none"):
    """Non-streamed and streamed completions of `prompt`: (text, streamed text, last chunk, response)."""
    c = client(server, key)
    model = c.models.list().data[0].id
    full = c.completions.create(model=model, prompt=prompt, max_tokens=n)
    chunks = list(c.completions.create(model=model, prompt=prompt, max_tokens=n, stream=True))
    streamed = "".join(ch.choices[0].text for ch in chunks)
    return full.choices[0].text, streamed, chunks[-1], full


def check_greedy_everywhere(server, target, draft, prompt=PROMPT, n=N, key="none", draft_max=8):
    """Every path gives the same tokens. The servers here run a fixed --draft-max (as does
    this function), so even the rounds agree; with `auto` only the tokens would."""
    text, streamed, last, full = served_by_server(server, prompt, n, key)
    with SpecGGUF(target, draft=draft, n_ctx=CTX, draft_max=draft_max) as llm:
        api = llm.generate(prompt, max_tokens=n)
    args = ["generate", target, "-p", prompt, "-n", n, "--ctx", CTX, "--draft-max", draft_max, "--json"]
    cli = json.loads(run_cli(*args, *(["--draft", draft] if draft else [])).stdout)
    assert text == streamed == api.text == cli["text"]
    assert full.usage.completion_tokens == len(api.tokens) == len(cli["tokens"])
    assert full.model_extra["specgguf"]["generated_tokens"] == len(api.tokens)
    assert last.choices[0].finish_reason == full.choices[0].finish_reason
    assert last.usage.total_tokens == full.usage.total_tokens
    assert last.model_extra["specgguf"]["rounds"] == full.model_extra["specgguf"]["rounds"]
    return full


# -- Gemma 3 270M, ngram ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_ngram(gemma_path):
    with start_server(gemma_path, "--draft", "ngram", "--ctx", CTX, "--draft-max", 8) as server:
        yield server


def test_models_and_health(gemma_ngram):
    models = client(gemma_ngram).models.list()
    assert [m.id for m in models.data] == ["gemma-3-270m-q4_k_m"]
    assert "n-gram" in models.data[0].model_extra["specgguf"]["draft"]
    assert health(gemma_ngram)["status"] == "ok"


def test_gemma_ngram_equals_api_and_cli(gemma_ngram, gemma_path):
    full = check_greedy_everywhere(gemma_ngram, gemma_path, "ngram")
    assert full.model_extra["specgguf"]["accepted"] > 0  # the copy prompt is what n-grams are for


def test_chat_stream_and_not_agree_with_api(gemma_ngram, gemma_path):
    c = client(gemma_ngram)
    messages = [{"role": "user", "content": "Name three colours."}]
    full = c.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=16)
    chunks = list(c.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=16,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert "tau" in chunks[-1].model_extra["specgguf"]
    # the server's fixed --draft-max: other lengths verify in other batch shapes, which may flip
    # a near-tie on this Q4_K_M model (tests/test_lossless.py measures those)
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=CTX, draft_max=8) as llm:
        api = llm.create_chat_completion(messages=messages, max_tokens=16)
    assert api["choices"][0]["message"]["content"] == full.choices[0].message.content


BAD_REQUESTS = {
    # name: (path, body, status, param, code)
    "malformed_json": ("/v1/completions", b'{"prompt": "hi", ', 400, None, "invalid_json"),
    "body_not_object": ("/v1/completions", b"[1, 2]", 400, None, "invalid_json"),
    "prompt_wrong_type": ("/v1/completions", {"prompt": 42}, 400, "prompt", "invalid_type"),
    "prompt_missing": ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "missing_prompt"),
    "max_tokens_string": ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens", "invalid_type"),
    "max_tokens_negative": ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens",
                            "invalid_value"),
    "max_tokens_huge": ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens",
                        "context_length_exceeded"),
    "prompt_over_context": ("/v1/completions", {"prompt": "word " * 2000, "max_tokens": 1}, 400, "prompt",
                            "context_length_exceeded"),
    "temperature_wrong_type": ("/v1/completions", {"prompt": "hi", "temperature": "warm"}, 400, "temperature",
                               "invalid_type"),
    "top_p_out_of_range": ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p", "invalid_value"),
    "stream_wrong_type": ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream", "invalid_type"),
    "stop_wrong_type": ("/v1/completions", {"prompt": "hi", "stop": [1]}, 400, "stop", "invalid_type"),
    "n_unsupported": ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n", "unsupported_parameter"),
    "messages_missing": ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "missing_messages"),
    "messages_empty": ("/v1/chat/completions", {"messages": []}, 400, "messages", "invalid_type"),
    "message_without_role": ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages[0]",
                             "invalid_type"),
    "unknown_model": ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                      404, "model", "model_not_found"),
    "unknown_endpoint": ("/v1/embeddings", {"input": "hi"}, 404, None, "not_found"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request(gemma_ngram, name):
    path, body, status, param, code = BAD_REQUESTS[name]
    got, _, payload = raw(gemma_ngram, "POST", path, body)
    assert got == status, payload
    assert_openai_error(payload, param, code)


def test_openai_client_sees_the_error_shape(gemma_ngram):
    c = client(gemma_ngram)
    with pytest.raises(openai.NotFoundError) as exc:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        c.completions.create(model="gemma-3-270m-q4_k_m", prompt="hi", max_tokens=10**9)
    assert exc.value.code == "context_length_exceeded"


def _wait_cancelled(server, before: int) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = health(server)["queue"]
        if status["cancelled"] > before and not status["running"]:
            return status
        time.sleep(0.1)
    raise AssertionError(f"generation not cancelled: {status}")


def test_disconnect_cancels_generation(gemma_ngram):
    before = health(gemma_ngram)["queue"]["cancelled"]
    stream = client(gemma_ngram).completions.create(model="gemma-3-270m-q4_k_m", prompt="Once upon a time",
                                                    max_tokens=400, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # the client goes away mid-stream
    t0 = time.monotonic()
    status = _wait_cancelled(gemma_ngram, before)
    assert time.monotonic() - t0 < 30  # stopped at a round, not after 400 tokens
    # a non-streamed request whose client leaves while it runs
    sock = socket.create_connection(("127.0.0.1", gemma_ngram.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(1.0)
    sock.close()
    _wait_cancelled(gemma_ngram, status["cancelled"])


def test_readme_server_examples_run(gemma_ngram, capsys):
    """The README's openai-client and curl examples, as written but for the port."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("### OpenAI-compatible server"):]
    python = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    curl = next(b for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S) if b.startswith("curl"))
    here = f"127.0.0.1:{gemma_ngram.port}"
    assert "127.0.0.1:8080" in python and "127.0.0.1:8080" in curl
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    exec(compile(python.replace("127.0.0.1:8080", here), "README.md", "exec"), {})
    assert "'tau'" in capsys.readouterr().out
    proc = subprocess.run(["bash", "-c", curl.replace("127.0.0.1:8080", here)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] == 16 and "specgguf" in out


def test_small_load_with_disconnects(gemma_ngram):
    """scripts/load_test_server.py in small: concurrent streams, some hanging up, two rounds."""
    spec = importlib.util.spec_from_file_location("load_test_server", Path(__file__).resolve().parent.parent
                                                  / "scripts" / "load_test_server.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    report = load.run_load(gemma_ngram, clients=8, rounds=2, max_tokens=8, disconnect_every=4, time_limit=600)
    assert report["ok"], report
    for r in report["rounds"]:
        assert r["completed"] == 6 and r["correct"] == 6 and r["disconnected"] == 2, r


def test_server_survives_everything_above(gemma_ngram):
    assert gemma_ngram.alive()
    text, streamed, _, _ = served_by_server(gemma_ngram, n=8)
    assert text == streamed and text
    assert health(gemma_ngram)["queue"]["failed"] == 0


# -- Gemma 3 270M, model draft (its requantized copy) ----------------------------------------

def test_gemma_model_draft_equals_api_and_cli(gemma_path, gemma_draft_path):
    with start_server(gemma_path, "--draft", gemma_draft_path, "--ctx", CTX, "--draft-max", 8) as server:
        full = check_greedy_everywhere(server, gemma_path, str(gemma_draft_path))
    assert full.model_extra["specgguf"]["drafted"] > 0


# -- synthetic qwen3 target, model draft, API key, a queue of one ----------------------------

@pytest.fixture(scope="module")
def qwen_keyed(qwen3_target, qwen3_draft):
    with start_server(qwen3_target, "--draft", qwen3_draft, "--ctx", CTX, "--draft-max", 8, "--api-key", KEY,
                      "--max-queue", "1") as server:
        yield server


def test_qwen3_model_draft_equals_api_and_cli(qwen_keyed, qwen3_target, qwen3_draft):
    check_greedy_everywhere(qwen_keyed, qwen3_target, str(qwen3_draft), prompt="The quick brown fox", key=KEY)


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Basic " + KEY, KEY])
def test_wrong_api_key(qwen_keyed, auth):
    headers = {"Authorization": auth} if auth else {}
    for method, path, body in (("GET", "/v1/models", None), ("GET", "/health", None),
                               ("POST", "/v1/completions", {"prompt": "hi"})):
        status, _, payload = raw(qwen_keyed, method, path, body, headers)
        assert status == 401, payload
        assert_openai_error(payload, code="invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        client(qwen_keyed, "wrong-key").models.list()


def test_full_queue_answers_503_with_retry_after(qwen_keyed):
    c = client(qwen_keyed, KEY)
    model = c.models.list().data[0].id
    running = c.completions.create(model=model, prompt="The quick brown fox", max_tokens=400, stream=True)
    next(iter(running))  # the first request is on the worker now
    waiting = c.completions.create(model=model, prompt="The quick brown fox", max_tokens=400, stream=True)
    try:
        status, headers, payload = raw(qwen_keyed, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                       {"Authorization": f"Bearer {KEY}"})
        assert status == 503, payload
        assert int(headers["Retry-After"]) >= 1
        assert_openai_error(payload, code="queue_full")
    finally:
        running.close()
        waiting.close()
    deadline = time.monotonic() + 60
    while health(qwen_keyed, KEY)["queue"]["running"] or health(qwen_keyed, KEY)["queue"]["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert c.completions.create(model=model, prompt="hi", max_tokens=2).usage.completion_tokens == 2


# -- synthetic counting target, eagle3 / dflash / dspark drafts ------------------------------

@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    from specgguf.synthetic import write_dflash, write_eagle3, write_qwen3

    d = tmp_path_factory.mktemp("served-kinds")
    return write_qwen3(d / "counting.gguf", counting=True), {
        "eagle3": write_eagle3(d / "e3c.gguf", counting_target_seed=0),
        "dflash": write_dflash(d / "df.gguf"),
        "dspark": write_dflash(d / "dsc.gguf", markov=True, confidence=True, counting=True),
    }


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "dspark"])
def test_feature_drafts_equal_api_and_cli(counting, kind):
    target, drafts = counting
    with start_server(target, "--draft", drafts[kind], "--ctx", CTX, "--draft-max", 4) as server:
        assert kind in client(server).models.list().data[0].model_extra["specgguf"]["draft"].lower()
        check_greedy_everywhere(server, target, str(drafts[kind]), prompt="The quick brown fox", draft_max=4)
