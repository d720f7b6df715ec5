"""Request fields checked once, for the Python API and the HTTP server alike.

OpenAI clients send loosely typed JSON; `Llama`-style Python callers send keyword arguments.
Both go through the functions here, so a bad value is refused with the same message (and the
same OpenAI error `param`/`code`) whichever way it came in. `RequestError` is a `UserError`
(one line for the CLI) and a `ValueError` (what `llama_cpp.Llama` raises for bad arguments).
"""

from __future__ import annotations

from .errors import UserError


class RequestError(UserError, ValueError):
    """A request the server answers with an OpenAI-shaped error (status 400 unless said)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def to_dict(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


# name -> (accepted Python types, check, what the check means). Defaults are those of
# `specgguf.sampling.SamplingParams` (greedy), not OpenAI's temperature 1.0: greedy output
# is the target's own, token for token, which is what speculative decoding promises.
_NUM = (int, float)
SAMPLING_FIELDS = {
    "temperature": (_NUM, lambda v: v >= 0, "a number >= 0"),
    "top_k": ((int,), lambda v: v >= 0, "a whole number >= 0"),
    "top_p": (_NUM, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (_NUM, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repeat_penalty": (_NUM, lambda v: v > 0, "a number > 0"),
    "presence_penalty": (_NUM, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (_NUM, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "seed": ((int,), lambda v: -1 <= v < 1 << 64, "a whole number in [0, 2**64 - 1] (-1: random)"),
}


def _typed(name: str, value, types, meaning: str):
    # bool is an int in Python but never a number in JSON: refuse it explicitly
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise RequestError(f"'{name}' must be {meaning} (got {type(value).__name__} {value!r})"[:300], param=name,
                           code="invalid_type")
    return value


def sampling_fields(values: dict) -> dict:
    """The sampling fields that were given (not None), checked; unknown names are not looked at."""
    out = {}
    for name, (types, ok, meaning) in SAMPLING_FIELDS.items():
        value = values.get(name)
        if value is None:
            continue
        _typed(name, value, types, meaning)
        if not ok(value):
            raise RequestError(f"'{name}' must be {meaning} (got {value!r})", param=name, code="invalid_value")
        out[name] = value
    return out


def sampling_params(fields: dict):
    """`specgguf.sampling.SamplingParams` for `fields`, or None while that module is absent
    (the engine is then greedy, which is also what the defaults ask for)."""
    try:
        from .sampling import SamplingParams
    except ImportError:
        return None
    try:
        return SamplingParams(**fields)
    except (TypeError, ValueError, UserError) as exc:
        raise RequestError(str(exc), param=None, code="invalid_value") from None


def stop_strings(value, extra=()) -> list[str]:
    """OpenAI's `stop`: None, a string or a list of strings (llama.cpp accepts any count)."""
    if value is None:
        value = []
    elif isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    return [s for s in [*value, *extra] if s]


def flag(values: dict, name: str, default: bool = False) -> bool:
    value = values.get(name)
    if value is None:
        return default
    return _typed(name, value, (bool,), "true or false")


def max_tokens(value, default: int | None) -> int | None:
    """A whole number >= 0, or the default (None: whatever the context has left)."""
    if value is None:
        return default
    _typed("max_tokens", value, (int,), "a whole number >= 0")
    if value < 0:
        raise RequestError(f"'max_tokens' must be >= 0 (got {value})", param="max_tokens", code="invalid_value")
    return value


def fit_context(n_prompt: int, wanted: int | None, n_ctx: int) -> int:
    """The token budget for a prompt of n_prompt tokens; refuses what cannot fit, as OpenAI does."""
    room = n_ctx - n_prompt - 1  # the engine keeps one slot for the token being verified
    if room < 0:
        raise RequestError(f"the prompt has {n_prompt} tokens but the context holds {n_ctx}: shorten it",
                           param="messages" if wanted is None else "prompt", code="context_length_exceeded")
    if wanted is None:
        return room
    if n_prompt + wanted > n_ctx:
        raise RequestError(f"this model's context holds {n_ctx} tokens, but {n_prompt + wanted} were requested "
                           f"({n_prompt} in the prompt, {wanted} in 'max_tokens'): lower max_tokens",
                           param="max_tokens", code="context_length_exceeded")
    return wanted


def prompt_value(value):
    """`prompt` of a text completion: a string, or a list of token ids (one prompt only)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one, as some clients send it
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if value is None or value == "" or value == []:
        raise RequestError("'prompt' is required and must not be empty", param="prompt", code="missing_prompt")
    raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)",
                       param="prompt", code="invalid_type")


def messages_value(value) -> list[dict]:
    """`messages` of a chat completion: a non-empty list of {role, content} with text content."""
    if value is None:
        raise RequestError("'messages' is required", param="messages", code="missing_messages")
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list", param="messages", code="invalid_type")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]",
                               code="invalid_type")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only (no images on a text model)
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported",
                                   param=f"messages[{i}].content", code="invalid_value")
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content",
                               code="invalid_type")
        out.append({"role": m["role"], "content": content})
    return out


# Fields of llama_cpp.Llama's methods (and OpenAI's) that specgguf cannot honour: refused when
# set to something other than their "off" value, rather than silently ignored.
UNSUPPORTED = {"suffix": None, "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
               "n": (None, 1), "best_of": (None, 1), "tools": (None, []), "functions": (None, []),
               "grammar": None, "logit_bias": (None, {}), "response_format": None}


def refuse_unsupported(values: dict) -> None:
    for name, off in UNSUPPORTED.items():
        if name not in values:
            continue
        value, offs = values[name], off if isinstance(off, tuple) else (off,)
        if not any(value == o and type(value) is type(o) for o in offs):
            if name == "response_format" and value == {"type": "text"}:
                continue
            raise RequestError(f"'{name}' is not supported by specgguf", param=name, code="unsupported_parameter")
