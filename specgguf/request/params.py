"""Request fields checked once, for the Python API and the HTTP server alike.

OpenAI clients send loosely typed JSON; `Llama`-style Python callers send keyword arguments.
Both go through the functions here, so a bad value is refused with the same message (and the
same OpenAI error `param`/`code`) whichever way it came in. `RequestError` is a `UserError`
(one line for the CLI) and a `ValueError` (what `llama_cpp.Llama` raises for bad arguments).
"""

from __future__ import annotations

import json
import math

from ..decoding.sampling import MIN_TEMPERATURE  # with |logit_bias| <= MAX_BIAS (1e6), logits / T stay under 1e9
from ..errors import RequestError, UserError

FLOAT32_MAX = 3.4028234663852886e38  # logits are float32: a larger number becomes inf (and NaN after)


def finite32(value) -> bool:
    """A number that float32 holds without overflowing (NaN and +-inf are not)."""
    try:
        return math.isfinite(value) and abs(value) <= FLOAT32_MAX
    except OverflowError:  # an int too large for a float
        return False


# name -> (accepted Python types, check, what the check means). Defaults are those of
# `specgguf.decoding.sampling.SamplingParams` (greedy), not OpenAI's temperature 1.0: greedy output
# is the target's own, token for token, which is what speculative decoding promises.
_NUM = (int, float)
SAMPLING_FIELDS = {
    # 0 is greedy; below 1e-3 the sampler's logits / T leave float32's precision (1e-30 overflowed)
    "temperature": (_NUM, lambda v: v == 0 or v >= MIN_TEMPERATURE, "0 (greedy) or a number >= 0.001"),
    "top_k": ((int,), lambda v: v >= 0, "a whole number >= 0"),
    "top_p": (_NUM, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (_NUM, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repeat_penalty": (_NUM, lambda v: v > 0, "a number > 0"),
    "presence_penalty": (_NUM, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (_NUM, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "seed": ((int,), lambda v: -1 <= v < 1 << 64, "a whole number in [0, 2**64 - 1] (-1: random)"),
}


def json_type(value) -> str:
    """A value's type in JSON's words (what a client sent), for error messages."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


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
        if name != "seed" and not finite32(value):  # inf passes `v >= 0`; 1e39 is inf in float32
            raise RequestError(f"'{name}' must be {meaning}, finite in float32 (|x| <= 3.4e38; got "
                               f"{value!r})"[:300], param=name, code="invalid_value")
        if not ok(value):
            raise RequestError(f"'{name}' must be {meaning} (got {value!r})", param=name, code="invalid_value")
        if name == "seed" and value in (-1, 0xFFFFFFFF):  # Llama's "random seed" values
            continue
        out[name] = value
    return out


def sampling_params(fields: dict):
    """`specgguf.decoding.sampling.SamplingParams` for `fields`, or None while that module is absent
    (the engine is then greedy, which is also what the defaults ask for)."""
    try:
        from ..decoding.sampling import SamplingParams
    except ImportError:
        return None
    try:
        return SamplingParams(**fields)
    except (TypeError, ValueError, UserError) as exc:  # the field SamplingParams names, as the checks above
        raise RequestError(str(exc), param=getattr(exc, "param", None), code="invalid_value") from None


MAX_STOP = 64  # stop strings per request (OpenAI allows 4; every one is matched after every token)
MAX_STOP_CHARS = 4096  # characters in one stop string


def stop_strings(value, extra=()) -> list[str]:
    """OpenAI's `stop`: None, a string or a list of strings (at most MAX_STOP, each at most
    MAX_STOP_CHARS characters)."""
    if value is None:
        value = []
    elif isinstance(value, str):
        value = [value]
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    if len(value) > MAX_STOP:
        raise RequestError(f"'stop' has {len(value)} strings; the limit is {MAX_STOP}", param="stop",
                           code="invalid_value")
    for s in value:
        if len(s) > MAX_STOP_CHARS:
            raise RequestError(f"a 'stop' string has {len(s)} characters; the limit is {MAX_STOP_CHARS}",
                               param="stop", code="invalid_value")
        text_value(s, "stop")
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


def text_value(value: str, param: str) -> str:
    """Text that can be encoded as UTF-8 (what the tokenizer takes): a lone surrogate, which is
    how Python carries invalid UTF-8 from a shell argument, a file or a JSON escape, is refused."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"'{param}' is not valid UTF-8 text: character {exc.start} is a lone surrogate "
                           f"({value[exc.start]!r}, from invalid bytes or a broken escape); send valid UTF-8",
                           param=param, code="invalid_value") from None
    return value


# The roles chat templates know; anything else is refused rather than rendered as nonsense.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def prompt_value(value):
    """`prompt` of a text completion: a string, or a list of token ids (one prompt only)."""
    if not isinstance(value, (str, list, type(None))):  # a numpy array, bytes, a tuple, a number ...
        kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
        hint = ": pass prompt.tolist()" if hasattr(value, "tolist") else (
            ": decode it to str first" if isinstance(value, (bytes, bytearray)) else "")
        raise RequestError(f"'prompt' must be a string or a list of token ids (got {kind}){hint}",
                           param="prompt", code="invalid_type")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one, as some clients send it
    if isinstance(value, str) and value:
        return text_value(value, "prompt")
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
        if m["role"] not in CHAT_ROLES:
            raise RequestError(f"messages[{i}].role {m['role'][:40]!r} is not a chat role: use one of "
                               f"{', '.join(CHAT_ROLES)}", param=f"messages[{i}].role", code="invalid_value")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only (no images on a text model)
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported",
                                   param=f"messages[{i}].content", code="invalid_value")
            content = "".join(p["text"] for p in content)
        if content is None and m["role"] != "assistant":  # an assistant may answer with tool calls only
            raise RequestError(f"messages[{i}].content is missing: a {m['role']} message needs text",
                               param=f"messages[{i}].content", code="invalid_type")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content",
                               code="invalid_type")
        msg = {"role": m["role"], "content": text_value(content, f"messages[{i}].content")}
        msg.update(_tool_fields(m, i))
        out.append(msg)
    return out


