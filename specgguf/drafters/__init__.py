"""Draft kinds behind one protocol (`base.Drafter`, after llama.cpp's `common_speculative`
hooks): `model`, `ngram`, `suffix`, `eagle3`, `dflash`, `dspark`, `mtp` and the hybrid, and
`make_drafter`, which builds the right one from a `DraftSpec` (spec.py)."""

from __future__ import annotations

import os

from .base import Drafter


from .spec import LOOKUPS, DraftSpec

KINDS = ("model", "ngram", "eagle3", "dflash", "dspark", "mtp")
# the kinds a draft file of each detected kind may run as (--draft-kind)
ALLOWED_KINDS = {"model": {"model"}, "eagle3": {"eagle3"}, "dflash": {"dflash", "dspark"}, "dspark": {"dspark"},
                 "mtp": {"mtp"}}


def detect_kind(info) -> str:
    """The kind a draft GGUF serves as: eagle3, dflash, dspark (a Markov head), mtp, or model."""
    if info.arch == "eagle3":
        return "eagle3"
    if info.arch == "gemma4-assistant":
        return "mtp"
    if info.arch == "dflash":
        return "dspark" if info.has_tensor("markov_w1.weight") else "dflash"
    return "model"


def make_drafter(spec: "DraftSpec | str", target, kind: str | None = None, draft_max: int = 8,
                 n_threads: int | None = None, n_gpu_layers: int | None = None, p_min: float = 0.0, n_min: int = 0,
                 **options) -> Drafter:
    """Build a drafter for `target` from a `DraftSpec` (a string is read by `DraftSpec.parse`:
    'ngram', 'suffix', a draft GGUF's path, or 'suffix+PATH', the hybrid). The model part must
    be a local file by now (the loader resolves Hub ids). options: max_shared_tokens (suffix: the
    bound on the store of earlier outputs), ngram_min / ngram_max (ngram), shared_draft (a model
    draft's `SharedDraft`, when `target` is a slot of a parallel target: open_shared_draft).
    `kind` (or spec.kind) overrides the detected kind (for example dspark slot rules for a
    DFlash file)."""
    from ..errors import UserError

    spec = DraftSpec.parse(spec, kind)
    if target.ctx.rollback == "none":
        # llama.cpp's loops refuse such a context too (COMMON_CONTEXT_SEQ_RM_TYPE_NO)
        raise UserError(f"{target.info.path.name} ({target.info.arch}) keeps no cache that could take back rejected "
                        "drafted tokens, so specgguf cannot speculate on it: run it without --draft", param="draft")
    if spec.own_mtp:
        from .mtp import NextNDrafter

        return NextNDrafter(target, draft_max=draft_max, n_threads=n_threads, p_min=p_min, n_min=n_min)
    lookup_options = {k: v for k, v in options.items() if k == "max_shared_tokens"}
    if spec.hybrid:
        # a suffix lookup where it pays more than the model draft (drafters/hybrid.py)
        from .hybrid import HybridDrafter
        from .suffix import SuffixDrafter

        model = _model_drafter(spec, target, draft_max, n_threads, n_gpu_layers, p_min, n_min,
                               {k: v for k, v in options.items() if k != "max_shared_tokens"})
        return HybridDrafter(SuffixDrafter(**lookup_options), model)
    if spec.lookup == "suffix":
        from .suffix import SuffixDrafter

        return SuffixDrafter(**lookup_options)
    if spec.lookup == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(ngram_min=options.get("ngram_min", 2), ngram_max=options.get("ngram_max", 4))
    return _model_drafter(spec, target, draft_max, n_threads, n_gpu_layers, p_min, n_min, options)


def _draft_info(spec: DraftSpec):
    """(GGUF info, kind) of the spec's draft file, checked: the file exists, is a GGUF that
    llama.cpp can load, and can run as the kind asked for."""
    from ..errors import UserError
    from ..runtime.compat import check_loadable
    from ..runtime.ggufinfo import read_gguf

    path = spec.model
    if not (path.endswith(".gguf") or os.path.exists(path)):
        raise UserError(f"unknown --draft {path!r}: give a draft GGUF file (path ending in .gguf), 'ngram', "
                        "'suffix', or both 'suffix' and a draft GGUF")
    if spec.kind is not None and spec.kind not in KINDS:
        raise UserError(f"unknown --draft-kind {spec.kind!r}: use one of {', '.join(KINDS)}")
    info = read_gguf(path, "draft")
    check_loadable(info, "draft")
    detected = detect_kind(info)
    kind = spec.kind or detected
    if kind not in ALLOWED_KINDS[detected]:
        raise UserError(f"draft {info.path.name} is a {detected} draft (arch {info.arch}); it cannot run as "
                        f"--draft-kind {kind}")
    return info, kind


def _model_drafter(spec: DraftSpec, target, draft_max, n_threads, n_gpu_layers, p_min, n_min, options) -> Drafter:
    info, kind = _draft_info(spec)
    common = dict(n_threads=n_threads, p_min=p_min, n_min=n_min,
                  n_gpu_layers=target.n_gpu_layers if n_gpu_layers is None else n_gpu_layers)
    if kind == "model":
        from .model import ModelDrafter

        return ModelDrafter(info, target, **common, shared=options.get("shared_draft"))
    if options.get("shared_draft") is not None:
        common["shared"] = options["shared_draft"]
    if kind == "mtp":
        from .mtp import MTPDrafter

        return MTPDrafter(info, target, draft_max=draft_max, **common)
    if kind == "eagle3":
        from .eagle3 import Eagle3Drafter

        return Eagle3Drafter(info, target, **common)
    from .dflash import DFlashDrafter

    return DFlashDrafter(info, target, kind, draft_max=draft_max, **common)


def open_shared_draft(spec: "DraftSpec | str", slot, kind: str | None = None, n_threads: int | None = None,
                      n_gpu_layers: int | None = None):
    """The SharedDraft the slots of a parallel target draft with (drafters/model.py), for a
    spec with a draft file; None for ngram and suffix, which keep their state in Python."""
    spec = DraftSpec.parse(spec, kind)
    if spec.model is None:
        return None
    info, kind = _draft_info(spec)
    from .model import SharedDraft

    return SharedDraft(info, slot, kind, n_gpu_layers=slot.n_gpu_layers if n_gpu_layers is None else n_gpu_layers,
                       n_threads=n_threads)


__all__ = ["Drafter", "DraftSpec", "KINDS", "LOOKUPS", "detect_kind", "make_drafter", "open_shared_draft"]
