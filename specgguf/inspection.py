"""`specgguf inspect`: what a GGUF is and what it can be used for (metadata only)."""

from __future__ import annotations

from .runtime.compat import LAYER_INPUT_ARCHS, check_hidden_state_pair, check_loadable, check_mtp_pair, check_shared_vocab, is_gemma4_draft, needs_eagle3_patch
from .drafters import detect_kind
from .errors import UserError
from .runtime.ggufinfo import read_gguf
from .runtime.patchprobe import BUILD_COMMAND


def describe(path, target_path=None) -> list[str]:
    info = read_gguf(path, "GGUF")
    mib = info.size_bytes / 2**20
    lines = [
        f"file:         {info.path} ({mib:.1f} MiB, {len(info.tensors)} tensors, {info.file_type})",
        f"name:         {info.name}",
        f"architecture: {info.arch}",
        f"layers:       {info.n_layer}, width {info.n_embd}, heads {info.n_head}, "
        f"trained context {info.n_ctx_train}",
        f"vocabulary:   {info.n_vocab} tokens ({info.tokenizer_model}), bos {info.bos_id}, eos {info.eos_id}, "
        f"fingerprint {info.vocab_fingerprint}",
        f"chat template: {'yes' if info.chat_template else 'none (chat uses a fallback format)'}",
    ]
    kind = detect_kind(info)
    try:
        check_loadable(info, "target" if kind == "model" else "draft")
    except UserError as exc:
        lines.append(f"problem:      {exc}")
    if kind == "model":
        feeds = "yes" if info.arch in LAYER_INPUT_ARCHS else "no (its graph exposes no layer inputs)"
        lines.append("as a target:  any plain draft of the same tokenizer, or ngram; "
                     f"eagle3/dflash/dspark drafts: {feeds}")
        lines.append("as a draft:   kind 'model' for targets with the same tokenizer")
    elif kind == "mtp":
        lines.append(f"as a draft:   kind 'mtp', reads the target's final hidden states (width "
                     f"{info.metadata.get('gemma4-assistant.embedding_length_out')}) and shares its KV cache")
        lines.append("runs on:      the stock build, beside the gemma4 target it was released with")
    else:
        lines.append(f"as a draft:   kind '{kind}', reads target layers {list(info.target_layers)} "
                     f"(inputs of those layers), {_head(info)}")
        if info.arch == "dflash":
            anchor = info.metadata.get("dflash.sample_from_anchor")
            rule = "sample-from-anchor" if (anchor is True or (kind == "dspark" and anchor is not False)) else "in-place"
            extra = ", confidence head" if info.has_tensor("conf_proj.weight") else ""
            lines.append(f"block:        {info.metadata.get('dflash.block_size', 16)} tokens, {rule} slots{extra}")
        lines.append(f"runs on:      {_runs_on(info, kind)}")
    lines.append(f"sampling:     --accept ratio uses {RATIO_Q[kind]}")
    if target_path:
        tgt = read_gguf(target_path, "target")
        try:
            if kind == "model":
                check_shared_vocab(tgt, info)
                verdict = f"fits target {tgt.path.name}: same tokenizer"
            elif kind == "mtp":
                check_mtp_pair(tgt, info)
                verdict = f"fits target {tgt.path.name}: width {tgt.n_embd}, its caches, same vocabulary"
            else:
                check_hidden_state_pair(tgt, info, kind)
                verdict = (f"fits target {tgt.path.name}: layers {list(info.target_layers)} of its "
                           f"{tgt.n_layer}, width {tgt.n_embd}, same vocabulary")
        except UserError as exc:
            verdict = f"does NOT fit target {tgt.path.name}: {exc}"
        lines.append(f"pairing:      {verdict}")
    if kind != "model":
        flags = health_flags(info, tgt if target_path else None)
        lines.append(f"health:       {'; '.join(flags) if flags else 'no static problem seen'}")
    return lines


def health_flags(info, target=None) -> list[str]:
    """What the file's weights say about a draft that would accept next to nothing (users'
    "is this drafter even working?"): norms never trained (every weight exactly 1.0), a head or
    projection that is all zeros, target layers the target does not have. Reads tensor data
    (memory-mapped), no llama.cpp."""
    import numpy as np
    from gguf import GGUFReader

    flags = []
    try:
        reader = GGUFReader(str(info.path))
    except (OSError, ValueError) as exc:
        return [f"cannot read its tensors ({exc})"]
    norms, untrained = 0, []
    for t in reader.tensors:
        name, data = t.name, np.asarray(t.data)
        if name.endswith("norm.weight") and data.dtype in (np.float32, np.float16):
            norms += 1
            if data.size and bool(np.all(data == 1.0)):
                untrained.append(name)
        elif name in _HEADS and data.size and not np.any(data.view(np.uint8)):
            flags.append(f"{name} is all zeros (a head switched off: it drafts nothing useful)")
    if untrained and len(untrained) == norms:
        flags.append(f"all {norms} norm weights are exactly 1.0 (never trained, or lost in the export)")
    elif untrained:
        flags.append(f"{len(untrained)} of {norms} norm weights are exactly 1.0 ({', '.join(untrained[:3])}"
                     f"{', ...' if len(untrained) > 3 else ''}): untrained?")
    if target is not None and info.target_layers:
        out = [i for i in info.target_layers if not 0 <= i < target.n_layer]
        if out:
            flags.append(f"target layers {out} are out of range for {target.path.name} ({target.n_layer} layers)")
    return flags


# a draft's head and the projections its features pass through: all zeros disables it
_HEADS = ("output.weight", "fc.weight", "markov_w1.weight", "markov_w2.weight", "conf_proj.weight",
          "blk.0.attn_q.weight")


# What `--accept ratio` knows of each kind's draft distribution q (tests/test_sampling.py
# checks it against the drafters' draft() signatures: a kind that takes `sampler` samples).
_POINT = "point masses (this kind drafts greedily): still exact, acceptance p(draft)"
RATIO_Q = {"model": "q = the draft's own sampled distribution (same transforms as the target)",
           "eagle3": _POINT, "dflash": _POINT, "dspark": _POINT, "mtp": _POINT}


def _runs_on(info, kind: str) -> str:
    """Which llama.cpp build runs this draft, and beside which target architectures."""
    if kind == "eagle3" and needs_eagle3_patch(info):
        build = f"the patched build only (`{BUILD_COMMAND}`; the stock one refuses it)"
    else:
        build = "the stock build"
    if is_gemma4_draft(info):
        targets = "a gemma4 target (a Gemma-4 draft)"
    else:
        targets = "targets that expose layer inputs (qwen3, llama, qwen3moe, gemma4, ...; not gemma3)"
    return f"{build}, beside {targets} of the same vocabulary"


def _head(info) -> str:
    if info.has_tensor("output.weight") and info.has_tensor("token_embd.weight"):
        return "own embeddings and head"
    if info.has_tensor("output.weight"):
        return "own head, the target's embeddings"
    return "the target's embeddings and head (shared)"