def _tool_fields(m: dict, i: int) -> dict:
    """What a tools-aware template reads besides the text: an assistant's `tool_calls` (their
    arguments as objects, as templates print them) and a tool result's `tool_call_id` / `name`."""
    out = {}
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise RequestError(f"messages[{i}].{key} must be a string", param=f"messages[{i}].{key}",
                                   code="invalid_type")
            out[key] = m[key]
    calls = m.get("tool_calls")
    if calls is None:
        return out
    if not isinstance(calls, list):
        raise RequestError(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls",
                           code="invalid_type")
    out["tool_calls"] = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"messages[{i}].tool_calls[{j}] must be an object with a 'function' that has a "
                               "string 'name'", param=f"messages[{i}].tool_calls", code="invalid_value")
        args = fn.get("arguments") or "{}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except RecursionError:  # a string nesting 100k brackets: json's own limit (a 500 before)
                raise RequestError(f"messages[{i}].tool_calls[{j}].function.arguments nests too deeply",
                                   param=f"messages[{i}].tool_calls", code="invalid_value") from None
            except ValueError:
                raise RequestError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON",
                                   param=f"messages[{i}].tool_calls", code="invalid_value") from None
        out["tool_calls"].append({"id": c.get("id"), "type": "function",
                                  "function": {"name": fn["name"], "arguments": args}})
    return out


# Fields of llama_cpp.Llama's methods (and OpenAI's) that specgguf cannot honour: refused when
# set to something other than their "off" value, rather than silently ignored.
UNSUPPORTED = {"suffix": None, "best_of": (None, 1), "functions": (None, []), "function_call": None,
               # llama_cpp.Llama's samplers that specgguf does not run: only their "off" values pass
               "typical_p": (None, 1.0, 1), "tfs_z": (None, 1.0, 1), "mirostat_mode": (None, 0),
               "mirostat_tau": (None, 5.0, 5), "mirostat_eta": (None, 0.1), "stopping_criteria": None,
               "logits_processor": None}


