"""Converted drafts drive real generations through the specgguf engine (issue 4 end to end):
each kind converts from a synthetic checkpoint, is detected, checked against the target, and
leaves the target's greedy output unchanged."""

from __future__ import annotations

import pytest

from specgguf.converters import convert
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine
from specgguf.runtime.target import Target

import checkpoint_fixtures as F

SPEC = F.TargetSpec()
PROMPTS = ["hello world, the draft token model", "speculative decoding of the world"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return F.make_target_gguf(tmp_path_factory.mktemp("tgt") / "target.gguf", SPEC)


def _run(target, drafter, prompt):
    gen = Engine(target, drafter, 5).generate(target.tokenize(prompt), 40)
    for _ in gen:
        pass
    return gen


@pytest.mark.parametrize("case, head, kind", [
    ("qwen3-dflash", "shared", "dflash"),   # a DeepSpec DFlash file: sample-from-anchor slots
    ("qwen3-dspark", "shared", "dspark"),
    ("qwen3-dspark", "own", "dspark"),
    ("eagle3", "own", "eagle3"),
])
def test_converted_draft_generates_losslessly(tmp_path, target, case, head, kind):
    if case == "eagle3":
        ck = F.make_eagle3_checkpoint(tmp_path / "ck", SPEC)
    else:
        rank = 32 if "dspark" in case else 0
        ck = F.make_dspark_checkpoint(tmp_path / "ck", SPEC, markov_rank=rank, conf=rank > 0)
    out = convert(str(ck), target, tmp_path / "draft.gguf", "f16", head)
    with Target(target, n_ctx=512) as tgt:
        plain = [_run(tgt, None, p).tokens for p in PROMPTS]
        drafter = make_drafter(str(out.path), tgt, draft_max=5)
        try:
            assert drafter.kind == kind
            if kind in ("dflash", "dspark"):
                assert drafter.sample_from_anchor  # DeepSpec files, DFlash included
            for prompt, want in zip(PROMPTS, plain):
                gen = _run(tgt, drafter, prompt)
                assert gen.tokens == want
                assert gen.stats.drafted > 0
        finally:
            drafter.close()
