"""A numpy reader for safetensors checkpoints (single file or sharded), memory-mapped.

Nothing is loaded up front: each tensor is a view into a read-only memory map of its file,
so converting a multi-GB checkpoint needs about one tensor chunk of RAM at a time. Pages that
were read can be handed back to the kernel (`release`) so that the process RSS stays near
the working set instead of growing to the size of the checkpoint.

Every header is checked against the file before any data is touched: a truncated download
or a header whose offsets lie becomes a one-line `UserError`, never a numpy crash later on.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specgguf.errors import UserError, missing_path

# safetensors dtype -> (numpy dtype used to view the bytes, bytes per element).
# BF16 has no numpy dtype: it is viewed as uint16 and widened by `to_float32`.
DTYPES = {
    "BF16": (np.uint16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "F64": (np.float64, 8),
    "I64": (np.int64, 8),
    "I32": (np.int32, 4),
    "I16": (np.int16, 2),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "BOOL": (np.bool_, 1),
}
FLOAT_DTYPES = ("BF16", "F16", "F32")
INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit; a larger value means a damaged file


@dataclass
class Tensor:
    """One tensor of a checkpoint: its metadata and a lazy view of its bytes."""

    name: str
    dtype: str  # safetensors dtype name ("BF16", "F16", "F32", ...)
    shape: tuple[int, ...]
    file: "SafetensorsFile"
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def raw(self) -> np.ndarray:
        """The stored values as a read-only memory-mapped array (BF16 as uint16)."""
        np_dtype = DTYPES[self.dtype][0]
        flat = np.frombuffer(self.file.map, dtype=np_dtype, count=self.n_elements, offset=self.begin)
        return flat.reshape(self.shape)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the first axis, as float32 (a copy of just that slice)."""
        return to_float32(self.raw()[start:stop], self.dtype)

    def float32(self) -> np.ndarray:
        return to_float32(self.raw(), self.dtype)

    def release(self) -> None:
        """Drop this tensor's pages from the process (the kernel keeps them cached)."""
        self.file.release(self.begin, self.end)


