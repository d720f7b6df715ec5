"""Bounds on the grammar work one request may ask for, checked before any of it is done.

llama-cpp-python's schema converter writes a bounded repetition (`maxLength`, `maxItems`, a
pattern's `{m,n}`) as nested optional groups, `(c (c (c)?)?)?`, one level per optional item,
and llama.cpp's GBNF parser reads a group by recursion (parse_sequence -> parse_alternates), so
a `maxLength` of 20000 overflowed the C stack: the process died with SIGSEGV, no exception.
Below that, llama.cpp refuses a `?` group holding over 2000 generated rules
(MAX_REPETITION_THRESHOLD), which the chain reaches at a span (max - min) of 1001, with a
message about "sane defaults" that names no keyword. constraints.converter writes `maxLength`
and `maxItems` as a flat chain of rules instead (any span up to MAX_REPEAT); a pattern's
quantifiers keep the nested form, so their span is held to MAX_SPAN here, with the keyword.
A schema with hundreds of optional properties makes the converter recurse once per property
(a RecursionError past ~990) and build rules in time quadratic in their number. So the schema
is walked first (no recursion here, whatever its depth) and refused with the keyword and the
limit when it asks for more than these bounds; the GBNF text, converted or given, is bounded too.

The bounds are far above what real schemas use (OpenAI's structured outputs allow 10 levels of
nesting and 5000 properties in all) and far below what breaks llama.cpp: the numbers behind them
are in docs/structured-output.md ("Limits"), measured with scripts/grammar_limits.py.
"""

from __future__ import annotations

import re

from ..errors import RequestError

MAX_REPEAT = 16384  # any minLength, maxLength, minItems, maxItems and pattern {m,n} bound
MAX_SPAN = 1000  # n - m of a pattern's {m,n}: llama.cpp refuses a nested optional chain of more (below)
MAX_EXPANSION = 65536  # the bounds summed over the whole schema (each costs a rule per unit)
MAX_DEPTH = 32  # subschemas inside subschemas
MAX_NODES = 10000  # subschemas in all (properties, items, anyOf members, $defs, ...)
MAX_PROPERTIES = 512  # properties of one object (the converter recurses once per optional one)
MAX_PROPERTY_WORK = 2 * 512 ** 2  # the sum of (properties per object)^2: the converter's time is quadratic
MAX_SCHEMA_CHARS = 1 << 20  # the schema as JSON text (enums, consts and names included)
MAX_GBNF_CHARS = 4 << 20  # GBNF text handed to llama.cpp, converted or given
MAX_GBNF_NESTING = 2048  # parentheses inside parentheses in GBNF (SIGSEGV at ~19000 on an 8 MiB stack)
LLAMA_MAX_REPETITION = 2000  # llama.cpp's own cap on GBNF {m,n}: past it a max is silently dropped

_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
_SUB_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_MAPS = ("properties", "$defs", "definitions")
_SUB_ONE = ("items", "additionalProperties")