def refuse_unsupported(values: dict) -> None:
    for name, off in UNSUPPORTED.items():
        if name not in values:
            continue
        value, offs = values[name], off if isinstance(off, tuple) else (off,)
        if not any(value == o and type(value) is type(o) for o in offs):
            if name == "response_format" and value == {"type": "text"}:
                continue
            off_value = next((o for o in offs if type(o) in (int, float)), None)
            hint = f": leave it out (or at {off_value!r}, which is off)" if off_value is not None else ""
            raise RequestError(f"'{name}' is not supported by specgguf{hint}", param=name,
                               code="unsupported_parameter")


# -- Llama's and OpenAI's per-request extras: n, echo, logprobs, logit_bias, stream_options --------

# Keyword arguments of llama_cpp.Llama.create_completion / create_chat_completion, plus OpenAI's
# n and stream_options (and max_completion_tokens): anything else is a TypeError in Python,
# as calling Llama with it would be. The HTTP server ignores fields it does not know, as OpenAI does.
COMPLETION_KEYS = {"prompt", "suffix", "max_tokens", "temperature", "top_p", "min_p", "typical_p", "logprobs",
                   "echo", "stop", "frequency_penalty", "presence_penalty", "repeat_penalty", "top_k", "stream",
                   "seed", "tfs_z", "mirostat_mode", "mirostat_tau", "mirostat_eta", "model", "stopping_criteria",
                   "logits_processor", "grammar", "logit_bias", "n", "best_of", "stream_options", "specgguf",
                   "prediction"}
CHAT_KEYS = {"messages", "functions", "function_call", "tools", "tool_choice", "temperature", "top_p", "top_k",
             "min_p", "typical_p", "stream", "stop", "seed", "response_format", "max_tokens", "presence_penalty",
             "frequency_penalty", "repeat_penalty", "tfs_z", "mirostat_mode", "mirostat_tau", "mirostat_eta", "model",
             "logits_processor", "grammar", "logit_bias", "logprobs", "top_logprobs", "n", "stream_options",
             "max_completion_tokens", "parallel_tool_calls", "specgguf", "prediction", "reasoning_effort"}

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
MAX_LOGIT_BIAS = 1 << 16  # entries of logit_bias (OpenAI allows 300; a 262k vocabulary may want more bans)
MAX_BIAS = 1e6  # |bias| beyond -inf: logits are ~±30, so ±1e6 already forces or bans a token; larger
# values only move float32 arithmetic toward overflow (bias / temperature)
MAX_N = 128  # OpenAI's limit for n


def check_keywords(kwargs: dict, chat: bool) -> None:
    known = CHAT_KEYS if chat else COMPLETION_KEYS
    for name in kwargs:
        if name not in known:
            method = "create_chat_completion" if chat else "create_completion"
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")


def token_ids(value, param: str, n_vocab: int) -> list[int]:
    """A list of token ids inside the vocabulary."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in value):
        raise RequestError(f"'{param}' must be a list of token ids", param=param, code="invalid_type")
    bad = next((t for t in value if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise RequestError(f"'{param}' holds token id {bad}, outside the vocabulary [0, {n_vocab})", param=param,
                           code="invalid_value")
    return list(value)


def logit_bias_value(value, n_vocab: int) -> tuple:
    """OpenAI's/Llama's logit_bias ({token id: bias}, ids as ints or, from JSON, as strings) as
    sorted (id, bias) pairs; -inf bans a token. Empty or None: ()."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must be an object mapping token ids to numbers", param="logit_bias",
                           code="invalid_type")
    if len(value) > MAX_LOGIT_BIAS:
        raise RequestError(f"'logit_bias' has {len(value)} entries; the limit is {MAX_LOGIT_BIAS}",
                           param="logit_bias", code="invalid_value")
    out = {}
    for key, bias in value.items():
        tok = key
        if isinstance(key, str) and key.isascii() and key.strip().lstrip("-").isdigit():  # not int("१")
            tok = int(key)
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < n_vocab:
            raise RequestError(f"'logit_bias' key {key!r} is not a token id in [0, {n_vocab})", param="logit_bias",
                               code="invalid_value")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or (
                bias != float("-inf") and not (finite32(bias) and abs(bias) <= MAX_BIAS)):
            raise RequestError(f"'logit_bias' value for token {tok} must be a number in [-{MAX_BIAS:g}, "
                               f"{MAX_BIAS:g}] or -inf to ban it (got {bias!r})"[:300], param="logit_bias",
                               code="invalid_value")
        out[tok] = float(bias)
    if len(out) >= n_vocab and all(b == float("-inf") for b in out.values()):
        raise RequestError(f"'logit_bias' bans every token of the vocabulary ({n_vocab}): nothing could be "
                           "generated; leave some token allowed", param="logit_bias", code="invalid_value")
    return tuple(sorted(out.items()))