def to_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    """Widen BF16 (as uint16), F16 or F32 values to a new float32 array."""
    if dtype == "BF16":
        # bfloat16 is the top half of a float32: shift the bits into place, exactly.
        return (values.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F16", "F32", "F64"):
        return values.astype(np.float32)
    raise UserError(f"tensor of type {dtype} cannot be read as floating point; "
                    "only BF16, F16 and F32 weights are supported")


class SafetensorsFile:
    """One .safetensors file: parsed, validated header and a read-only memory map."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
        except OSError:
            raise UserError(missing_path(self.path, "weights file")) from None
        if not self.path.is_file():
            raise UserError(f"weights file {self.path} is not a regular file (a directory, pipe or device)")
        if size < 8:
            raise UserError(f"{self.path.name} is truncated ({size} bytes): download the checkpoint again")
        with open(self.path, "rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > MAX_HEADER or 8 + header_len > size:
                raise UserError(f"{self.path.name} is truncated or not a safetensors file (header of "
                                f"{header_len} bytes in a {size}-byte file): download it again")
            raw_header = fh.read(header_len)
        try:
            header = json.loads(raw_header.decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (UnicodeDecodeError, ValueError) as exc:
            raise UserError(f"{self.path.name} has a damaged safetensors header ({exc}): "
                            "download it again") from None
        self.metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + header_len
        data_size = size - data_start
        self.tensors: dict[str, Tensor] = {}
        spans = []
        for name, info in header.items():
            self.tensors[name] = t = self._check_entry(name, info, data_start, data_size)
            spans.append((t.begin, t.end, name))
        # Offsets must not overlap: overlapping spans mean a header that lies about the data.
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise UserError(f"{self.path.name}: tensors {n0} and {n1} overlap in the file; "
                                "the header is damaged, download the checkpoint again")
        self.size = size
        if size == 0 or data_size == 0:
            self.map = b""
        else:
            with open(self.path, "rb") as fh:
                self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

    def _check_entry(self, name, info, data_start, data_size) -> Tensor:
        where = f"{self.path.name}: tensor {name}"
        if not isinstance(info, dict):
            raise UserError(f"{where} has a damaged header entry; download the checkpoint again")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPES:
            raise UserError(f"{where} has unsupported dtype {dtype!r}; only BF16, F16 and F32 "
                            "weights are supported")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise UserError(f"{where} has a damaged header entry (shape {shape}, offsets "
                            f"{offsets}); download the checkpoint again")
        begin, end = offsets
        expected = math.prod(shape) * DTYPES[dtype][1]  # exact: int64 would wrap for lying shapes
        if begin < 0 or end < begin or end - begin != expected:
            raise UserError(f"{where}: header offsets {offsets} do not match its shape {shape} "
                            f"and dtype {dtype} ({expected} bytes); the file is damaged")
        if end > data_size:
            raise UserError(f"{where} ends at byte {data_start + end} but {self.path.name} has only "
                            f"{data_start + data_size}: the file is truncated, download it again")
        return Tensor(name, dtype, tuple(shape), self, data_start + begin, data_start + end)

    def release(self, begin: int, end: int) -> None:
        if isinstance(self.map, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            start = begin - begin % mmap.PAGESIZE
            length = end - start
            if length > 0:
                try:
                    self.map.madvise(mmap.MADV_DONTNEED, start, length)
                except (OSError, ValueError):
                    pass  # an optimisation only

    def close(self) -> None:
        if isinstance(self.map, mmap.mmap):
            try:
                self.map.close()
            except BufferError:
                pass  # numpy views still alive: the map is freed with them


def check_float_tensor(t, name: str, shape) -> None:
    """The one rule every converter applies to a weight it reads: the shape config.json implies
    and a float type (one line naming the tensor otherwise)."""
    if tuple(t.shape) != tuple(shape):
        if len(shape) == 2 and tuple(t.shape) == tuple(shape)[::-1] and shape[0] != shape[1]:
            raise UserError(f"tensor {name} is transposed: shape {list(t.shape)} where config.json implies "
                            f"{list(shape)} (PyTorch [out, in] order); re-export it untransposed")
        raise UserError(f"tensor {name} has shape {list(t.shape)} but config.json implies "
                        f"{list(shape)}: the weights do not match the config")
    if t.dtype not in FLOAT_DTYPES:
        raise UserError(f"tensor {name} is {t.dtype}; only BF16, F16 and F32 weights are supported")


class Weights:
    """All tensors of a checkpoint directory, across shards, by name."""

    def __init__(self, directory: Path):
        directory = Path(directory)
        self.directory = directory  # side files (mask_embedding.pt) are looked up here
        self.files: list[SafetensorsFile] = []
        self.tensors: dict[str, Tensor] = {}
        index = directory / INDEX_NAME
        if index.exists():
            names = self._shards_from_index(index)
        else:
            names = sorted(p.name for p in directory.glob("*.safetensors"))
            if not names:
                raise UserError(f"no model.safetensors in {directory}: the checkpoint is incomplete "
                                "(only safetensors weights are supported, not .bin/.pt)")
        for name in names:
            f = SafetensorsFile(directory / name)
            self.files.append(f)
            for tname, t in f.tensors.items():
                if tname in self.tensors:
                    raise UserError(f"tensor {tname} appears in two weight files ({name} and "
                                    f"{self.tensors[tname].file.path.name}); the checkpoint is damaged")
                self.tensors[tname] = t
        if index.exists():
            for tname, fname in self._weight_map.items():
                if tname not in self.tensors:
                    raise UserError(f"{INDEX_NAME} lists {tname} in {fname} but that file does not "
                                    "contain it; download the checkpoint again")

    def _shards_from_index(self, index: Path) -> list[str]:
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
            if not isinstance(weight_map, dict):
                raise ValueError("weight_map is not an object")
            if not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError("weight_map maps a tensor to something that is not a file name")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{index.name} is damaged ({exc}); download the checkpoint again") from None
        self._weight_map = weight_map
        names = sorted(set(weight_map.values()))
        for n in names:
            if not (index.parent / n).is_file():
                raise UserError(f"shard {n} listed in {index.name} is missing from {index.parent}; "
                                "download the checkpoint again")
        return names

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def names(self) -> list[str]:
        return list(self.tensors)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
