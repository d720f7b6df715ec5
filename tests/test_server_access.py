"""Who gets in (issue 47): the Host check that stops DNS rebinding, the CORS default that lets the
user's own tools and the chat page in and no website, `--allowed-hosts`, `--cors-origins`, and
the warning for an exposed server. Real servers on the synthetic qwen3 target; raw HTTP, since a
browser's attack is a matter of headers. The attacks themselves are also rows of the hostile
corpus (test_hostile.py, HEADER_CASES).
"""

from __future__ import annotations

import socket
import time

import openai
import pytest

from conftest import run_cli
from serverproc import start_server
from test_server import raw

EVIL = "https://evil.example"
KEY = "sk-access-test"


def request_as(server, method: str, path: str, headers: dict, body=None):
    """test_server.raw with the Host header sent as headers["Host"] (verbatim, empty included;
    http.client then adds none) or the real address when absent."""
    return raw(server, method, path, body, {"Host": f"127.0.0.1:{server.port}", **headers})


def raw_bytes(server, request: bytes) -> bytes:
    """The whole answer to a hand-written request (what http.client will not send: no Host)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def preflight(origin: str, **extra) -> dict:
    return {"Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type", **extra}


@pytest.fixture(scope="module")
def default_server(qwen3_target):
    with start_server(qwen3_target, "--ctx", 256) as server:
        yield server


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}",
                                  "app.localhost:{port}", "localhost.:{port}", "127.0.0.1", "192.168.1.20:{port}"])
def test_loopback_names_and_ip_literals_get_in(default_server, host):
    status, _, body = request_as(default_server, "GET", "/v1/models", {"Host": host.format(port=default_server.port)})
    assert status == 200 and body["data"], body


@pytest.mark.parametrize("host", ["attacker.example:{port}", "attacker.example", "", ":{port}", "[::1", "::1",
                                  "localhost:{port}, evil", "127.0.0.1:99999", "localhost.attacker.example",
                                  "127.1:{port}"])
def test_rebinding_and_malformed_hosts_get_403(default_server, host):
    status, headers, body = request_as(default_server, "GET", "/v1/models",
                                       {"Host": host.format(port=default_server.port), "Origin": EVIL})
    assert status == 403 and body["error"]["code"] == "host_not_allowed", body
    assert "--allowed-hosts" in body["error"]["message"]
    assert "Access-Control-Allow-Origin" not in headers


def test_a_request_without_host_gets_403(default_server):
    answer = raw_bytes(default_server, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403") and b"host_not_allowed" in answer, answer[:300]


@pytest.mark.parametrize("origin", [EVIL, "http://attacker.example:8080", "null", "http://localhost.evil.example",
                                    "http://127.0.0.1.evil.example:80", "file://"])
def test_a_websites_origin_gets_no_cors_and_no_answer(default_server, origin):
    status, headers, _ = request_as(default_server, "OPTIONS", "/v1/chat/completions", preflight(origin))
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, body = request_as(default_server, "POST", "/v1/completions", {"Origin": origin},
                                       {"prompt": "hi", "max_tokens": 1})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    assert "--cors-origins" in body["error"]["message"] and "Access-Control-Allow-Origin" not in headers


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8000",
                                    "https://localhost:8443"])
def test_local_tools_get_cors_without_credentials(default_server, origin):
    status, headers, _ = request_as(default_server, "OPTIONS", "/v1/chat/completions", preflight(origin))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert "Access-Control-Allow-Credentials" not in headers
    assert "Access-Control-Allow-Private-Network" not in headers  # not asked for
    status, headers, body = request_as(default_server, "POST", "/v1/completions", {"Origin": origin},
                                       {"prompt": "hi", "max_tokens": 2})
    assert status == 200 and body["choices"]
    assert headers["Access-Control-Allow-Origin"] == origin and "Access-Control-Allow-Credentials" not in headers
    assert "Origin" in headers.get_all("Vary")


def test_private_network_preflight_only_for_allowed_origins(default_server):
    pna = {"Access-Control-Request-Private-Network": "true"}
    status, headers, _ = request_as(default_server, "OPTIONS", "/v1/models", preflight("http://localhost:3000", **pna))
    assert status == 200 and headers["Access-Control-Allow-Private-Network"] == "true"
    status, headers, _ = request_as(default_server, "OPTIONS", "/v1/models", preflight(EVIL, **pna))
    assert status == 403 and "Access-Control-Allow-Private-Network" not in headers


def test_the_chat_page_is_its_own_origin(default_server):
    """The page's fetches carry its own origin (the Host it was loaded from): let in, no CORS needed."""
    for host in (f"127.0.0.1:{default_server.port}", f"localhost:{default_server.port}"):
        status, _, page = request_as(default_server, "GET", "/", {"Host": host})
        assert status == 200 and b"<html" in page.lower()
        status, headers, body = request_as(default_server, "POST", "/v1/chat/completions",
                                           {"Host": host, "Origin": f"http://{host}"},
                                           {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 200 and body["choices"], body
        assert "Access-Control-Allow-Credentials" not in headers


def test_the_openai_client_is_unaffected(default_server):
    c = openai.OpenAI(base_url=default_server.base_url, api_key="none", max_retries=0, timeout=60)
    assert c.completions.create(model="x", prompt="hi", max_tokens=2).choices[0].text is not None
    local = openai.OpenAI(base_url=f"http://localhost:{default_server.port}/v1", api_key="none", max_retries=0)
    assert local.models.list().data


def test_star_sends_a_literal_star_and_never_credentials(qwen3_target):
    with start_server(qwen3_target, "--ctx", 128, "--cors-origins", "*") as server:
        for origin in (EVIL, "null", "http://localhost:3000"):
            status, headers, _ = request_as(server, "OPTIONS", "/v1/completions", preflight(origin))
            assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
            assert "Access-Control-Allow-Credentials" not in headers
            status, headers, _ = request_as(server, "GET", "/v1/models", {"Origin": origin})
            assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
            assert "Access-Control-Allow-Credentials" not in headers
        status, _, _ = request_as(server, "GET", "/v1/models", {"Host": "attacker.example"})
        assert status == 403  # '*' opens CORS, not the Host check


def test_named_origins_proxy_names_and_a_key(qwen3_target):
    """A named origin gets in with credentials; a declared proxy name passes the Host check;
    /health and the page stay open with a key, the API does not."""
    app = "https://app.example.com"
    with start_server(qwen3_target, "--ctx", 128, "--cors-origins", f"{app},app://obsidian.md",
                      "--allowed-hosts", "llm.internal.example,*.lan", "--api-key", KEY) as server:
        status, headers, _ = request_as(server, "OPTIONS", "/v1/completions", preflight(app))
        assert status == 200 and headers["Access-Control-Allow-Origin"] == app
        assert headers["Access-Control-Allow-Credentials"] == "true"
        status, headers, body = request_as(server, "POST", "/v1/completions", {"Origin": app}, {"prompt": "hi"})
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert headers["Access-Control-Allow-Origin"] == app  # so the page can read why
        status, headers, _ = request_as(server, "GET", "/v1/models",
                                        {"Origin": "app://obsidian.md", "Authorization": f"Bearer {KEY}"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "app://obsidian.md"
        status, headers, _ = request_as(server, "GET", "/v1/models",
                                        {"Origin": "http://localhost:3000", "Authorization": f"Bearer {KEY}"})
        assert status == 200 and "Access-Control-Allow-Credentials" not in headers  # defaults kept, no credentials
        status, _, _ = request_as(server, "OPTIONS", "/v1/completions", preflight(EVIL))
        assert status == 403
        for host in ("llm.internal.example", "LLM.internal.example:443", "box.lan:8080"):
            status, _, body = request_as(server, "GET", "/v1/models", {"Host": host, "Authorization": f"Bearer {KEY}"})
            assert status == 200, (host, body)
        for host in ("lan", "internal.example", "llm.internal.example.evil.example"):
            status, _, _ = request_as(server, "GET", "/v1/models", {"Host": host, "Authorization": f"Bearer {KEY}"})
            assert status == 403, host
        for path in ("/health", "/"):
            status, _, _ = request_as(server, "GET", path, {})
            assert status == 200, path
        status, _, _ = request_as(server, "GET", "/v1/models", {})
        assert status == 401


def test_no_host_check_only_when_asked(qwen3_target):
    with start_server(qwen3_target, "--ctx", 128, "--allowed-hosts", "*", "--cors-origins", "none") as server:
        status, _, _ = request_as(server, "GET", "/v1/models", {"Host": "anything.example:1"})
        assert status == 200
        status, headers, _ = request_as(server, "OPTIONS", "/v1/models", preflight("http://localhost:3000"))
        assert status == 403 and "Access-Control-Allow-Origin" not in headers  # 'none': the own page only
        status, _, _ = request_as(server, "GET", "/v1/models",
                                  {"Host": "anything.example:1", "Origin": "http://anything.example:1"})
        assert status == 200  # its own origin, through whatever name the user chose


def test_an_exposed_server_without_a_key_warns(qwen3_target):
    with start_server(qwen3_target, "--ctx", 128, "--host", "0.0.0.0") as server:
        deadline = time.monotonic() + 10  # the warning follows the ready line
        while not (warning := [line for line in server.log if "warning" in line]) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(warning) == 1 and "--api-key" in warning[0] and "anyone" in warning[0], server.log
    with start_server(qwen3_target, "--ctx", 128) as server:
        assert not any("warning" in line for line in server.log), server.log
