"""`SpecGGUF`: a target, an optional drafter and the loop, behind one object.

Three layers, thinnest on top: `generate()`/`stream()` for plain Python use;
`create_completion()`/`create_chat_completion()` with the dict shapes of llama_cpp.Llama (so an
app can swap it in); and `prepare()`/`response_chunks()`, the request-level pieces that the
HTTP server drives from its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import native, params
from .chat import ChatFormat
from .drafters import make_drafter
from .engine import Engine
from .responses import Shaper, openai_finish_reason
from .sampling import SamplingParams
from .stats import GenerationStats
from .target import Target
from .textstream import TextStream


@dataclass
class Result:
    """What `generate()` returns: the text, its token ids, why it ended, and the statistics."""

    text: str
    tokens: list[int]
    finish_reason: str  # "stop", "length" or "context"
    stats: GenerationStats = field(repr=False)

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


@dataclass
class Chunk:
    """One piece of a `stream()`: text as soon as it is verified; the last chunk (text may be
    empty) also carries `finish_reason`, all `tokens` and the `stats`."""

    text: str
    finish_reason: str | None = None
    tokens: list[int] | None = None
    stats: GenerationStats | None = field(default=None, repr=False)


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


class SpecGGUF:
    """Speculative generation with a GGUF target and an optional draft.

    target: path of the target GGUF (None: the embedded Gemma 3 270M default).
    draft: None (plain decoding), "ngram" (prompt lookup) or a path to a draft GGUF; the kind of
    a GGUF draft (model, eagle3, dflash, dspark) is read from the file.
    Greedy output equals the target's own greedy output; the draft only changes the speed.
    Not thread-safe: one generation at a time (the server queues requests for that reason).
    """

    def __init__(self, target=None, draft: str | None = None, draft_max: int | str = "auto", n_ctx: int = 4096,
                 n_threads: int | None = None, n_gpu_layers: int = 0, verbose: bool = False,
                 rpc_servers: str | list[str] | None = None, **draft_options):
        native.set_verbose(verbose)
        if target is None:
            from .defaults import default_target

            target = default_target()
        # rpc_servers: 'HOST:PORT,...' of llama.cpp RPC servers holding the offloaded layers (README: Scale-out)
        self.target = Target(target, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                             rpc_servers=rpc_servers)
        self.drafter = None
        try:
            if draft is not None:
                self.drafter = make_drafter(str(draft), self.target, draft_max=draft_max, n_threads=n_threads,
                                            **draft_options)  # block drafts need the configured length
            self.engine = Engine(self.target, self.drafter, draft_max)
        except BaseException:
            self.close()
            raise
        self.model_name = Path(str(target)).stem
        self._chat_format: ChatFormat | None = None
        self._plain: Engine | None = None

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    # -- prompts ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        self._check_open()
        return self.target.tokenize(text, add_special)

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            self._chat_format = ChatFormat.for_model(self.target.model, self.target.info.chat_template)
        return self._chat_format

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """Render `messages` with the chat format and tokenize it (no double BOS)."""
        self._check_open()
        fmt = self.chat_format
        try:
            text = fmt.render(messages)
        except ValueError as exc:  # the template's own raise_exception(), or a malformed message
            raise params.RequestError(f"the chat template refused the messages: {exc}", param="messages") from None
        bos_in_text = bool(fmt.bos_text) and text.startswith(fmt.bos_text)
        return self.target.tokenize(text, add_special=not bos_in_text)

    def _prompt_tokens(self, prompt) -> list[int]:
        self._check_open()
        prompt = params.prompt_value(prompt)
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        n_vocab = self.target.model.n_vocab
        if any(t < 0 or t >= n_vocab for t in prompt):
            raise params.RequestError(f"'prompt' holds token ids outside the vocabulary [0, {n_vocab})",
                                      param="prompt", code="invalid_value")
        return list(prompt)

    # -- generation ------------------------------------------------------------------------
    def stream_tokens(self, prompt_tokens: list[int], max_tokens: int = 256, stop=None,
                      sampling: "dict | SamplingParams | None" = None, speculate: bool = True,
                      cancelled: Callable[[], bool] | None = None):
        """(generation, text chunks iterator) for already tokenized input: the one way every
        front end (CLI, chat, profile, server) runs a generation.

        sampling: checked sampling fields (see `params.SAMPLING_FIELDS`) or a `SamplingParams`.
        speculate=False decodes plainly with the same target and the same loop (n = 0): the
        fair baseline. cancelled: asked between prefill chunks and rounds (from the iterating
        thread); when it says yes the generation ends with finish_reason "cancelled".
        """
        self._check_open()
        sp = sampling if isinstance(sampling, SamplingParams) else params.sampling_params(sampling or {})
        engine = self.engine if speculate else self._plain_engine()
        gen = engine.generate(prompt_tokens, max_tokens, sampling=sp, cancelled=cancelled)
        return gen, TextStream(gen, self.target.model, stop)

    def _plain_engine(self) -> Engine:
        if self._plain is None:
            self._plain = Engine(self.target, None, 1)
        return self._plain

    def _check_open(self) -> None:
        if self.target is None:
            raise params.RequestError("this SpecGGUF is closed: create a new one to generate again")

    def stream(self, prompt, max_tokens: int = 256, stop=None, **sampling) -> Iterator[Chunk]:
        """Yield `Chunk`s as text is verified; the last one carries finish_reason, tokens and stats.

        prompt: text or token ids. Leaving the loop early stops the generation.
        """
        gen, text = self.stream_tokens(self._prompt_tokens(prompt), max_tokens, params.stop_strings(stop),
                                       params.sampling_fields(sampling))
        try:
            for piece in text:
                yield Chunk(piece)
            yield Chunk("", gen.finish_reason or "stop", list(gen.tokens), gen.stats)
        finally:
            gen.close("cancelled")  # no-op when it already finished

    def generate(self, prompt, max_tokens: int = 256, stop=None, **sampling) -> Result:
        """Generate a completion of `prompt` (text or token ids) and return it whole."""
        gen, text = self.stream_tokens(self._prompt_tokens(prompt), max_tokens, params.stop_strings(stop),
                                       params.sampling_fields(sampling))
        out = "".join(text)
        return Result(out, list(gen.tokens), gen.finish_reason or "stop", gen.stats)

    # -- cost profile ----------------------------------------------------------------------
    def measure_costs(self, prompt_tokens: list[int], lengths=(1, 2, 3, 4, 6, 8), tokens: int = 48,
                      repeats: int = 2):
        """Run the real loop at fixed draft lengths (and plainly) on `prompt_tokens`; return the
        measured `tuning.Costs`, which also land in the profile cache that `auto` starts from."""
        from .profiling import ProfileStore

        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise params.RequestError(f"tokens must be a whole number >= 1 (got {tokens!r})", param="tokens")
        self._check_open()
        target, drafter = self.target, self.drafter
        spec = None if drafter is None else drafter.profile_id
        store = ProfileStore(target.info.path, spec, target.n_threads, target.n_gpu_layers,
                             drafter is not None and drafter.block)
        costs = store.costs_for(0)
        costs.verify.clear()
        costs.draft_round = costs.draft_step = None
        costs.smoothing = 0.5
        runs = [(None, 1)] + [(drafter, n) for n in lengths if drafter is not None]
        for _ in range(repeats):
            for d, n in runs:
                gen = Engine(target, d, n).generate(prompt_tokens, tokens)
                for _tok in gen:
                    pass
                # per round: the engine's own timings, as `auto` sees them
                rounds = gen.stats.rounds_detail
                if not rounds:
                    continue
                width = round(sum(r[0] for r in rounds) / len(rounds))
                costs.observe_verify(width, gen.stats.verify_s / len(rounds))
                if d is not None:
                    costs.observe_draft(max(width, 1), gen.stats.draft_s / len(rounds))
        store.save()
        return costs

    # -- llama_cpp.Llama-compatible --------------------------------------------------------
    def prepare(self, body: dict, chat: bool) -> Request:
        """Check an OpenAI/Llama-style request (a JSON body or keyword arguments) and tokenize it.

        Raises `params.RequestError` (a ValueError) with the OpenAI `param` and `code`.
        """
        params.refuse_unsupported(body)
        sampling = params.sampling_fields(body)
        params.sampling_params(sampling)  # refuse what SamplingParams refuses, before queueing
        stream = params.flag(body, "stream")
        if chat:
            tokens = self.chat_prompt(params.messages_value(body.get("messages")))
            stop = params.stop_strings(body.get("stop"), self.chat_format.stop)
            wanted = params.max_tokens(body.get("max_tokens", body.get("max_completion_tokens")), None)
        else:
            tokens = self._prompt_tokens(body.get("prompt"))
            stop = params.stop_strings(body.get("stop"))
            # absent: OpenAI's default of 16; null (or None from Python): the rest of the context
            wanted = params.max_tokens(body.get("max_tokens"), None if "max_tokens" in body else 16)
        budget = params.fit_context(len(tokens), wanted, self.n_ctx)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise params.RequestError("'model' must be a string", param="model", code="invalid_type")
        return Request(tokens, budget, stop, sampling, chat, stream, model)

    def response_chunks(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """The stream of one request as Llama/OpenAI chunk dicts, stats on the last one.

        `cancelled` is asked after every chunk: when it says yes the generation is closed (the
        engine stops at that round) and nothing more is yielded.
        """
        shaper = Shaper(req.model or self.model_name, req.chat)
        gen, text = self.stream_tokens(req.tokens, req.max_tokens, req.stop, req.sampling, cancelled=cancelled)
        try:
            first = shaper.first()
            if first is not None:
                yield first
            for piece in text:
                if cancelled():
                    return
                yield shaper.delta(piece)
            if cancelled():
                return
            yield shaper.last(openai_finish_reason(gen.finish_reason), len(req.tokens), len(gen.tokens),
                              gen.stats.to_dict())
        finally:
            gen.close("cancelled")

    def response(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict | None:
        """The whole response of one request (None when cancelled before the end)."""
        shaper = Shaper(req.model or self.model_name, req.chat)
        gen, text = self.stream_tokens(req.tokens, req.max_tokens, req.stop, req.sampling, cancelled=cancelled)
        pieces = []
        try:
            for piece in text:
                if cancelled():
                    return None
                pieces.append(piece)
        finally:
            gen.close("cancelled")
        return shaper.full("".join(pieces), openai_finish_reason(gen.finish_reason), len(req.tokens),
                           len(gen.tokens), gen.stats.to_dict())

    def create_completion(self, prompt, max_tokens: int | None = 16, stop=None, stream: bool = False, **kwargs):
        """Complete `prompt` (text or token ids) like `llama_cpp.Llama.create_completion`.

        Returns the same dict (or, with stream=True, an iterator of chunk dicts), plus a
        `specgguf` field with the speculative statistics on the response / the last chunk.
        Sampling keywords (temperature, top_k, top_p, min_p, repeat_penalty,
        presence_penalty, frequency_penalty, seed) default to greedy; features specgguf
        lacks (logprobs, echo, suffix, grammar, n > 1...) raise ValueError when asked for.
        """
        req = self.prepare(dict(kwargs, prompt=prompt, max_tokens=max_tokens, stop=stop, stream=stream), chat=False)
        return self.response_chunks(req) if stream else self.response(req)

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None, stop=None,
                               stream: bool = False, **kwargs):
        """Answer `messages` like `llama_cpp.Llama.create_chat_completion` (same dict shapes,
        plus `specgguf`), with the GGUF's chat template or the stated fallback."""
        body = dict(kwargs, messages=messages, max_tokens=max_tokens, stop=stop, stream=stream)
        req = self.prepare(body, chat=True)
        return self.response_chunks(req) if stream else self.response(req)

    chat = create_chat_completion
    __call__ = create_completion

    # -- resources -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the draft and the target (contexts, then models). Safe to call twice."""
        if getattr(self, "drafter", None) is not None:
            self.drafter.close()  # the draft context may point at the target's: free it first
            self.drafter = None
        if getattr(self, "target", None) is not None:
            self.target.close()
            self.target = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
