"""The chat page of `specgguf serve` (issue 45; server/webpage.py, server/webui/), in a real
browser: Debian's Chromium driven by selenium through the system chromedriver (nothing is
downloaded). Skipped where no browser is installed; SPECGGUF_REQUIRE_BROWSER=1 (CI) makes that
a failure. One server and one browser for the module: the page is reloaded per test."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request

import pytest

from serverproc import start_server

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CTX = 512


def _need_browser():
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        why = f"no browser to test the chat page with: {', '.join(missing)} missing (apt-get install chromium " \
              "chromium-driver; pip install selenium)"
        if os.environ.get("SPECGGUF_REQUIRE_BROWSER") == "1":
            pytest.fail("SPECGGUF_REQUIRE_BROWSER=1 but " + why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def server(chat_model_path):
    with start_server(chat_model_path, "--draft", "ngram", "--ctx", CTX) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="specgguf-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions", f"--user-data-dir={profile}", "--window-size=1200,800"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_script_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.root + "/")
    browser.get_log("performance")  # start the request log afresh
    WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "model").get_attribute("data-id"))


def _ask(browser, text: str, max_tokens: int = 24):
    from selenium.webdriver.common.keys import Keys

    field = browser.find_element("id", "max-tokens")
    field.clear()
    field.send_keys(str(max_tokens))
    box = browser.find_element("id", "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)  # Enter sends (Shift+Enter would add a line)


def _answer(browser, timeout: float = 120):
    """The last assistant bubble once the answer has ended (the send button is enabled again)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(
        lambda d: d.find_elements("css selector", ".msg.assistant")
        and d.find_element("id", "send").is_enabled() and not d.find_element("id", "stop").is_enabled())
    return browser.find_elements("css selector", ".msg.assistant")[-1]


def _requested_urls(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_page_is_served_and_no_webui_turns_it_off(server, chat_model_path):
    page = urllib.request.urlopen(server.root + "/").read().decode()
    assert "<title>specgguf chat</title>" in page
    with urllib.request.urlopen(server.root + "/") as resp:
        assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    with start_server(chat_model_path, "--no-webui", "--ctx", 64) as bare:
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(bare.root + "/")
        assert exc.value.code == 404
        assert not any("chat page" in line for line in bare.log)


def _stream(server, body: dict) -> list[dict]:
    req = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        lines = resp.read().decode().splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line.strip() != "data: [DONE]"]


def test_the_trace_rides_only_on_streams_that_ask_for_it(server):
    ask = {"messages": [{"role": "user", "content": "Count: one two three four five"}], "max_tokens": 16,
           "stream": True}
    plain = _stream(server, ask)
    assert plain and all("specgguf_trace" not in c for c in plain)
    traced = _stream(server, dict(ask, specgguf={"trace": True}))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in traced if c["choices"])
    tokens = [t for c in traced for t in c.get("specgguf_trace", {}).get("tokens", [])]
    assert "".join(piece for piece, _ in tokens) == text  # every committed token, in order
    rounds = [r for c in traced for r in c.get("specgguf_trace", {}).get("rounds", [])]
    assert sum(a + 1 for _, a in rounds) >= len(tokens) and all(origin in (0, 1) for _, origin in tokens)
    assert sum(origin for _, origin in tokens) <= sum(a for _, a in rounds)
    # the same answer either way (greedy), the trace only added
    assert text == "".join(c["choices"][0]["delta"].get("content") or "" for c in plain if c["choices"])
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(
            server.base_url + "/chat/completions", headers={"Content-Type": "application/json"},
            data=json.dumps(dict(ask, stream=False, specgguf={"trace": True})).encode()))
    assert exc.value.code == 400 and b"needs 'stream': true" in exc.value.read()


