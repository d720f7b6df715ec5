"""`SpecGGUF`: a target, an optional drafter and the loop, behind one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from . import native
from .chat import ChatFormat
from .drafters import make_drafter
from .engine import Engine
from .stats import GenerationStats
from .target import Target
from .textstream import TextStream


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(repr=False)

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


class SpecGGUF:
    """Speculative generation with a GGUF target and an optional draft.

    target: path of the target GGUF (None: the embedded Gemma 3 270M default).
    draft: None (plain decoding), "ngram" (prompt lookup) or a path to a draft GGUF.
    Greedy output equals the target's own greedy output; the draft only changes the speed.
    """

    def __init__(self, target=None, draft: str | None = None, draft_max: int = 8, n_ctx: int = 4096,
                 n_threads: int | None = None, n_gpu_layers: int = 0, verbose: bool = False, **draft_options):
        native.set_verbose(verbose)
        if target is None:
            from .defaults import default_target

            target = default_target()
        self.target = Target(target, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        self.drafter = None
        try:
            if draft is not None:
                self.drafter = make_drafter(str(draft), self.target, n_threads=n_threads, **draft_options)
            self.engine = Engine(self.target, self.drafter, draft_max)
        except BaseException:
            self.close()
            raise
        self._chat_format: ChatFormat | None = None

    # -- prompts ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.target.tokenize(text, add_special)

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            self._chat_format = ChatFormat.for_model(self.target.model, self.target.info.chat_template)
        return self._chat_format

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """Render `messages` with the chat format and tokenize it (no double BOS)."""
        fmt = self.chat_format
        text = fmt.render(messages)
        bos_in_text = bool(fmt.bos_text) and text.startswith(fmt.bos_text)
        return self.target.tokenize(text, add_special=not bos_in_text)

    # -- generation ------------------------------------------------------------------------
    def stream_tokens(self, prompt_tokens: list[int], max_tokens: int = 256, stop=None):
        """(generation, text chunks iterator) for already tokenized input."""
        gen = self.engine.generate(prompt_tokens, max_tokens)
        return gen, TextStream(gen, self.target.model, stop)

    def stream(self, prompt: str, max_tokens: int = 256, stop=None) -> Iterator[str]:
        """Yield text chunks as they are verified; see `last` for stats afterwards."""
        gen, text = self.stream_tokens(self.tokenize(prompt), max_tokens, stop)
        self.last = gen
        yield from text

    def generate(self, prompt: str, max_tokens: int = 256, stop=None) -> Result:
        gen, text = self.stream_tokens(self.tokenize(prompt), max_tokens, stop)
        out = "".join(text)
        return Result(out, list(gen.tokens), gen.finish_reason or "stop", gen.stats)

    def close(self) -> None:
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
