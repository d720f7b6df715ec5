"""A request in, checked and tokenized: `Request`, ready to run (completions.py shapes what it returns).

`prepare(llm, body, chat)` takes an OpenAI/Llama-style body (a JSON body, or the keyword
arguments of create_completion / create_chat_completion) and checks every field once, for the
Python API and the HTTP server alike; `llm` is the `SpecGGUF` it will run on (its target, chat
format, seed and penalty window).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from . import constraints, params
from .chat import effort_thinks
from .tools import ToolSet
from .trace import trace_option


@dataclass
class Request:
    """A checked request, ready to run: prompt tokens, token budget, stop strings, sampling."""

    tokens: list[int]
    max_tokens: int
    stop: list[str]
    sampling: dict
    chat: bool
    stream: bool = False
    model: str | None = None
    n: int = 1  # choices, run one after another
    echo: bool = False  # completions: the prompt's text leads the returned text
    logprobs: int | None = None  # None: no logprobs; k: the target's logprobs with the top k
    include_usage: bool = False  # stream_options.include_usage: a separate final usage chunk
    prompt_text: str = ""  # completions: the prompt as text (echo, logprobs' text_offset)
    grammar: str | None = None  # GBNF the output follows (grammar, response_format, a forced tool call)
    tools: ToolSet | None = None  # chat: the request's tools, whose calls are parsed from the output
    trace: bool = False  # specgguf's stream extension (request/trace.py)
    prediction: list[int] | None = None  # Predicted Outputs: tokens the output should repeat (drafted from)


def prepare(llm, body: dict, chat: bool) -> Request:
    """Check an OpenAI/Llama-style request and tokenize it.

    Raises `params.RequestError` (a ValueError) with the OpenAI `param` and `code`.
    """
    params.refuse_unsupported(body)
    sampling = params.sampling_fields(body)
    if "seed" not in sampling and llm.seed is not None:
        sampling["seed"] = llm.seed  # the constructor's seed, as Llama(seed=...)
    if llm.penalty_last_n != 64:
        sampling["penalty_last_n"] = llm.penalty_last_n  # Llama's last_n_tokens_size
    bias = params.logit_bias_value(body.get("logit_bias"), llm.n_vocab())
    if bias:
        sampling["logit_bias"] = bias
    params.sampling_params(sampling)  # refuse what SamplingParams refuses, before queueing
    stream = params.flag(body, "stream")
    extras = params.choice_options(body, chat, stream)
    grammar, toolset = structure(llm, body, chat)
    if chat:
        # reasoning_effort turns the template's thinking switch (chat.py); the Messages and
        # Responses translations set it from Anthropic's `thinking` and `reasoning.effort`
        template_vars = llm.chat_format.thinking_vars(effort_thinks(params.reasoning_effort(body)))
        tokens = chat_tokens(llm, params.messages_value(body.get("messages")), toolset, template_vars)
        stop = params.stop_strings(body.get("stop"), llm.chat_format.stop)
        wanted = params.max_tokens(body.get("max_tokens", body.get("max_completion_tokens")), None)
    else:
        tokens = prompt_tokens(llm, body.get("prompt"))
        stop = params.stop_strings(body.get("stop"))
        # absent: OpenAI's default of 16; null (or None from Python): the rest of the context
        wanted = params.max_tokens(body.get("max_tokens"), None if "max_tokens" in body else 16)
    budget = params.fit_context(len(tokens), wanted, llm.n_ctx())
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise params.RequestError("'model' must be a string", param="model", code="invalid_type")
    prompt_text = ""
    if not chat:
        prompt = params.prompt_value(body.get("prompt"))
        prompt_text = prompt if isinstance(prompt, str) else llm.detokenize(tokens).decode("utf-8", "replace")
    return Request(tokens, budget, stop, sampling, chat, stream, model, prompt_text=prompt_text, grammar=grammar,
                   tools=toolset, trace=trace_option(body, stream), prediction=prediction_tokens(llm, body.get("prediction")), **extras)


def prediction_tokens(llm, value) -> list[int] | None:
    """A request's `prediction` as tokens (drafters/prediction.py): its text read as plain text
    (no BOS, no special tokens), so that it drafts what the model would write."""
    text = params.prediction_text(value)
    if text is None:
        return None
    refuse_past_context(llm, text, "prediction")
    return llm.target.model.tokenize(text, add_special=False, parse_special=False)


def structure(llm, body: dict, chat: bool) -> tuple[str | None, ToolSet | None]:
    """The request's grammar (grammar, response_format or a forced tool call) and its tools."""
    target = llm.target
    grammar = constraints.request_grammar(body)
    toolset = None
    if chat:
        toolset = ToolSet.from_request(body, llm.chat_format.template, target.info.arch)
    elif body.get("tools") is not None or body.get("tool_choice") is not None:
        raise params.RequestError("'tools' need a chat completion (/v1/chat/completions)", param="tools",
                                  code="invalid_value")
    if toolset is not None and toolset.parses:
        if grammar is not None:
            raise params.RequestError("give either 'tools' or a 'grammar' / JSON 'response_format', not both "
                                      "(or set tool_choice to 'none')", param="tools", code="invalid_value")
        grammar = toolset.grammar()
    if grammar is not None:
        constraints.check(target.model, grammar)
    return grammar, toolset


