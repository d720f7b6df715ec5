"""SpecGGUF as a drop-in for llama_cpp.Llama: the same calls on the same GGUF (the embedded
Gemma 3 270M), side by side, the same shapes and, greedy, the same texts and logprobs.

Both run with flash attention off (Llama's default; SpecGGUF honours flash_attn=False) and
Llama greedy (temperature=0: its default is 0.8, specgguf's is greedy). Llama gets the chat
template that SpecGGUF falls back to for this base model (no template in the GGUF) through its
own Jinja2ChatFormatter, so that both render the same chat prompt. SpecGGUF drafts with ngram
(draft_max 4): the texts compare speculative output with Llama's plain decoding.
"""

from __future__ import annotations

import numbers

import pytest
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from specgguf import SpecGGUF

CTX = 256
PROMPTS = ["Once upon a time", "Copy exactly: alpha beta gamma delta epsilon. Copy: alpha beta"]
MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a colour."}]
# SpecGGUF's fallback for a GGUF without a chat template (specgguf/request/chat.py), as a Jinja template
TRANSCRIPT = ("{{ bos_token }}{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n"
              "{% endfor %}Assistant:")
N = 16
GREEDY = {"temperature": 0.0}  # for Llama only


def fresh(llama: Llama) -> Llama:
    """Llama reuses the cache rows of its previous call's common prefix, computed in another
    batch shape, which can flip a near-tie on this Q4_K_M model; SpecGGUF reads every prompt
    into an empty cache. reset() makes Llama do the same."""
    llama.reset()
    return llama


@pytest.fixture(scope="module")
def pair(gemma_path):
    handler = Jinja2ChatFormatter(TRANSCRIPT, eos_token="<eos>", bos_token="<bos>").to_chat_handler()
    llama = Llama(model_path=str(gemma_path), n_ctx=CTX, n_batch=64, logits_all=True, flash_attn=False,
                  chat_handler=handler, verbose=False)
    spec = SpecGGUF(model_path=str(gemma_path), n_ctx=CTX, n_batch=64, logits_all=True, flash_attn=False,
                    draft="ngram", draft_max=4, verbose=False)
    yield llama, spec
    spec.close()
    llama.close()


