"""Draft kinds behind one protocol (`base.Drafter`, after llama.cpp's `common_speculative`
hooks): `model`, `ngram`, `eagle3`, `dflash` and `dspark`, and `make_drafter`, which builds
the right one from a CLI-style spec."""

from __future__ import annotations

import os

from .base import Drafter


def top10_prob(logits, tok: int) -> float:
    """llama.cpp's draft confidence for --draft-p-min: the softmax over the 10 best logits
    (not the whole vocabulary) at token `tok`."""
    import numpy as np

    top = np.partition(logits, -10)[-10:]
    top = np.exp(top - top.max())
    return float(np.exp(logits[tok] - logits.max()) / top.sum())


KINDS = ("model", "ngram", "eagle3", "dflash", "dspark", "mtp")
LOOKUPS = ("ngram", "suffix")  # draft kinds that need no file
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


def make_drafter(spec: str, target, kind: str | None = None, draft_max: int = 8, n_threads: int | None = None,
                 n_gpu_layers: int | None = None, p_min: float = 0.0, n_min: int = 0, **options) -> Drafter:
    """Build a drafter for `target` from a CLI-style spec: 'ngram', 'suffix', a path to a draft
    GGUF, or 'suffix+PATH' (the hybrid: suffix lookups and a draft model, `--draft suffix
    --draft PATH` on the command line). options: max_shared_tokens (suffix: the bound on the
    store of earlier outputs), ngram_min / ngram_max (ngram), shared_draft (a model draft's
    `SharedDraft`, when `target` is a slot of a parallel target: open_shared_draft).
    `kind` overrides the detected kind (for example dspark slot rules for a DFlash file)."""
    from ..runtime.compat import check_loadable
    from ..errors import UserError
    from ..runtime.ggufinfo import read_gguf

    spec = os.fspath(spec)
    if target.model.recurrent:
        # llama.cpp's C++ loop checkpoints such a state and re-decodes after every partial
        # acceptance; specgguf rolls back by removing KV cells, which a recurrent state refuses
        raise UserError(f"{target.info.path.name} ({target.info.arch}) keeps a recurrent state that cannot take "
                        "back rejected draft tokens, so specgguf cannot speculate on it: run it without --draft",
                        param="draft")
    if spec == "suffix":
        if kind is not None:
            raise UserError(f"--draft suffix needs no file, so no --draft-kind (got {kind})")
        from .suffix import SuffixDrafter

        return SuffixDrafter(**{k: v for k, v in options.items() if k == "max_shared_tokens"})
    if spec.startswith("suffix+") and not os.path.exists(spec):
        # the hybrid: a suffix lookup where it pays more than the model draft (drafters/hybrid.py)
        from .hybrid import HybridDrafter
        from .suffix import SuffixDrafter

        model = make_drafter(spec[len("suffix+"):], target, kind, draft_max, n_threads, n_gpu_layers, p_min, n_min,
                             **{k: v for k, v in options.items() if k != "max_shared_tokens"})
        if model.lookup:
            model.close()
            raise UserError(f"--draft {spec}: pair 'suffix' with a draft GGUF, not with {model.kind!r}")
        return HybridDrafter(SuffixDrafter(**{k: v for k, v in options.items() if k == "max_shared_tokens"}), model)

    if (spec == "ngram" and kind not in (None, "ngram")) or (spec != "ngram" and kind == "ngram"):
        raise UserError(f"--draft {spec} cannot run as --draft-kind {kind}: the kind of a draft file is read from "
                        "the file, and 'ngram' needs no file (leave out --draft-kind)")
    if spec == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(ngram_min=options.get("ngram_min", 2), ngram_max=options.get("ngram_max", 4))
    if not (spec.endswith(".gguf") or os.path.exists(spec)):
        raise UserError(f"unknown --draft {spec!r}: give a draft GGUF file (path ending in .gguf), 'ngram', "
                        "'suffix', or both 'suffix' and a draft GGUF")
    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown --draft-kind {kind!r}: use one of {', '.join(KINDS)}")
    info = read_gguf(spec, "draft")
    check_loadable(info, "draft")
    detected = detect_kind(info)
    kind = kind or detected
    if kind not in ALLOWED_KINDS[detected]:
        raise UserError(f"draft {info.path.name} is a {detected} draft (arch {info.arch}); it cannot run as "
                        f"--draft-kind {kind}")
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


def open_shared_draft(spec: str, slot, kind: str | None = None, n_threads: int | None = None,
                      n_gpu_layers: int | None = None):
    """The SharedDraft the slots of a parallel target draft with (drafters/model.py), for a
    draft spec naming a file ('PATH' or 'suffix+PATH'); None for ngram and suffix, which keep
    their state in Python."""
    from ..runtime.compat import check_loadable
    from ..runtime.ggufinfo import read_gguf

    spec = os.fspath(spec)
    if spec in LOOKUPS:
        return None
    path = spec[len("suffix+"):] if spec.startswith("suffix+") and not os.path.exists(spec) else spec
    if not (path.endswith(".gguf") or os.path.exists(path)):
        return None  # make_drafter says what is wrong with it
    info = read_gguf(path, "draft")
    check_loadable(info, "draft")
    detected = detect_kind(info)
    kind = kind or detected
    if kind not in ALLOWED_KINDS[detected]:
        return None  # make_drafter says why
    from .model import SharedDraft

    return SharedDraft(info, slot, kind, n_gpu_layers=slot.n_gpu_layers if n_gpu_layers is None else n_gpu_layers,
                       n_threads=n_threads)