def chat_tokens(llm, messages: list[dict], tools: ToolSet | None = None,
                template_vars: dict | None = None) -> list[int]:
    """Render `messages` (and `tools`, see tools.py) with the chat format and tokenize it (no double BOS)."""
    fmt = llm.chat_format
    try:
        if tools is None:
            text = fmt.render(messages, variables=template_vars)
        else:
            text = fmt.render(tools.messages(messages), tools.tools if tools.in_template else None, template_vars)
    except ValueError as exc:  # the template's own raise_exception(), or a malformed message
        raise params.RequestError(f"the chat template refused the messages: {exc}", param="messages") from None
    bos_in_text = bool(fmt.bos_text) and text.startswith(fmt.bos_text)
    refuse_past_context(llm, text, "messages")
    return llm.target.tokenize(text, add_special=not bos_in_text)


def prompt_tokens(llm, prompt) -> list[int]:
    """A completion's prompt (text or token ids) as token ids, checked."""
    prompt = params.prompt_value(prompt)
    target = llm.target
    if isinstance(prompt, str):
        refuse_past_context(llm, prompt, "prompt")
        return target.tokenize(prompt)  # special-token text read as tokens, as Llama's prompts
    n_vocab = target.model.n_vocab
    if any(t < 0 or t >= n_vocab for t in prompt):
        raise params.RequestError(f"'prompt' holds token ids outside the vocabulary [0, {n_vocab})",
                                  param="prompt", code="invalid_value")
    return list(prompt)


_MAX_PIECE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its longest piece in bytes


def refuse_past_context(llm, text: str, param: str) -> None:
    """Refuse, before tokenizing it, a text that cannot fit the context even if every token
    were twice the vocabulary's longest piece: 16 MB takes seconds to tokenize, for nothing."""
    n = len(text.encode("utf-8", "replace"))
    n_ctx = llm.n_ctx()
    if n <= 32 * n_ctx:  # the usual case: tokenize and count
        return
    model = llm.target.model
    longest = _MAX_PIECE.get(model)
    if longest is None:  # once, on the first long text (0.9 s for 262k tokens)
        longest = _MAX_PIECE[model] = max(len(model.token_to_piece(t, True)) for t in range(model.n_vocab))
    if n > 2 * longest * n_ctx:
        raise params.RequestError(f"the {param} text is {n} bytes, which cannot fit the context of "
                                  f"{n_ctx} tokens (no token is longer than {longest} "
                                  "bytes): shorten it", param=param, code="context_length_exceeded")


def text_tokens(model, text, add_bos: bool = True, special: bool = False) -> list[int]:
    """SpecGGUF.tokenize: UTF-8 bytes (or a str) as token ids, as llama_cpp.Llama.tokenize."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise params.RequestError(f"'text' is not valid UTF-8 (byte {exc.start}): send UTF-8 bytes",
                                      param="text", code="invalid_value") from None
    elif not isinstance(text, str):
        raise params.RequestError(f"'text' must be bytes or str (got {type(text).__name__})", param="text",
                                  code="invalid_type")
    params.text_value(text, "text")
    for name, value in (("add_bos", add_bos), ("special", special)):
        if not isinstance(value, bool):
            raise params.RequestError(f"{name} must be True or False (got {value!r})", param=name,
                                      code="invalid_type")
    return model.tokenize(text, add_special=add_bos, parse_special=special)


def token_bytes(model, tokens, prev_tokens=None, special: bool = False) -> bytes:
    """SpecGGUF.detokenize: the bytes of `tokens`, as llama_cpp.Llama.detokenize (prev_tokens
    is checked and, as there, changes nothing: each token's piece is read on its own)."""
    ids = params.token_ids(tokens, "tokens", model.n_vocab)
    if prev_tokens is not None:  # pieces here do not depend on the text before them
        params.token_ids(prev_tokens, "prev_tokens", model.n_vocab)
    out = b"".join(model.token_to_piece(t, special) for t in ids)
    if ids and ids[0] == model.bos and out.startswith(b" "):
        out = out[1:]  # as Llama: the space a BOS-led SentencePiece text begins with is dropped
    return out
