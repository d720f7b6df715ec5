"""The OpenAI-compatible HTTP server: `app` (routes, errors, streaming) on top of `worker`
(one thread that owns the model, and a bounded queue in front of it). Importing this package
needs the `server` extra (starlette, uvicorn, sse-starlette)."""

from .app import create_app

__all__ = ["create_app"]
