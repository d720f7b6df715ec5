"""The HTTP side of Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): its
server-sent events, and its error shape for every failure on those routes (docs/server.md,
"The Anthropic Messages API"). The translation itself is request/messages.py and messagereply.py.
"""

from __future__ import annotations

import json

from sse_starlette.event import ServerSentEvent

from ..request.messagereply import PING, error_body

PATH = "/v1/messages"
PING_INTERVAL = 10  # seconds between `ping` events, so that proxies and clients keep a stream open
# while a long prompt is read (or the request waits its turn) and no token has come yet


def ping_event() -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(PING), event="ping", sep="\n")  # as the other events


def _sse(event: dict) -> dict:
    return {"event": event["type"], "data": json.dumps(event, ensure_ascii=False)}


async def events(job, start: dict, metrics):
    """message_start and a first ping at once, then the worker's events; a failure mid-stream
    (the status is sent already) is an `error` event, as Anthropic sends one; leaving early (a
    disconnect) cancels the job."""
    try:
        yield _sse(start)
        yield _sse(PING)
        async for event in job:
            if event["type"] == "message_delta":
                metrics.observe(event.get("specgguf"))
            yield _sse(event)
    except Exception as exc:
        yield _sse(error_body(500, f"generation failed: {exc}"))
    finally:
        job.cancel()


def _ours(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


class AnthropicErrors:
    """ASGI middleware, outermost: an error answer on the Messages routes (the app's OpenAI-shaped
    ones: 400s, 401 of --api-key, 403 of the access check, 404, 413, 503 of a full queue, 500)
    leaves in Anthropic's shape, {"type": "error", "error": {"type", "message"}}, with its status
    and headers (Retry-After). Streams and successes pass through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _ours(scope["path"]):
            return await self.app(scope, receive, send)
        held: dict = {}

        async def reshape(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"], held["body"] = message, b""
                return
            if "start" not in held or message["type"] != "http.response.body":
                return await send(message)
            held["body"] += message.get("body", b"")
            if message.get("more_body"):
                return
            start = held.pop("start")
            body = json.dumps(_anthropic(start["status"], held["body"])).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length",
                                                                                       b"content-type")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return await self.app(scope, receive, reshape)


def _anthropic(status: int, raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("type") == "error":
        return body
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return error_body(status, message if isinstance(message, str) else raw.decode("utf-8", "replace")[:400]
                      or f"HTTP {status}")
