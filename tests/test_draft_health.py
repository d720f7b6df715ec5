"""Is the draft working at all? (issue 43; decoding/health.py, inspection.health_flags.) A draft
whose head is switched off still runs losslessly but drafts nothing the target takes: after 64
drafting rounds that accept (almost) nothing at the first position, specgguf says so once, on
stderr, in the stats and on /metrics; `specgguf inspect` flags the zero head statically. The
working fixtures trigger neither."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from specgguf.api import SpecGGUF
from specgguf.decoding import health
from specgguf.inspection import describe

PROMPT = list(range(20, 60))


def zeroed(src, dst, *names):
    """A copy of the GGUF `src` with the tensors `names` set to zero in place."""
    from gguf import GGUFReader

    shutil.copy(src, dst)
    reader = GGUFReader(str(dst), "r+")
    for t in reader.tensors:
        if t.name in names:
            t.data[...] = 0
    reader.data.flush()
    return dst


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(health, "_warned", {})


def test_a_zeroed_head_is_flagged_at_run_time_and_by_inspect(counting_target, hidden_drafts, tmp_path,
                                                              fresh_warnings, capsys):
    broken = zeroed(hidden_drafts["eagle3-counting"], tmp_path / "broken.gguf", "output.weight")
    with SpecGGUF(counting_target, n_ctx=512) as plain:
        want = plain.generate(PROMPT, max_tokens=80).tokens
    with SpecGGUF(counting_target, draft=str(broken), draft_max=2, n_ctx=512) as spec:
        got = spec.generate(PROMPT, max_tokens=80)
    assert got.tokens == want  # still lossless: only slow
    assert got.stats.draft_warning is not None and "broken.gguf" in got.stats.draft_warning
    assert "is it made for this target and tokenizer" in got.stats.to_dict()["draft_warning"]
    err = capsys.readouterr().err
    assert err.count("specgguf: warning: this draft") == 1
    lines = describe(broken, counting_target)
    assert any(ln.startswith("health:") and "output.weight is all zeros" in ln for ln in lines)


def test_working_drafts_raise_no_warning(counting_target, hidden_drafts, fresh_warnings, capsys):
    for name in ("eagle3-counting", "dspark-counting"):
        with SpecGGUF(counting_target, draft=str(hidden_drafts[name]), draft_max=2, n_ctx=512) as spec:
            got = spec.generate(PROMPT, max_tokens=240)  # some 80 rounds of 3 tokens
        assert got.stats.rounds > health.WINDOW and got.stats.draft_warning is None
        health_line = next(ln for ln in describe(hidden_drafts[name], counting_target) if ln.startswith("health:"))
        assert "no static problem" in health_line
    assert "warning" not in capsys.readouterr().err


def test_untrained_norms_are_flagged(hidden_drafts, qwen3_target, tmp_path):
    from gguf import GGUFReader

    src = hidden_drafts["dflash"]
    dst = tmp_path / "ones.gguf"
    shutil.copy(src, dst)
    reader = GGUFReader(str(dst), "r+")
    for t in reader.tensors:
        if t.name.endswith("norm.weight"):
            t.data[...] = np.float32(1.0)
    reader.data.flush()
    line = next(ln for ln in describe(dst, qwen3_target) if ln.startswith("health:"))
    assert "norm weights are exactly 1.0" in line


def test_a_lookup_is_never_doubted(qwen3_target, fresh_warnings):
    with SpecGGUF(qwen3_target, draft="ngram", draft_max=4, n_ctx=512) as spec:
        assert spec.generate("hello world " * 20, max_tokens=100).stats.draft_warning is None


def test_metrics_carry_the_warning():
    from specgguf.server.metrics import Metrics

    m = Metrics()
    m.observe({"generated_tokens": 4, "draft_warning": None})
    assert "specgguf_draft_warning 0" in m.render({})
    m.observe({"generated_tokens": 4, "draft_warning": 'this draft ("x.gguf") accepts 1%'})
    assert 'specgguf_draft_warning{message="this draft (\\"x.gguf\\") accepts 1%"} 1' in m.render({})
