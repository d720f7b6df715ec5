"""The device tier: every layer offloaded to a GPU backend (issue 46). It runs where the loaded
libllama has llama.cpp's Vulkan backend with a device: an AMD or Intel GPU, or, on a CPU-only
machine, Mesa's lavapipe (`apt install mesa-vulkan-drivers`; ggml-vulkan skips CPU-type devices
unless named: GGML_VK_VISIBLE_DEVICES=0). Elsewhere it skips, naming why;
SPECGGUF_REQUIRE_DEVICE=1 makes that a failure (a CI stage that built `specgguf build-llama --vulkan`).

What is checked on the device, with the synthetic F32 qwen3 targets and drafts: llama.cpp's own
log says every layer went to the device; its logits match the CPU backend's; and greedy
speculative output equals plain greedy output ON THE SAME DEVICE for every draft kind (ngram,
suffix, a model draft, eagle3, dflash, dspark), across the prompt cache, saved and loaded
states, two parallel slots, logprobs and a grammar. Offloading moves the verify batches and
the one-token decodes onto the same device kernels, so the comparison is like for like, up
to one thing: a device's matrix kernels for a batch and for one row round differently (on
lavapipe the F32 logits of a prompt prefilled and the same prompt decoded token by token differ
in the fourth decimal). Where the target's two best tokens are that close, the cells a verify
batch wrote may tip them the other way, as they would in any batched server; so an answer
equals plain's, or parts from it first at a near-tie of the target (under DEVICE_TIE_NATS)
and took one of its two best tokens there (tests/ties.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import numpy as np
import pytest

import ties
from conftest import run_cli
from test_parallel import together
from specgguf.api import SpecGGUF
from specgguf.runtime import doctor

ALL = 99  # --gpu-layers: every layer
N_CTX = 512
N = 24
PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n",
           "one two three four one two three four one two three"]
# the widest top-two gap (nats) at which a device's batch-vs-row rounding may pick the other
# token of an F32 target; measured on lavapipe: a 0.0004-nat tie flipped, nothing wider
DEVICE_TIE_NATS = 0.01


def assert_plain_or_tie(target, prompt: str, got: list[int], want: list[int]) -> None:
    """`got` is `want` (plain greedy on the device), or parts from it at a near-tie there."""
    if got == want:
        return
    with SpecGGUF(str(target), n_ctx=N_CTX, n_gpu_layers=ALL) as plain:
        ties.assert_same_or_near_tie(plain, plain.tokenize(prompt), got, want, nats=DEVICE_TIE_NATS)


def _device_or_reason() -> str | None:
    """None when this build's Vulkan backend has a device; else why the tier cannot run."""
    vk = [b for b in doctor.backends() if b["name"] == "Vulkan"]
    if not vk:
        return "the loaded libllama has no Vulkan backend (specgguf build-llama --vulkan)"
    if not vk[0]["devices"]:
        return ("the Vulkan backend sees no device (no GPU driver; on a CPU-only machine install "
                "mesa-vulkan-drivers and set GGML_VK_VISIBLE_DEVICES=0 for lavapipe)")
    return None


_REASON = _device_or_reason()
if _REASON and os.environ.get("SPECGGUF_REQUIRE_DEVICE") == "1":
    raise RuntimeError(f"SPECGGUF_REQUIRE_DEVICE=1 but {_REASON}")
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@contextlib.contextmanager
def llama_log():
    """llama.cpp's own log (it goes through specgguf's callback to sys.stderr when verbose)."""
    from specgguf.runtime import native

    buf = io.StringIO()
    native.set_verbose(True)
    try:
        with contextlib.redirect_stderr(buf):
            yield buf
    finally:
        native.set_verbose(False)


def offloaded(log: str) -> list[tuple[int, int]]:
    """(offloaded, total) for each model load in the log."""
    return [(int(a), int(b)) for a, b in re.findall(r"offloaded (\d+)/(\d+) layers to GPU", log)]


def _spec(name, hidden_drafts, qwen3_draft):
    return {"model": str(qwen3_draft), "eagle3": str(hidden_drafts["eagle3"]),
            "dflash": str(hidden_drafts["dflash"]), "dspark": str(hidden_drafts["dspark-counting"])}.get(name, name)


