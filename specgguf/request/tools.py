"""Tool calls: OpenAI's `tools` / `tool_choice` through the model's chat template, the model's
calls parsed back into OpenAI `tool_calls`, and a grammar when a call is forced.

Two call formats (docs/structured-output.md):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what Qwen2.5/Qwen3 and
  Hermes templates describe to the model (a template that mentions `<tool_call>`).
- `gemma`: `[name(key=value, ...)]` (optionally in a ```tool_code fence), the format Google's
  Gemma function-calling guide prompts for; Gemma's templates have no tool section.

A template that renders `tools` itself gets them (and the messages' `tool_calls` / `tool`
results) as the template expects. A model without a tools-aware template (or without a
template) gets a system message that lists the tools as JSON schemas and asks for the format
above (gemma for Gemma-family models, hermes otherwise); tool results are shown to it as user
turns. `tool_choice` "required" or a named function constrains the output with a grammar built
from the functions' JSON schemas: one call, then the end of the turn. "auto" parses whatever
calls the model writes; "none" leaves the output as text (the tools stay in the prompt).
"""

from __future__ import annotations

import ast
import json
import re
import uuid

from ..errors import RequestError
from . import grammarlimits

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128  # OpenAI's limit on functions in one request


def check_tools(value, forced: bool = True) -> list[dict]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
    forced: a call will be decoded under the schemas' grammar (tool_choice required or named)."""
    if not isinstance(value, list):
        raise RequestError("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", param="tools",
                           code="invalid_type")
    if len(value) > MAX_TOOLS:
        raise RequestError(f"'tools' has {len(value)} functions; the limit is {MAX_TOOLS}", param="tools",
                           code="invalid_value")
    out, names, chars = [], set(), 0
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               param=f"tools[{i}]", code="invalid_value")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError(f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-' "
                               f"(got {name!r})"[:200], param=f"tools[{i}].function.name", code="invalid_value")
        if name in names:
            raise RequestError(f"tools[{i}]: the function name {name!r} is given twice", param=f"tools[{i}]",
                               code="invalid_value")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               param=f"tools[{i}].function.parameters", code="invalid_type")
        # a forced call is decoded under the schemas' grammar, so each must convert within the
        # grammar bounds and use no keyword the grammar cannot enforce (maximum, format, ...); under
        # auto or none a schema only reaches the prompt, as at OpenAI's: it must be JSON of a
        # bounded size, whatever lengths it allows (agents' schemas allow 512k-character strings)
        from .constraints import prompt_schema, schema_grammar

        where = f"tools[{i}].function.parameters"
        chars += len(schema_grammar(params, where) if forced else prompt_schema(params, where))
        if chars > grammarlimits.MAX_GBNF_CHARS:
            raise RequestError(f"the grammars of 'tools' add up to over {grammarlimits.MAX_GBNF_CHARS} characters, "
                               "the limit: send fewer or smaller functions", param="tools", code="grammar_too_large")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise RequestError(f"tools[{i}].function.description must be a string",
                               param=f"tools[{i}].function.description", code="invalid_type")
        f = {"name": name, "parameters": params}
        if desc is not None:
            f["description"] = desc
        out.append({"type": "function", "function": f})
    return out


def check_choice(value, tools: list[dict]):
    """'none', 'auto', 'required' or a function name (from {"type": "function", "function": {"name"}})."""
    if value is None:
        return "auto" if tools else "none"
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise RequestError("'tool_choice' is 'required' but no 'tools' were given", param="tool_choice",
                               code="invalid_value")
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if not any(t["function"]["name"] == name for t in tools):
            raise RequestError(f"'tool_choice' names the function {name!r}, which is not in 'tools'"[:200],
                               param="tool_choice", code="invalid_value")
        return name
    raise RequestError("'tool_choice' must be 'none', 'auto', 'required' or "
                       '{"type": "function", "function": {"name": ...}}', param="tool_choice", code="invalid_value")


