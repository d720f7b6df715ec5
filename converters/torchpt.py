"""Read a small PyTorch `.pt` file (a dict of tensors and numbers) without torch.

`torch.save` writes a zip archive: `<name>/data.pkl` (a pickle) and one raw little-endian
file per tensor storage, `<name>/data/<key>`. The pickle rebuilds each tensor with
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` and names its storage
through a persistent id `('storage', torch.FloatStorage, key, location, numel)`.

The unpickler here is restricted: it knows those few globals (plus `collections.OrderedDict`)
and nothing else, so a hostile file cannot run code; anything else is a one-line UserError
that says how to re-save the file. Tensors come back as float32 numpy arrays (contiguous).
Used for the `mask_embedding.pt` side file of some DFlash drafts (docs/gguf-formats.md §8).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

from specgguf.errors import UserError

# storage class -> (numpy dtype of the raw bytes, bytes per element)
_STORAGES = {
    "FloatStorage": (np.dtype("<f4"), 4),
    "HalfStorage": (np.dtype("<f2"), 2),
    "BFloat16Storage": (np.dtype("<u2"), 2),  # widened to float32 below
    "DoubleStorage": (np.dtype("<f8"), 8),
    "LongStorage": (np.dtype("<i8"), 8),
    "IntStorage": (np.dtype("<i4"), 4),
}
_MAX_PICKLE = 16 * 1024 * 1024  # a dict of a few tensors; a bigger pickle is not such a file


class _Storage:
    def __init__(self, kind: str, data: np.ndarray):
        self.kind, self.data = kind, data


def _rebuild_tensor(storage, offset, size, stride, *_rest):
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("tensor without a storage")
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(size) != len(stride) or any(s < 0 for s in size + stride) or offset < 0:
        raise pickle.UnpicklingError("bad tensor geometry")
    n = int(np.prod(size, dtype=np.int64)) if size else 1
    last = offset + sum((d - 1) * s for d, s in zip(size, stride)) if n else offset
    if n and last >= storage.data.size:
        raise pickle.UnpicklingError("tensor reaches past its storage")
    item = storage.data.itemsize
    view = np.lib.stride_tricks.as_strided(storage.data[offset:], shape=size,
                                           strides=tuple(s * item for s in stride))
    values = np.array(view)  # a copy: the archive's bytes are not kept
    if storage.kind == "BFloat16Storage":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32) if values.dtype.kind == "f" else values


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: Path):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.path = archive, prefix, path

    def find_class(self, module, name):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":  # an nn.Parameter: its data
            return lambda data, *_rest: data
        if module == "torch" and name in _STORAGES:
            return name  # only ever used as the storage type inside a persistent id
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and pid[1] in _STORAGES):
            raise _Refused(f"persistent id {pid!r:.60}")
        kind, key = pid[1], str(pid[2])
        dtype, size = _STORAGES[kind]
        try:
            raw = self.archive.read(f"{self.prefix}/data/{key}")
        except KeyError:
            raise pickle.UnpicklingError(f"storage {key} missing from the archive") from None
        if len(raw) % size:
            raise pickle.UnpicklingError(f"storage {key} is not a whole number of elements")
        return _Storage(kind, np.frombuffer(raw, dtype=dtype))


class _Refused(Exception):
    pass


def _how(path: Path) -> str:
    return (f"re-save it as a plain dict of tensors and ints (torch.save({{'mask_token_id': id, "
            f"'embedding': tensor}}, '{path.name}'))")


def read_pt(path: Path) -> dict:
    """The dict stored in a torch.save zip file: tensors as numpy arrays, numbers as numbers."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise UserError(f"{path.name} is not a torch.save zip archive (an old or non-PyTorch format); "
                        f"{_how(path)} with PyTorch 1.6 or later")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise UserError(f"{path.name} is a zip file but not a torch.save archive (no single "
                                f"<name>/data.pkl); {_how(path)}")
            info = archive.getinfo(pickles[0])
            if info.file_size > _MAX_PICKLE:
                raise UserError(f"{path.name} holds a {info.file_size}-byte pickle, far more than a few "
                                f"tensors need; {_how(path)}")
            prefix = pickles[0].split("/")[0]
            byteorder = f"{prefix}/byteorder"
            if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"little", b""):
                raise UserError(f"{path.name} was saved on a big-endian machine; {_how(path)} on a "
                                "little-endian one")
            obj = _Unpickler(archive.read(pickles[0]), archive, prefix, path).load()
    except UserError:
        raise
    except _Refused as exc:
        raise UserError(f"{path.name} holds objects other than tensors and numbers ({exc}); "
                        f"{_how(path)}") from None
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, OSError, RecursionError, MemoryError) as exc:
        raise UserError(f"{path.name} is damaged or not a torch.save file ({str(exc)[:120] or type(exc).__name__}); "
                        f"{_how(path)}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path.name} holds a {type(obj).__name__}, not a dict; {_how(path)}")
    return dict(obj)
