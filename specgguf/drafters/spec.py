"""`DraftSpec`: what the user asked to draft with, parsed once at the edge (the CLI's `--draft`
options, `SpecGGUF(draft=...)`) and passed down as a value.

A spec has up to two parts: a lookup (`ngram` or `suffix`, which need no file) and a model
(a draft GGUF: a path, or a Hugging Face id that the loader resolves to one). Both together
make the hybrid: suffix lookups and a draft model, each used where it pays
(drafters/hybrid.py). Nothing below the API splits a draft string: the Hub and the
conversion resolve `model` alone, and `make_drafter` reads the parts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..errors import UserError

LOOKUPS = ("ngram", "suffix")  # draft kinds that need no file
OWN_MTP = "mtp"  # the target's own multi-token-prediction layers (Qwen3.5's NextN block): no file either
HYBRID_PREFIX = "suffix+"  # the hybrid's one-string form, 'suffix+PATH' (SpecGGUF(draft=...) has always taken it)


@dataclass(frozen=True)
class DraftSpec:
    """lookup: 'ngram', 'suffix' or None; model: a draft GGUF's path or Hub id, or None;
    kind: the --draft-kind override of the kind read from the model file (None: read it)."""

    lookup: str | None = None
    model: str | None = None
    kind: str | None = None

    def __post_init__(self):
        if self.own_mtp:
            return
        if self.lookup is None and self.model is None:
            raise UserError("a draft spec needs a lookup ('ngram', 'suffix') or a draft model", param="draft")
        if self.lookup is not None and self.lookup not in LOOKUPS:
            raise UserError(f"unknown draft lookup {self.lookup!r}: use one of {', '.join(LOOKUPS)}", param="draft")
        if self.lookup is not None and self.model in LOOKUPS:
            raise UserError(f"--draft {self.lookup}+{self.model}: pair '{self.lookup}' with a draft GGUF, not with "
                            f"{self.model!r}", param="draft")
        if self.lookup == "ngram" and self.model is not None:
            raise UserError(f"'ngram' cannot be paired with a draft model ({self.model}): pair 'suffix' with it, "
                            "or give one of them", param="draft")
        if self.model is None and self.kind not in (None, self.lookup):
            raise UserError(f"--draft {self.lookup} needs no file, so no --draft-kind (got {self.kind})",
                            param="draft_kind")

    @classmethod
    def parse(cls, value, kind: str | None = None) -> "DraftSpec | None":
        """The spec of `SpecGGUF(draft=value)`: None (no draft), a DraftSpec, 'ngram', 'suffix',
        a path or Hub id of a draft GGUF (or checkpoint repo), or 'suffix+PATH' (the hybrid)."""
        if value is None:
            if kind == "ngram":
                return cls(lookup="ngram")
            return None
        if isinstance(value, DraftSpec):
            return value if kind is None or kind == value.kind else replace(value, kind=kind)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value:
            raise UserError(f"draft must be 'ngram', 'suffix' or a path or Hugging Face id of a draft GGUF "
                            f"(got {value!r})", param="draft")
        if value == OWN_MTP:
            if kind not in (None, OWN_MTP):
                raise UserError(f"--draft mtp drafts with the target's own MTP layers, so it cannot run as "
                                f"--draft-kind {kind} (leave out --draft-kind)", param="draft_kind")
            return cls(kind=OWN_MTP)
        if value in LOOKUPS:
            if kind not in (None, value):
                raise UserError(f"--draft {value} needs no file, so it cannot run as --draft-kind {kind} "
                                "(leave out --draft-kind)", param="draft_kind")
            return cls(lookup=value)
        if kind == "ngram":
            raise UserError(f"--draft {value} cannot run as --draft-kind ngram: the kind of a draft file is read "
                            "from the file, and 'ngram' needs no file (leave out --draft-kind)", param="draft_kind")
        if value.startswith(HYBRID_PREFIX) and not os.path.exists(value):
            return cls(lookup="suffix", model=value[len(HYBRID_PREFIX):], kind=kind)
        return cls(model=value, kind=kind)

    @classmethod
    def from_options(cls, values, kind: str | None = None) -> "DraftSpec | None":
        """The spec of the CLI's `--draft` given zero, one or two times ('suffix' and a GGUF:
        the hybrid)."""
        values = list(values or ())
        if not values:
            return cls.parse(None, kind)
        if len(values) == 1:
            return cls.parse(values[0], kind)
        if OWN_MTP in values:
            raise UserError("--draft mtp (the target's own MTP layers) pairs with nothing else: give it alone",
                            param="draft")
        models = [v for v in values if v not in LOOKUPS]
        if len(values) == 2 and "suffix" in values and len(models) == 1:
            return cls(lookup="suffix", model=models[0], kind=kind)
        raise UserError(f"--draft given {len(values)} times ({', '.join(values)}): give one draft, or 'suffix' "
                        "and one draft GGUF", param="draft")

    def with_model(self, model) -> "DraftSpec":
        """The same spec with its model resolved (a local GGUF path for a Hub id)."""
        return replace(self, model=None if model is None else os.fspath(model))

    @property
    def own_mtp(self) -> bool:
        """The target drafts for itself with its own MTP (NextN) layers (`--draft mtp`)."""
        return self.lookup is None and self.model is None and self.kind == OWN_MTP

    @property
    def hybrid(self) -> bool:
        return self.lookup is not None and self.model is not None

    def __str__(self) -> str:
        """The one-string form: 'ngram', 'suffix', the model, or 'suffix+MODEL'."""
        if self.hybrid:
            return HYBRID_PREFIX + self.model
        if self.own_mtp:
            return OWN_MTP
        return self.model if self.model is not None else self.lookup
