"""Structured output under speculation: a GBNF grammar applied to the target at every position.

Where the grammar comes from (`request_grammar`): `grammar=` (GBNF text or a
`llama_cpp.LlamaGrammar`), `response_format` `{"type": "json_object"}` (llama-cpp-python's JSON
grammar, or the grammar of its `schema` when one is given, as llama-cpp-python does) or
`{"type": "json_schema", "json_schema": {"schema": ...}}` (converted to GBNF by llama-cpp-python's
`json_schema_to_gbnf`). How it runs (`Constraint`, one per generation; docs/structured-output.md):

- drafts are cut at the first token the grammar forbids before they are verified (`cut`);
- verification masks the target at position i with the grammar state after d_1..d_i (`Walk`):
  greedy takes the arg-max over allowed tokens, sampling draws from the masked distribution,
  so the output is the one plain grammar-constrained decoding gives (token for token greedy,
  in distribution sampled): the same masked target, whatever the draft proposed.

Cost: asking llama.cpp about all 262k tokens of a Gemma vocabulary takes milliseconds, so greedy
asks about the arg-max first, then about the candidates at or above the 64th largest logit, and
the whole vocabulary only when none of them is allowed. That is exact: the first allowed token
in logit order is the masked arg-max, and ties at the cut are all in the candidate set (the
lowest id wins, as numpy's and llama.cpp's greedy arg-max pick it).
"""

from __future__ import annotations

import json

import numpy as np

from . import native
from .params import RequestError

TOP_K = 64  # greedy's second try: candidates at or above the TOP_K-th largest logit

# llama-cpp-python's JSON grammar; its `char` rule lets raw control characters into strings,
# which JSON forbids (json.loads refuses them), so the schema grammar's `char` is tightened to
# llama.cpp's own rule (common/json-schema-to-grammar.cpp).
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def json_grammar() -> str:
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema, param: str) -> str:
    """GBNF for a JSON schema (a dict, or its JSON text), by llama-cpp-python's converter."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise RequestError(f"'{param}' is not valid JSON: {exc}", param=param, code="invalid_value") from None
    if not isinstance(schema, dict):
        raise RequestError(f"'{param}' must be a JSON schema object (got {type(schema).__name__})", param=param,
                           code="invalid_type")
    _refuse_unenforced(schema, param, "")
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises ValueError, KeyError, TypeError, ... on bad schemas
        raise RequestError(f"'{param}' is not a JSON schema llama-cpp-python can turn into a grammar: "
                           f"{type(exc).__name__}: {exc}"[:400], param=param, code="invalid_value") from None
    return gbnf.replace(_LOOSE_CHAR, _JSON_CHAR)


# Validation keywords llama-cpp-python's converter (0.3.36) passes over without enforcing them:
# refused, so that no output claims to match a schema it may break (OpenAI's strict mode refuses
# keywords it cannot enforce too). Annotations (title, description, default, ...) are fine.
UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then",
              "else", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
              "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def _refuse_unenforced(schema, param: str, where: str) -> None:
    if not isinstance(schema, dict):
        return
    for key in UNENFORCED:
        if key in schema:
            raise RequestError(f"'{param}' uses '{key}'{' at ' + where if where else ''}, which llama-cpp-python's "
                               "schema-to-grammar converter does not enforce: remove it (or express it with "
                               "enum, pattern, maxLength or maxItems)", param=param, code="unsupported_schema")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or ()):
            _refuse_unenforced(sub, param, f"{where}/{key}/{i}")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                _refuse_unenforced(sub, param, f"{where}/{key}/{name}")
    for key in ("items", "additionalProperties"):
        _refuse_unenforced(schema.get(key), param, f"{where}/{key}")


def grammar_text(grammar, param: str = "grammar") -> str:
    """GBNF text from `grammar`: a string or a llama_cpp.LlamaGrammar."""
    text = getattr(grammar, "_grammar", grammar)  # LlamaGrammar keeps its text there (0.3.x)
    if not isinstance(text, str):
        raise RequestError(f"'{param}' must be GBNF text or a llama_cpp.LlamaGrammar "
                           f"(got {type(grammar).__name__})", param=param, code="invalid_type")
    if not text.strip():
        raise RequestError(f"'{param}' is empty: give a GBNF grammar with a 'root' rule", param=param,
                           code="invalid_value")
    return text


def response_format_grammar(fmt) -> str | None:
    """GBNF for OpenAI's `response_format` (None for {"type": "text"} or no format)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise RequestError("'response_format' must be an object with a 'type' (text, json_object or json_schema)",
                           param="response_format", code="invalid_type")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema")  # llama-cpp-python's extension: json_object with a schema
        return json_grammar() if schema is None else schema_grammar(schema, "response_format.schema")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RequestError("'response_format.json_schema' must be an object with a 'schema' "
                               '(OpenAI\'s shape: {"name": ..., "schema": {...}})',
                               param="response_format.json_schema", code="invalid_value")
        return schema_grammar(spec["schema"], "response_format.json_schema.schema")
    raise RequestError(f"'response_format.type' {kind[:40]!r} is not one of text, json_object, json_schema",
                       param="response_format.type", code="invalid_value")


