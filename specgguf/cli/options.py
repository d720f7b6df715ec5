"""What the commands share: the model and sampling options, and opening a `SpecGGUF` from
them (every command reaches the engine through the public API)."""

from __future__ import annotations

import click

import re

from ..errors import UserError

DEMO_PROMPT = (
    "Copy the following list exactly, then stop.\n"
    "1. Preheat the oven to 200 degrees.\n2. Mix the flour, the sugar and the butter.\n"
    "3. Add two eggs and stir well.\n4. Pour the batter into a tin.\n5. Bake for thirty minutes.\n\n"
    "Copy:\n1. Preheat the oven to"
)


# Python argument -> the flag that sets it: library errors name the argument (`param`), the
# command line shows the flag.
FLAGS = {"n_ctx": "--ctx", "n_threads": "--threads", "n_gpu_layers": "--gpu-layers", "max_tokens": "--max-tokens",
         "draft_max": "--draft-max", "draft_kind": "--draft-kind", "draft_p_min": "--draft-p-min",
         "draft": "--draft", "prompt": "--prompt", "stop": "--stop", "temperature": "--temperature",
         "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "repeat_penalty": "--repeat-penalty",
         "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
         "penalty_last_n": "--penalty-last-n", "seed": "--seed", "accept": "--accept", "rpc_servers": "--rpc",
         "tokens": "--tokens"}


def flag_message(exc: Exception) -> str:
    """The error's message with the Python argument it names written as the CLI flag."""
    message, param = str(exc), getattr(exc, "param", None)
    flag = FLAGS.get(param or "")
    if flag:
        message = re.sub(rf"(?<![\w-])'?{re.escape(param)}'?(?!\w)", flag, message)
    return message


def _draft_values(ctx, param, values):
    """--draft as given (zero, one or two values): open_model parses them with --draft-kind,
    once, into a DraftSpec."""
    return tuple(values) or None


