"""Bad checkpoints and bad pairings are refused with one line, and no output file is left.

These tests need no llama.cpp: the reader, kind detection and target checks run first.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from specgguf.errors import UserError
from specgguf.converters import convert
from specgguf.converters.checkpoints import detect_kind, locate
from specgguf.converters.safetensors import SafetensorsFile, Weights

import checkpoint_fixtures as F

SPEC = F.TargetSpec()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return F.make_target_gguf(tmp_path_factory.mktemp("tgt") / "target.gguf", SPEC)


@pytest.fixture
def ckpt(tmp_path):
    return F.make_dspark_checkpoint(tmp_path / "ckpt", SPEC)


def refused(tmp_path, ckpt, target, match, **kw):
    out = tmp_path / "out.gguf"
    with pytest.raises(UserError, match=match) as err:
        convert(str(ckpt), target, out, **kw)
    assert "\n" not in str(err.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    return str(err.value)


# -- safetensors reader ---------------------------------------------------------------------

def test_bf16_is_widened_exactly(tmp_path):
    x = F.bf16_round(np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32))
    F.write_safetensors(tmp_path / "a.safetensors", {"x": x}, "BF16")
    t = SafetensorsFile(tmp_path / "a.safetensors").tensors["x"]
    assert t.dtype == "BF16" and t.shape == (5, 7)
    assert np.array_equal(t.float32(), x)
    assert np.array_equal(t.rows(1, 3), x[1:3])


def test_sharded_equals_single(tmp_path):
    F.make_dspark_checkpoint(tmp_path / "one", SPEC)
    F.make_dspark_checkpoint(tmp_path / "two", SPEC, shards=3)
    with Weights(tmp_path / "one") as a, Weights(tmp_path / "two") as b:
        assert len(b.files) == 3
        assert sorted(a.names()) == sorted(b.names())
        for n in a.names():
            assert np.array_equal(a[n].raw(), b[n].raw())


def test_truncated_file(tmp_path, ckpt, target):
    st = ckpt / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    assert "truncated" in refused(tmp_path, ckpt, target, "truncated")


def test_header_length_beyond_file(tmp_path, ckpt, target):
    st = ckpt / "model.safetensors"
    st.write_bytes(struct.pack("<Q", 10 ** 9) + st.read_bytes()[8:])
    refused(tmp_path, ckpt, target, "truncated or not a safetensors")


def _rewrite_header(path, edit):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (n - len(raw))
    assert len(raw) == n
    path.write_bytes(data[:8] + raw + data[8 + n:])


def test_header_offsets_that_lie(tmp_path, ckpt, target):
    def edit(h):
        b, e = h["fc.weight"]["data_offsets"]
        h["fc.weight"]["data_offsets"] = [b, e - 2]  # shorter than shape x dtype
    _rewrite_header(ckpt / "model.safetensors", edit)
    refused(tmp_path, ckpt, target, "do not match its shape")


def test_overlapping_offsets(tmp_path, ckpt, target):
    def edit(h):
        h["norm.weight"]["data_offsets"] = list(h["hidden_norm.weight"]["data_offsets"])
    _rewrite_header(ckpt / "model.safetensors", edit)
    refused(tmp_path, ckpt, target, "overlap")


def test_damaged_json_header(tmp_path, ckpt, target):
    st = ckpt / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[8] = ord("]")
    st.write_bytes(bytes(data))
    refused(tmp_path, ckpt, target, "damaged safetensors header")


def test_missing_shard(tmp_path, target):
    ck = F.make_dspark_checkpoint(tmp_path / "sh", SPEC, shards=2)
    (ck / "model-00002-of-00002.safetensors").unlink()
    refused(tmp_path, ck, target, "shard .* is missing")


# -- checkpoint, config and kind ------------------------------------------------------------

def test_missing_config(tmp_path, ckpt, target):
    (ckpt / "config.json").unlink()
    refused(tmp_path, ckpt, target, "no config.json")


def test_unknown_architecture(tmp_path, ckpt, target):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["MysteryForCausalLM"]
    for k in ("target_layer_ids", "block_size"):
        cfg.pop(k)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    refused(tmp_path, ckpt, target, "unknown checkpoint architecture 'MysteryForCausalLM'")


def test_kind_from_deepspec_keys_without_architectures():
    cfg = F.dspark_config(SPEC)
    cfg.pop("architectures")
    assert detect_kind(cfg).name == "dspark"
    cfg["markov_rank"] = 0
    assert detect_kind(cfg).name == "dflash"
    assert detect_kind(F.eagle3_config(SPEC)).family == "eagle3"


def test_missing_tensor(tmp_path, target):
    cfg = F.dspark_config(SPEC)
    t = F.dspark_tensors(SPEC, cfg)
    del t["layers.1.mlp.up_proj.weight"]
    ck = F.write_checkpoint(tmp_path / "ck", cfg, t)
    refused(tmp_path, ck, target, "lacks tensor layers.1.mlp.up_proj.weight")


def test_misshaped_tensor(tmp_path, target):
    cfg = F.dspark_config(SPEC)
    t = F.dspark_tensors(SPEC, cfg)
    t["fc.weight"] = t["fc.weight"][:, :-32]
    ck = F.write_checkpoint(tmp_path / "ck", cfg, t)
    refused(tmp_path, ck, target, r"fc.weight has shape \[64, 160\]")


def test_unknown_extra_tensor(tmp_path, target):
    cfg = F.dspark_config(SPEC)
    t = F.dspark_tensors(SPEC, cfg)
    t["layers.0.mystery.weight"] = np.ones(4, np.float32)
    ck = F.write_checkpoint(tmp_path / "ck", cfg, t)
    refused(tmp_path, ck, target, "does not know")


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_markov_head_types_other_than_vanilla(tmp_path, ckpt, target, kind):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["markov_head_type"] = kind
    (ckpt / "config.json").write_text(json.dumps(cfg))
    refused(tmp_path, ckpt, target, f"Markov head type '{kind}'")


def test_deepspec_eagle3_gemma4_against_qwen3_target_refused(tmp_path, target):
    # both variants convert against their own targets (tests/test_eagle3_patch.py, test_eagle3_gemma4.py)
    ck = F.make_deepspec_eagle3_checkpoint(tmp_path / "e3", backbone="gemma4")
    msg = refused(tmp_path, ck, target, "Gemma 4 draft")
    assert "'qwen3'" in msg


def test_registry_eagle3_gemma4_against_qwen3_refused_before_download(tmp_path, target):
    msg = refused(tmp_path, "deepseek-ai/eagle3_gemma4_12b_ttt7", target, "gemma4 draft for google/gemma-4-12B-it")
    assert "'qwen3'" in msg


# -- target pairing ---------------------------------------------------------------------------

@pytest.mark.parametrize("change, match", [
    ({"n_vocab": 352}, "vocab_size is 320 but the target GGUF has 352"),
    ({"n_embd": 96}, "hidden_size .* is 64 but the target's hidden size is 96"),
    ({"n_layer": 3}, "trained for a target with 4 layers"),
    ({"head_dim": 16}, "head size is 32 but the target's is 16"),
])
def test_target_mismatch(tmp_path, ckpt, change, match):
    spec = F.TargetSpec(**{**SPEC.__dict__, **change})
    other = F.make_target_gguf(tmp_path / "other.gguf", spec)
    refused(tmp_path, ckpt, other, match)


def test_layer_ids_beyond_target(tmp_path, target):
    # DeepSpec id 3 is the output of the last layer: llama.cpp would need input 4 of 4 layers
    ck = F.make_dspark_checkpoint(tmp_path / "ck", SPEC, target_layer_ids=(0, 1, 3))
    refused(tmp_path, ck, target, r"target layers \[0, 1, 3\] do not fit")


def test_target_that_cannot_feed_warns(tmp_path, ckpt):
    g3 = F.make_target_gguf(tmp_path / "g3.gguf", SPEC, arch="gemma3")
    warnings = []
    convert(str(ckpt), g3, tmp_path / "out.gguf", warn=warnings.append)
    assert any("'gemma3' cannot feed hidden states" in w for w in warnings)


def test_missing_target(tmp_path, ckpt):
    refused(tmp_path, ckpt, tmp_path / "nope.gguf", "target file not found")


def test_bad_type_and_head(tmp_path, ckpt, target):
    refused(tmp_path, ckpt, target, "unknown out_type 'q2_k'", out_type="q2_k")  # Python names, not flags
    refused(tmp_path, ckpt, target, "unknown head 'half'", head="half")


def test_checkpoint_not_found(tmp_path, target):
    with pytest.raises(UserError, match="checkpoint not found"):
        locate(str(tmp_path / "missing-dir"))


def test_offline_repo_id_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError, match="no network and no cached copy"):
        locate("someone/not-cached-anywhere", offline=True)


# -- the command line ------------------------------------------------------------------------

def test_cli_refusal_is_one_line_exit_2(tmp_path, target):
    ck = F.make_deepspec_eagle3_checkpoint(tmp_path / "e3", backbone="gemma4")
    out = tmp_path / "out.gguf"
    proc = subprocess.run([sys.executable, "-m", "specgguf", "convert", str(ck), "--target", str(target),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this is a Gemma 4 draft"), proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_cli_success_prints_summary(tmp_path, target):
    ck = F.make_dspark_checkpoint(tmp_path / "ck", SPEC)
    out = tmp_path / "d.gguf"
    proc = subprocess.run([sys.executable, "-m", "specgguf", "convert", str(ck), "--target", str(target),
                           "-o", str(out), "--type", "q8_0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and "Traceback" not in proc.stderr
    assert "kind           dspark (qwen3)" in proc.stdout and "(DeepSpec ids [0, 1, 2] + 1)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "specgguf", "models"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("deepseek-ai/") == 12