def request_grammar(values: dict) -> str | None:
    """The GBNF a request asks for through `grammar` or `response_format` (not both)."""
    grammar = values.get("grammar")
    from_format = response_format_grammar(values.get("response_format"))
    if grammar is None:
        return from_format
    if from_format is not None:
        raise RequestError("give either 'grammar' or a JSON 'response_format', not both", param="grammar",
                           code="invalid_value")
    return grammar_text(grammar)


def check(model: native.Model, gbnf: str) -> None:
    """Refuse a grammar llama.cpp cannot parse now, before the request is queued."""
    try:
        native.Grammar(model, gbnf).close()
    except RequestError:
        raise
    except Exception as exc:
        raise RequestError(str(exc), param="grammar", code="invalid_value") from None


class Constraint:
    """The grammar state of one generation: after every token emitted so far."""

    def __init__(self, model: native.Model, gbnf: str):
        self.model = model
        self.grammar = native.Grammar(model, gbnf)
        self.cut_tokens = 0  # drafted tokens dropped before verification
        self.full_scans = 0  # verified positions that needed the whole vocabulary

    def close(self) -> None:
        self.grammar.close()

    def cut(self, draft: list[int]) -> list[int]:
        """The longest prefix of `draft` the grammar allows (it ends at an allowed end token)."""
        if not draft:
            return draft
        g = self.grammar.clone()
        try:
            for j, tok in enumerate(draft):
                if not g.allows(tok):
                    self.cut_tokens += len(draft) - j
                    return draft[:j]
                if self.model.is_eog(tok):
                    return draft[:j + 1]
                g.accept(tok)
            return draft
        finally:
            g.close()

    def walk(self, draft: list[int]) -> "Walk":
        return Walk(self, draft)


class Walk:
    """One round's verification: position i sees the grammar after the drafts before it.

    The acceptance rules ask positions 0, 1, ... in order and go on past i only when d_i was
    kept, so the state advances in place; `finish(ids)` adds the target's own last token."""

    def __init__(self, constraint: Constraint, draft: list[int]):
        self.c, self.g, self.draft, self.pos = constraint, constraint.grammar, draft, 0

    def _at(self, i: int):
        if i < self.pos:
            raise RuntimeError("grammar positions must be visited in order")
        while self.pos < i:
            self.g.accept(self.draft[self.pos])
            self.pos += 1
        return self.g

    def argmax(self, i: int, x: np.ndarray) -> int:
        """The highest-scoring allowed token at position i (lowest id among ties)."""
        g = self._at(i)
        t = int(x.argmax())
        if (i < len(self.draft) and t == self.draft[i]) or g.allows(t):  # drafts were checked by `cut`
            return t
        if x.size > TOP_K:
            cand = np.flatnonzero(x >= np.partition(x, -TOP_K)[-TOP_K])
            ok = g.allowed(cand)
            if ok.any():
                cand = cand[ok]
                return int(cand[x[cand].argmax()])
        self.c.full_scans += 1
        ok = g.allowed()
        if not ok.any():
            raise RequestError("the grammar allows no token of this vocabulary here: it cannot be completed "
                               "with this model", param="grammar", code="invalid_value")
        return int(np.where(ok, x, -np.inf).argmax())

    def mask(self, i: int, x: np.ndarray) -> np.ndarray:
        """The logits at position i with forbidden tokens at -inf (for sampling)."""
        self.c.full_scans += 1
        ok = self._at(i).allowed()
        if not ok.any():
            raise RequestError("the grammar allows no token of this vocabulary here: it cannot be completed "
                               "with this model", param="grammar", code="invalid_value")
        return np.where(ok, x, -np.inf)

    def finish(self, ids: list[int]) -> None:
        g = self._at(len(ids) - 1)
        if not self.c.model.is_eog(ids[-1]):
            g.accept(ids[-1])
