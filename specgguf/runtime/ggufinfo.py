"""Cheap, validated reads of GGUF metadata (no llama.cpp involved).

Everything that decides whether a file may be handed to llama.cpp is read here first, with
`gguf.GGUFReader` (a numpy memory map: nothing is loaded). Bad files become one-line
`UserError`s: missing, not GGUF, truncated, no tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import UserError, missing_path

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFInfo:
    """What specgguf needs to know about a GGUF file before loading it."""

    path: Path
    arch: str
    metadata: dict = field(repr=False)  # scalar keys only (strings, numbers, bools)
    arrays: dict = field(repr=False)  # small numeric array keys (e.g. <arch>.target_layers)
    tensors: dict = field(repr=False)  # tensor name -> shape (ne0, ne1, ...)
    tensor_types: dict = field(repr=False)  # tensor name -> ggml type name
    size_bytes: int
    _raw: tuple = field(repr=False, compare=False)  # (memmap, located string arrays)

    # -- architecture --------------------------------------------------------------------
    def arch_key(self, suffix: str, default=None):
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    @property
    def name(self) -> str:
        return self.metadata.get("general.name") or self.path.name

    @property
    def n_embd(self) -> int:
        return int(self.arch_key("embedding_length", 0))

    @property
    def n_layer(self) -> int:
        return int(self.arch_key("block_count", 0))

    @property
    def n_head(self) -> int:
        value = self.arch_key("attention.head_count", 0)
        return int(value) if np.isscalar(value) else 0

    @property
    def n_ctx_train(self) -> int:
        return int(self.arch_key("context_length", 0))

    @property
    def target_layers(self) -> tuple[int, ...]:
        """Target layer ids a hidden-state draft (eagle3/dflash) reads; () for other files."""
        return tuple(int(x) for x in self.arrays.get(f"{self.arch}.target_layers", ()))

    @property
    def file_type(self) -> str:
        """The dominant weight type, as llama.cpp names it in `general.file_type`."""
        ft = self.metadata.get("general.file_type")
        return _FILE_TYPES.get(ft, f"type {ft}") if ft is not None else "unknown"

    # -- tokenizer -----------------------------------------------------------------------
    @property
    def tokenizer_model(self) -> str | None:
        return self.metadata.get("tokenizer.ggml.model")

    @cached_property
    def tokens(self) -> list[str]:
        """All token texts (decoded on first use)."""
        return self.string_array("tokenizer.ggml.tokens")

    def string_array(self, key: str) -> list[str]:
        data, located = self._raw
        if key not in located:
            return []
        start, end, count = located[key]
        buf, off, out = memoryview(data), start, []
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", buf, off)
            out.append(bytes(buf[off + 8:off + 8 + n]).decode("utf-8", "replace"))
            off += 8 + n
        return out

    @property
    def n_vocab(self) -> int:
        return self._raw[1].get("tokenizer.ggml.tokens", (0, 0, 0))[2]

    @cached_property
    def vocab_fingerprint(self) -> str:
        """sha256 over the raw bytes of the token list: equal lists give equal prints."""
        data, located = self._raw
        if "tokenizer.ggml.tokens" not in located:
            return ""
        start, end, _ = located["tokenizer.ggml.tokens"]
        return hashlib.sha256(memoryview(data[start:end])).hexdigest()[:16]

    def reader(self):
        """A full `gguf.GGUFReader` of the file (slow for big vocabularies: seconds)."""
        from gguf import GGUFReader

        return GGUFReader(self.path, "r")

    @property
    def bos_id(self) -> int | None:
        return _opt_int(self.metadata.get("tokenizer.ggml.bos_token_id"))

    @property
    def eos_id(self) -> int | None:
        return _opt_int(self.metadata.get("tokenizer.ggml.eos_token_id"))

    @property
    def add_bos(self) -> bool | None:
        return self.metadata.get("tokenizer.ggml.add_bos_token")

    @property
    def mask_id(self) -> int | None:
        return _opt_int(self.metadata.get("tokenizer.ggml.mask_token_id"))

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors


def read_gguf(path: str | os.PathLike, what: str = "model") -> GGUFInfo:
    """Read and validate a GGUF header; `what` names the file's role in error messages."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(missing_path(p, f"{what} file"))
    if p.is_dir():
        raise UserError(f"{what} path is a directory, not a GGUF file: {p}")
    if not p.is_file():
        raise UserError(f"{what} path is not a regular file (a pipe or a device), not a GGUF file: {p}")
    size = p.stat().st_size
    with open(p, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise UserError(f"{what} file is not a GGUF file (bad magic bytes): {p}")
    data = np.memmap(p, dtype=np.uint8, mode="r")
    try:
        header = _Header(memoryview(data)).parse()
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} file has a damaged or truncated GGUF header: {p} ({_short(exc)}); "
                        "download or convert it again") from None
    metadata, arrays, string_arrays, tensors, types, data_end = header
    for name, dims in tensors.items():
        _check_dims(p, what, name, dims, types[name], size)
    if data_end > size:
        raise UserError(f"{what} file is truncated: {p} has {size} bytes but its tensors need "
                        f"{data_end}; download or convert it again")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UserError(f"{what} file has no general.architecture key: {p}")
    return GGUFInfo(p, arch, metadata, arrays, tensors, types, size, (data, string_arrays))


