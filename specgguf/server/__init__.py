"""The OpenAI-compatible HTTP server: `app` (routes, errors, streaming) on top of `worker`
(one thread that owns the model, and a bounded queue in front of it). Importing this package
needs the `server` extra (starlette, uvicorn, sse-starlette) once `create_app` is asked for;
`access` (the Host and origin rules) needs none, so the CLI checks its options first."""

__all__ = ["create_app"]


def __getattr__(name):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