def model_options(f):
    options = [
        click.argument("target", required=False),
        click.option("--offline", is_flag=True,
                     help="Hugging Face ids (TARGET or --draft as org/repo[@REV][:QUANT] or org/repo/FILE.gguf) "
                          "from the local cache only, never the network (also HF_HUB_OFFLINE=1)."),
        click.option("--draft", "-d", multiple=True, callback=_draft_values,
                     help="A draft GGUF (a path or a Hugging Face id; same tokenizer as the target), 'ngram' "
                          "(prompt lookup), 'suffix' (lookup in the text and in earlier outputs) or 'mtp' (the target's own MTP "
                          "layers: Qwen3.5/3.6); give 'suffix' and a GGUF (--draft suffix --draft D.gguf) to use "
                          "each where it pays. Omit for plain decoding."),
        click.option("--draft-max", default="auto", show_default=True,
                     help="Tokens drafted per round: a number, or auto (chosen each round from costs "
                          "measured on this machine and the acceptance so far; 0 when drafting does not pay)."),
        click.option("--draft-kind", type=click.Choice(["model", "ngram", "eagle3", "dflash", "dspark", "mtp"]),
                     default=None, help="Override the kind detected from the draft GGUF (e.g. dspark slot "
                                        "rules for a DFlash file)."),
        click.option("--draft-p-min", type=float, default=0.0, show_default=True,
                     help="Stop drafting at a token whose draft confidence is below this (DSpark: its "
                          "confidence head; others: softmax over the top 10)."),
        click.option("--ctx", "n_ctx", type=int, default=None,
                     help="Context size in tokens [default: 4096, or the model's trained context if smaller; "
                          "0: the trained context]."),
        click.option("--threads", "n_threads", type=int, default=None, help="CPU threads (default: all usable)."),
        click.option("--gpu-layers", "n_gpu_layers", type=int, default=0, show_default=True,
                     help="Layers offloaded to the GPU (CUDA/Metal builds; 99 = all)."),
        click.option("--rpc", "rpc_servers", default=None, metavar="HOST:PORT[,HOST:PORT]",
                     help="llama.cpp RPC servers (ggml-rpc-server) that hold the --gpu-layers target layers "
                          "(a build with RPC: specgguf build-llama --rpc)."),
        click.option("--flash-attn", type=click.Choice(["off", "on", "auto"]), default=None,
                     help="Flash attention for the target and its draft [default: off, as in llama_cpp.Llama: on "
                          "the CPU its single-token decode splits long contexts (>= 512 cells) another way than a "
                          "verify batch, so greedy drafting would answer differently from plain decoding; on in "
                          "--batch-invariant] (docs/machines.md)."),
        click.option("--batch-invariant", is_flag=True,
                     help="Verify batches that compute one-token decoding's logits bit for bit: greedy output is "
                          "plain greedy output on quantised targets, whatever the draft. ggml's reference CPU "
                          "kernels and flash attention; slower (README); measured once per model at load."),
        click.option("--deterministic", is_flag=True,
                     help="Auto draft lengths from the text alone, never from timing, so two runs draft alike "
                          "(implied by --seed; docs/loop.md §2.4)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def parse_draft_max(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise UserError(f"--draft-max must be 'auto' or a whole number >= 1 (got {value!r})") from None
    if n < 1:
        raise UserError(f"--draft-max must be at least 1 (got {n}); omit --draft to decode without a draft")
    return n


def open_model(target, draft, draft_max, n_ctx, n_threads, n_gpu_layers, verbose, draft_kind=None, draft_p_min=0.0,
          rpc_servers=None, flash_attn=None, chat=False, offline=False, deterministic=False,
          batch_invariant=False, n_parallel=1, **_):
    """A SpecGGUF from the command's options. chat: with no TARGET, start the default chat
    model (an instruct model) rather than the API's default (the Gemma base model)."""
    from ..api import SpecGGUF

    n = parse_draft_max(draft_max)
    if not 0.0 <= draft_p_min <= 1.0:
        raise UserError(f"--draft-p-min must be within [0, 1] (got {draft_p_min})")
    if draft is None and draft_kind not in (None, "ngram"):
        raise UserError(f"--draft-kind {draft_kind} needs a --draft GGUF")
    from ..drafters.spec import DraftSpec

    draft = DraftSpec.from_options(draft, draft_kind)  # the one parse of --draft
    draft_kind = None  # ...which carries it
    if batch_invariant and flash_attn is not None and flash_attn != "on":
        raise UserError(f"--batch-invariant runs flash attention on (its vector path is the kernel that is the same "
                        f"at every batch width): drop --flash-attn {flash_attn}")
    if target is None and chat:
        from ..runtime.defaults import default_chat_target

        target = default_chat_target()
    if offline:  # read by runtime/hub.py when SpecGGUF resolves Hub ids (the target's, the draft's)
        import os

        os.environ["HF_HUB_OFFLINE"] = "1"
    return SpecGGUF(target, draft=draft, draft_max=n, n_ctx=n_ctx, n_threads=n_threads,
                    n_gpu_layers=n_gpu_layers, verbose=verbose, draft_kind=draft_kind, draft_p_min=draft_p_min,
                    rpc_servers=rpc_servers, flash_attn={None: False, "off": False, "on": True, "auto": None}[flash_attn],
                    deterministic=deterministic, batch_invariant=batch_invariant, n_parallel=n_parallel)


def sampling_options(f):
    """Sampler settings (specgguf.decoding.sampling.SamplingParams); the defaults decode greedily."""
    options = [
        click.option("--temperature", "--temp", "temperature", type=float, default=0.0, show_default=True,
                     help="Sampling temperature; 0 = greedy (the target's own arg-max)."),
        click.option("--top-k", type=int, default=0, show_default=True,
                     help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=1.0, show_default=True,
                     help="Keep the most likely tokens up to this probability mass (1 = off)."),
        click.option("--min-p", type=float, default=0.0, show_default=True,
                     help="Drop tokens below this fraction of the top token's probability (0 = off)."),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True,
                     help="Penalise tokens seen in the last --penalty-last-n tokens (1 = off)."),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True),
        click.option("--penalty-last-n", type=int, default=64, show_default=True,
                     help="Tokens the penalties look back over (-1 = all, 0 = off)."),
        click.option("--seed", type=int, default=None,
                     help="Random seed in [0, 2**64 - 1]: the same seed, prompt and settings give the same text, "
                          "with any draft and draft length (coupled and exact rules). Omitted or -1: one is drawn "
                          "and shown in the stats (--stats, --json) so the run can be repeated."),
        click.option("--accept", type=click.Choice(["coupled", "exact", "ratio"]), default=None,
                     help="Acceptance rule when sampling: coupled (the default: target and draft sample with the "
                          "same keyed noise; output = plain sampling with the same seed), exact (llama.cpp: greedy "
                          "drafts kept while they match the target's sample; same output) or ratio (min(1, p/q), "
                          "residual resampling; same distribution, but the text depends on the draft lengths)."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def sampling_from(opts: dict):
    """SamplingParams from (and removed from) the command's options; bad values: one line."""
    from ..decoding.sampling import SamplingParams

    names = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
             "frequency_penalty", "penalty_last_n", "seed")
    values = {n: opts.pop(n) for n in names}
    if values["seed"] == -1:  # llama.cpp's "random seed"
        values["seed"] = None
    return SamplingParams(**values, accept=opts.pop("accept") or "auto")
