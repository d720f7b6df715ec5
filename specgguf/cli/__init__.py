"""The `specgguf` command line: a thin layer over the public API (`specgguf.api.SpecGGUF`)."""

from .main import main
from .options import DEMO_PROMPT

__all__ = ["main", "DEMO_PROMPT"]
