"""`specgguf inspect`: what a GGUF is and what it can be used for (metadata only)."""

from __future__ import annotations

from .compat import check_shared_vocab
from .errors import UserError
from .ggufinfo import read_gguf

# Architectures whose graph in the pinned llama.cpp exposes per-layer inputs, which
# eagle3/dflash/dspark drafts read (runtime-protocol.md §6.9).
LAYER_INPUT_ARCHS = {"llama", "llama-embed", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next",
                     "qwen4exp", "gemma4", "gpt-oss", "lfm2", "hunyuan-vl", "hunyuan-dense", "nemotron_h",
                     "minimax-01", "minimax-m2", "mimo2", "bailingmoe3", "deepseek4", "muse-glimmer",
                     "nanbeige"}


def draft_kind_of(info) -> str:
    """The draft kind a GGUF serves as: eagle3, dflash, dspark, or model (any plain LM)."""
    if info.arch == "eagle3":
        return "eagle3"
    if info.arch == "dflash":
        return "dspark" if info.has_tensor("markov_w1.weight") else "dflash"
    return "model"


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
    kind = draft_kind_of(info)
    if kind == "model":
        feeds = "yes" if info.arch in LAYER_INPUT_ARCHS else "no (its graph exposes no layer inputs)"
        lines.append("as a target:  any plain draft of the same tokenizer, or ngram; "
                     f"eagle3/dflash/dspark drafts: {feeds}")
        lines.append("as a draft:   kind 'model' for targets with the same tokenizer")
    else:
        lines.append(f"as a draft:   kind '{kind}', reads target layers {list(info.target_layers)} "
                     "(runs in a later specgguf release)")
    if target_path:
        tgt = read_gguf(target_path, "target")
        try:
            check_shared_vocab(tgt, info)
            verdict = f"fits target {tgt.path.name}: same tokenizer"
        except UserError as exc:
            verdict = f"does NOT fit target {tgt.path.name}: {exc}"
        lines.append(f"pairing:      {verdict}")
    return lines
