"""Structured output under speculation: GBNF grammars and JSON schemas applied to the target at
every verified position (specgguf/request/constraints.py).

What is compared: the greedy output of speculative decoding with a grammar equals, token for
token, plain decoding with the same grammar (the same loop with no drafter, one target row per
round), and on the synthetic F32 target also llama-cpp-python's own grammar-constrained greedy
decoding (`llama_cpp.Llama(..., grammar=LlamaGrammar)`), an implementation that shares nothing
with ours but llama.cpp's grammar code. Every output parses as JSON and matches its schema.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from specgguf.api import SpecGGUF
from specgguf.request.constraints import json_grammar, schema_grammar
from specgguf.decoding.sampling import SamplingParams

# A small test set of schemas; every string and number is bounded, so that even a random
# synthetic model has to finish the object within the token budget.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
                                      "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"]},
    {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["unit", "tags"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
]
# sampling from a random model picks byte tokens that are not valid UTF-8 together, which
# llama.cpp's grammar does not check (docs/structured-output.md): sampled tests keep strings ASCII
ASCII = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z ]{1,8}$"},
                                          "age": {"type": "integer"}, "ok": {"type": "boolean"}},
         "required": ["name", "age", "ok"]}
PROMPTS = ["Hello, world! The quick brown fox", "import numpy as np\nx = ", "The draft proposes, the target"]


def matches(value, schema) -> bool:
    """The part of JSON-schema validation the test set uses (types, required, enum, bounds)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", ()))
                and all(matches(value[k], s) for k, s in schema["properties"].items() if k in value)
                and set(value) <= set(schema["properties"]))
    if kind == "array":
        return (isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 30)
                and all(matches(v, schema["items"]) for v in value))
    if kind == "string":
        return (isinstance(value, str) and len(value) <= schema.get("maxLength", 1 << 30)
                and re.fullmatch(schema.get("pattern", "^.*$")[1:-1], value) is not None)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    raise AssertionError(f"schema kind {kind} not covered by this checker")


def constrained(llm, prompt, gbnf, speculate=True, n=64, sampling=None):
    gen, text = llm.stream_tokens(llm.target.tokenize(prompt), n, sampling=sampling, speculate=speculate,
                                  grammar=gbnf)
    out = "".join(text)
    return out, list(gen.tokens), gen


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_schema_output_equals_plain_constrained_decoding_synthetic(qwen3_target, qwen3_draft, draft):
    spec = str(qwen3_draft) if draft == "model" else "ngram"
    cut = accepted = 0
    with SpecGGUF(qwen3_target, draft=spec, n_ctx=512, draft_max=4) as llm:
        for schema in SCHEMAS:
            gbnf = schema_grammar(schema, "schema")
            for prompt in PROMPTS:
                text, tokens, gen = constrained(llm, prompt, gbnf)
                plain_text, plain_tokens, _ = constrained(llm, prompt, gbnf, speculate=False)
                assert tokens == plain_tokens, (schema, prompt, text, plain_text)
                assert gen.finish_reason == "stop", (text, gen.finish_reason)
                assert matches(json.loads(text), schema), (schema, text)
                cut += gen.constraint.cut_tokens
                accepted += gen.stats.accepted
    assert cut > 0  # drafts the grammar forbids were met (and cut before verification)
    if draft == "model":
        assert accepted > 0  # and drafts were still accepted: the check is not vacuous


def test_schema_output_equals_llama_cpp_python(qwen3_target, qwen3_draft):
    """llama-cpp-python's own grammar-constrained greedy decoding gives the same text. Both run
    with flash attention off (Llama's default and now SpecGGUF's) and our thread count: with it
    on in one and off in the other the attention sums round differently and, on this random
    model, a near-tie among digits (logit gap ~1e-3) falls the other way."""
    from llama_cpp import Llama, LlamaGrammar

    from specgguf.runtime.native import default_threads

    ref = Llama(model_path=str(qwen3_target), n_ctx=512, verbose=False, n_threads=default_threads())  # both flash_attn off
    try:
        with SpecGGUF(qwen3_target, draft=str(qwen3_draft), n_ctx=512, draft_max=4) as llm:
            for schema in SCHEMAS[:2]:
                grammar = LlamaGrammar.from_json_schema(json.dumps(schema))
                for prompt in PROMPTS[:2]:
                    want = ref.create_completion(prompt, max_tokens=64, temperature=0.0, grammar=grammar)
                    got = llm.create_completion(prompt, max_tokens=64, grammar=schema_grammar(schema, "s"))
                    assert got["choices"][0]["text"] == want["choices"][0]["text"], (schema, prompt)
    finally:
        ref.close()


def test_grammar_keyword_takes_gbnf_text_and_llama_grammar(qwen3_target, qwen3_draft):
    from llama_cpp import LlamaGrammar

    gbnf = 'root ::= ("yes" | "no") " because " [a-z ]{3,12} "."'
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), n_ctx=512, draft_max=4) as llm:
        a = llm.generate("Is it? ", 40, grammar=gbnf)
        b = llm.generate("Is it? ", 40, grammar=LlamaGrammar.from_string(gbnf))
        c = llm.create_completion("Is it? ", max_tokens=40, grammar=gbnf)
        pieces = [ch.text for ch in llm.stream("Is it? ", 40, grammar=gbnf)]
    assert a.text == b.text == c["choices"][0]["text"] == "".join(pieces)
    assert re.fullmatch(r"(yes|no) because [a-z ]{3,12}\.", a.text), a.text