def test_a_message_gets_a_streamed_answer_with_the_stats(browser, server):
    _open(browser, server)
    assert browser.find_element("id", "model").text.startswith("SmolLM2")
    assert "n-gram" in browser.find_element("id", "drafter").text
    _ask(browser, "Repeat after me: alpha beta gamma delta epsilon. Repeat: alpha beta", max_tokens=12)
    answer = _answer(browser)
    assert answer.text.strip() and "error" not in answer.get_attribute("class")
    spans = answer.find_elements("css selector", "span.d, span.t")
    assert spans, "no token carries its origin"
    assert browser.find_element("id", "tps").text not in ("", "-")
    assert browser.find_element("id", "tau").text not in ("", "-")
    assert "from the cache" in browser.find_element("id", "prompt").text
    urls = _requested_urls(browser)
    assert urls and all(u.startswith(server.root + "/") for u in urls), urls  # nothing off its own origin
    # a second turn: the conversation is sent whole, and read mostly from the cache
    _ask(browser, "And again.", max_tokens=8)
    _answer(browser)
    assert len(browser.find_elements("css selector", ".msg.user")) == 2
    cached = int(browser.find_element("id", "prompt").text.split(", ")[1].split()[0])
    assert cached > 0


def test_stop_ends_the_stream_and_frees_the_server(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, server)
    _ask(browser, "Write a very long story about a lighthouse keeper.", max_tokens=400)
    WebDriverWait(browser, 60).until(lambda d: d.find_elements("css selector", ".msg.assistant span"))
    browser.find_element("id", "stop").click()
    answer = _answer(browser)
    assert "stopped" in answer.text
    deadline = time.monotonic() + 30
    while True:  # the server ends the generation at its next round once the client has gone
        health = json.loads(urllib.request.urlopen(server.root + "/health").read())
        if health["queue"].get("running", 0) == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.2)
    _ask(browser, "Say hi.", max_tokens=8)  # and the page goes on
    assert "error" not in _answer(browser).get_attribute("class")


def test_a_server_error_is_shown_as_its_text(browser, server):
    _open(browser, server)
    browser.execute_script("document.getElementById('input').value = arguments[0];", "word " * 2 * CTX)
    _ask(browser, "!")
    answer = _answer(browser)
    assert "error" in answer.get_attribute("class")
    assert "context" in answer.text  # the server's own message: the prompt does not fit the context


XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def test_model_output_is_shown_as_text_and_never_runs(browser, server):
    """The server really streams an answer holding markup (a grammar forces it: the page's own
    request gains one field), and the page shows it as text: no element, no script ran."""
    _open(browser, server)
    gbnf = "root ::= " + json.dumps(XSS)
    browser.execute_script("""
        const real = window.fetch, gbnf = arguments[0];
        window.fetch = (url, opts) => {
            if (String(url).includes('/chat/completions')) {
                const body = JSON.parse(opts.body); body.grammar = gbnf;
                opts = Object.assign({}, opts, {body: JSON.stringify(body)});
            }
            return real(url, opts);
        };""", gbnf)
    _ask(browser, "Say something.", max_tokens=48)
    answer = _answer(browser)
    assert XSS in answer.text.replace("\n", "")
    assert not answer.find_elements("css selector", "img, script")
    assert browser.execute_script("return window.__xss === undefined")
    assert not [e for e in browser.get_log("browser") if "__xss" in e.get("message", "")]


def test_the_cost_curve_plots_the_servers_profile(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, server)
    browser.find_element("id", "show-costs").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "costs-note").text)
    profile = json.loads(urllib.request.urlopen(server.root + "/specgguf/profile").read())
    rows = browser.find_elements("css selector", "#predicted tbody tr")
    assert len(rows) == len(profile["predicted"])
    if profile["curve"]:
        assert browser.find_elements("css selector", "#curve polyline")


def test_the_page_without_a_drafter(browser, chat_model_path):
    """Plain decoding: every token is the target's own (no colour), and the speed still shows."""
    with start_server(chat_model_path, "--ctx", CTX) as plain:
        _open(browser, plain)
        assert "none (plain decoding)" in browser.find_element("id", "drafter").text
        _ask(browser, "Say hello.", max_tokens=6)
        answer = _answer(browser)
        assert answer.find_elements("css selector", "span.t") and not answer.find_elements("css selector", "span.d")
        assert browser.find_element("id", "tps").text not in ("", "-")
        assert browser.find_element("id", "acc").text == "no drafts"