def test_every_layer_is_on_the_device_and_computes_the_cpu_logits(qwen3_target):
    """llama.cpp's log: N/N layers offloaded and the weights in a Vulkan buffer; the last-row
    logits of a prompt agree with the CPU backend's (float32 on other kernels: close, same
    argmax), so the device really computes the model."""
    rows = {}
    for layers in (0, ALL):
        with llama_log() as log:
            llm = SpecGGUF(str(qwen3_target), n_ctx=N_CTX, n_gpu_layers=layers, verbose=True)
        try:
            text = log.getvalue()
            if layers:
                loads = offloaded(text)
                assert loads and all(a == b for a, b in loads), loads
                assert re.search(r"Vulkan\d+ model buffer size", text), text[-2000:]
            toks = llm.tokenize(PROMPTS[0])
            ctx, batch = llm.target.ctx, llm.target.batch
            ctx.clear()
            batch.clear().add_tokens(toks, 0, "last")
            ctx.decode(batch)
            rows[layers] = np.array(ctx.logits(len(toks) - 1), dtype=np.float64)
            llm.reset()
        finally:
            llm.close()
    cpu, dev = rows[0], rows[ALL]
    assert int(np.argmax(cpu)) == int(np.argmax(dev))
    assert np.max(np.abs(cpu - dev)) < 1e-3 * max(1.0, np.max(np.abs(cpu))), np.max(np.abs(cpu - dev))


@pytest.fixture(scope="module")
def plain_dev(qwen3_target, counting_target):
    """Plain greedy output on the device, per (target, prompt)."""
    out = {}
    for path in (qwen3_target, counting_target):
        with SpecGGUF(str(path), n_ctx=N_CTX, n_gpu_layers=ALL) as llm:
            for p in PROMPTS:
                out[(str(path), p)] = llm.generate(p, max_tokens=N).tokens
    return out


@pytest.mark.parametrize("kind", ["ngram", "suffix", "model", "eagle3", "dflash", "dspark"])
def test_speculative_equals_plain_on_the_device(qwen3_target, counting_target, qwen3_draft, hidden_drafts,
                                                plain_dev, kind):
    path = counting_target if kind == "dspark" else qwen3_target
    spec = _spec(kind, hidden_drafts, qwen3_draft)
    with llama_log() as log:
        llm = SpecGGUF(str(path), draft=spec, draft_max=4, n_ctx=N_CTX, n_gpu_layers=ALL, verbose=True)
    try:
        loads = offloaded(log.getvalue())
        # the target, and for a model draft the draft too, went to the device whole
        assert loads and all(a == b for a, b in loads), loads
        if kind in ("model", "eagle3", "dflash", "dspark"):
            assert len(loads) >= 2, f"{kind}: the draft model was not loaded onto the device ({loads})"
        drafted = 0
        for p in PROMPTS:
            got = llm.generate(p, max_tokens=N)
            assert_plain_or_tie(path, p, got.tokens, plain_dev[(str(path), p)])
            drafted += got.stats.drafted
            assert got.stats.accepted <= got.stats.drafted
        assert drafted > 0 or kind in ("ngram", "suffix"), f"{kind} never drafted"
        if kind == "dspark":
            assert got.stats.accepted > 0  # the counting draft knows the counting target's rule
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["ngram", pytest.param("eagle3", marks=pytest.mark.slow)])  # eagle3: 150 s
def test_prompt_cache_and_saved_states_on_the_device(qwen3_target, qwen3_draft, hidden_drafts, kind):
    """Prompts that alternate, with a prompt cache beyond the live context, and a state saved,
    overwritten and loaded back: every answer is the fresh plain one, and the cache was used.
    The prompts are longer than the prompt cache's shortest reuse (MIN_REUSE tokens)."""
    from specgguf.decoding.promptcache import MIN_REUSE

    spec = _spec(kind, hidden_drafts, qwen3_draft)
    a, b = PROMPTS[0] + " jumps over the lazy dog. " * 4, PROMPTS[2] * 3
    with SpecGGUF(str(qwen3_target), n_ctx=N_CTX, n_gpu_layers=ALL) as plain:
        assert min(len(plain.tokenize(a)), len(plain.tokenize(b))) > MIN_REUSE
        want = {p: plain.generate(p, max_tokens=N).tokens for p in (a, b)}
    with SpecGGUF(str(qwen3_target), draft=spec, draft_max=4, n_ctx=N_CTX, n_gpu_layers=ALL,
                  prompt_cache_bytes=64 << 20) as llm:
        cached = 0
        for p in (a, b, a, b):
            got = llm.generate(p, max_tokens=N)
            assert_plain_or_tie(qwen3_target, p, got.tokens, want[p])
            cached += got.stats.cached_tokens
        assert cached > 0, "the prompt cache never served a prefix"
        first = llm.generate(a, max_tokens=N).tokens
        state = llm.save_state()
        llm.generate(b, max_tokens=N)
        llm.load_state(state)
        got = llm.generate(a, max_tokens=N)
        assert got.stats.cached_tokens > 0
        assert_plain_or_tie(qwen3_target, a, got.tokens, want[a])
        assert got.tokens == first  # the loaded state is the saved one: the same cells, the same answer


