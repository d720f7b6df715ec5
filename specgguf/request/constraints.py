"""Where a request's grammar comes from: `grammar=`, `response_format` and JSON schemas, as GBNF.

`request_grammar`: `grammar=` (GBNF text or a `llama_cpp.LlamaGrammar`), `response_format`
`{"type": "json_object"}` (llama-cpp-python's JSON grammar, or the grammar of its `schema` when
one is given, as llama-cpp-python does) or `{"type": "json_schema", "json_schema": {"schema":
...}}` (converted to GBNF by llama-cpp-python's `json_schema_to_gbnf`). How the grammar then
constrains speculative decoding is `specgguf/decoding/grammar.py` (docs/structured-output.md).
"""

from __future__ import annotations

import json

from ..errors import RequestError
from ..decoding import grammar as grammar_state
from ..runtime import native
from . import grammarlimits

# llama-cpp-python's JSON grammar; its `char` rule lets raw control characters into strings,
# which JSON forbids (json.loads refuses them), so the schema grammar's `char` is tightened to
# llama.cpp's own rule (common/json-schema-to-grammar.cpp).
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def json_grammar() -> str:
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema, param: str) -> str:
    """GBNF for a JSON schema (a dict, or its JSON text), by llama-cpp-python's converter, after
    the schema is checked against the bounds of grammarlimits.py (too large: refused)."""
    if isinstance(schema, str):
        if len(schema) > grammarlimits.MAX_SCHEMA_CHARS:
            raise RequestError(f"'{param}' is {len(schema)} characters of JSON; the limit is "
                               f"{grammarlimits.MAX_SCHEMA_CHARS}", param=param, code="schema_too_large")
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise RequestError(f"'{param}' nests too deeply (the limit is {grammarlimits.MAX_DEPTH} levels)",
                               param=param, code="schema_too_large") from None
        except ValueError as exc:
            raise RequestError(f"'{param}' is not valid JSON: {exc}", param=param, code="invalid_value") from None
    if not isinstance(schema, dict):
        raise RequestError(f"'{param}' must be a JSON schema object (got {type(schema).__name__})", param=param,
                           code="invalid_type")
    text = schema_text(schema, param)
    try:
        conv = converter()
        conv.visit(conv.resolve_refs(json.loads(text), "stdin"), "")
        gbnf = conv.format_grammar()
    except Exception as exc:  # the converter raises ValueError, KeyError, TypeError, ... on bad schemas
        raise RequestError(f"'{param}' is not a JSON schema llama-cpp-python can turn into a grammar: "
                           f"{type(exc).__name__}: {exc}"[:400], param=param, code="invalid_value") from None
    gbnf = gbnf.replace(_LOOSE_CHAR, _JSON_CHAR)
    grammarlimits.check_gbnf(gbnf, param)
    return gbnf


# Keys the converter looks at before a string's or array's bounds: a schema with any of them
# takes the converter's own branch (its bounds then mean nothing to it, or are checked there).
_EARLIER_KEYS = {"$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "additionalProperties",
                 "pattern", "format", "prefixItems"}