def test_sampled_exact_rule_equals_plain_sampled_constrained(qwen3_target):
    """The exact rule draws once per emitted token from the masked target: with a deterministic
    draft (ngram) and the same seed, the sampled text is plain sampled decoding's, draw for draw."""
    gbnf = schema_grammar(ASCII, "s")
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=512, draft_max=4) as llm:
        for seed in range(3):
            sp = SamplingParams(temperature=0.7, seed=seed, accept="exact")
            text, tokens, gen = constrained(llm, PROMPTS[0], gbnf, sampling=sp)
            plain_text, plain_tokens, _ = constrained(llm, PROMPTS[0], gbnf, speculate=False, sampling=sp)
            assert tokens == plain_tokens, (text, plain_text)
            assert matches(json.loads(text), ASCII)


def test_sampled_ratio_rule_keeps_the_masked_distribution(qwen3_target, qwen3_draft):
    """Two-letter grammar, a sampling draft (ratio rule): the first token's frequencies over many
    seeds match the masked target distribution (chi-square), and nothing leaves the grammar."""
    from chisquare import gof, pvalue

    from specgguf.runtime import native

    gbnf = 'root ::= [a-f] [a-f]'
    runs, temp = 300, 0.9
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), n_ctx=256, draft_max=2) as llm:
        toks = llm.target.tokenize(PROMPTS[0])
        # the masked distribution of the first token, from plain decoding's row for it
        ctx, batch = llm.target.ctx, llm.target.batch
        ctx.clear()
        batch.clear().add_tokens(toks, 0, "last")
        ctx.decode(batch)
        logits = ctx.logits(len(toks) - 1).astype(np.float64)
        with native.Grammar(llm.target.model, gbnf) as g:
            allowed = np.flatnonzero(g.allowed())
        p = np.exp((logits[allowed] - logits[allowed].max()) / temp)
        p /= p.sum()
        counts = dict.fromkeys(allowed.tolist(), 0)
        for seed in range(runs):
            sp = SamplingParams(temperature=temp, seed=seed, accept="ratio")
            text, tokens, gen = constrained(llm, PROMPTS[0], gbnf, n=4, sampling=sp)
            assert len(text) == 2 and set(text) <= set("abcdef"), text
            counts[tokens[0]] += 1
    stat, df = gof([counts[t] for t in allowed.tolist()], p)
    assert pvalue(stat, df) > 1e-3, (counts, p)


def test_gemma_json_schema_greedy_equals_plain(gemma_path, gemma_draft_path):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    gbnf = schema_grammar(schema, "schema")
    prompts = ["Alice is 30 years old. As JSON: ", "Bob, aged 41. JSON: "]
    for draft, cases in (("ngram", prompts[:1]), (str(gemma_draft_path), prompts)):
        with SpecGGUF(gemma_path, draft=draft, n_ctx=512, draft_max=4) as llm:
            for prompt in cases:
                text, tokens, gen = constrained(llm, prompt, gbnf, n=40)
                _, plain_tokens, _ = constrained(llm, prompt, gbnf, n=40, speculate=False)
                assert tokens == plain_tokens, (draft, prompt, text)
                assert matches(json.loads(text), schema), text


def test_gemma_json_object_is_json(gemma_path):
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=512, draft_max=4) as llm:
        r = llm.create_chat_completion([{"role": "user", "content": "Describe a cat as a JSON object."}],
                                       max_tokens=48, response_format={"type": "json_object"})
    choice = r["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # cut by max_tokens: still a prefix the JSON grammar allows
        assert choice["message"]["content"].lstrip().startswith("{")


def test_response_format_json_schema_in_create_chat_completion(qwen3_target, qwen3_draft):
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), n_ctx=512, draft_max=4) as llm:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS[0]}}
        r = llm.create_chat_completion([{"role": "user", "content": "Who?"}], max_tokens=64, response_format=fmt)
        chunks = list(llm.create_chat_completion([{"role": "user", "content": "Who?"}], max_tokens=64,
                                                 response_format=fmt, stream=True))
        # llama-cpp-python's extension: json_object with a schema
        r2 = llm.create_chat_completion([{"role": "user", "content": "Who?"}], max_tokens=64,
                                        response_format={"type": "json_object", "schema": SCHEMAS[0]})
    text = r["choices"][0]["message"]["content"]
    assert matches(json.loads(text), SCHEMAS[0])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == text
    assert r2["choices"][0]["message"]["content"] == text


@pytest.mark.parametrize("kwargs, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/definitions/nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": "json"}, "response_format"),
    ({"grammar": "root ::= undefined-rule"}, "grammar"),
    ({"grammar": "root ::= \"a"}, "grammar"),
    ({"grammar": ""}, "grammar"),
    ({"grammar": 42}, "grammar"),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}, "grammar"),
])
def test_refused_structure_options(qwen3_target, kwargs, param, capfd):
    with SpecGGUF(qwen3_target, n_ctx=256) as llm:
        with pytest.raises(ValueError) as err:
            llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=4, **kwargs)
    assert err.value.param == param
    assert str(err.value)
    assert "parse:" not in capfd.readouterr().err  # llama.cpp's parser message became the error


def test_grammar_json_grammar_is_llama_cpp_pythons():
    from llama_cpp.llama_grammar import JSON_GBNF

    assert json_grammar() == JSON_GBNF
