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
    if resp.headers.get("Content-Type", "").startswith("application/json"):
        payload = json.loads(payload)
    return resp.status, resp.headers, payload or None  # headers: case-insensitive; a CORS preflight: text


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
    "n_zero": ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n", "invalid_value"),
    "best_of_unsupported": ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    "typical_p_unsupported": ("/v1/completions", {"prompt": "hi", "typical_p": 0.5}, 400, "typical_p",
                              "unsupported_parameter"),
    "mirostat_unsupported": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                      "mirostat_mode": 2}, 400, "mirostat_mode", "unsupported_parameter"),
    "logprobs_too_many": ("/v1/completions", {"prompt": "hi", "logprobs": 50}, 400, "logprobs", "invalid_value"),
    "echo_with_logprobs": ("/v1/completions", {"prompt": "hi", "logprobs": 1, "echo": True}, 400, "echo",
                           "unsupported_parameter"),
    "top_logprobs_alone": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
    "stream_options_without_stream": ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}},
                                      400, "stream_options", "invalid_value"),
    "logit_bias_bad_token": ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias",
                             "invalid_value"),
    "tokenize_without_content": ("/tokenize", {"text": "hi"}, 400, "content", "missing_field"),
    "detokenize_outside_vocab": ("/detokenize", {"tokens": [10**9]}, 400, "tokens", "invalid_value"),
    "messages_missing": ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "missing_messages"),
    "messages_empty": ("/v1/chat/completions", {"messages": []}, 400, "messages", "invalid_type"),
    "message_without_role": ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages[0]",
                             "invalid_type"),
    "model_not_a_string": ("/v1/chat/completions", {"model": 7, "messages": [{"role": "user", "content": "hi"}]},
                           400, "model", "invalid_type"),
    "unknown_endpoint": ("/v1/embeddings", {"input": "hi"}, 404, None, "not_found"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request(gemma_ngram, name):
    path, body, status, param, code = BAD_REQUESTS[name]
    got, _, payload = raw(gemma_ngram, "POST", path, body)
    assert got == status, payload
    assert_openai_error(payload, param, code)


def test_any_model_name_gets_the_one_model(gemma_ngram):
    """Clients written for OpenAI send their own model name; the answer names the real model."""
    c = client(gemma_ngram)
    r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.model == "gemma-3-270m-q4_k_m" and r.choices[0].message.content is not None


def test_strict_model_name_refuses_other_names(qwen3_target):
    with start_server(qwen3_target, "--ctx", 256, "--strict-model-name") as server:
        c = client(server)
        with pytest.raises(openai.NotFoundError) as exc:
            c.completions.create(model="gpt-4o-mini", prompt="hi", max_tokens=2)
        assert exc.value.code == "model_not_found"
        name = c.models.list().data[0].id
        assert c.completions.create(model=name, prompt="hi", max_tokens=2).model == name


def test_openai_client_sees_the_error_shape(gemma_ngram):
    c = client(gemma_ngram)
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
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
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


def test_logprobs_over_the_openai_client(gemma_ngram):
    c = client(gemma_ngram)
    full = c.completions.create(model="gemma-3-270m-q4_k_m", prompt=PROMPT, max_tokens=8, logprobs=2)
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == full.usage.completion_tokens
    assert "".join(lp.tokens) == full.choices[0].text and all(v <= 0 for v in lp.token_logprobs)
    assert all(tok in top for tok, top in zip(lp.tokens, lp.top_logprobs))
    chunks = list(c.completions.create(model="gemma-3-270m-q4_k_m", prompt=PROMPT, max_tokens=8, logprobs=2,
                                       stream=True))
    assert [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens] == lp.tokens
    messages = [{"role": "user", "content": "Name three colours."}]
    chat = c.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=6, logprobs=True,
                                     top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob for e in content)
    streamed = list(c.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=6,
                                              logprobs=True, top_logprobs=2, stream=True))
    assert [e.token for ch in streamed if ch.choices and ch.choices[0].logprobs
            for e in ch.choices[0].logprobs.content] == [e.token for e in content]


