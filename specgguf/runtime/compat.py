"""Draft/target checks that run before llama.cpp can see the pair.

llama.cpp aborts the whole process on some mismatches (GGML_ASSERT) and throws C++
exceptions on others, so every check a user can fail is done here first, on metadata only,
and ends in one `UserError` line.
"""

from __future__ import annotations

from ..errors import UserError
from .ggufinfo import GGUFInfo
from .patchprobe import BUILD_COMMAND

# llama.cpp accepts draft vocabularies up to this many tokens larger or smaller (padding).
MAX_VOCAB_DIFF = 128

# Limits the pinned llama.cpp asserts on while loading (llama-hparams.h): a file beyond them
# aborts the process instead of failing to load, so they are checked here first.
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 256
# Architectures that only draft: their graph reads a target's hidden states or shares its
# cache, so alone they produce nonsense (or abort) as a target.
DRAFT_ONLY_ARCHS = frozenset({"eagle3", "dflash", "gemma4-assistant"})


def check_loadable(info: GGUFInfo, role: str) -> None:
    """Hyperparameters within llama.cpp's limits and a file in the right role, on metadata
    alone; `role` is "target" or "draft". `inspect` reports the same verdicts."""
    name = f"{role} {info.path.name}"
    if role == "target" and info.arch in DRAFT_ONLY_ARCHS:
        raise UserError(f"{name} is a draft ({info.arch} architecture), not a target model: pass it with "
                        "--draft beside the target it was made for")
    n_layer = info.metadata.get(f"{info.arch}.block_count")
    if n_layer is None:
        raise UserError(f"{name} has no {info.arch}.block_count key: the file is damaged or not a model")
    if not isinstance(n_layer, int) or not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise UserError(f"{name} declares {n_layer!r} layers ({info.arch}.block_count); llama.cpp handles "
                        f"1 to {LLAMA_MAX_LAYERS}: the file is damaged or was written wrongly")
    width = info.metadata.get(f"{info.arch}.embedding_length")
    if width is not None and (not isinstance(width, int) or width < 1):
        raise UserError(f"{name} declares width {width!r} ({info.arch}.embedding_length): the file is damaged")
    heads = info.arrays.get(f"{info.arch}.attention.head_count", info.metadata.get(f"{info.arch}.attention.head_count"))
    if isinstance(heads, list) and len(heads) not in (1, n_layer):
        raise UserError(f"{name} lists {len(heads)} head counts for {n_layer} layers "
                        f"({info.arch}.attention.head_count): the file is damaged")
    experts = info.metadata.get(f"{info.arch}.expert_count", 0)
    used = info.metadata.get(f"{info.arch}.expert_used_count", 0)
    if isinstance(experts, int) and isinstance(used, int) and (experts > LLAMA_MAX_EXPERTS or used > experts):
        raise UserError(f"{name} declares {used} of {experts} experts per token; llama.cpp handles at most "
                        f"{LLAMA_MAX_EXPERTS} experts and no more used than exist: the file is damaged")
    if info.arch == "gemma4":
        _check_gemma4(info, name, n_layer)


def _check_gemma4(info: GGUFInfo, name: str, n_layer: int) -> None:
    """What the gemma4 loader asserts on when a context is made (llama-model.cpp's memory setup):
    the cache is always interleaved sliding/full, so some layer must slide, and layers that
    reuse earlier layers' KV (shared_kv_layers) must leave at least two that own theirs."""
    pattern = info.arrays.get("gemma4.attention.sliding_window_pattern")
    if pattern is not None and not any(pattern[:n_layer]):
        raise UserError(f"{name} marks no layer as sliding-window (gemma4.attention.sliding_window_pattern), "
                        "which llama.cpp aborts on: the file was converted wrongly; convert it again")
    shared = info.metadata.get("gemma4.attention.shared_kv_layers", 0)
    if isinstance(shared, int) and shared > 0 and n_layer - shared < 2:
        raise UserError(f"{name} shares the KV cache of {shared} of its {n_layer} layers, leaving fewer than 2 "
                        "with their own, which llama.cpp aborts on: the file was converted wrongly")


