"""Draft/target checks that run before llama.cpp can see the pair.

llama.cpp aborts the whole process on some mismatches (GGML_ASSERT) and throws C++
exceptions on others, so every check a user can fail is done here first, on metadata only,
and ends in one `UserError` line.
"""

from __future__ import annotations

from .errors import UserError
from .ggufinfo import GGUFInfo

# llama.cpp accepts draft vocabularies up to this many tokens larger or smaller (padding).
MAX_VOCAB_DIFF = 128


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
