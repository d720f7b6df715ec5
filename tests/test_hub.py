"""Hugging Face ids for targets and drafts (specgguf/runtime/hub.py), offline: each test lays
out a Hub cache in tmp_path (models--org--repo/snapshots/<commit>/..., refs/main) holding the
real Gemma 3 270M and a synthetic qwen3 GGUF, sets HF_HOME to it and HF_HUB_OFFLINE=1, and
checks that nothing reaches for the network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from specgguf.api import SpecGGUF
from specgguf.runtime import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "org/gemma-3-270m-GGUF"
GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
PROMPT = "Copy exactly: alpha beta gamma delta. Copy: alpha"


def lay_out(root: Path, repo: str, files: dict[str, Path], commit: str = COMMIT, ref: str = "main") -> Path:
    """A Hub cache entry as huggingface_hub writes it: snapshot files linked into blobs/."""
    base = root / "hub" / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / commit
    for i, (name, src) in enumerate(files.items()):
        blob = base / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.symlink_to(Path(src).resolve())
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def hf_home(tmp_path, monkeypatch, gemma_path, qwen3_target):
    root = tmp_path / "hf"
    lay_out(root, REPO, {GEMMA_FILE: gemma_path, "extra/qwen3-tiny-Q8_0.gguf": qwen3_target})
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


@pytest.fixture
def no_network(monkeypatch):
    """Any call that would reach the Hub fails the test (rather than being caught and retried
    from the cache, which would hide it)."""
    import huggingface_hub

    class Reached(BaseException):
        pass

    def refuse(*a, **k):
        raise Reached("the network was reached")

    for name in ("model_info", "list_repo_files", "list_repo_tree"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    return Reached


@pytest.mark.parametrize("spec, want", [
    ("org/repo", hub.HubRef("org/repo")),
    ("org/repo:q4_k_m", hub.HubRef("org/repo", quant="q4_k_m")),
    ("org/repo@v1.2:Q8_0", hub.HubRef("org/repo", "v1.2", "Q8_0")),
    (f"org/repo@{COMMIT}/sub/m.gguf", hub.HubRef("org/repo", COMMIT, filename="sub/m.gguf")),
    ("hf.co/org/repo:IQ4_XS", hub.HubRef("org/repo", quant="IQ4_XS")),
    ("model.gguf", None), ("./org/repo", None), ("/abs/org/repo", None), ("~/org/repo", None),
    ("dir/model.gguf", None),  # a missing local file, never a repo named model.gguf
    ("org/repo/notes.txt", None), ("ngram", None), ("suffix", None),
])
def test_parse(spec, want):
    assert hub.parse(spec) == want


def test_pick_quants_and_split_parts():
    files = ["README.md", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "mmproj-m-f16.gguf", "m-UD-Q4_K_XL.gguf",
             "Q8_0/m-Q8_0-00002-of-00002.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf"]

    def pick(spec):
        return hub.pick(hub.Listing(hub.parse(spec), files, COMMIT, cached=False))

    assert pick("o/r") == ["m-Q4_K_M.gguf"]  # Q4_K_M when no quant is given
    assert pick("o/r:q4_k_s") == ["m-Q4_K_S.gguf"]  # case-insensitive; Q4_K never picks Q4_K_M
    assert pick("o/r:UD-Q4_K_XL") == ["m-UD-Q4_K_XL.gguf"]
    assert pick("o/r:Q8_0") == ["Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"]
    assert pick("o/r/Q8_0/m-Q8_0-00001-of-00002.gguf") == pick("o/r:Q8_0")  # a split file: all its parts
    with pytest.raises(ValueError, match=r"no Q6_K GGUF; quants available: .*Q4_K_M, Q4_K_S, Q4_K_XL, Q8_0"):
        pick("o/r:Q6_K")


def test_target_by_quant_gives_the_same_text_as_by_path(hf_home, gemma_path, no_network):
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=256) as llm:
        by_path = llm.generate(PROMPT, max_tokens=16)
    for spec in (f"{REPO}:Q4_K_M", REPO, f"{REPO}@main:q4_k_m", f"{REPO}@{COMMIT}/{GEMMA_FILE}"):
        with SpecGGUF(spec, draft="ngram", n_ctx=256) as llm:
            r = llm.generate(PROMPT, max_tokens=16)
            assert llm.model_name == Path(GEMMA_FILE).stem
        assert r.tokens == by_path.tokens and r.text == by_path.text, spec


def test_a_quant_not_cached_lists_those_that_are(hf_home, no_network):
    with pytest.raises(ValueError) as err:
        SpecGGUF(f"{REPO}:Q5_K_M", n_ctx=256)
    assert "no Q5_K_M GGUF in the local cache" in str(err.value)
    assert "quants cached: Q4_K_M, Q8_0" in str(err.value)
    with pytest.raises(ValueError, match="not in .* offline mode"):
        SpecGGUF("org/not-downloaded:Q4_K_M", n_ctx=256)


def test_cli_offline_target_and_draft(hf_home, gemma_path):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": ""}  # --offline alone keeps it off the network
    by_path = run_cli("generate", gemma_path, "-p", PROMPT, "-n", "12", "--json", "--draft", "ngram", env=env)
    by_id = run_cli("generate", f"{REPO}:Q4_K_M", "-p", PROMPT, "-n", "12", "--json", "--offline",
                    "--draft", "suffix", "--draft", f"{REPO}/{GEMMA_FILE}", env=env)
    assert by_path.returncode == 0 and by_id.returncode == 0, (by_path.stderr, by_id.stderr)
    import json

    assert json.loads(by_id.stdout)["tokens"] == json.loads(by_path.stdout)["tokens"]
    bad = run_cli("generate", f"{REPO}:IQ2_XXS", "--offline", "-n", "4", env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and "no IQ2_XXS GGUF" in line and "Q4_K_M, Q8_0" in line


def test_a_local_path_always_wins(hf_home, tmp_path, monkeypatch, qwen3_target):
    local = tmp_path / "cwd" / "org" / "gemma-3-270m-GGUF"
    local.parent.mkdir(parents=True)
    local.symlink_to(qwen3_target)
    monkeypatch.chdir(tmp_path / "cwd")
    assert hub.resolve(REPO) == REPO  # the file ./org/gemma-3-270m-GGUF, not the repo


def test_from_pretrained_offline(hf_home, gemma_path, no_network):
    with SpecGGUF(gemma_path, n_ctx=256) as llm:
        want = llm.generate(PROMPT, max_tokens=12).tokens
    with SpecGGUF.from_pretrained(REPO, "*Q4_K_M.gguf", draft="ngram", n_ctx=256) as llm:
        assert llm.generate(PROMPT, max_tokens=12).tokens == want
    with SpecGGUF.from_pretrained(REPO, n_ctx=256) as llm:  # no filename: the Q4_K_M
        assert llm.target.info.path.name == GEMMA_FILE
    with pytest.raises(ValueError, match=r"no GGUF in org/gemma-3-270m-GGUF matches '\*Q6_K\*'.*Q4_K_M, Q8_0"):
        SpecGGUF.from_pretrained(REPO, "*Q6_K*")
    with pytest.raises(ValueError, match="matches 2 GGUFs"):
        SpecGGUF.from_pretrained(REPO, "*.gguf")


# -- a draft checkpoint repo (converters/hubdraft.py) -------------------------------------------

def test_a_checkpoint_repo_converts_once_and_is_reused(tmp_path, monkeypatch, capfd, no_network):
    import time

    import checkpoint_fixtures as F

    spec = F.TargetSpec()
    target = F.make_target_gguf(tmp_path / "target.gguf", spec)
    ck = F.make_dspark_checkpoint(tmp_path / "ck", spec, markov_rank=32, conf=True)
    root = tmp_path / "hf"
    lay_out(root, "org/dspark-tiny", {p.name: p for p in Path(ck).iterdir()})
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "specgguf-cache"))
    prompt = "hello world, the draft token model"
    with SpecGGUF(target, n_ctx=256) as llm:
        plain = llm.generate(prompt, max_tokens=24).tokens
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        with SpecGGUF(target, draft="org/dspark-tiny", n_ctx=256, draft_max=5) as llm:
            ready = time.perf_counter() - t0
            assert llm.drafter.kind == "dspark"
            r = llm.generate(prompt, max_tokens=24)
        assert r.tokens == plain and r.stats.drafted > 0
        drafts = list((tmp_path / "specgguf-cache" / "drafts").glob("*.gguf"))
        runs.append((capfd.readouterr().err, ready, [(d.name, d.stat().st_mtime_ns) for d in drafts]))
    (first_err, first_s, first_files), (second_err, second_s, second_files) = runs
    assert "converting org/dspark-tiny" in first_err and "converting" not in second_err
    assert len(first_files) == 1 and second_files == first_files  # the same file, not rewritten
    assert first_files[0][0].startswith(f"org--dspark-tiny-{COMMIT[:12]}-")
    print(f"draft ready: converted {first_s:.2f} s, reused {second_s:.2f} s")
    # another target file is another conversion (the cache key holds the target's fingerprint)
    other = F.make_target_gguf(tmp_path / "other.gguf", F.TargetSpec(seed=7))
    with SpecGGUF(other, draft="suffix+org/dspark-tiny", n_ctx=256, draft_max=5) as llm:
        assert llm.drafter.kind == "suffix+dspark"
    assert len(list((tmp_path / "specgguf-cache" / "drafts").glob("*.gguf"))) == 2