def check_mtp_pair(target: GGUFInfo, draft: GGUFInfo) -> None:
    """A gemma4-assistant draft and its gemma4 target: the assistant reads the target's cache
    (its sliding layers that of the target's layer n-2, its full ones that of layer n-1) and
    its hidden states, so widths, head sizes and that layout must agree, or llama.cpp aborts."""
    name = f"mtp draft {draft.path.name}"
    fix = "use the gemma4 target the assistant was released with"
    if draft.arch != "gemma4-assistant":
        raise UserError(f"{name} has architecture {draft.arch!r}; --draft-kind mtp runs gemma4-assistant drafts")
    if target.arch != "gemma4":
        raise UserError(f"{name} drafts for gemma4 targets, but {target.path.name} is a {target.arch!r} model; {fix}")
    out = draft.metadata.get("gemma4-assistant.embedding_length_out")
    if out != target.n_embd:
        raise UserError(f"{name} takes hidden states of width {out} (embedding_length_out) but {target.path.name} "
                        f"has width {target.n_embd}; {fix}")
    nextn = draft.metadata.get("gemma4-assistant.nextn_predict_layers", 0)
    if not isinstance(nextn, int) or not 1 <= nextn <= draft.n_layer:
        raise UserError(f"{name} declares {nextn!r} prediction layers for {draft.n_layer} layers; convert it again")
    pattern = target.arrays.get("gemma4.attention.sliding_window_pattern") or []
    if target.n_layer < 2 or len(pattern) < target.n_layer or list(pattern[target.n_layer - 2:target.n_layer]) != [1, 0]:
        raise UserError(f"{target.path.name} does not end in a sliding and a full-attention layer, whose caches "
                        f"{name} reads; {fix}")
    for key in ("attention.key_length", "attention.key_length_swa"):
        if draft.metadata.get(f"gemma4-assistant.{key}") != target.metadata.get(f"gemma4.{key}"):
            raise UserError(f"{name} has {key} {draft.metadata.get(f'gemma4-assistant.{key}')} but the target has "
                            f"{target.metadata.get(f'gemma4.{key}')}: it cannot read that cache; {fix}")
    if draft.n_vocab != target.n_vocab or draft.vocab_fingerprint != target.vocab_fingerprint:
        raise UserError(f"{name} and {target.path.name} have different vocabularies; {fix}")


def is_gemma4_draft(draft: GGUFInfo) -> bool:
    """A dflash or eagle3 draft converted from a Gemma-4 checkpoint (sqrt(H) embeddings, Gemma's post norms)."""
    return draft.arch in ("dflash", "eagle3") and (draft.metadata.get(f"{draft.arch}.embedding_scale") is not None
                                                   or draft.has_tensor("blk.0.post_attention_norm.weight"))


def check_shared_vocab(target: GGUFInfo, draft: GGUFInfo) -> None:
    """A plain draft model must tokenize exactly like the target (spec.cpp:67-130)."""
    fix = "use a draft from the target's model family (same tokenizer)"
    if draft.tokenizer_model is None:
        raise UserError(f"draft {draft.path.name} has no tokenizer; {fix}")
    if draft.tokenizer_model != target.tokenizer_model:
        raise UserError(f"draft tokenizer type {draft.tokenizer_model!r} differs from the target's "
                        f"{target.tokenizer_model!r}; {fix}")
    if abs(draft.n_vocab - target.n_vocab) > MAX_VOCAB_DIFF:
        raise UserError(f"draft vocabulary ({draft.n_vocab} tokens) differs from the target's "
                        f"({target.n_vocab} tokens); {fix}")
    if (draft.bos_id, draft.eos_id, bool(draft.add_bos)) != (target.bos_id, target.eos_id, bool(target.add_bos)):
        raise UserError(f"draft BOS/EOS settings (bos {draft.bos_id}, eos {draft.eos_id}) differ from the "
                        f"target's (bos {target.bos_id}, eos {target.eos_id}); {fix}")
    if draft.vocab_fingerprint != target.vocab_fingerprint:
        n = min(draft.n_vocab, target.n_vocab)
        a, b = draft.tokens, target.tokens
        for i in range(5, n):  # llama.cpp ignores the first 5 (special) tokens here
            if a[i] != b[i]:
                raise UserError(f"draft token {i} is {a[i]!r} but the target's is {b[i]!r}: the "
                                f"vocabularies differ; {fix}")


# Architectures whose graph in the pinned llama.cpp stores per-layer inputs (t_layer_inp),
# which eagle3/dflash/dspark drafts read. Enabling extraction on any other target aborts
# the whole process at its next decode (docs/loop.md §5): gemma3 and qwen2 are not here.
LAYER_INPUT_ARCHS = frozenset({
    "llama", "llama-embed", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "gemma4",
    "gpt-oss", "lfm2", "hunyuan-vl", "hunyuan-dense", "nemotron_h", "minimax-01", "minimax-m2", "mimo2",
    "bailingmoe3", "deepseek4", "muse-glimmer", "nanbeige"})