def test_stream_options_include_usage(gemma_ngram):
    c = client(gemma_ngram)
    messages = [{"role": "user", "content": "Name three colours."}]
    chunks = list(c.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=8,
                                            stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == last.model_extra["specgguf"]["generated_tokens"]
    assert all(ch.usage is None and ch.choices for ch in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    plain = list(c.completions.create(model="gemma-3-270m-q4_k_m", prompt=PROMPT, max_tokens=4, stream=True,
                                      stream_options={"include_usage": True}))
    assert plain[-1].choices == [] and plain[-1].usage.total_tokens > 4


def _metrics(server) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/plain"), text
    values, helped = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name.split("{")[0] in helped, line  # every sample has its HELP and TYPE
            values[name] = float(value)
    return values


def test_metrics_before_and_after_traffic(gemma_ngram):
    before = _metrics(gemma_ngram)
    full = client(gemma_ngram).completions.create(model="gemma-3-270m-q4_k_m", prompt=PROMPT, max_tokens=12)
    stats = full.model_extra["specgguf"]
    after = _metrics(gemma_ngram)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta['specgguf_requests_total{outcome="served"}'] == 1
    assert delta["specgguf_generations_total"] == 1
    assert delta["specgguf_completion_tokens_total"] == full.usage.completion_tokens
    assert delta["specgguf_prompt_tokens_total"] == full.usage.prompt_tokens
    for name, key in (("rounds", "rounds"), ("drafted_tokens", "drafted"), ("accepted_tokens", "accepted")):
        assert delta[f"specgguf_{name}_total"] == stats[key], name
    rounds, drafted, accepted = (after[f"specgguf_{n}_total"] for n in ("rounds", "drafted_tokens",
                                                                       "accepted_tokens"))
    assert after["specgguf_acceptance_rate"] == pytest.approx(accepted / drafted, abs=1e-5)
    assert after["specgguf_tau"] == pytest.approx((accepted + rounds) / rounds, abs=1e-5)
    assert after["specgguf_tokens_per_second"] > 0 and after["specgguf_requests_running"] == 0


def test_tokenize_and_detokenize(gemma_ngram):
    text = "Hello world, caf\u00e9 \u4e16\u754c"
    status, _, got = raw(gemma_ngram, "POST", "/tokenize", {"content": text})
    assert status == 200 and got["tokens"] and all(isinstance(t, int) for t in got["tokens"])
    status, _, back = raw(gemma_ngram, "POST", "/detokenize", {"tokens": got["tokens"]})
    assert status == 200 and back == {"content": text}
    _, _, special = raw(gemma_ngram, "POST", "/tokenize", {"content": text, "add_special": True})
    assert special["tokens"][0] == 2 and special["tokens"][1:] == got["tokens"]  # BOS
    marker = "<start_of_turn>user"
    _, _, parsed = raw(gemma_ngram, "POST", "/tokenize", {"content": marker})
    _, _, literal = raw(gemma_ngram, "POST", "/tokenize", {"content": marker, "parse_special": False})
    assert len(literal["tokens"]) > len(parsed["tokens"])  # the marker read as text, not as one token
    _, _, pieces = raw(gemma_ngram, "POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert "".join(p["piece"] for p in pieces["tokens"]) == "Hello world"
    # llama-cpp-python's /extras: tokens with BOS (its tokenize() default), count, text
    _, _, extras = raw(gemma_ngram, "POST", "/extras/tokenize", {"input": "Hello world"})
    assert extras["tokens"][0] == 2 and extras["tokens"][1:] == [p["id"] for p in pieces["tokens"]]
    _, _, count = raw(gemma_ngram, "POST", "/extras/tokenize/count", {"input": "Hello world"})
    assert count == {"count": len(extras["tokens"])}
    _, _, detok = raw(gemma_ngram, "POST", "/extras/detokenize", {"tokens": extras["tokens"][1:]})
    assert detok == {"text": "Hello world"}


def test_cors_preflight_from_a_browser_origin(gemma_ngram):
    origin = "http://localhost:5173"
    status, headers, _ = raw(gemma_ngram, "OPTIONS", "/v1/chat/completions", None, {
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] in (origin, "*")
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "authorization" in headers["Access-Control-Allow-Headers"].lower()
    status, headers, body = raw(gemma_ngram, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                {"Origin": origin})
    assert status == 200 and headers["Access-Control-Allow-Origin"] in (origin, "*") and body["choices"]


def test_server_survives_everything_above(gemma_ngram):
    assert gemma_ngram.alive()
    text, streamed, _, _ = served_by_server(gemma_ngram, n=8)
    assert text == streamed and text
    assert health(gemma_ngram)["queue"]["failed"] == 0


# -- Gemma 3 270M, model draft (its requantized copy) ----------------------------------------

@pytest.mark.slow  # the qwen3 model draft below checks the same path in the default tier
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
    for method, path, body in (("GET", "/v1/models", None), ("GET", "/metrics", None),
                               ("POST", "/v1/completions", {"prompt": "hi"})):
        status, _, payload = raw(qwen_keyed, method, path, body, headers)
        assert status == 401, payload
        assert_openai_error(payload, code="invalid_api_key")
    assert raw(qwen_keyed, "GET", "/health", None, headers)[0] == 200  # open, for a process manager's probe
    with pytest.raises(openai.AuthenticationError):
        client(qwen_keyed, "wrong-key").models.list()


def test_cors_with_an_api_key_and_a_fixed_origin(qwen3_target):
    """The preflight carries no key (browsers never send one): it is answered before the key
    check; a refused request still carries the CORS header, so the page can read the error."""
    origin = "https://app.example.com"
    with start_server(qwen3_target, "--ctx", 128, "--api-key", KEY, "--cors-origins", origin) as server:
        preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization"}
        status, headers, _ = raw(server, "OPTIONS", "/v1/completions", None, preflight)
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
        status, headers, _ = raw(server, "OPTIONS", "/v1/completions", None,
                                 {**preflight, "Origin": "https://evil.example.com"})
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
        status, headers, body = raw(server, "POST", "/v1/completions", {"prompt": "hi"}, {"Origin": origin})
        assert status == 401 and headers["Access-Control-Allow-Origin"] == origin
        assert_openai_error(body, code="invalid_api_key")
    bad = run_cli("serve", qwen3_target, "--cors-origins", "localhost:3000", timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --cors-origins") and "Traceback" not in bad.stderr


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
    from specgguf.synthetic.qwen3 import write_dflash, write_eagle3, write_qwen3

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