_U64 = struct.Struct("<Q")


class _Header:
    """A minimal GGUF (v2/v3) header parser: scalars and small arrays decoded, string arrays
    (the 262k-token vocabulary) only located, so reading a header takes milliseconds."""

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}
    _STRING, _ARRAY = 8, 9

    def __init__(self, buf: memoryview):
        self.buf, self.off = buf, 0

    def _unpack(self, fmt):
        (value,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        if self.off + n > len(self.buf):
            raise ValueError("string runs past the end of the file")
        text = bytes(self.buf[self.off:self.off + n]).decode("utf-8")
        self.off += n
        return text

    def _value(self, vtype):
        if vtype == self._STRING:
            return self._string()
        if vtype in self._SCALARS:
            return self._unpack(self._SCALARS[vtype])
        raise ValueError(f"unknown value type {vtype}")

    def parse(self):
        if self._unpack("<I") != int.from_bytes(GGUF_MAGIC, "little"):
            raise ValueError("bad magic")
        version = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        metadata, arrays, string_arrays = {}, {}, {}
        for _ in range(n_kv):
            key = self._string()
            vtype = self._unpack("<I")
            if vtype != self._ARRAY:
                metadata[key] = self._value(vtype)
                continue
            etype, count = self._unpack("<I"), self._unpack("<Q")
            if etype == self._STRING:  # walked, not decoded: one length read per string
                start = off = self.off
                buf, length = self.buf, _U64.unpack_from
                for _ in range(count):
                    off += 8 + length(buf, off)[0]
                self.off = off
                string_arrays[key] = (start, off, count)
            elif etype in self._SCALARS:
                fmt = self._SCALARS[etype]
                width = struct.calcsize(fmt)
                if count <= 4096:
                    arrays[key] = list(struct.unpack_from("<" + fmt[1] * count, self.buf, self.off))
                self.off += width * count
            else:
                raise ValueError(f"nested arrays are not supported ({key})")
            if self.off > len(self.buf):
                raise ValueError(f"array {key} runs past the end of the file")
        tensors, types, infos = {}, {}, []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if not 1 <= n_dims <= 4:  # GGML_MAX_DIMS; garbage here would be read as dimensions
                raise ValueError(f"tensor {name} has {n_dims} dimensions (llama.cpp allows 1 to 4)")
            dims = tuple(self._unpack("<Q") for _ in range(n_dims))
            ttype, offset = self._unpack("<I"), self._unpack("<Q")
            tensors[name], types[name] = dims, _type_name(ttype)
            infos.append((dims, ttype, offset))
        align = int(metadata.get("general.alignment", 32))
        data_start = (self.off + align - 1) // align * align
        data_end = data_start
        for dims, ttype, offset in infos:
            data_end = max(data_end, data_start + offset + _nbytes(dims, ttype))
        return metadata, arrays, string_arrays, tensors, types, data_end


def _check_dims(p: Path, what: str, name: str, dims, type_name: str, size: int) -> None:
    """One tensor's dimensions against llama.cpp's limits and the file's size: a damaged or
    byte-swapped header is named as such, not as a file that 'needs 2e22 bytes'."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    shown = list(dims)
    n = 1
    for d in dims:
        n *= int(d)
    block, bsize = GGML_QUANT_SIZES.get(getattr(GGMLQuantizationType, type_name, None), (1, 1))
    if n // block * bsize > size:
        raise UserError(f"{what} file {p}: tensor {name} has dimensions {shown}, larger than the whole "
                        f"file ({size} bytes): its header is damaged (dimensions corrupted or byte-swapped)")
    if dims[0] % block:
        raise UserError(f"{what} file {p}: tensor {name} ({type_name}) has rows of {dims[0]} values, not a "
                        f"multiple of its block of {block}: dimensions in the wrong order or a damaged header")


def _type_name(ttype: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ttype).name
    except ValueError:
        return f"type{ttype}"


def _nbytes(dims, ttype: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown tensor type {ttype} (a newer GGUF?)") from None
    n = 1
    for d in dims:
        n *= int(d)
    return n // block * size


def _opt_int(v):
    return None if v is None else int(v)


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]


# llama_ftype names for the common values (llama.h `enum llama_ftype`).
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
               10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
               16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}