# Archs whose graph exposes the pre-final-norm state, which eagle3 reads for layer id == n_layer.
NEXTN_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next", "gemma4", "gpt-oss", "deepseek2", "deepseek4",
                         "glm4moe", "nemotron_h"})


def _has_qk_norm(draft: GGUFInfo) -> bool:
    return draft.has_tensor("blk.0.attn_q_norm.weight") or draft.has_tensor("blk.0.attn_k_norm.weight")


def needs_eagle3_patch(draft: GGUFInfo) -> bool:
    """The stock eagle3 loader takes exactly 3 target layers, no q/k norms and no Gemma-4 layer
    (docs/patches.md)."""
    return len(draft.target_layers) != 3 or _has_qk_norm(draft) or is_gemma4_draft(draft)


def _eagle3_patched(gemma: bool) -> bool:
    from .patchprobe import has_eagle3_patch  # probes in a subprocess once per library, cached

    return has_eagle3_patch(gemma=gemma)


def check_hidden_state_pair(target: GGUFInfo, draft: GGUFInfo, kind: str, p_min: float = 0.0) -> None:
    """An eagle3/dflash/dspark draft and its target, checked on metadata alone."""
    name = f"{kind} draft {draft.path.name}"
    if target.arch not in LAYER_INPUT_ARCHS:
        raise UserError(f"target architecture {target.arch!r} cannot hand hidden states to an {kind} draft "
                        "in this llama.cpp (its graph exposes no layer inputs); use --draft ngram or a plain "
                        "draft model with the same tokenizer")
    ids = draft.target_layers
    if not ids:
        raise UserError(f"{name} lists no target layers ({draft.arch}.target_layers); convert it again")
    if is_gemma4_draft(draft) and target.arch != "gemma4":
        raise UserError(f"{name} is a Gemma-4 draft but {target.path.name} is a {target.arch!r} model; "
                        "use the gemma4 target it was converted for")
    if kind == "eagle3":
        if needs_eagle3_patch(draft) and not _eagle3_patched(is_gemma4_draft(draft)):
            raise UserError(f"{name} is a DeepSpec-style Eagle3 draft ({len(ids)} target layers"
                            f"{', q/k norms' if _has_qk_norm(draft) else ''}"
                            f"{', Gemma-4 layer' if is_gemma4_draft(draft) else ''}) that the installed llama.cpp "
                            f"cannot run (without specgguf's patches it runs 3-layer EAGLE-3 only): install the patched build with "
                            f"`{BUILD_COMMAND}` (add --cuda or --metal for a GPU; one llama.cpp compile, minutes)")
        width = draft.metadata.get("eagle3.target_hidden_size")
        if width is not None and int(width) != target.n_embd:
            raise UserError(f"{name} was made for a target of width {width}, but {target.path.name} has "
                            f"width {target.n_embd}; use the target it was trained for")
        for lid in ids:
            if lid > target.n_layer or (lid == target.n_layer and target.arch not in NEXTN_ARCHS):
                raise UserError(f"{name} reads target layer {lid}, but {target.path.name} has {target.n_layer} "
                                f"layers; use the target it was trained for")
    else:
        if draft.n_embd != target.n_embd:
            raise UserError(f"{name} has width {draft.n_embd} but {target.path.name} has width {target.n_embd}; "
                            "a DFlash/DSpark draft must match its target's width: use the target it was trained for")
        bad = [lid for lid in ids if lid >= target.n_layer]
        if bad:
            raise UserError(f"{name} reads target layers {bad}, but {target.path.name} has only {target.n_layer} "
                            "layers; use the target it was trained for")
        if draft.mask_id is None:
            raise UserError(f"{name} has no mask token (tokenizer.ggml.mask_token_id); convert it again")
        if not 0 <= draft.mask_id < target.n_vocab:
            raise UserError(f"{name} has mask token id {draft.mask_id}, outside the target's {target.n_vocab}-token "
                            "vocabulary; convert it again against this target")
        if kind == "dspark" and p_min > 0 and draft.metadata.get("dflash.has_confidence_head") is False:
            raise UserError(f"{name} has no confidence head, so --draft-p-min must be 0")
    if draft.n_vocab != target.n_vocab:
        raise UserError(f"{name} has a {draft.n_vocab}-token vocabulary but the target has {target.n_vocab}; "
                        "use the target it was converted for")
    if draft.vocab_fingerprint != target.vocab_fingerprint:
        i = next((i for i, (a, b) in enumerate(zip(draft.tokens, target.tokens)) if a != b), None)
        raise UserError(f"{name} and the target have different token texts"
                        f"{f' (first at id {i})' if i is not None else ''}; use the target it was converted for")
