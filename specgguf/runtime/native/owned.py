"""`_Owned`: the base of every llama.cpp handle, which frees its C pointer exactly once and
closes its children first."""

from __future__ import annotations

import weakref

from ...errors import LlamaError


class _Owned:
    """Base for objects that own one C pointer and free it exactly once.

    Ownership: a child (a context on a model, a batch on a context, a draft context linked
    to a target context through ctx_other) holds a reference to its parent, so the parent
    outlives it, and registers with it, so that closing the parent closes the child first.
    Every access goes through `ptr`, which raises a clear error once the handle is closed
    instead of handing llama.cpp a freed pointer; close() is idempotent."""

    _ptr = None

    def _free(self, ptr):  # pragma: no cover - overridden
        raise NotImplementedError

    def _adopt_by(self, parent: "_Owned") -> None:
        kids = parent.__dict__.setdefault("_children", weakref.WeakSet())
        kids.add(self)

    @property
    def ptr(self):
        if self._ptr is None:
            raise LlamaError(f"this {type(self).__name__.lower()} is closed (it was freed by close())")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        for child in list(self.__dict__.get("_children", ())):
            child.close()
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
