"""`specgguf convert` under bad input and interruption: one `error:` line, a non-zero exit, no
traceback, and nothing left in the output directory (hidden `.partial` files included).

Categories (counted in the module's closing note): checkpoints (architecture, values, shapes),
files (symlinks, damaged GGUF headers, output paths, stale partial files) and signals
(SIGINT/SIGTERM/SIGKILL at several points of a conversion).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import gguf

from specgguf.errors import UserError
from specgguf.converters import convert
from specgguf.converters.writer import partial_files
from specgguf.runtime.ggufinfo import read_gguf

import checkpoint_fixtures as F

SPEC = F.TargetSpec()
POSIX = os.name == "posix"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return F.make_target_gguf(tmp_path_factory.mktemp("tgt") / "target.gguf", SPEC)


def refused(tmp_path, ckpt, target, match, **kw) -> str:
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(UserError, match=match) as err:
        convert(str(ckpt), target, out, **kw)
    assert "\n" not in str(err.value)
    assert list(out.parent.iterdir()) == []  # no output, no .partial file
    return str(err.value)


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "specgguf", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def one_error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.strip() and line.strip() != "writing"
                and not line.startswith(("error:", "warning:"))], proc.stderr
    return errors[0]


def _checkpoint(tmp_path, edit_config=None, edit_tensors=None, dtype="BF16", name="ck"):
    cfg = F.dspark_config(SPEC)
    tensors = F.dspark_tensors(SPEC, cfg)
    if edit_config:
        edit_config(cfg)
    if edit_tensors:
        edit_tensors(tensors)
    return F.write_checkpoint(tmp_path / name, cfg, tensors, dtype)


# -- checkpoints: architecture --------------------------------------------------------------

def test_unknown_architecture_with_deepspec_keys_is_refused(tmp_path, target):
    # it used to convert as a Qwen3 DSpark because the DeepSpec keys were there
    ck = _checkpoint(tmp_path, lambda c: c.update(architectures=["LlamaDSparkModel"], model_type="llama"))
    refused(tmp_path, ck, target, "unknown checkpoint architecture 'LlamaDSparkModel'")


def test_no_architectures_and_foreign_model_type_is_refused(tmp_path, target):
    def edit(c):
        c.pop("architectures")
        c["model_type"] = "mistral"

    msg = refused(tmp_path, _checkpoint(tmp_path, edit), target, "model_type 'mistral'")
    assert "qwen3 or gemma4" in msg


def test_no_architectures_and_no_deepspec_keys_is_refused(tmp_path, target):
    def edit(c):
        c.pop("architectures")
        for k in ("target_layer_ids", "block_size", "mask_token_id"):
            c.pop(k)

    refused(tmp_path, _checkpoint(tmp_path, edit), target, "no architectures and no DeepSpec keys")


@pytest.mark.parametrize("archs", [[["Qwen3DSparkModel"]], {"a": 1}, [3]])
def test_malformed_architectures_is_refused(tmp_path, target, archs):
    ck = _checkpoint(tmp_path, lambda c: c.update(architectures=archs))
    refused(tmp_path, ck, target, "architectures must be a list of class names")


@pytest.mark.parametrize("edit, match", [
    ({"mask_token_id": -1}, "mask_token_id is -1, outside 0.."),          # was a struct.error traceback
    ({"num_attention_heads": 0}, "num_attention_heads is 0, outside 1.."),  # was ZeroDivisionError
    ({"num_hidden_layers": 0, "layer_types": []}, "num_hidden_layers is 0"),
    ({"max_position_embeddings": 2**40}, "max_position_embeddings is 1099511627776, outside"),
    ({"block_size": 10**12}, "block_size is 1000000000000, outside"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer"),
    ({"hidden_size": float("inf")}, "hidden_size must be an integer"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a positive finite number"),  # was converted
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a positive finite number"),
    ({"rope_parameters": {"rope_theta": 0, "rope_type": "default"}}, "rope_theta must be a positive"),
    ({"rope_parameters": [1e6]}, "rope_parameters must be an object"),  # was silently ignored
])
def test_out_of_range_config_values_are_refused(tmp_path, target, edit, match):
    refused(tmp_path, _checkpoint(tmp_path, lambda c: c.update(edit)), target, match)


# -- checkpoints: values and shapes ------------------------------------------------------------

@pytest.mark.parametrize("dtype, out_type, value", [
    ("BF16", "f16", np.nan),      # widened to float32, encoded to F16
    ("BF16", "bf16", np.inf),     # BF16 bits copied as they are
    ("F32", "q8_0", -np.inf),     # numpy Q8_0 encoder
    ("F16", "f32", np.nan),
])
def test_nonfinite_weights_are_refused_with_name_and_count(tmp_path, target, dtype, out_type, value):
    def edit(t):
        w = t["layers.1.mlp.up_proj.weight"].copy()
        w.flat[[3, 70, 5000]] = value
        t["layers.1.mlp.up_proj.weight"] = w

    ck = _checkpoint(tmp_path, edit_tensors=edit, dtype=dtype)
    msg = refused(tmp_path, ck, target, "NaN/Inf", out_type=out_type)
    assert "layers.1.mlp.up_proj.weight" in msg and "has 3 NaN/Inf values" in msg


def test_nonfinite_norm_weight_is_refused(tmp_path, target):
    def edit(t):
        t["norm.weight"] = np.full_like(t["norm.weight"], np.nan)

    msg = refused(tmp_path, _checkpoint(tmp_path, edit_tensors=edit, dtype="F32"), target, "NaN/Inf")
    assert f"norm.weight (output_norm.weight) has {SPEC.n_embd} NaN/Inf values" in msg


def test_values_beyond_f16_are_refused_for_f16_and_converted_as_bf16(tmp_path, target):
    def edit(t):
        t["fc.weight"] = t["fc.weight"].copy()
        t["fc.weight"][0, :2] = 1e6

    ck = _checkpoint(tmp_path, edit_tensors=edit, dtype="F32")
    msg = refused(tmp_path, ck, target, "too large for F16", out_type="f16")
    assert "has 2 values" in msg and "as bf16 or f32" in msg
    res = convert(str(ck), target, tmp_path / "ok.gguf", "bf16")
    assert res.path.exists()


def test_transposed_tensor_is_named_as_such(tmp_path, target):
    def edit(t):
        t["fc.weight"] = np.ascontiguousarray(t["fc.weight"].T)

    msg = refused(tmp_path, _checkpoint(tmp_path, edit_tensors=edit), target, "fc.weight is transposed")
    assert "[192, 64]" in msg and "[64, 192]" in msg


# -- files: symlinks ------------------------------------------------------------------------

def _loop(directory: Path, name: str) -> Path:
    a, b = directory / name, directory / (name + ".other")
    os.symlink(b, a)
    os.symlink(a, b)
    return a


@pytest.mark.skipif(not POSIX, reason="symlinks")
def test_symlink_loops_are_reported_as_loops(tmp_path, target):
    ck = _checkpoint(tmp_path)
    refused(tmp_path, _loop(tmp_path, "ckloop"), target, "ckloop is a symlink loop")
    refused(tmp_path, ck, _loop(tmp_path, "t.gguf"), "target file .*t.gguf is a symlink loop")
    with pytest.raises(UserError, match="is a symlink loop"):
        read_gguf(tmp_path / "t.gguf", "draft")
    st = ck / "model.safetensors"
    st.unlink()
    _loop(ck, "model.safetensors")
    refused(tmp_path, ck, target, "weights file .*model.safetensors is a symlink loop")


@pytest.mark.skipif(not POSIX, reason="symlinks")
def test_broken_symlink_names_where_it_points(tmp_path, target):
    ck = _checkpoint(tmp_path)
    link = tmp_path / "t.gguf"
    os.symlink(tmp_path / "gone.gguf", link)
    refused(tmp_path, ck, link, "broken symlink .*gone.gguf")


@pytest.mark.skipif(not POSIX, reason="symlinks")
def test_output_symlink_loop_is_refused(tmp_path, target):
    ck = _checkpoint(tmp_path)
    out = _loop(tmp_path, "o.gguf")
    with pytest.raises(UserError, match="symlink loop"):
        convert(str(ck), target, out)


# -- files: not what they claim to be -----------------------------------------------------------

def test_weights_file_that_is_a_directory(tmp_path, target):
    ck = _checkpoint(tmp_path)
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").mkdir()  # was IsADirectoryError
    refused(tmp_path, ck, target, "model.safetensors is not a regular file")


@pytest.mark.skipif(not POSIX, reason="FIFOs and /dev/null")
def test_target_that_is_a_pipe_or_a_device(tmp_path, target):
    ck = _checkpoint(tmp_path)
    os.mkfifo(tmp_path / "t.gguf")  # opening it used to block forever
    refused(tmp_path, ck, tmp_path / "t.gguf", "target path is not a regular file")
    refused(tmp_path, ck, "/dev/null", "target path is not a regular file")


def test_shard_index_naming_no_file(tmp_path, target):
    ck = F.make_dspark_checkpoint(tmp_path / "ck", SPEC, shards=2)
    index = ck / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["fc.weight"] = 3  # was a TypeError while sorting the shard names
    index.write_text(json.dumps(data))
    refused(tmp_path, ck, target, "index.json is damaged .weight_map maps a tensor to something")


def test_safetensors_shape_whose_size_wraps_around(tmp_path, target):
    ck = _checkpoint(tmp_path)
    st = ck / "model.safetensors"
    data = st.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["fc.weight"].update(shape=[2**62, 4], data_offsets=[0, 0])  # 2**64 bytes: 0 in int64
    raw = json.dumps(header).encode()
    st.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    refused(tmp_path, ck, target, r"offsets \[0, 0\] do not match its shape \[4611686018427387904, 4\]")


# -- files: damaged GGUF headers ---------------------------------------------------------------

def _tiny_gguf(path: Path, shape=(8, 64), qtype=None) -> Path:
    w = gguf.GGUFWriter(path, "qwen3")
    a = np.ones(shape, np.float32)
    if qtype is None:
        w.add_tensor("blk.0.attn_q.weight", a)
    else:
        w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _patch_tensor_info(path: Path, edit) -> None:
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    pos = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    edit(data, pos)  # pos: n_dims (u32), then the dims (u64 each)
    path.write_bytes(bytes(data))


def test_byte_swapped_dimensions_are_a_damaged_header_not_a_huge_file(tmp_path):
    p = _tiny_gguf(tmp_path / "x.gguf")

    def swap(data, pos):
        first = pos + 4
        data[first:first + 8] = struct.pack(">Q", 64)  # ne0 written big-endian

    _patch_tensor_info(p, swap)
    with pytest.raises(UserError) as err:
        read_gguf(p, "target")
    msg = str(err.value)
    assert "blk.0.attn_q.weight has dimensions [4611686018427387904, 8]" in msg
    assert "header is damaged" in msg and "needs" not in msg


def test_too_many_dimensions(tmp_path):
    p = _tiny_gguf(tmp_path / "y.gguf", shape=(64,))

    def five(data, pos):
        data[pos:pos + 4] = struct.pack("<I", 5)

    _patch_tensor_info(p, five)
    with pytest.raises(UserError, match=r"damaged .*has 5 dimensions \(llama.cpp allows 1 to 4\)"):
        read_gguf(p, "target")


def test_flipped_quantized_dimensions_are_named(tmp_path):
    # Q8_0 rows must hold whole blocks of 32: a [64, 8] table stored as ne {8, 64} is flipped
    p = _tiny_gguf(tmp_path / "x.gguf", shape=(8, 64), qtype=gguf.GGMLQuantizationType.Q8_0)

    def flip(data, pos):
        d0, d1 = struct.unpack_from("<QQ", data, pos + 4)
        struct.pack_into("<QQ", data, pos + 4, d1, d0)

    _patch_tensor_info(p, flip)
    with pytest.raises(UserError, match=r"rows of 8 values, not a multiple of its block of 32"):
        read_gguf(p, "target")


# -- files: output paths ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    return F.make_dspark_checkpoint(tmp_path_factory.mktemp("ck") / "ck", SPEC)


@pytest.mark.parametrize("where, match", [
    ("missing/dir/d.gguf", "output directory does not exist"),
    ("afile/d.gguf", "is not a directory"),
])
def test_cli_output_in_a_bad_directory(tmp_path, target, small_ckpt, where, match):
    (tmp_path / "afile").write_text("x")
    proc = cli("convert", small_ckpt, "--target", target, "-o", tmp_path / where)
    assert proc.returncode == 2
    assert match in one_error_line(proc)


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_cli_output_in_an_unwritable_system_directory(target, small_ckpt):
    proc = cli("convert", small_ckpt, "--target", target, "-o", "/proc/specgguf-draft.gguf")
    assert proc.returncode == 2
    assert "cannot write to /proc" in one_error_line(proc)


@pytest.mark.skipif(not POSIX or os.geteuid() == 0, reason="root may write anywhere")
def test_cli_output_in_a_read_only_directory(tmp_path, target, small_ckpt):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        proc = cli("convert", small_ckpt, "--target", target, "-o", ro / "d.gguf")
    finally:
        ro.chmod(0o700)
    assert proc.returncode == 2 and "cannot write to" in one_error_line(proc)
    assert list(ro.iterdir()) == []


def test_cli_output_name_too_long(tmp_path, target, small_ckpt):
    proc = cli("convert", small_ckpt, "--target", target, "-o", tmp_path / ("d" * 300 + ".gguf"))
    assert proc.returncode == 2
    assert "name too long" in one_error_line(proc).lower()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not POSIX, reason="a deleted working directory")
def test_cli_default_output_in_a_deleted_working_directory(tmp_path, target, small_ckpt):
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && exec "$2" -m specgguf convert "$3" --target "$4"',
                           "sh", str(gone), sys.executable, str(small_ckpt), str(target)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "the current directory no longer exists; give the output path (-o)" in one_error_line(proc)


@pytest.mark.skipif(not POSIX, reason="pid liveness")
def test_stale_partial_files_are_removed_by_the_next_run(tmp_path, target, small_ckpt):
    out = tmp_path / "d.gguf"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = [tmp_path / f".d.gguf.{dead.pid}.partial", tmp_path / f".d.gguf.{dead.pid}.f16.partial",
             tmp_path / f".d.gguf.{dead.pid}-0123abcd.partial"]
    alive = tmp_path / f".d.gguf.{os.getppid()}-89abcdef.partial"  # a run that still lives
    other = tmp_path / f".e.gguf.{dead.pid}.partial"  # another output's
    for p in [*stale, alive, other]:
        p.write_bytes(b"x" * 1000)
    with pytest.raises(UserError):  # refused before the output is looked at: nothing touched
        convert(str(small_ckpt), target, out, head="half")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in stale), alive.name, other.name])
    with pytest.raises(UserError, match="NaN"):  # a run that fails later has cleared them
        convert(str(_nan_checkpoint(tmp_path)), target, out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted([alive.name, other.name])
    convert(str(small_ckpt), target, out)
    assert out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(["d.gguf", alive.name, other.name])


def _nan_checkpoint(tmp_path):
    def edit(t):
        t["fc.weight"] = np.full_like(t["fc.weight"], np.nan)

    return _checkpoint(tmp_path, edit_tensors=edit, name="nan")


# -- signals --------------------------------------------------------------------------------
# A target and checkpoint big enough (about 150 MB of checkpoint) that a kill lands mid-write.

BIG = F.TargetSpec(n_vocab=320, n_embd=512, n_layer=4, n_head=8, n_head_kv=4, head_dim=64, n_ff=2048)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    tgt = F.make_target_gguf(d / "target.gguf", BIG)
    ck = F.make_dspark_checkpoint(d / "ck", BIG, n_layer=16)
    return tgt, ck


def _wait_for(cond, proc, timeout=120.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def _quantiser_children(out: Path) -> list[int]:
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f".{out.name}.".encode() in cmd and b"_quantize_child" in cmd:
            pids.append(int(d.name))
    return pids


def _start(ck, tgt, out, *extra):
    return subprocess.Popen([sys.executable, "-m", "specgguf", "convert", str(ck), "--target", str(tgt),
                             "-o", str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, out: Path, sig: int) -> None:
    _, err = proc.communicate(timeout=120)
    expected = 128 + int(sig)  # 130 SIGINT, 143 SIGTERM, 129 SIGHUP
    assert proc.returncode == expected, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: interrupted by {signal.Signals(sig).name}; partial files removed, any "
                      "older output left as it was"], err
    assert sorted(p.name for p in out.parent.iterdir()) == [], "files left behind"


@pytest.mark.skipif(not POSIX, reason="POSIX signals and FIFOs")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_before_writing(tmp_path, target, sig):
    # A FIFO as the shard index: the converter blocks reading it, inside `convert`, before
    # any output exists; the test knows it got there when its own open of the FIFO returns.
    ck = F.make_dspark_checkpoint(tmp_path / "ck", SPEC, shards=2)
    index = ck / "model.safetensors.index.json"
    index.unlink()
    os.mkfifo(index)
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    proc = _start(ck, target, out)
    fd = {}
    opener = threading.Thread(target=lambda: fd.setdefault("w", os.open(index, os.O_WRONLY)), daemon=True)
    opener.start()
    opener.join(120)
    try:
        assert "w" in fd and proc.poll() is None
        proc.send_signal(sig)
        _finish(proc, out, sig)
    finally:
        if "w" in fd:
            os.close(fd["w"])
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(not POSIX, reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM)])
def test_signal_while_writing(tmp_path, big, sig):
    tgt, ck = big
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    proc = _start(ck, tgt, out, "--type", "q8_0", "--head", "own")
    assert _wait_for(lambda: any(p.stat().st_size > 1 << 20 for p in partial_files(out)), proc), \
        "the conversion ended before a partial file grew"
    proc.send_signal(sig)
    _finish(proc, out, sig)


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_quantising(tmp_path, big, sig):
    # --type q4_k_m: an F16 intermediate, then llama.cpp's quantiser writes the final partial
    tgt, ck = big
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    proc = _start(ck, tgt, out, "--type", "q4_k_m")
    quantising = lambda: any(not p.name.endswith(".f16.partial") for p in partial_files(out))  # noqa: E731
    assert _wait_for(quantising, proc), "the quantiser never started"
    assert _quantiser_children(out)
    proc.send_signal(sig)
    _finish(proc, out, sig)
    assert _quantiser_children(out) == []


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_python_api_ctrl_c_while_quantising(tmp_path, big):
    # Without our CLI handler: Python's own KeyboardInterrupt must stop the quantiser too (it
    # used to be swallowed inside llama.cpp's log callback, and the conversion finished).
    # On a quiet machine the quantiser can finish between "it started" and the signal: such a
    # run proves nothing either way, so up to three tries; the old bug finished every time.
    # The child installs Python's own SIGINT handler, as a program started from a terminal has:
    # a runner that starts us in the background (a non-interactive shell's `&`) passes SIGINT
    # on as ignored, and Python then installs no KeyboardInterrupt handler at all.
    tgt, ck = big
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from specgguf.converters import convert; "
            "convert(sys.argv[1], sys.argv[2], sys.argv[3], 'q4_k_m')")
    errors = []
    for attempt in range(3):
        out = tmp_path / f"out{attempt}" / "d.gguf"
        out.parent.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", code, str(ck), str(tgt), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        quantising = lambda: any(not p.name.endswith(".f16.partial") for p in partial_files(out))  # noqa: E731
        assert _wait_for(quantising, proc), "the quantiser never started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            assert "KeyboardInterrupt" in err, err
            assert list(out.parent.iterdir()) == [] and _quantiser_children(out) == []
            return
        errors.append(err)
    pytest.fail(f"three conversions ran to the end through SIGINT: {errors[-1][-500:]}")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
@pytest.mark.parametrize("phase", ["writing", "quantising"])
def test_sigkill_leftovers_are_cleaned_by_the_next_run(tmp_path, big, target, small_ckpt, phase):
    tgt, ck = big
    out = tmp_path / "d.gguf"
    proc = _start(ck, tgt, out, "--type", "q4_k_m")
    if phase == "writing":
        ready = lambda: any(p.stat().st_size > 1 << 20 for p in partial_files(out))  # noqa: E731
    else:
        ready = lambda: any(not p.name.endswith(".f16.partial") for p in partial_files(out))  # noqa: E731
    assert _wait_for(ready, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert partial_files(out), "SIGKILL leaves its partial files (nothing can remove them then)"
    end = time.monotonic() + 30  # an orphaned quantiser notices that its parent died and stops
    while _quantiser_children(out) and time.monotonic() < end:
        time.sleep(0.1)
    assert _quantiser_children(out) == []
    proc = cli("convert", small_ckpt, "--target", target, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["d.gguf"]