def test_two_parallel_slots_on_the_device(qwen3_target, qwen3_draft, plain_dev):
    """n_parallel=2 (serve --parallel 2): two generations at once share the device's passes and
    each answers as alone."""
    for draft in ("ngram", str(qwen3_draft)):
        with SpecGGUF(str(qwen3_target), draft=draft, n_ctx=N_CTX, n_gpu_layers=ALL, n_parallel=2) as llm:
            out = together(llm, PROMPTS[:2], max_tokens=N, timeout=300)
            for r, p in zip(out, PROMPTS[:2]):
                assert_plain_or_tie(qwen3_target, p, r.tokens, plain_dev[(str(qwen3_target), p)])
            assert llm._pool.shared.passes < sum(r.stats.rounds for r in out)


def test_logprobs_and_grammar_on_the_device(qwen3_target, qwen3_draft):
    """Logprobs of a drafted completion are plain decoding's on the device; a grammar holds
    and gives the plain grammar-constrained answer."""
    with SpecGGUF(str(qwen3_target), n_ctx=N_CTX, n_gpu_layers=ALL) as plain, \
            SpecGGUF(str(qwen3_target), draft=str(qwen3_draft), draft_max=4, n_ctx=N_CTX, n_gpu_layers=ALL) as spec:
        ref = plain.create_completion(PROMPTS[0], max_tokens=24, logprobs=3)
        got = spec.create_completion(PROMPTS[0], max_tokens=24, logprobs=3)
        assert got["specgguf"]["drafted"] > 0
        a, b = got["choices"][0]["logprobs"], ref["choices"][0]["logprobs"]
        assert_plain_or_tie(qwen3_target, PROMPTS[0], spec.generate(PROMPTS[0], max_tokens=24).tokens,
                            plain.generate(PROMPTS[0], max_tokens=24).tokens)
        j = next((k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), len(b["tokens"]))
        assert j > 0 and a["tokens"][:j] == b["tokens"][:j]
        assert a["token_logprobs"][:j] == pytest.approx(b["token_logprobs"][:j], abs=1e-3, rel=1e-4)
        gbnf = 'root ::= "yes" | "no" | ("maybe " [a-z]+)'
        want = plain.generate(PROMPTS[1], max_tokens=12, grammar=gbnf)
        have = spec.generate(PROMPTS[1], max_tokens=12, grammar=gbnf)
        assert have.tokens == want.tokens
        assert re.fullmatch(r"yes|no|maybe [a-z]+", have.text) or (have.finish_reason == "length"
                                                                   and re.fullmatch(r"maybe [a-z]*", have.text))


@pytest.mark.slow  # 90 s on lavapipe: a second target arch on the device
def test_gemma4_assistant_mtp_on_the_device(tmp_path):
    """Gemma 4's own MTP assistant (kind mtp: it reads the target's KV cache, here device
    memory) drafts on the device, is accepted, and leaves plain's answer."""
    from specgguf.synthetic.gemma4 import Gemma4Shape, write_gemma4, write_gemma4_assistant

    target = write_gemma4(tmp_path / "g4-counting.gguf", Gemma4Shape(), seed=0, counting=True)
    assistant = write_gemma4_assistant(tmp_path / "assistant.gguf", Gemma4Shape(), counting_target_seed=0)
    p = "The quick brown fox"
    with SpecGGUF(str(target), n_ctx=N_CTX, n_gpu_layers=ALL) as plain:
        want = plain.generate(p, max_tokens=N).tokens
    with SpecGGUF(str(target), draft=str(assistant), draft_max=4, n_ctx=N_CTX, n_gpu_layers=ALL) as llm:
        assert llm.drafter.kind == "mtp"
        got = llm.generate(p, max_tokens=N)
    assert_plain_or_tie(target, p, got.tokens, want)
    assert got.stats.accepted > 0