def _count(values: dict, name: str, low: int, high: int, default):
    value = values.get(name)
    if value is None:
        return default
    _typed(name, value, (int,), f"a whole number in [{low}, {high}]")
    if not low <= value <= high:
        raise RequestError(f"'{name}' must be in [{low}, {high}] (got {value})", param=name, code="invalid_value")
    return value


def choice_options(values: dict, chat: bool, stream: bool) -> dict:
    """n, echo, logprobs (None or how many top alternatives) and include_usage, checked.

    Completions: logprobs is a count (Llama's and OpenAI's legacy API). Chat: logprobs is true
    or false and top_logprobs the count, as OpenAI's chat API; top_logprobs alone is refused."""
    n = _count(values, "n", 1, MAX_N, 1)
    echo = flag(values, "echo")
    if chat:
        if echo:
            raise RequestError("'echo' applies to text completions only", param="echo", code="invalid_value")
        top = _count(values, "top_logprobs", 0, MAX_TOP_LOGPROBS, None)
        if flag(values, "logprobs"):
            logprobs = top or 0
        elif top is not None:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value")
        else:
            logprobs = None
    else:
        if values.get("top_logprobs") is not None:
            raise RequestError("'top_logprobs' belongs to chat completions; completions take 'logprobs': <count>",
                               param="top_logprobs", code="invalid_value")
        logprobs = None if values.get("logprobs") is False else _count(values, "logprobs", 0, MAX_TOP_LOGPROBS, None)
        if echo and logprobs is not None:
            raise RequestError("'echo' with 'logprobs' is not supported: the prompt's logprobs are not computed "
                               "(the prompt is read without outputs); ask for one or the other",
                               param="echo", code="unsupported_parameter")
    options = values.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("'stream_options' must be an object", param="stream_options", code="invalid_type")
        if not stream:
            raise RequestError("'stream_options' is only allowed when 'stream' is true", param="stream_options",
                               code="invalid_value")
        unknown = sorted(set(options) - {"include_usage"})
        if unknown:
            raise RequestError(f"'stream_options' has unknown fields: {', '.join(unknown)}", param="stream_options",
                               code="invalid_value")
        include_usage = flag(options, "include_usage")
    return {"n": n, "echo": echo, "logprobs": logprobs, "include_usage": include_usage}


# -- Predicted Outputs ---------------------------------------------------------------------------

def prediction_text(value) -> str | None:
    """OpenAI's `prediction`: {"type": "content", "content": text or [{"type": "text", "text": ...}]}
    (a bare string is taken too, as Python callers may pass one); None when absent or empty."""
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    where = "'prediction' must be {\"type\": \"content\", \"content\": <text or text parts>}"
    if not isinstance(value, dict):
        raise RequestError(f"{where} (got {type(value).__name__})", param="prediction", code="invalid_type")
    unknown = sorted(set(value) - {"type", "content"})
    if value.get("type") != "content" or unknown:
        got = f"unknown fields: {', '.join(unknown)}" if unknown else f"type {value.get('type')!r}"
        raise RequestError(f"{where} ({got})"[:300], param="prediction", code="invalid_value")
    content = value.get("content")
    if isinstance(content, str):
        return content or None
    if not isinstance(content, list) or not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        raise RequestError(f"{where}: 'content' must be a string or a list of {{\"type\": \"text\", \"text\": ...}} "
                           "parts", param="prediction.content", code="invalid_value")
    return "".join(p["text"] for p in content) or None


def reasoning_effort(values: dict) -> str | None:
    """Chat Completions' `reasoning_effort`, checked (request/chat.py maps it to a thinking switch)."""
    from .chat import EFFORTS

    effort = values.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise RequestError(f"'reasoning_effort' must be one of {', '.join(EFFORTS)} (got {effort!r})"[:300],
                           param="reasoning_effort", code="invalid_value")
    return effort