def _refuse(param: str, where: str, message: str, code: str = "schema_too_large") -> RequestError:
    at = f" at {where}" if where else ""
    return RequestError(f"'{param}'{at}: {message}", param=param, code=code)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_schema(schema, param: str, unenforced=()) -> None:
    """Refuse a schema that is too large or deep to convert safely, that contradicts itself
    (minItems > maxItems, minLength > maxLength), or that uses a keyword in `unenforced`."""
    total = nodes = work = 0
    todo = [(schema, "", 0)]
    while todo:
        node, where, depth = todo.pop()
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > MAX_NODES:
            raise _refuse(param, "", f"the schema has more than {MAX_NODES} subschemas, the limit")
        if depth > MAX_DEPTH:
            raise _refuse(param, where, f"subschemas nest {depth} deep; the limit is {MAX_DEPTH}")
        for key in unenforced:
            if key in node:
                raise _refuse(param, where, f"uses '{key}', which llama-cpp-python's schema-to-grammar converter "
                                            "does not enforce: remove it (or express it with enum, pattern, "
                                            "maxLength or maxItems)", "unsupported_schema")
        for key in _REPEAT_KEYS:
            if key in node:
                value = node[key]
                if not _whole(value) or value < 0:
                    raise _refuse(param, where, f"'{key}' must be a whole number >= 0 (got {value!r})"[:200],
                                  "invalid_value")
                if value > MAX_REPEAT:
                    raise _refuse(param, where, f"'{key}' is {value}; the limit is {MAX_REPEAT} (a grammar "
                                                "repeats its item once per unit)")
        for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
            if low in node and high in node and node[low] > node[high]:
                raise _refuse(param, where, f"'{low}' ({node[low]}) is larger than '{high}' ({node[high]}): "
                                            "no value can match", "invalid_value")
        total += max((node.get(k, 0) for k in _REPEAT_KEYS), default=0)
        pattern = node.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise _refuse(param, where, f"'pattern' must be a string (got {type(pattern).__name__})",
                              "invalid_value")
            total += pattern_cost(pattern, param, where)
        if total > MAX_EXPANSION:
            raise _refuse(param, where, f"the schema's repetition bounds (maxLength, maxItems, pattern "
                                        f"quantifiers, ...) add up to more than {MAX_EXPANSION}, the limit")
        props = node.get("properties")
        if isinstance(props, dict):
            if len(props) > MAX_PROPERTIES:
                raise _refuse(param, where, f"an object has {len(props)} properties; the limit is {MAX_PROPERTIES}")
            work += len(props) ** 2
            if work > MAX_PROPERTY_WORK:
                raise _refuse(param, where, f"the schema's objects have too many properties together (the sum "
                                            f"of their squares is over {MAX_PROPERTY_WORK}, the limit)")
        required = node.get("required")
        if required is not None and (not isinstance(required, list) or
                                     not all(isinstance(r, str) for r in required)):
            raise _refuse(param, where, "'required' must be a list of property names", "invalid_value")
        for key in _SUB_LISTS:
            subs = node.get(key)
            if subs is None:
                continue
            if not isinstance(subs, list):
                raise _refuse(param, where, f"'{key}' must be a list of schemas", "invalid_value")
            todo.extend((sub, f"{where}/{key}/{i}", depth + 1) for i, sub in enumerate(subs))
        for key in _SUB_MAPS:
            subs = node.get(key)
            if subs is None:
                continue
            if not isinstance(subs, dict):
                raise _refuse(param, where, f"'{key}' must be an object of schemas", "invalid_value")
            todo.extend((sub, f"{where}/{key}/{name}"[:200], depth + 1) for name, sub in subs.items())
        for key in _SUB_ONE:
            sub = node.get(key)
            if isinstance(sub, list):  # draft-04 tuple items
                todo.extend((s, f"{where}/{key}/{i}", depth + 1) for i, s in enumerate(sub))
            elif sub is not None:
                todo.append((sub, f"{where}/{key}", depth + 1))


_QUANT = re.compile(r"\{(\d*)(,?)(\d*)\}")


def pattern_cost(pattern: str, param: str, where: str = "") -> int:
    """The grammar levels a regular expression's quantifiers expand to (their bounds summed);
    a bound over MAX_REPEAT is refused. Escapes and character classes are skipped."""
    cost, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class: ']' right after '[' or '[^' is a literal
            i += 2 if pattern.startswith("[^", i) else 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            continue
        if c == "{":
            m = _QUANT.match(pattern, i)
            if m and (m.group(1) or m.group(3)):
                bounds = [int(g) for g in (m.group(1), m.group(3)) if g]
                low = int(m.group(1) or 0)
                high = int(m.group(3)) if m.group(3) else (None if m.group(2) else low)
                if max(bounds) > MAX_REPEAT or (high is not None and high - low > MAX_SPAN):
                    raise _refuse(param, where, f"'pattern' repeats {m.group(0)}; the limits for a quantifier "
                                                f"{{m,n}} are n <= {MAX_REPEAT} and n - m <= {MAX_SPAN}")
                cost += max(bounds)
                i = m.end()
                continue
        i += 1
    return cost


def check_gbnf(text: str, param: str) -> None:
    """Refuse GBNF that is too large, nests parentheses deeper than llama.cpp's parser can
    recurse, or has an {m,n} bound that llama.cpp would refuse or silently drop."""
    if len(text) > MAX_GBNF_CHARS:
        raise RequestError(f"'{param}': the grammar is {len(text)} characters; the limit is {MAX_GBNF_CHARS}",
                           param=param, code="grammar_too_large")
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':  # a literal: skip to its closing quote
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "[":  # a character class
            i += 1
            while i < n and text[i] != "]":
                i += 2 if text[i] == "\\" else 1
        elif c == "#":  # a comment, to the end of the line
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_GBNF_NESTING:
                raise RequestError(f"'{param}': the grammar nests parentheses more than {MAX_GBNF_NESTING} deep, "
                                   "the limit", param=param, code="grammar_too_large")
        elif c == ")":
            depth -= 1
        elif c == "{":
            m = _QUANT.match(text, i)
            if m:
                bounds = [int(g) for g in (m.group(1), m.group(3)) if g]
                if bounds and max(bounds) > LLAMA_MAX_REPETITION:
                    raise RequestError(f"'{param}': the repetition {m.group(0)} is over llama.cpp's limit of "
                                       f"{LLAMA_MAX_REPETITION} (past it llama.cpp drops the maximum or refuses "
                                       "the grammar)", param=param, code="grammar_too_large")
                i = m.end()
                continue
        i += 1
