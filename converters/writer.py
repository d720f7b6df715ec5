"""Write a draft GGUF from a conversion plan: tokenizer from the target, typed tensors, atomically.

Tensors are streamed: the header and tensor table are written first, then each tensor is
converted a slab of rows at a time straight from the checkpoint's memory map into the file,
so peak memory is one slab plus the quantiser's temporaries, not the model. Output types:
F32/F16/BF16/Q8_0 with `gguf`'s numpy code; K-quants by `llama_model_quantize` on an
intermediate F16 file (gguf's numpy code has no K-quant encoder). Everything goes to a hidden
temporary file next to the output and is renamed into place only when complete, so an error or
Ctrl-C never leaves a half-written draft (nor clobbers an older one).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.gguf_writer import WriterState

from specgguf.errors import UserError

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


def _encode(values: np.ndarray, qtype: QT) -> np.ndarray:
    if qtype == QT.F32:
        return values.astype(np.float32, copy=False)
    if qtype == QT.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, qtype)  # BF16 (rounded) and Q8_0


def _slabs(t: OutTensor, qtype: QT):
    """Encoded pieces of a tensor, in order, one slab of rows at a time."""
    src = t.source
    if isinstance(src, np.ndarray):
        data = src if qtype == QT.I64 else src.astype(np.float32)
        if t.transform is not None:
            data = t.transform(data)
        yield data if qtype == QT.I64 else _encode(data, qtype)
        return
    if t.transform is not None:  # permutations mix rows: whole tensor (only small ones use this)
        yield _encode(t.transform(src.float32()), qtype)
        src.release()
        return
    if len(src.shape) < 2:
        yield _encode(src.float32(), qtype)
        return
    same_bits = qtype == QT.BF16 and src.dtype == "BF16"  # copy the bits, never round twice
    rows = src.shape[0]
    per_row = max(1, int(np.prod(src.shape[1:], dtype=np.int64)))
    step = max(1, SLAB_ELEMENTS // per_row)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        yield np.array(src.raw()[start:stop]) if same_bits else _encode(src.rows(start, stop), qtype)
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
    out = Path(out).expanduser()
    if out.suffix.lower() != ".gguf":
        raise UserError(f"output file must end in .gguf: {out}")
    if out.exists() and out.is_dir():
        raise UserError(f"output path is a directory: {out}; give a file name ending in .gguf")
    if not out.parent.exists():
        raise UserError(f"output directory does not exist: {out.parent}")
    if not os.access(out.parent, os.W_OK):
        raise UserError(f"cannot write to {out.parent} (permission denied); choose another -o")
    if out.exists() and out.resolve() == Path(target_path).resolve():
        raise UserError("output file is the target GGUF itself; choose another -o")
    return out


def write_draft(plan: DraftPlan, target, out: Path, out_type: str = "f16",
                progress: Callable[[int], None] | None = None) -> dict:
    """Write `plan` as a GGUF at `out` (atomically); returns {'bytes', 'types', 'tensors'}.

    `target` is the target's GGUFInfo (specgguf.ggufinfo): its tokenizer is copied.
    """
    if out_type not in OUT_TYPES:
        raise UserError(f"unknown output type {out_type!r}; use one of {', '.join(OUT_TYPES)}")
    out = check_output_path(out, target.path)
    base_type = "f16" if out_type in KQUANTS else out_type
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    tmp_f16 = out.with_name(f".{out.name}.{os.getpid()}.f16.partial")
    try:
        first = tmp_f16 if out_type in KQUANTS else tmp
        types = _write_gguf(plan, target.path, first, base_type, progress)
        if out_type in KQUANTS:
            from specgguf import native  # llama.cpp is needed only for K-quants

            native.quantize(tmp_f16, tmp, out_type)
            tmp_f16.unlink()
            types = _types_in(tmp)
        os.replace(tmp, out)
    except BaseException:  # includes KeyboardInterrupt: never leave a partial file behind
        for p in (tmp, tmp_f16):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        raise
    return {"bytes": out.stat().st_size, "types": types, "tensors": len(plan.tensors), "path": out}


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
            written = 0
            for piece in _slabs(t, q):
                fout.write(memoryview(np.ascontiguousarray(piece)).cast("B"))
                written += piece.nbytes
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
    from specgguf.ggufinfo import read_gguf

    counts: dict[str, int] = {}
    for name in read_gguf(path, "draft").tensor_types.values():
        counts[name] = counts.get(name, 0) + 1
    return counts
