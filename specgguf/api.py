"""`SpecGGUF`: a target, an optional drafter and the loop, behind one object: the face.

The loader (loading/) builds what runs; this module only faces it. Three layers, thinnest on
top: `generate()`/`stream()` for plain Python use; `create_completion()`/
`create_chat_completion()` with the dict shapes of llama_cpp.Llama (so an app can swap it in;
llamacompat.py), and `create_message()` / `create_response()` with Anthropic's and OpenAI's
Responses shapes; and `prepare()`/`response_chunks()`, the request-level pieces
(request/prepare.py, request/completions.py) that the HTTP server drives from its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import loading
from .decoding.engine import Engine
from .decoding.promptcache import PromptCache
from .decoding.sampling import SamplingParams
from .decoding.stats import GenerationStats
from .decoding.textstream import StopStrings, TextStream
from .drafters import DraftSpec
from .drafters.prediction import PredictionDrafter
from .errors import UserError
from .llamacompat import LlamaMethods
from .loading import MAX_PARALLEL, options as llamaargs  # noqa: F401  (MAX_PARALLEL: part of the API)
from .request import completions, constraints, messagereply, params, responseshape
from .request import prepare as preparing
from .request.chat import ChatFormat
from .request.prepare import Request
from .request.tools import ToolSet
from .runtime import hub, native


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


class SpecGGUF(LlamaMethods):
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
        See specgguf/loading/options.py for the list.
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
        computes, whatever the drafter (docs/machines.md, "Batch invariance"): reference CPU
        kernels, flash attention on, and verify batches no wider than measured at load. CPU only.
        n_parallel: generations that run at once, from any threads, in one context (one target
        pass per round for all: decoding/slots.py), each with n_ctx tokens and a prompt cache of
        its own; more wait for a free slot. Every draft kind (docs/loop.md §9)."""
        self._loaded = self.drafter = self.target = self.engine = None
        target, self._seed = llamaargs.check_init(target, model_path, draft, draft_max, draft_kind, draft_p_min,
                                                  n_threads_batch, n_batch, seed, verbose, chat_format,
                                                  last_n_tokens_size, logits_all, flash_attn)
        llamaargs.check_extra(llama_options)
        llamaargs.check_resources(n_ctx, n_threads, n_threads_batch, n_batch)
        llamaargs.whole("prompt_cache_bytes", prompt_cache_bytes, 0)
        llamaargs.flag("deterministic", deterministic)
        llamaargs.flag("batch_invariant", batch_invariant)
        llamaargs.whole("n_parallel", n_parallel, 1)
        native.set_verbose(verbose)
        try:
            spec = DraftSpec.parse(draft, draft_kind)  # the one parse of the draft argument
            self._loaded = loading.load(target, spec, draft_max=draft_max, n_ctx=n_ctx, n_threads=n_threads,
                                        n_threads_batch=n_threads_batch, n_gpu_layers=n_gpu_layers, n_batch=n_batch,
                                        rpc_servers=rpc_servers, flash_attn=flash_attn,
                                        batch_invariant=batch_invariant, n_parallel=n_parallel,
                                        draft_p_min=draft_p_min,
                                        deterministic=deterministic or self._seed is not None)
        except UserError as exc:  # a bad argument or file: a ValueError, as Llama raises
            raise llamaargs.as_value_error(exc) from None
        loaded = self._loaded
        self.target, self.drafter, self.engine, self._pool = loaded.target, loaded.drafter, loaded.engine, loaded.pool
        self.draft_spec: DraftSpec | None = loaded.draft
        self.set_cache_bytes(prompt_cache_bytes)
        self.verbose, self.penalty_last_n = verbose, last_n_tokens_size
        self.model_name = loading.model_name(loaded)
        self._chat_format: ChatFormat | None = None
        self._plain: Engine | None = None

    @property
    def seed(self) -> int | None:
        """The constructor's seed: the default of every sampled request (None: a fresh one each)."""
        return self._seed

    _pool = None  # decoding.slots.SlotPool when n_parallel > 1

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
        try:
            spec = loading.resolve_draft(DraftSpec.parse(draft, kwargs.get("draft_kind")), path, cache_dir=cache_dir)
        except UserError as exc:
            raise llamaargs.as_value_error(exc) from None
        return cls(path, draft=spec, **kwargs)

    def reset(self) -> None:
        """Forget the context's contents: the next generation reads its whole prompt (saved
        states of the prompt cache stay; `set_cache(None)` drops them)."""
        self._check_open()
        if self._pool is not None:
            self._pool.reset()
            return
        self.target.acquire(self)  # waits for another thread's generation; refuses an unfinished one
        try:
            PromptCache.of(self.target).clear()
        finally:
            self.target.release()

    # -- the prompt cache (decoding/promptcache.py) -----------------------------------------
    def set_cache_bytes(self, capacity_bytes: int) -> None:
        """Keep up to `capacity_bytes` of saved cache states beyond the live context (0: none)."""
        self._check_open()
        self._loaded.set_saved_states(llamaargs.whole("capacity_bytes", capacity_bytes, 0))

    # -- prompts ---------------------------------------------------------------------------
    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            self._chat_format = ChatFormat.for_model(self.target.model, self.target.info.chat_template)
        return self._chat_format

    def chat_prompt(self, messages: list[dict], tools: ToolSet | None = None) -> list[int]:
        """Render `messages` (and `tools`, see request/tools.py) with the chat format and tokenize
        it (no double BOS)."""
        self._check_open()
        return preparing.chat_tokens(self, messages, tools)

    def _prompt_tokens(self, prompt) -> list[int]:
        self._check_open()
        return preparing.prompt_tokens(self, prompt)

    # -- generation ------------------------------------------------------------------------
    def stream_tokens(self, prompt_tokens: list[int], max_tokens: int = 256, stop=None,
                      sampling: "dict | SamplingParams | None" = None, speculate: bool = True,
                      cancelled: Callable[[], bool] | None = None, grammar: str | None = None,
                      on_verified=None, trace=None, prediction: list[int] | None = None):
        """(generation, text chunks iterator) for already tokenized input: the one way every
        front end (CLI, chat, profile, server) runs a generation.

        sampling: checked sampling fields (see `params.SAMPLING_FIELDS`) or a `SamplingParams`.
        speculate=False decodes plainly with the same target and the same loop (n = 0): the
        fair baseline. cancelled: asked between prefill chunks and rounds (from the iterating
        thread); when it says yes the generation ends with finish_reason "cancelled".
        grammar: GBNF text the output must follow (constraints.py), or None.
        on_verified(ctx, ids): called once a round with the committed ids (request/logprobs.py);
        trace: a decoding.trace.RoundTrace that times every round's phases. prediction: tokens
        the output is expected to repeat (Predicted Outputs), drafted from when they fit.
        """
        self._check_open()
        if prediction and not speculate:
            raise UserError("a prediction is a draft: it needs speculate=True", param="prediction")
        stop = params.stop_strings(stop)  # checked once, here: every front end passes through
        sp = sampling if isinstance(sampling, SamplingParams) else params.sampling_params(sampling or {})
        stops = StopStrings(self.target.model, stop)
        front = (lambda inner, width: PredictionDrafter(prediction, inner, width)) if prediction else None
        hooks = dict(on_verified=on_verified, draft_limit=stops.draft_limit, trace=trace, prediction=front)
        if self._pool is not None:  # the free slot whose cache holds most of the prompt
            engines = self._pool.engines if speculate else \
                self._pool.plain_engines(lambda slot: Engine(slot, None, 1))
            gen = engines[0].generate_on(engines, self._pool, prompt_tokens, max_tokens, sampling=sp,
                                         cancelled=cancelled, grammar=grammar, **hooks)
        else:
            engine = self.engine if speculate else self._plain_engine()
            gen = engine.generate(prompt_tokens, max_tokens, sampling=sp, cancelled=cancelled, grammar=grammar,
                                  **hooks)
        return gen, TextStream(gen, stops)

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

    def stream(self, prompt, max_tokens: int = 256, stop=None, grammar=None, prediction=None,
               **sampling) -> Iterator[Chunk]:
        """Yield `Chunk`s as text is verified; the last one carries finish_reason, tokens and stats.

        prompt: text or token ids. Leaving the loop early stops the generation.
        grammar: GBNF text or a llama_cpp.LlamaGrammar the output must follow.
        prediction: text the output is expected to repeat (the file being edited): drafted from
        wherever the output follows it, by whatever drafter (none included); output unchanged.
        """
        gen, text = self._start(prompt, max_tokens, stop, grammar, prediction, sampling)
        try:
            for piece in text:
                yield Chunk(piece)
            yield Chunk("", gen.finish_reason or "stop", list(gen.tokens), gen.stats)
        finally:
            gen.close("cancelled")  # no-op when it already finished

    def generate(self, prompt, max_tokens: int = 256, stop=None, grammar=None, prediction=None, **sampling) -> Result:
        """Generate a completion of `prompt` (text or token ids) and return it whole (grammar,
        prediction: as stream's)."""
        gen, text = self._start(prompt, max_tokens, stop, grammar, prediction, sampling)
        out = "".join(text)
        return Result(out, list(gen.tokens), gen.finish_reason or "stop", gen.stats)

    def _start(self, prompt, max_tokens, stop, grammar, prediction, sampling):
        return self.stream_tokens(self._prompt_tokens(prompt), max_tokens, stop, params.sampling_fields(sampling),
                                  grammar=self._grammar(grammar), prediction=preparing.prediction_tokens(self, prediction))

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
        from .decoding.measure import measure_costs

        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise params.RequestError(f"tokens must be a whole number >= 1 (got {tokens!r})", param="tokens")
        self._check_open()
        return measure_costs(self.target, self.drafter, prompt_tokens, lengths, tokens, repeats)

    def cost_profile(self) -> dict:
        """The costs auto draft lengths have measured here so far (decoding/measure.py report)."""
        from .decoding.measure import report

        self._check_open()
        return report(self.engine.profile)

    # -- llama_cpp.Llama-compatible --------------------------------------------------------
    def prepare(self, body: dict, chat: bool) -> Request:
        """Check an OpenAI/Llama-style request (a JSON body or keyword arguments) and tokenize it.

        Raises `params.RequestError` (a ValueError) with the OpenAI `param` and `code`.
        """
        self._check_open()
        return preparing.prepare(self, body, chat)

    def response_chunks(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """The stream of one request as Llama/OpenAI chunk dicts, usage and stats on the last one.

        `cancelled` is asked after every chunk: when it says yes the generation is closed (the
        engine stops at that round) and nothing more is yielded.
        """
        return completions.chunks(self, req, cancelled)

    def response(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict | None:
        """The whole response of one request (None when cancelled before the end)."""
        return completions.full(self, req, cancelled)

    # -- the other APIs' requests (docs/server.md), the same generation underneath -----------
    def create_message(self, **body):
        """Anthropic's Messages API: the message dict, or with stream=True an iterator of its events."""
        self._check_open()
        return messagereply.create(self, body)

    def create_response(self, history: list[dict] | None = None, **body):
        """OpenAI's Responses API: a Response dict, or with stream=True (event type, event) pairs.
        history: the conversation a stored response holds, for `previous_response_id`."""
        self._check_open()
        return responseshape.create(self, body, history)

    # -- resources -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the draft and the target (contexts, then models). Safe to call twice."""
        loaded = getattr(self, "_loaded", None)
        if loaded is not None:
            loaded.close()
        self.drafter = self.target = self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