def _vulkan_tools_or_skip():
    """The C++ loop for the per-round comparison: llama-speculative-simple built with Vulkan
    (scripts/build_llama_cpp_tools.sh with CMAKE_ARGS=-DGGML_VULKAN=on, pointed to by
    SPECGGUF_CPP_TOOLS_DIR, as scripts/gpu_check.sh --vulkan builds it)."""
    import cpp_baseline

    cpp_baseline.require_tool()
    if not (cpp_baseline.lib_dir() / "libggml-vulkan.so").exists():
        pytest.skip(f"the C++ tools in {cpp_baseline.tools_dir()} have no Vulkan backend: build them with "
                    "CMAKE_ARGS=-DGGML_VULKAN=on and point SPECGGUF_CPP_TOOLS_DIR there")


@pytest.mark.slow  # 80 s on lavapipe; the default tier's lossless tests keep the device's drafts honest
def test_cpp_loop_agrees_per_round_on_the_device(request, tmp_path):
    """llama-speculative-simple on the same Vulkan libllama, every layer (the draft's too) on
    the device: the same drafted and accepted counts per round and the same tokens, for a
    model draft. Its eagle3, dflash and dspark drafts crash on lavapipe with both models
    offloaded (Mesa 22.3: SIGSEGV in lavapipe's queue thread; dflash and dspark on Mesa 25.0.7
    too: GGML_ASSERT(allow_misalign || misalign_bytes == 0) in ggml-vulkan.cpp, a tensor view
    off the device's 16-byte offset alignment, which gpu_check's real-shaped drafts do not
    meet) and run with -ngl 0, so those kinds are compared with plain output on the device
    only (docs/machines.md)."""
    case_id = "model-qwen3-synthetic"
    import dataclasses

    import test_parity as TP

    _vulkan_tools_or_skip()
    case = next(c for c in TP.CASES if c.id == case_id)
    case = dataclasses.replace(case, our_args=(*case.our_args, "--gpu-layers", str(ALL)),
                               cpp_args=(*case.cpp_args, "-ngl", str(ALL), "-ngld", str(ALL)))
    TP.test_rounds_and_tokens_match_llama_cpp(case, request, tmp_path)


def test_cli_offloads_every_layer(qwen3_target):
    """`specgguf generate --gpu-layers 99 --draft ngram --json` on the device: the plain answer."""
    base = ["generate", str(qwen3_target), "-p", PROMPTS[2], "-n", "24", "--gpu-layers", str(ALL), "--json"]
    plain = run_cli(*base)
    spec = run_cli(*base, "--draft", "ngram", "--verbose")
    assert plain.returncode == 0 and spec.returncode == 0, (plain.stderr[-1500:], spec.stderr[-1500:])
    assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    loads = offloaded(spec.stderr)
    assert loads and all(a == b for a, b in loads), loads


def test_doctor_names_the_vulkan_device_and_the_offload():
    """`specgguf doctor`: the Vulkan build variant, its device, and a probe model with every
    layer on that device."""
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["build_variant"].split("+")[0] == "vulkan"
    vk = next(b for b in r["backends"] if b["name"] == "Vulkan")
    assert vk["devices"] and any(d["name"] == vk["devices"][0] and d["kind"] in ("gpu", "igpu") for d in r["devices"])
    o = r["offload"]
    assert o["layers"] and o["offloaded"] == o["layers"], o
    assert any(b.startswith("Vulkan") for b in o["buffers"]), o
    assert r["verdict"].startswith("ok: "), r["verdict"]
    text = run_cli("doctor").stdout
    assert re.search(r"^offload +a probe model with --gpu-layers 99 put (\d+)/\1 layers on Vulkan", text, re.M), text