def same_shape(ours, theirs, path="response"):
    """Every key Llama returns is there, with a value of the same JSON kind, recursively; ours
    may add `specgguf` (and `usage` on a stream's last chunk), and OpenAI's
    usage.prompt_tokens_details, nothing else."""
    if isinstance(theirs, dict) and path.endswith("top_logprobs[]"):  # {token text: logprob}: keys are data
        assert isinstance(ours, dict) and all(isinstance(k, str) and isinstance(v, float) for k, v in ours.items())
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        assert set(theirs) <= set(ours), (path, set(theirs) - set(ours))
        # usage may carry OpenAI's prompt_tokens_details (cached tokens), which Llama omits
        assert set(ours) - set(theirs) <= {"specgguf", "usage", "prompt_tokens_details"}, (path, set(ours) - set(theirs))
        for k in theirs:
            if theirs[k] is not None and ours[k] is not None:
                same_shape(ours[k], theirs[k], f"{path}.{k}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), path
        for a, b in zip(ours, theirs):
            same_shape(a, b, f"{path}[]")
    else:
        # a number is a number (Llama's logprobs are numpy float32, ours JSON-ready floats)
        kind = numbers.Real if isinstance(theirs, numbers.Real) and not isinstance(theirs, bool) else type(theirs)
        assert isinstance(ours, kind), (path, ours, theirs)


def test_model_methods(pair):
    llama, spec = pair
    assert spec.n_ctx() == llama.n_ctx() == CTX
    assert spec.n_vocab() == llama.n_vocab()
    assert spec.token_eos() == llama.token_eos() and spec.token_bos() == llama.token_bos()
    assert spec.metadata == llama.metadata and "general.architecture" in spec.metadata
    for text in (b"Hello world", b"<start_of_turn>user caf\xc3\xa9", b""):
        for add_bos in (True, False):
            for special in (True, False):
                ids = llama.tokenize(text, add_bos=add_bos, special=special)
                assert spec.tokenize(text, add_bos=add_bos, special=special) == ids, (text, add_bos, special)
                assert spec.detokenize(ids) == llama.detokenize(ids)
    assert spec.tokenize(b"Hello") == spec.tokenize("Hello")  # str is taken too
    assert spec.reset() is None and llama.reset() is None
    llama.load_state(llama.save_state())
    spec.load_state(spec.save_state())  # as Llama's: a state to put back (the prompt cache)
    with pytest.raises(ValueError, match="save_state"):
        spec.load_state(object())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_texts_and_shapes(pair, prompt):
    llama, spec = pair
    theirs = fresh(llama).create_completion(prompt, max_tokens=N, **GREEDY)
    ours = spec.create_completion(prompt, max_tokens=N)
    same_shape(ours, theirs)
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert {k: ours["usage"][k] for k in theirs["usage"]} == theirs["usage"]
    chunks = list(spec.create_completion(prompt, max_tokens=N, stream=True))
    ref_chunks = list(fresh(llama).create_completion(prompt, max_tokens=N, stream=True, **GREEDY))
    for c in chunks:
        same_shape(c, ref_chunks[0])
    assert "".join(c["choices"][0]["text"] for c in chunks) == theirs["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == ref_chunks[-1]["choices"][0]["finish_reason"]


def test_completion_logprobs(pair):
    """Llama sorts the whole vocabulary per token for logprobs (slow): few tokens here."""
    llama, spec = pair
    prompt, n = PROMPTS[1], 8  # the copy prompt: ngram drafts are verified in batches
    theirs = fresh(llama).create_completion(prompt, max_tokens=n, logprobs=3, **GREEDY)
    ours = spec.create_completion(prompt, max_tokens=n, logprobs=3)
    same_shape(ours, theirs)
    assert ours["specgguf"]["accepted"] > 0
    a, b = ours["choices"][0]["logprobs"], theirs["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    # Rows verified in a batch of several (a draft round) are not bit-identical to one-token
    # decoding on this Q4_K_M model's CPU kernels, and the cache rows they write carry that on:
    # measured up to ~0.12 nats here (test_api checks equality on an F32 target). Rows before
    # the first draft come from the same batch shapes as Llama's: equal to float32 precision.
    assert a["token_logprobs"] == pytest.approx([float(x) for x in b["token_logprobs"]], abs=0.25)
    rounds = ours["specgguf"]["rounds_detail"]
    first_draft = next((i for i, (d, _) in enumerate(rounds) if d), len(rounds))
    assert a["token_logprobs"][:first_draft] == pytest.approx(
        [float(x) for x in b["token_logprobs"][:first_draft]], abs=1e-5)
    for mine, ref in zip(a["top_logprobs"], b["top_logprobs"]):
        best = max(ref, key=ref.get)
        assert best in mine and mine[best] == pytest.approx(float(ref[best]), abs=0.25)
    # stream on: chunk shapes as Llama's, the per-chunk logprobs add up to the whole
    chunks = list(spec.create_completion(prompt, max_tokens=n, logprobs=3, stream=True))
    ref_chunks = list(fresh(llama).create_completion(prompt, max_tokens=n, logprobs=3, stream=True, **GREEDY))
    for c in chunks:
        same_shape(c, ref_chunks[0])
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert [t for lp in streamed for t in lp["tokens"]] == a["tokens"]
    assert [o for lp in streamed for o in lp["text_offset"]] == a["text_offset"]
    assert [v for lp in streamed for v in lp["token_logprobs"]] == a["token_logprobs"]


def test_chat_texts_and_shapes(pair):
    llama, spec = pair
    theirs = fresh(llama).create_chat_completion(MESSAGES, max_tokens=N, stop=["\nUser:"], **GREEDY)
    ours = spec.create_chat_completion(MESSAGES, max_tokens=N, stop=["\nUser:"])
    same_shape(ours, theirs)
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    chunks = list(spec.create_chat_completion(MESSAGES, max_tokens=N, stream=True))
    ref_chunks = list(fresh(llama).create_chat_completion(MESSAGES, max_tokens=N, stop=["\nUser:"], stream=True, **GREEDY))
    assert chunks[0]["choices"][0]["delta"] == ref_chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    same_shape(chunks[1], ref_chunks[1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "".join(c["choices"][0]["delta"].get("content") or "" for c in ref_chunks)
    # chat logprobs: OpenAI's content list, with the same tokens and values as Llama's
    theirs = fresh(llama).create_chat_completion(MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2, **GREEDY)
    ours = spec.create_chat_completion(MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2)
    a, b = ours["choices"][0]["logprobs"], theirs["choices"][0]["logprobs"]
    assert set(a) == set(b) == {"content", "refusal"}
    assert [e["token"] for e in a["content"]] == [e["token"] for e in b["content"]]
    assert [e["logprob"] for e in a["content"]] == pytest.approx([float(e["logprob"]) for e in b["content"]],
                                                                 abs=2e-3)
    for e, r in zip(a["content"], b["content"]):
        assert set(e) == set(r) and set(e["top_logprobs"][0]) == set(r["top_logprobs"][0])
        assert bytes(e["bytes"]).decode("utf-8", "ignore") == e["token"]


def test_echo_logit_bias_and_n(pair):
    llama, spec = pair
    prompt = PROMPTS[0]
    theirs = fresh(llama).create_completion(prompt, max_tokens=8, echo=True, **GREEDY)
    ours = spec.create_completion(prompt, max_tokens=8, echo=True)
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["choices"][0]["text"].startswith(prompt)
    # ban the greedy first token, and push another one up: both take the biased arg-max
    plain = spec.create_completion(prompt, max_tokens=8)
    first = spec.tokenize(plain["choices"][0]["text"].encode(), add_bos=False)[0]
    lifted = spec.tokenize(b" in", add_bos=False)[0]
    bias = {first: -100.0, lifted: 3.0}
    theirs = fresh(llama).create_completion(prompt, max_tokens=8, logit_bias=bias, **GREEDY)
    ours = spec.create_completion(prompt, max_tokens=8, logit_bias=bias)
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"] != plain["choices"][0]["text"]
    assert not ours["choices"][0]["text"].startswith(plain["choices"][0]["text"][:3])
    # OpenAI's JSON form (ids as strings) is the same bias
    again = spec.create_completion(prompt, max_tokens=8, logit_bias={str(k): v for k, v in bias.items()})
    assert again["choices"][0]["text"] == ours["choices"][0]["text"]
    # n > 1 (Llama has no n): greedy choices are all the greedy text, counted in usage
    many = spec.create_completion(prompt, max_tokens=8, n=3)
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert {c["text"] for c in many["choices"]} == {plain["choices"][0]["text"]}
    assert many["usage"]["completion_tokens"] == 3 * plain["usage"]["completion_tokens"]
    assert many["specgguf"]["generated_tokens"] == 3 * plain["specgguf"]["generated_tokens"]
    sampled = spec.create_completion(prompt, max_tokens=8, n=3, temperature=1.5, seed=3)
    assert sampled == {**sampled, "choices": spec.create_completion(prompt, max_tokens=8, n=3, temperature=1.5,
                                                                   seed=3)["choices"]}  # seeded: repeatable
    assert len({c["text"] for c in sampled["choices"]}) > 1  # each choice draws anew


@pytest.mark.parametrize("kwargs, param", [
    ({"mirostat_mode": 2}, "mirostat_mode"), ({"typical_p": 0.5}, "typical_p"), ({"tfs_z": 0.5}, "tfs_z"),
    ({"max_tokens": 2.5}, "max_tokens"), ({"logprobs": 2, "echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
])
def test_what_llama_takes_and_specgguf_refuses(pair, kwargs, param):
    llama, spec = pair
    with pytest.raises(ValueError) as exc:
        spec.create_completion(PROMPTS[0], **kwargs)
    assert getattr(exc.value, "param", None) == param and param in str(exc.value)


@pytest.mark.parametrize("kwargs, param", [
    ({"use_mlock": True}, "use_mlock"), ({"lora_path": "x.bin"}, "lora_path"), ({"n_threads": 0}, "n_threads"),
    ({"n_gpu_layers": 1.5}, "n_gpu_layers"), ({"chat_format": "chatml"}, "chat_format"),
    ({"seed": -7}, "seed"), ({"n_threads_batch": 0}, "n_threads_batch"), ({"model_path": "missing.gguf"}, None),
])
def test_constructor_refuses_what_it_does_not_honour(gemma_path, kwargs, param):
    kwargs = {"model_path": str(gemma_path), **kwargs}
    with pytest.raises(ValueError) as exc:
        SpecGGUF(n_ctx=64, **kwargs)
    if param is not None:
        assert exc.value.param == param and param in str(exc.value) and "--" not in str(exc.value)


def test_unknown_keywords_are_type_errors(gemma_path, pair):
    with pytest.raises(TypeError, match="n_gqa"):
        SpecGGUF(model_path=str(gemma_path), n_gqa=8)
    with pytest.raises(TypeError, match="frobnicate"):
        pair[1].create_completion("hi", frobnicate=True)
    with pytest.raises(TypeError, match="echo"):
        pair[1].create_chat_completion(MESSAGES, echo=True)