class ToolSet:
    """The tools of one chat request: how they reach the prompt, and how calls come back."""

    def __init__(self, tools: list[dict], choice: str, template: str | None, arch: str, parallel: bool = True):
        self.tools, self.choice, self.parallel = tools, choice, parallel
        self.in_template = bool(template) and "tools" in template
        if self.in_template or not arch.startswith("gemma"):
            self.format = "hermes"
        else:
            self.format = "gemma"

    @classmethod
    def from_request(cls, values: dict, template: str | None, arch: str) -> "ToolSet | None":
        if values.get("functions") is not None or values.get("function_call") is not None:
            raise RequestError("'functions' / 'function_call' (OpenAI's deprecated form) are not supported: "
                               "send 'tools' and 'tool_choice'", param="functions", code="unsupported_parameter")
        parallel = values.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise RequestError(f"'parallel_tool_calls' must be true or false (got {type(parallel).__name__} "
                               f"{parallel!r})"[:200], param="parallel_tool_calls", code="invalid_type")
        choice = values.get("tool_choice")
        forced = choice == "required" or isinstance(choice, dict)
        tools = check_tools(values["tools"], forced) if values.get("tools") is not None else []
        choice = check_choice(values.get("tool_choice"), tools)
        return cls(tools, choice, template, arch, parallel is not False) if tools else None

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    # -- the prompt ---------------------------------------------------------------------------
    def messages(self, messages: list[dict]) -> list[dict]:
        """The messages as the template should see them (the fallback's system message added)."""
        if self.in_template:
            return messages
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["content"] = (m.get("content") or "") + "".join(self._render_call(c) for c in m["tool_calls"])
                m.pop("tool_calls")
            if m["role"] == "tool":
                m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
            out.append(m)
        desc = self.system_text()
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + desc}
        else:
            out.insert(0, {"role": "system", "content": desc})
        return out

    def system_text(self) -> str:
        listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in self.tools)
        if self.format == "gemma":
            how = ("If you decide to invoke any of the function(s), you MUST put it in the format of "
                   "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. "
                   "You SHOULD NOT include any other text in the response if you call a function.")
        else:
            how = ("To call a function, answer with one <tool_call></tool_call> block per call, each holding "
                   'a JSON object {"name": <function name>, "arguments": <arguments object>}.')
        return f"You can call these functions:\n{listing}\n{how}"

    def _render_call(self, call: dict) -> str:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "{}")
        args = json.loads(args) if isinstance(args, str) and args.strip() else (args or {})
        if self.format == "gemma":
            kw = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
            return f"[{fn.get('name')}({kw})]"
        body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
        return f"{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}"

    # -- forcing a call -------------------------------------------------------------------------
    def grammar(self) -> str | None:
        """GBNF for tool_choice 'required' (any one function) or a named function; else None."""
        if self.choice in ("none", "auto"):
            return None
        from .constraints import _JSON_CHAR, _LOOSE_CHAR, converter

        fns = [t["function"] for t in self.tools if self.choice == "required" or t["function"]["name"] == self.choice]
        conv = converter(prop_order={"name": 0, "arguments": 1})
        try:
            if self.format == "gemma":
                calls = [self._gemma_call(conv, f) for f in fns]
                conv._add_rule("root", '"[" (' + " | ".join(calls) + ') "]"')
            else:
                schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                                      "arguments": f["parameters"]},
                                     "required": ["name", "arguments"]} for f in fns]}
                body = conv.visit(conv.resolve_refs(schema, "tools"), "tool-call")
                conv._add_rule("root", f'"{HERMES_OPEN}\\n" {body} "\\n{HERMES_CLOSE}"')
        except Exception as exc:
            raise RequestError(f"the parameters of a function in 'tools' are not a JSON schema llama-cpp-python "
                               f"can turn into a grammar: {type(exc).__name__}: {exc}"[:400], param="tools",
                               code="invalid_value") from None
        gbnf = conv.format_grammar().replace(_LOOSE_CHAR, _JSON_CHAR)
        grammarlimits.check_gbnf(gbnf, "tools")
        return gbnf

    @staticmethod
    def _gemma_call(conv, fn: dict) -> str:
        params = conv.resolve_refs(fn["parameters"], "tools")
        props = params.get("properties") or {}
        required = [k for k in props if k in set(params.get("required") or ())]
        optional = [k for k in props if k not in required]
        parts, first = [], True
        for k in required + optional:
            rule = conv.visit(props[k], f"{fn['name']}-{k}")
            arg = f'"{"" if first else ", "}{k}=" {rule}'
            parts.append(arg if k in required else f"({arg})?")
            first = False
        return f'"{fn["name"]}(" ' + " ".join(parts) + ' ")"' if parts else f'"{fn["name"]}()"'

    # -- reading calls back ---------------------------------------------------------------------
    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a whole answer; no calls: (text, [])."""
        if not self.parses:
            return text, []
        found = _parse_gemma(text) if self.format == "gemma" else _parse_hermes(text)
        if found is None:
            return text, []
        content, calls = found
        if not self.parallel:  # parallel_tool_calls: false, as OpenAI: at most one call per answer
            calls = calls[:1]
        return (content or None), [openai_call(name, args) for name, args in calls]

    def stream(self, pieces):
        """Text pieces in; out come text pieces (content) and lists of tool-call deltas."""
        if not self.parses:
            yield from pieces
            return
        held, index, in_call = "", 0, False
        mode = self.format  # "gemma" until the first visible character says call or text
        for piece in pieces:
            if mode == "text":
                yield piece
                continue
            held += piece
            if mode == "gemma":  # a call is the whole answer: hold what could start one
                if held.lstrip() and not held.lstrip().startswith(("[", "`")):
                    yield held
                    held, mode = "", "text"
                continue
            while True:
                if not in_call:
                    at = held.find(HERMES_OPEN)
                    if at < 0:
                        keep = _partial_suffix(held, HERMES_OPEN)
                        if len(held) > keep and (index == 0 or held[:len(held) - keep].strip()):
                            yield held[:len(held) - keep]
                            held = held[len(held) - keep:]
                        break
                    if at and (index == 0 or held[:at].strip()):
                        yield held[:at]
                    held, in_call = held[at:], True
                end = held.find(HERMES_CLOSE)
                if end < 0:
                    break
                block, held, in_call = held[:end + len(HERMES_CLOSE)], held[end + len(HERMES_CLOSE):], False
                found = _parse_hermes(block)
                if found is None or not found[1]:
                    yield block
                    continue
                for name, args in found[1]:
                    if self.parallel or index == 0:
                        yield call_deltas(index, openai_call(name, args))
                        index += 1
        if held:
            content, calls = self.parse(held)
            if content:
                yield content
            for call in calls:
                if self.parallel or index == 0:
                    yield call_deltas(index, call)
                    index += 1


def openai_call(name: str, args) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def call_deltas(index: int, call: dict) -> list[dict]:
    """A call as OpenAI streams it: id, type and name first, then the arguments."""
    head = {"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}
    return [head, {"index": index, "function": {"arguments": call["function"]["arguments"]}}]


def _partial_suffix(text: str, opener: str) -> int:
    """How many trailing characters of `text` could be the start of `opener`."""
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0


_HERMES_BLOCK = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(HERMES_CLOSE) + r"|$)", re.S)


def _parse_hermes(text: str):
    at = text.find(HERMES_OPEN)
    if at < 0:
        return None
    calls = []
    for m in _HERMES_BLOCK.finditer(text, at):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        calls.append((obj["name"], args))
    return text[:at].strip(), calls


_FENCE = re.compile(r"```(?:tool_code|python)?\s*(.*?)\s*```", re.S)
_JSON_NAMES = {"true": True, "false": False, "null": None}


def _parse_gemma(text: str):
    m = _FENCE.search(text)
    expr, content = (m.group(1), text[:m.start()].strip()) if m else (text.strip(), "")
    if not expr.startswith("["):
        expr = f"[{expr}]"
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            calls.append((node.func.id, {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}))
        except ValueError:
            return None
    return content, calls


def _literal(node):
    """A Python or JSON literal (true/false/null as JSON spells them)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)