def converter(prop_order: dict | None = None):
    """llama-cpp-python's SchemaConverter, except for a bounded repetition (maxLength, maxItems):
    the converter writes n optional items as n nested groups, `(c (c (c)?)?)?`, which llama.cpp
    refuses past 1000 and whose parser overflows the stack past ~19000 (grammarlimits.py); here
    they are a chain of rules, `r1 ::= c r2 | ""`, `r2 ::= c r3 | ""`, ..., flat for the parser and a
    tail call for the grammar's stacks. Same language, any length up to grammarlimits' bounds."""
    from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, SchemaConverter

    class Converter(SchemaConverter):
        def visit(self, schema, name):
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind == "string" and "maxLength" in schema and not _EARLIER_KEYS & set(schema):
                rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
                item = self._add_primitive("char", PRIMITIVE_RULES["char"])
                body = self._chain(rule_name, item, schema.get("minLength", 0), schema["maxLength"], None)
                return self._add_rule(rule_name, r'"\"" ' + body + r' "\"" space')
            if (kind == "array" and "maxItems" in schema and isinstance(schema.get("items"), dict)
                    and not _EARLIER_KEYS & set(schema)):
                rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
                item = self.visit(schema["items"], f"{name}{'-' if name else ''}item")
                body = self._chain(rule_name, item, schema.get("minItems", 0), schema["maxItems"], '"," space')
                return self._add_rule(rule_name, '"[" space ' + body + ' "]" space')
            return super().visit(schema, name)

        def _chain(self, name: str, item: str, low: int, high: int, sep: str | None) -> str:
            """`low` items, then up to `high - low` more, each optional one a rule of the chain."""
            lead = f"{sep} {item}" if sep else item
            first = [item] + [lead] * (low - 1) if low else []
            tail = ""
            for i in range(high - low, 0, -1):  # from the end, so each rule can name the next
                opt = item if (i == 1 and not low) else lead  # the very first item has no separator
                tail = self._add_rule(f"{name}-rest{i}", f"{opt}{' ' + tail if tail else ''} | \"\"")
            if not first:
                return tail
            return " ".join(first + ([tail] if tail else []))

    return Converter(prop_order=prop_order or {}, allow_fetch=False, dotall=False, raw_pattern=False)


def prompt_schema(schema: dict, param: str) -> str:
    """A schema that only reaches the prompt (an unforced call's tool) as JSON text: no grammar is
    built from it, so only its size is bounded (grammarlimits.MAX_SCHEMA_CHARS)."""
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError, RecursionError) as exc:
        raise RequestError(f"'{param}' is not JSON: {exc}"[:300], param=param, code="invalid_value") from None
    if len(text) > grammarlimits.MAX_SCHEMA_CHARS:
        raise RequestError(f"'{param}' is {len(text)} characters of JSON; the limit is "
                           f"{grammarlimits.MAX_SCHEMA_CHARS}", param=param, code="schema_too_large")
    return text


def schema_text(schema: dict, param: str) -> str:
    """`schema` checked (bounds, contradictions, unenforced keywords) and as JSON text."""
    grammarlimits.check_schema(schema, param, UNENFORCED)
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:  # a Python caller's non-JSON value (a set, NaN is fine)
        raise RequestError(f"'{param}' is not JSON: {exc}"[:300], param=param, code="invalid_value") from None
    if len(text) > grammarlimits.MAX_SCHEMA_CHARS:
        raise RequestError(f"'{param}' is {len(text)} characters of JSON; the limit is "
                           f"{grammarlimits.MAX_SCHEMA_CHARS}", param=param, code="schema_too_large")
    return text


# Validation keywords llama-cpp-python's converter (0.3.36) passes over without enforcing them:
# refused, so that no output claims to match a schema it may break (OpenAI's strict mode refuses
# keywords it cannot enforce too). Annotations (title, description, default, ...) are fine.
UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then",
              "else", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
              "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies")


def grammar_text(grammar, param: str = "grammar") -> str:
    """GBNF text from `grammar`: a string or a llama_cpp.LlamaGrammar."""
    text = getattr(grammar, "_grammar", grammar)  # LlamaGrammar keeps its text there (0.3.x)
    if not isinstance(text, str):
        raise RequestError(f"'{param}' must be GBNF text or a llama_cpp.LlamaGrammar "
                           f"(got {type(grammar).__name__})", param=param, code="invalid_type")
    if not text.strip():
        raise RequestError(f"'{param}' is empty: give a GBNF grammar with a 'root' rule", param=param,
                           code="invalid_value")
    grammarlimits.check_gbnf(text, param)
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
        grammar_state.compile_gbnf(model, gbnf).close()
    except RequestError:
        raise
    except Exception as exc:
        raise RequestError(str(exc), param="grammar", code="invalid_value") from None
