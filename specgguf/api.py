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

from .openai import constraints, llamaargs, params, responses
from .runtime import hub, native
from .openai.chat import ChatFormat
from .drafters import make_drafter
from .decoding.engine import Engine
from .errors import UserError
from .decoding.sampling import SamplingParams
from .decoding.stats import GenerationStats
from .runtime.target import Target
from .decoding.textstream import TextStream
from .openai.tools import ToolSet

MAX_PARALLEL = 64  # sequences per context: our bound (each holds n_ctx cells of its own; llama.cpp allows more)


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
    n: int = 1  # choices, run one after another
    echo: bool = False  # completions: the prompt's text leads the returned text
    logprobs: int | None = None  # None: no logprobs; k: the target's logprobs with the top k
    include_usage: bool = False  # stream_options.include_usage: a separate final usage chunk
    prompt_text: str = ""  # completions: the prompt as text (echo, logprobs' text_offset)
    grammar: str | None = None  # GBNF the output follows (grammar, response_format, a forced tool call)
    tools: ToolSet | None = None  # chat: the request's tools, whose calls are parsed from the output


class SpecGGUF:
    """Speculative generation with a GGUF target and an optional draft.

    target: path of the target GGUF (None: the embedded Gemma 3 270M default), or a Hugging Face
    id, org/repo[@REV][:QUANT] or org/repo/file.gguf (runtime/hub.py; HF_HUB_OFFLINE=1: the cache only).
    draft: None (plain decoding), "ngram" (prompt lookup) or a path or Hub id of a draft GGUF (a
    DeepSpec or EAGLE-3 checkpoint repo is converted for the target once, cached); the kind of
    a GGUF draft (model, eagle3, dflash, dspark) is read from the file.
    Greedy output equals the target's own greedy output; the draft only changes the speed.
    Not thread-safe: one generation at a time (the server queues requests for that reason).
    """

    def __init__(self, target=None, draft: str | None = None, draft_max: int | str = "auto", n_ctx: int | None = None,
                 n_threads: int | None = None, n_gpu_layers: int = 0, verbose: bool = False, *,
                 model_path=None, draft_kind: str | None = None, draft_p_min: float = 0.0,
                 n_threads_batch: int | None = None, n_batch: int = 512, seed: int | None = None,
                 chat_format: str | None = None, last_n_tokens_size: int = 64, logits_all: bool = False,
                 rpc_servers: str | list[str] | None = None, flash_attn: bool | None = False,
                 prompt_cache_bytes: int = 0, deterministic: bool = False, batch_invariant: bool = False,
                 n_parallel: int = 1, **llama_options):
        """target (or Llama's name, model_path): the target GGUF (None: the embedded Gemma 3
        270M). llama_cpp.Llama's other keywords are honoured where they apply (n_ctx, n_threads,
        n_threads_batch, n_gpu_layers, n_batch, flash_attn, seed, verbose, last_n_tokens_size), accepted at
        Llama's default value where SpecGGUF runs llama.cpp's default (use_mmap=True, ...), and
        refused otherwise (ValueError naming the argument; TypeError for unknown names).
        See specgguf/openai/llamaargs.py for the list.
        rpc_servers: 'HOST:PORT[,HOST:PORT...]' of llama.cpp RPC servers (`ggml-rpc-server`) that
        hold the n_gpu_layers offloaded target layers; needs a GGML_RPC build (README: Scale-out).
        prompt_cache_bytes: the prompt cache beyond the live context: up to this many bytes of
        saved cache states, so that prompts which alternate (two documents, one system prompt
        for many users) are not re-read (0: only the live context, which every call reuses:
        a prompt that shares a prefix with the last call's prompt and output reads only the rest).
        deterministic: auto draft lengths that depend only on the text and the seed, never on
        timing (docs/loop.md §2.4); implied for every generation given a seed, and for all of
        them when this constructor is given one.
        batch_invariant: verify batches compute, bit for bit, the logits one-token decoding
        computes, so greedy output is plain greedy output and a seeded `coupled` sample is plain
        sampling's, whatever the drafter (docs/machines.md, "Batch invariance"): ggml's reference
        CPU kernels, flash attention on (whatever flash_attn says: the mode needs it), no repacked
        weights, and no verify batch wider than the width measured on this target at load (once
        per model, a few seconds; cached). CPU only; it costs speed (README).
        n_parallel: generations that run at once, from any threads, in one context (one target
        pass per round for all of them: decoding/parallel.py), each with n_ctx tokens of its own
        and its own prompt cache; more wait for a free slot. Every draft kind: a draft model is
        loaded once for all slots (a plain one drafts in one context for all of them, and drafts
        asked for at once share a pass; eagle3, dflash, dspark and mtp keep a context per
        slot)."""
        self.drafter = self.target = None
        target, self._seed = llamaargs.check_init(target, model_path, draft, draft_max, draft_kind, draft_p_min,
                                                  n_threads_batch, n_batch, seed, verbose, chat_format,
                                                  last_n_tokens_size, logits_all, flash_attn)
        llamaargs.check_extra(llama_options)
        llamaargs.check_resources(n_ctx, n_threads, n_threads_batch, n_batch)
        llamaargs.whole("prompt_cache_bytes", prompt_cache_bytes, 0)
        llamaargs.flag("deterministic", deterministic)
        llamaargs.flag("batch_invariant", batch_invariant)
        llamaargs.whole("n_parallel", n_parallel, 1)
        if n_parallel > MAX_PARALLEL:
            raise params.RequestError(f"n_parallel must be at most {MAX_PARALLEL} (got {n_parallel})",
                                      param="n_parallel")
        if n_parallel > 1 and batch_invariant:
            raise params.RequestError("n_parallel > 1 and batch_invariant cannot be combined yet: a batch of several "
                                      "sequences is not measured invariant; use one of them", param="n_parallel")
        if draft is None and draft_kind == "ngram":
            draft = "ngram"
        native.set_verbose(verbose)
        if target is None:
            from .runtime.defaults import default_target

            target = default_target()
        try:
            target = hub.resolve(target, what="target")
            self.target = Target(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                                 rpc_servers=rpc_servers, flash_attn=flash_attn, batch_invariant=batch_invariant,
                                 n_parallel=n_parallel)
        except UserError as exc:  # a bad argument or file: a ValueError, as Llama raises
            raise llamaargs.as_value_error(exc) from None
        try:
            if n_threads_batch is not None:
                self.target.ctx.set_threads(self.target.n_threads, n_threads_batch)
            deterministic = deterministic or self._seed is not None
            if draft is not None:
                from .converters.hubdraft import resolve_draft  # a checkpoint repo: converted once, cached

                draft = str(resolve_draft(draft, target))
            if n_parallel > 1:
                self._pool = self._slot_pool(draft, draft_kind, draft_max, n_threads, draft_p_min, deterministic)
                self.engine = self._pool.engines[0]
                self.drafter = self.engine.drafter
            else:
                if draft is not None:
                    self.drafter = make_drafter(draft, self.target, kind=draft_kind, draft_max=draft_max,
                                                n_threads=n_threads, p_min=draft_p_min)  # block drafts need the length
                self.engine = Engine(self.target, self.drafter, draft_max, deterministic=deterministic)
        except BaseException as exc:
            self.close()
            if isinstance(exc, UserError):
                raise llamaargs.as_value_error(exc) from None
            raise
        self.set_cache_bytes(prompt_cache_bytes)
        self.verbose, self.penalty_last_n = verbose, last_n_tokens_size
        self.model_name = Path(str(target)).stem
        self._chat_format: ChatFormat | None = None
        self._plain: Engine | None = None

    _pool = None  # decoding.parallel.SlotPool when n_parallel > 1

    @property
    def n_parallel(self) -> int:
        """Generations this model runs at once (its slots)."""
        return 1 if self._pool is None else self._pool.n

    def slots_status(self) -> dict | None:
        """With n_parallel > 1: slots, slots_busy, batch_width (rows of the last target pass) and
        passes (target passes so far); None with one sequence."""
        pool = self._pool
        if pool is None:
            return None
        return {"slots": pool.n, "slots_busy": pool.busy(), "batch_width": pool.shared.last_width,
                "passes": pool.shared.passes}

    def _slot_pool(self, draft, draft_kind, draft_max, n_threads, p_min, deterministic):
        """n_parallel slots, each with its own drafter and engine."""
        from .decoding.parallel import SlotPool
        from .drafters import open_shared_draft

        shared = []  # a draft model's SharedDraft: one model and context for all the slots

        def make_engine(slot):
            if draft is None:
                return Engine(slot, None, draft_max, deterministic=deterministic)
            if not shared:
                shared.append(open_shared_draft(draft, slot, draft_kind, n_threads))
            drafter = make_drafter(draft, slot, kind=draft_kind, draft_max=draft_max, n_threads=n_threads,
                                   p_min=p_min, shared_draft=shared[0])
            return Engine(slot, drafter, draft_max, deterministic=deterministic)

        return SlotPool(self.target, make_engine)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, *, draft: str | None = None,
                        additional_files: list[str] | None = None, local_dir=None, cache_dir=None,
                        **kwargs) -> "SpecGGUF":
        """llama_cpp.Llama.from_pretrained, offline-capable: the target from Hugging Face repo
        `repo_id` ('org/repo' or 'org/repo@REV'), `filename` a glob over its files (None: the
        Q4_K_M GGUF, or the repo's only one), `additional_files` globs fetched beside it; `draft`
        as for SpecGGUF (a path, 'ngram', or a Hub id, fetched into the same cache_dir; a DeepSpec
        or EAGLE-3 checkpoint repo is converted for this target once, then reused). With
        HF_HUB_OFFLINE=1 only the local cache is read (Llama lists the repo online first, and
        fails). Other keywords go to SpecGGUF()."""
        path = hub.from_pretrained(repo_id, filename, additional_files=additional_files, local_dir=local_dir,
                                   cache_dir=cache_dir)
        from .converters.hubdraft import resolve_draft

        return cls(path, draft=resolve_draft(draft, path, cache_dir=cache_dir), **kwargs)

    # -- llama_cpp.Llama's model methods -----------------------------------------------------
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
        model = self.target.model
        ids = params.token_ids(tokens, "tokens", model.n_vocab)
        if prev_tokens is not None:  # pieces here do not depend on the text before them
            params.token_ids(prev_tokens, "prev_tokens", model.n_vocab)
        out = b"".join(model.token_to_piece(t, special) for t in ids)
        if ids and ids[0] == model.bos and out.startswith(b" "):
            out = out[1:]  # as Llama: the space a BOS-led SentencePiece text begins with is dropped
        return out

    def reset(self) -> None:
        """Forget the context's contents: the next generation reads its whole prompt (saved
        states of the prompt cache stay; `set_cache(None)` drops them)."""
        self._check_open()
        if self._pool is not None:
            self._pool.reset()
            return
        self.target.acquire(self)  # waits for another thread's generation; refuses an unfinished one
        try:
            self.target.ctx.clear()
            self.target.kept = None
            if self.drafter is not None:
                self.drafter.kept = None
        finally:
            self.target.release()

    # -- the prompt cache (decoding/promptcache.py) -----------------------------------------
    def set_cache_bytes(self, capacity_bytes: int) -> None:
        """Keep up to `capacity_bytes` of saved cache states beyond the live context (0: none)."""
        from .decoding.promptcache import StateCache

        self._check_open()
        capacity_bytes = llamaargs.whole("capacity_bytes", capacity_bytes, 0)
        cache = StateCache(capacity_bytes) if capacity_bytes else None
        if self._pool is not None:  # one cache for all slots: a state saved by one loads into any
            for slot in self._pool.slots:
                slot.saved_states = cache
            return
        self.target.saved_states = cache

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
        from .decoding.promptcache import SavedState

        self._check_open()
        self._one_sequence("save_state")
        target, drafter = self.target, self.drafter
        target.acquire(self)
        try:
            tokens = target.kept or []
            draft = drafter.save() if drafter is not None and drafter.kept == tokens else None
            return SavedState(tuple(tokens), target.ctx.state_bytes() if tokens else b"", drafter, draft)
        finally:
            target.release()

    def load_state(self, state) -> None:
        """Put back a state from `save_state` of this instance; the next prompt that shares its
        tokens reads only the rest."""
        from .decoding.promptcache import SavedState

        self._check_open()
        if not isinstance(state, SavedState):
            raise params.RequestError(f"load_state takes a state from SpecGGUF.save_state (got {type(state).__name__})",
                                      param="state", code="invalid_type")
        self._one_sequence("load_state")
        target, drafter = self.target, self.drafter
        target.acquire(self)
        try:
            target.kept = None
            if drafter is not None:
                drafter.kept = None
            if not state.tokens:
                target.ctx.clear()
                return
            target.ctx.load_state_bytes(state.target)
            target.kept = list(state.tokens)
            if drafter is not None:
                if state.drafter is drafter and state.draft is not None and drafter.restore(state.draft):
                    drafter.kept = list(state.tokens)
                else:
                    drafter.reset()
        finally:
            target.release()

    # -- prompts ---------------------------------------------------------------------------
    def tokenize(self, text: "bytes | str", add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`: UTF-8 bytes, as llama_cpp.Llama.tokenize takes (a str is taken
        too). add_bos: begin with the model's BOS (when it uses one); special: read special-token
        text such as '<start_of_turn>' as that token (prompts of create_completion are read so)."""
        self._check_open()
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
        llamaargs.flag("add_bos", add_bos)
        llamaargs.flag("special", special)
        return self.target.model.tokenize(text, add_special=add_bos, parse_special=special)

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            self._chat_format = ChatFormat.for_model(self.target.model, self.target.info.chat_template)
        return self._chat_format

    def chat_prompt(self, messages: list[dict], tools: ToolSet | None = None) -> list[int]:
        """Render `messages` (and `tools`, see tools.py) with the chat format and tokenize it (no double BOS)."""
        self._check_open()
        fmt = self.chat_format
        try:
            if tools is None:
                text = fmt.render(messages)
            else:
                text = fmt.render(tools.messages(messages), tools.tools if tools.in_template else None)
        except ValueError as exc:  # the template's own raise_exception(), or a malformed message
            raise params.RequestError(f"the chat template refused the messages: {exc}", param="messages") from None
        bos_in_text = bool(fmt.bos_text) and text.startswith(fmt.bos_text)
        self._refuse_past_context(text, "messages")
        return self.target.tokenize(text, add_special=not bos_in_text)

    _max_piece = None

    def _refuse_past_context(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit the context even if every token
        were twice the vocabulary's longest piece: 16 MB takes seconds to tokenize, for nothing."""
        n = len(text.encode("utf-8", "replace"))
        if n <= 32 * self.n_ctx():  # the usual case: tokenize and count
            return
        if self._max_piece is None:  # once, on the first long text (0.9 s for 262k tokens)
            model = self.target.model
            self._max_piece = max(len(model.token_to_piece(t, True)) for t in range(model.n_vocab))
        if n > 2 * self._max_piece * self.n_ctx():
            raise params.RequestError(f"the {param} text is {n} bytes, which cannot fit the context of "
                                      f"{self.n_ctx()} tokens (no token is longer than {self._max_piece} "
                                      "bytes): shorten it", param=param, code="context_length_exceeded")

    def _prompt_tokens(self, prompt) -> list[int]:
        self._check_open()
        prompt = params.prompt_value(prompt)
        if isinstance(prompt, str):
            self._refuse_past_context(prompt, "prompt")
            return self.target.tokenize(prompt)  # special-token text read as tokens, as Llama's prompts
        n_vocab = self.target.model.n_vocab
        if any(t < 0 or t >= n_vocab for t in prompt):
            raise params.RequestError(f"'prompt' holds token ids outside the vocabulary [0, {n_vocab})",
                                      param="prompt", code="invalid_value")
        return list(prompt)

    # -- generation ------------------------------------------------------------------------
    def stream_tokens(self, prompt_tokens: list[int], max_tokens: int = 256, stop=None,
                      sampling: "dict | SamplingParams | None" = None, speculate: bool = True,
                      cancelled: Callable[[], bool] | None = None, grammar: str | None = None):
        """(generation, text chunks iterator) for already tokenized input: the one way every
        front end (CLI, chat, profile, server) runs a generation.

        sampling: checked sampling fields (see `params.SAMPLING_FIELDS`) or a `SamplingParams`.
        speculate=False decodes plainly with the same target and the same loop (n = 0): the
        fair baseline. cancelled: asked between prefill chunks and rounds (from the iterating
        thread); when it says yes the generation ends with finish_reason "cancelled".
        grammar: GBNF text the output must follow (constraints.py), or None.
        """
        self._check_open()
        stop = params.stop_strings(stop)  # checked once, here: every front end passes through
        sp = sampling if isinstance(sampling, SamplingParams) else params.sampling_params(sampling or {})
        if self._pool is not None:  # the free slot whose cache holds most of the prompt
            engines = self._pool.engines if speculate else \
                self._pool.plain_engines(lambda slot: Engine(slot, None, 1))
            gen = engines[0].generate_on(engines, self._pool, prompt_tokens, max_tokens, sampling=sp,
                                         cancelled=cancelled, grammar=grammar)
        else:
            engine = self.engine if speculate else self._plain_engine()
            gen = engine.generate(prompt_tokens, max_tokens, sampling=sp, cancelled=cancelled, grammar=grammar)
        return gen, TextStream(gen, self.target.model, stop)

    def _plain_engine(self) -> Engine:
        if self._plain is None:
            self._plain = Engine(self.target, None, 1)
        return self._plain

    def _one_sequence(self, what: str) -> None:
        if self._pool is not None:
            raise UserError(f"{what} works on one sequence: this model runs n_parallel={self._pool.n}; "
                            "create it with n_parallel=1 for saved states")

    def _check_open(self) -> None:
        if self.target is None:
            raise params.RequestError("this SpecGGUF is closed: create a new one to generate again")

    def stream(self, prompt, max_tokens: int = 256, stop=None, grammar=None, **sampling) -> Iterator[Chunk]:
        """Yield `Chunk`s as text is verified; the last one carries finish_reason, tokens and stats.

        prompt: text or token ids. Leaving the loop early stops the generation.
        grammar: GBNF text or a llama_cpp.LlamaGrammar the output must follow.
        """
        gen, text = self.stream_tokens(self._prompt_tokens(prompt), max_tokens, stop,
                                       params.sampling_fields(sampling), grammar=self._grammar(grammar))
        try:
            for piece in text:
                yield Chunk(piece)
            yield Chunk("", gen.finish_reason or "stop", list(gen.tokens), gen.stats)
        finally:
            gen.close("cancelled")  # no-op when it already finished

    def generate(self, prompt, max_tokens: int = 256, stop=None, grammar=None, **sampling) -> Result:
        """Generate a completion of `prompt` (text or token ids) and return it whole (grammar: as stream's)."""
        gen, text = self.stream_tokens(self._prompt_tokens(prompt), max_tokens, stop,
                                       params.sampling_fields(sampling), grammar=self._grammar(grammar))
        out = "".join(text)
        return Result(out, list(gen.tokens), gen.finish_reason or "stop", gen.stats)

    def _grammar(self, grammar) -> str | None:
        """Checked GBNF text of `grammar` (None: none)."""
        if grammar is None:
            return None
        self._check_open()
        text = constraints.grammar_text(grammar)
        constraints.check(self.target.model, text)
        return text

    # -- cost profile ----------------------------------------------------------------------
    def measure_costs(self, prompt_tokens: list[int], lengths=(1, 2, 3, 4, 6, 8), tokens: int = 48,
                      repeats: int = 2):
        """Run the real loop at fixed draft lengths (and plainly) on `prompt_tokens`; return the
        measured `tuning.Costs`, which also land in the profile cache that `auto` starts from."""
        from .decoding.profiling import ProfileStore

        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise params.RequestError(f"tokens must be a whole number >= 1 (got {tokens!r})", param="tokens")
        self._check_open()
        target, drafter = self.target, self.drafter
        spec = None if drafter is None else drafter.profile_id
        store = ProfileStore(target.info.path, spec, target.n_threads, target.n_gpu_layers,
                             drafter is not None and drafter.block, rpc_servers=target.rpc_servers,
                             kernels=target.kernels)
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
        if "seed" not in sampling and self._seed is not None:
            sampling["seed"] = self._seed  # the constructor's seed, as Llama(seed=...)
        if self.penalty_last_n != 64:
            sampling["penalty_last_n"] = self.penalty_last_n  # Llama's last_n_tokens_size
        bias = params.logit_bias_value(body.get("logit_bias"), self.n_vocab())
        if bias:
            sampling["logit_bias"] = bias
        params.sampling_params(sampling)  # refuse what SamplingParams refuses, before queueing
        stream = params.flag(body, "stream")
        extras = params.choice_options(body, chat, stream)
        grammar, toolset = self._structure(body, chat)
        if chat:
            tokens = self.chat_prompt(params.messages_value(body.get("messages")), toolset)
            stop = params.stop_strings(body.get("stop"), self.chat_format.stop)
            wanted = params.max_tokens(body.get("max_tokens", body.get("max_completion_tokens")), None)
        else:
            tokens = self._prompt_tokens(body.get("prompt"))
            stop = params.stop_strings(body.get("stop"))
            # absent: OpenAI's default of 16; null (or None from Python): the rest of the context
            wanted = params.max_tokens(body.get("max_tokens"), None if "max_tokens" in body else 16)
        budget = params.fit_context(len(tokens), wanted, self.n_ctx())
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise params.RequestError("'model' must be a string", param="model", code="invalid_type")
        prompt_text = ""
        if not chat:
            prompt = params.prompt_value(body.get("prompt"))
            prompt_text = prompt if isinstance(prompt, str) else self.detokenize(tokens).decode("utf-8", "replace")
        return Request(tokens, budget, stop, sampling, chat, stream, model, prompt_text=prompt_text, grammar=grammar,
                       tools=toolset, **extras)

    def _structure(self, body: dict, chat: bool) -> tuple[str | None, ToolSet | None]:
        """The request's grammar (grammar, response_format or a forced tool call) and its tools."""
        self._check_open()
        grammar = constraints.request_grammar(body)
        toolset = None
        if chat:
            toolset = ToolSet.from_request(body, self.chat_format.template, self.target.info.arch)
        elif body.get("tools") is not None or body.get("tool_choice") is not None:
            raise params.RequestError("'tools' need a chat completion (/v1/chat/completions)", param="tools",
                                      code="invalid_value")
        if toolset is not None and toolset.parses:
            if grammar is not None:
                raise params.RequestError("give either 'tools' or a 'grammar' / JSON 'response_format', not both "
                                          "(or set tool_choice to 'none')", param="tools", code="invalid_value")
            grammar = toolset.grammar()
        if grammar is not None:
            constraints.check(self.target.model, grammar)
        return grammar, toolset

    def response_chunks(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """The stream of one request as Llama/OpenAI chunk dicts, usage and stats on the last one.

        `cancelled` is asked after every chunk: when it says yes the generation is closed (the
        engine stops at that round) and nothing more is yielded.
        """
        return responses.chunks(self, req, cancelled)

    def response(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict | None:
        """The whole response of one request (None when cancelled before the end)."""
        return responses.full(self, req, cancelled)

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

    # -- resources -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the draft and the target (contexts, then models). Safe to call twice."""
        if getattr(self, "_pool", None) is not None:
            self._pool.close()  # waits for the running generations
            for engine in self._pool.engines:
                if engine.drafter is not None and engine.drafter is not self.drafter:
                    engine.drafter.close()
            self._pool = None
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
