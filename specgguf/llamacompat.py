"""llama_cpp.Llama's surface on `SpecGGUF`: the model's methods (n_ctx, tokenize, metadata, ...),
saved states (set_cache, save_state, load_state) and create_completion / create_chat_completion
with Llama's dict shapes, so that an app written against `llama_cpp.Llama` swaps SpecGGUF in.

A mixin: `api.SpecGGUF` holds the target and the request entry points (`prepare`, `response`,
`response_chunks`) these methods go through; this module only speaks Llama's dialect of them.
"""

from __future__ import annotations

from .decoding.promptcache import PromptCache, SavedState
from .request import params
from .request import prepare as preparing


class LlamaMethods:
    """The methods of llama_cpp.Llama that SpecGGUF offers (see the module doc)."""

    # -- the model ----------------------------------------------------------------------
    def n_ctx(self) -> int:
        """The context window in tokens (a method, as llama_cpp.Llama's)."""
        self._check_open()
        return self.target.n_ctx

    def n_vocab(self) -> int:
        self._check_open()
        return self.target.model.n_vocab

    def token_eos(self) -> int:
        self._check_open()
        return self.target.model.eos

    def token_bos(self) -> int:
        self._check_open()
        return self.target.model.bos

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF's metadata, every value as text (as llama_cpp.Llama.metadata)."""
        self._check_open()
        if self._metadata is None:
            self._metadata = self.target.model.metadata()
        return dict(self._metadata)

    _metadata = None

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        """The bytes of `tokens`, as llama_cpp.Llama.detokenize (prev_tokens is checked and, as
        there, changes nothing: each token's piece is read on its own)."""
        self._check_open()
        return preparing.token_bytes(self.target.model, tokens, prev_tokens, special)

    def tokenize(self, text: "bytes | str", add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`: UTF-8 bytes, as llama_cpp.Llama.tokenize takes (a str is taken
        too). add_bos: begin with the model's BOS (when it uses one); special: read special-token
        text such as '<start_of_turn>' as that token (prompts of create_completion are read so)."""
        self._check_open()
        return preparing.text_tokens(self.target.model, text, add_bos, special)

    # -- saved states (decoding/promptcache.py) ---------------------------------------------
    def set_cache(self, cache) -> None:
        """llama_cpp.Llama.set_cache: a `llama_cpp.LlamaRAMCache` (its capacity_bytes is used) or
        None. A disk cache is not offered: SpecGGUF keeps its saved states in memory."""
        if cache is None:
            self.set_cache_bytes(0)
            return
        capacity = getattr(cache, "capacity_bytes", None)
        if type(cache).__name__ != "LlamaRAMCache" or capacity is None:
            raise params.RequestError(f"set_cache takes a llama_cpp.LlamaRAMCache or None (got "
                                      f"{type(cache).__name__}); SpecGGUF keeps saved states in memory only",
                                      param="cache", code="invalid_type")
        self.set_cache_bytes(int(capacity))

    def save_state(self):
        """The caches' state after the last generation (a `promptcache.SavedState`), for
        `load_state`; as llama_cpp.Llama.save_state."""
        self._check_open()
        self._one_sequence("save_state")
        target = self.target
        target.acquire(self)
        try:
            return PromptCache.of(target).snapshot(self.drafter)
        finally:
            target.release()

    def load_state(self, state) -> None:
        """Put back a state from `save_state` of this instance; the next prompt that shares its
        tokens reads only the rest."""
        self._check_open()
        if not isinstance(state, SavedState):
            raise params.RequestError(f"load_state takes a state from SpecGGUF.save_state (got {type(state).__name__})",
                                      param="state", code="invalid_type")
        self._one_sequence("load_state")
        target = self.target
        target.acquire(self)
        try:
            PromptCache.of(target).load(state, self.drafter)
        finally:
            target.release()

    # -- completions -----------------------------------------------------------------------
    def create_completion(self, prompt, max_tokens: int | None = 16, stop=None, stream: bool = False, **kwargs):
        """Complete `prompt` (text or token ids) like `llama_cpp.Llama.create_completion`.

        Returns the same dict (or, with stream=True, an iterator of chunk dicts), plus a
        `specgguf` field with the speculative statistics on the response / the last chunk.
        Sampling keywords (temperature, top_k, top_p, min_p, repeat_penalty,
        presence_penalty, frequency_penalty, seed, logit_bias) default to greedy; logprobs
        (the target's own, with the top k), echo and n (choices run one after another) work
        as in Llama; samplers specgguf lacks (typical_p, tfs_z, mirostat_*, suffix...) raise
        ValueError when set to anything but their off value, unknown keywords TypeError.
        """
        params.check_keywords(kwargs, chat=False)
        req = self.prepare(dict(kwargs, prompt=prompt, max_tokens=max_tokens, stop=stop, stream=stream), chat=False)
        return self.response_chunks(req) if stream else self.response(req)

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None, stop=None,
                               stream: bool = False, **kwargs):
        """Answer `messages` like `llama_cpp.Llama.create_chat_completion` (same dict shapes,
        plus `specgguf`), with the GGUF's chat template or the stated fallback."""
        params.check_keywords(kwargs, chat=True)
        body = dict(kwargs, messages=messages, max_tokens=max_tokens, stop=stop, stream=stream)
        req = self.prepare(body, chat=True)
        return self.response_chunks(req) if stream else self.response(req)

    chat = create_chat_completion
    __call__ = create_completion
