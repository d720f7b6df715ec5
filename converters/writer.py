"""Write a draft GGUF from a conversion plan: tokenizer from the target, typed tensors, atomically.

Tensors are streamed: the header and tensor table are written first, then each tensor is
converted a slab of rows at a time straight from the checkpoint's memory map into the file,
so peak memory is one slab plus the quantiser's temporaries, not the model. Output types:
F32/F16/BF16/Q8_0 with `gguf`'s numpy code; K-quants by `llama_model_quantize` on an
intermediate F16 file (gguf's numpy code has no K-quant encoder), run in a child process so that
an interrupt reaches Python at once (docs/gguf-formats.md, "Writing safely"). Everything goes to
a hidden `.partial` file next to the output and is renamed into place only when complete, so an
error, Ctrl-C or SIGTERM never leaves a half-written draft (nor clobbers an older one); partial
files of a run that was killed outright are removed by the next run on the same output.
Weights that are NaN or infinite, or too large for F16, are refused with the tensor's name.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.gguf_writer import WriterState

from specgguf.errors import LlamaError, UserError

from .safetensors import Tensor

OUT_TYPES = ("f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "f32")
KQUANTS = ("q4_k_m", "q5_k_m", "q6_k")
# llama_ftype values for general.file_type (llama.h)
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
SLAB_ELEMENTS = 1 << 22  # rows converted at once: 16 MiB of float32


@dataclass
class OutTensor:
    """One tensor of the draft: GGUF name, numpy-order shape and where its values come from."""

    name: str
    source: Tensor | np.ndarray
    f32: bool = False  # keep F32 whatever the output type (norms, scales, tiny heads)
    transform: Callable[[np.ndarray], np.ndarray] | None = None  # on the whole float32 tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)


@dataclass
class DraftPlan:
    """Everything the writer needs; made by deepspec.py / eagle3.py, checked before writing."""

    arch: str
    kv: list = field(default_factory=list)  # (key, value, GGUFValueType, sub type or None)
    tensors: list[OutTensor] = field(default_factory=list)
    mask_token_id: int | None = None
    name: str = "draft"
    summary: dict = field(default_factory=dict)

    def add(self, key: str, value, vtype: VT, sub: VT | None = None) -> None:
        self.kv.append((f"{self.arch}.{key}" if not key.startswith(("general.", "tokenizer.")) else key,
                        value, vtype, sub))

    def tensor(self, name: str, source, *, f32: bool = False, transform=None) -> None:
        self.tensors.append(OutTensor(name, source, f32, transform))

    @property
    def source_bytes(self) -> int:
        return sum(int(t.source.nbytes) for t in self.tensors)


def tensor_type(t: OutTensor, out_type: str) -> QT:
    """The GGML type a tensor is stored as for a given output type."""
    if isinstance(t.source, np.ndarray) and t.source.dtype == np.int64:
        return QT.I64
    if t.f32 or len(t.shape) == 1 or out_type == "f32":
        return QT.F32  # 1-D tensors feed ggml ops that want F32 (norms, rope factors, scales)
    if out_type == "bf16":
        return QT.BF16
    if out_type == "q8_0" and t.shape[-1] % 32 == 0:
        return QT.Q8_0
    return QT.F16  # f16, the K-quant intermediate, and rows too narrow for Q8_0 blocks


def _nbytes(shape, qtype: QT) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape, dtype=np.int64)) // block * size


F16_MAX = 65504.0


@dataclass
class _Bad:
    """Values of one tensor that cannot be written faithfully, counted while it is streamed."""

    nonfinite: int = 0
    too_big: int = 0  # finite, but beyond F16's range (would become inf)

    def check(self, values: np.ndarray, qtype: QT) -> np.ndarray:
        """Count the bad values; return `values` with them zeroed, so that encoding them raises
        no numpy warning (the tensor is refused once it has been read to the end)."""
        finite = np.isfinite(values)
        n_bad = int(values.size - np.count_nonzero(finite))
        if n_bad:
            self.nonfinite += n_bad
            values = np.where(finite, values, np.float32(0))
        if qtype in (QT.F16, QT.Q8_0):  # Q8_0 keeps one F16 scale per 32 values: max/127 must fit
            limit = F16_MAX if qtype == QT.F16 else F16_MAX * 127
            big = np.abs(values) > limit
            n_big = int(np.count_nonzero(big))
            if n_big:
                self.too_big += n_big
                values = np.where(big, np.float32(0), values)
        return values

    def check_bf16_bits(self, bits: np.ndarray) -> None:
        self.nonfinite += int(np.count_nonzero((bits & 0x7F80) == 0x7F80))  # exponent all ones

    def raise_if_any(self, t: "OutTensor", qtype: QT) -> None:
        src = getattr(t.source, "name", None)
        name = f"{src} ({t.name})" if src and src != t.name else t.name
        total = int(np.prod(t.shape, dtype=np.int64))
        if self.nonfinite:
            raise UserError(f"tensor {name} has {self.nonfinite} NaN/Inf values (of {total}): the "
                            "checkpoint is damaged or its training diverged; refusing to convert it")
        if self.too_big:
            raise UserError(f"tensor {name} has {self.too_big} values too large for {qtype.name} "
                            "(|x| > 65504): convert it as bf16 or f32 instead")


def _encode(values: np.ndarray, qtype: QT, bad: _Bad) -> np.ndarray:
    values = bad.check(values, qtype)
    if qtype == QT.F32:
        return values.astype(np.float32, copy=False)
    if qtype == QT.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, qtype)  # BF16 (rounded) and Q8_0


def _slabs(t: OutTensor, qtype: QT, bad: _Bad):
    """Encoded pieces of a tensor, in order, one slab of rows at a time."""
    src = t.source
    if isinstance(src, np.ndarray):
        data = src if qtype == QT.I64 else src.astype(np.float32)
        if t.transform is not None:
            data = t.transform(data)
        yield data if qtype == QT.I64 else _encode(data, qtype, bad)
        return
    if t.transform is not None:  # permutations mix rows: whole tensor (only small ones use this)
        yield _encode(t.transform(src.float32()), qtype, bad)
        src.release()
        return
    if len(src.shape) < 2:
        yield _encode(src.float32(), qtype, bad)
        return
    same_bits = qtype == QT.BF16 and src.dtype == "BF16"  # copy the bits, never round twice
    rows = src.shape[0]
    per_row = max(1, int(np.prod(src.shape[1:], dtype=np.int64)))
    step = max(1, SLAB_ELEMENTS // per_row)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        if same_bits:
            piece = np.array(src.raw()[start:stop])
            bad.check_bf16_bits(piece)
            yield piece
        else:
            yield _encode(src.rows(start, stop), qtype, bad)
        src.release()  # drop the pages just read, so RSS does not grow with the checkpoint


def tokenizer_records(path: Path, skip=()) -> list[bytes]:
    """The raw bytes of every tokenizer.* key/value record of a GGUF file.

    Copied verbatim into the draft: exact by construction, and cheap. (gguf.GGUFReader builds
    a numpy object per token: ~500 MB for a 152k-token vocabulary, more than the conversion.)
    """
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        magic, version, _n_tensors, n_kv = struct.unpack_from("<IIQQ", m, 0)
        if magic != gguf.GGUF_MAGIC or version < 2:
            raise UserError(f"target {path} is not a GGUF v2/v3 file")
        pos, out = 24, []
        for _ in range(n_kv):
            start = pos
            (klen,) = struct.unpack_from("<Q", m, pos)
            key = bytes(m[pos + 8:pos + 8 + klen]).decode("utf-8", "replace")
            pos += 8 + klen
            (vtype,) = struct.unpack_from("<I", m, pos)
            pos = _skip_value(m, pos + 4, vtype)
            if key.startswith("tokenizer.") and key not in skip:
                out.append(bytes(m[start:pos]))
    return out


_SCALAR_SIZES = {VT.UINT8: 1, VT.INT8: 1, VT.BOOL: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4,
                 VT.INT32: 4, VT.FLOAT32: 4, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}


def _skip_value(m, pos: int, vtype: int) -> int:
    if vtype == VT.STRING:
        return pos + 8 + struct.unpack_from("<Q", m, pos)[0]
    if vtype == VT.ARRAY:
        item, count = struct.unpack_from("<IQ", m, pos)
        pos += 12
        if item == VT.STRING:
            for _ in range(count):
                pos += 8 + struct.unpack_from("<Q", m, pos)[0]
            return pos
        if item == VT.ARRAY:
            for _ in range(count):
                pos = _skip_value(m, pos, VT.ARRAY)
            return pos
        return pos + count * _SCALAR_SIZES[VT(item)]
    return pos + _SCALAR_SIZES[VT(vtype)]


def check_output_path(out: Path, target_path: Path) -> Path:
    """`out` if a draft can be written there; otherwise a UserError that says why."""
    out = Path(out).expanduser()
    try:
        return _check_output_path(out, target_path)
    except OSError as exc:  # e.g. a parent directory we may not even look into
        raise UserError(f"cannot write {out} ({exc.strerror or exc}); choose another output file") from None


def _check_output_path(out: Path, target_path: Path) -> Path:
    if out.suffix.lower() != ".gguf":
        raise UserError(f"output file must end in .gguf: {out}")
    if out.is_symlink() and not out.exists():
        raise UserError(f"output path {out} is a dangling symlink or a symlink loop; remove it or choose "
                        "another output file")
    if out.exists() and out.is_dir():
        raise UserError(f"output path is a directory: {out}; give a file name ending in .gguf")
    if not out.parent.exists():
        raise UserError(f"output directory does not exist: {out.parent}; create it or choose another output file")
    if not out.parent.is_dir():
        raise UserError(f"output directory {out.parent} is not a directory; choose another output file")
    try:  # the real test (os.access says yes to root on a read-only file system)
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as exc:
        raise UserError(f"cannot write to {out.parent} ({exc.strerror or exc}); choose another output file") from None
    if out.exists() and out.resolve() == Path(target_path).resolve():
        raise UserError("output file is the target GGUF itself; choose another output file")
    return out


# Hidden partial files: .<output name>.<pid>-<run>.partial (and .f16.partial for the K-quant
# intermediate); older versions wrote .<output name>.<pid>[.f16].partial.
_PARTIAL = re.compile(r"(?P<pid>\d+)(-[0-9a-f]+)?(\.f16)?\.partial")


def partial_files(out: Path) -> list[Path]:
    """Every hidden partial file of any run writing `out`."""
    prefix = f".{out.name}."
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    return [out.parent / n for n in names if n.startswith(prefix) and _PARTIAL.fullmatch(n[len(prefix):])]


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove partial files left by runs that no longer exist (killed outright: SIGKILL, power
    loss); a run still alive keeps its own. Returns what was removed."""
    removed = []
    for p in partial_files(out):
        pid = int(_PARTIAL.fullmatch(p.name[len(out.name) + 2:])["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass  # another run removed it first, or it is not ours to remove
    return removed


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate it there: keep the file
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def write_draft(plan: DraftPlan, target, out: Path, out_type: str = "f16",
                progress: Callable[[int], None] | None = None) -> dict:
    """Write `plan` as a GGUF at `out` (atomically); returns {'bytes', 'types', 'tensors'}.

    `target` is the target's GGUFInfo (specgguf.runtime.ggufinfo): its tokenizer is copied.
    """
    if out_type not in OUT_TYPES:
        raise UserError(f"unknown output type {out_type!r}; use one of {', '.join(OUT_TYPES)}")
    out = check_output_path(out, target.path)
    remove_stale_partials(out)
    base_type = "f16" if out_type in KQUANTS else out_type
    run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out.with_name(f".{out.name}.{run}.partial")
    tmp_f16 = out.with_name(f".{out.name}.{run}.f16.partial")
    try:
        first = tmp_f16 if out_type in KQUANTS else tmp
        types = _write_gguf(plan, target.path, first, base_type, progress)
        if out_type in KQUANTS:
            quantize_in_child(tmp_f16, tmp, out_type)
            tmp_f16.unlink()
            types = _types_in(tmp)
        os.replace(tmp, out)
    except OSError as exc:  # disk full, a file system that refuses writes, ...
        _remove(tmp, tmp_f16)
        where = f" ({exc.filename})" if exc.filename else ""
        raise UserError(f"converting to {out} failed: {exc.strerror or exc}{where}; nothing was written") from None
    except BaseException:  # includes KeyboardInterrupt and signals: never leave a partial file behind
        _remove(tmp, tmp_f16)
        raise
    return {"bytes": out.stat().st_size, "types": types, "tensors": len(plan.tensors), "path": out}


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def quantize_in_child(src: Path, dst: Path, out_type: str) -> None:
    """llama_model_quantize(src -> dst) in a child process, killed if we are interrupted.

    In-process, a signal reaches Python only inside llama.cpp's log callback, where ctypes
    drops the exception: Ctrl-C would be lost and the quantiser would run to the end. Here the
    parent waits on the child (interruptible), kills it and waits for it before the caller
    removes the partial files. The child exits by itself if the parent dies.
    """
    code = "from specgguf.converters.writer import _quantize_child; _quantize_child()"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # find specgguf as we do
    proc = subprocess.Popen([sys.executable, "-c", code, os.fspath(src), os.fspath(dst), out_type],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    try:
        _, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise LlamaError(lines[-1] if lines else f"quantising to {out_type} failed (exit {proc.returncode})")


def _quantize_child() -> None:  # pragma: no cover - runs in the child process
    import signal
    import threading

    src, dst, out_type = sys.argv[1:4]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    parent = os.getppid()
    from specgguf.runtime import native

    failed: list[str] = []

    def work() -> None:
        try:
            native.quantize(src, dst, out_type)
        except Exception as exc:  # reported to the parent on stderr
            failed.append(" ".join(str(exc).split()))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        if os.getppid() != parent:  # the parent was killed: stop writing
            os._exit(3)
    if failed:
        sys.stderr.write(failed[0] + "\n")
        sys.exit(1)


def _write_gguf(plan: DraftPlan, target_path: Path, path: Path, out_type: str, progress) -> dict:
    writer = gguf.GGUFWriter(path, plan.arch)
    try:
        writer.add_name(plan.name)
        for key, value, vtype, sub in plan.kv:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        if out_type in FILE_TYPES:
            writer.add_uint32("general.file_type", FILE_TYPES[out_type])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        skip = ("tokenizer.ggml.mask_token_id",) if plan.mask_token_id is not None else ()
        records = tokenizer_records(target_path, skip)
        if plan.mask_token_id is not None:
            writer.add_uint32("tokenizer.ggml.mask_token_id", int(plan.mask_token_id))

        qtypes = [tensor_type(t, out_type) for t in plan.tensors]
        for t, q in zip(plan.tensors, qtypes):
            np_dtype = np.int64 if q == QT.I64 else np.float32
            writer.add_tensor_info(t.name, t.shape, np.dtype(np_dtype), _nbytes(t.shape, q), raw_dtype=q)
        # The header counts our keys plus the raw tokenizer records appended after them.
        writer.open_output_file()
        fout = writer.fout[0]
        fout.write(struct.pack("<IIQQ", gguf.GGUF_MAGIC, gguf.GGUF_VERSION, len(plan.tensors),
                               len(writer.kv_data[0]) + len(records)))
        writer.state = WriterState.HEADER
        writer.write_kv_data_to_file()
        for record in records:
            fout.write(record)
        writer.write_ti_data_to_file()
        for t, q in zip(plan.tensors, qtypes):
            writer.write_padding(fout, fout.tell())
            written, bad = 0, _Bad()
            for piece in _slabs(t, q, bad):
                fout.write(memoryview(np.ascontiguousarray(piece)).cast("B"))
                written += piece.nbytes
            bad.raise_if_any(t, q)
            if written != _nbytes(t.shape, q):  # a bug, not user input: fail loudly
                raise RuntimeError(f"{t.name}: wrote {written} bytes, expected {_nbytes(t.shape, q)}")
            writer.write_padding(fout, written)
            if progress is not None:
                progress(int(t.source.nbytes))
        fout.flush()
    finally:
        writer.close()
    counts: dict[str, int] = {}
    for q in qtypes:
        counts[q.name] = counts.get(q.name, 0) + 1
    return counts


def _types_in(path: Path) -> dict:
    from specgguf.runtime.ggufinfo import read_gguf

    counts: dict[str, int] = {}
    for name in read_gguf(path, "draft").tensor_types.values():
        counts[name] = counts.get(name, 0) + 1
    return counts
