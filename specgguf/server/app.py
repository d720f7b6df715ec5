"""OpenAI-compatible HTTP server over one `SpecGGUF` (needs the `server` extra).

Starlette + uvicorn + sse-starlette, the family llama-cpp-python's server uses. Starlette
rather than FastAPI on purpose: requests are checked by `SpecGGUF.prepare()` (shared with the
Python API), so a pydantic layer would check them twice and answer in a shape (422) that
OpenAI clients do not expect. Every error, including ones the app did not foresee, leaves as
OpenAI's `{"error": {"message", "type", "param", "code"}}` (on Anthropic's /v1/messages routes as
Anthropic's, server/anthropic.py) and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from ..errors import RequestError, UserError
from ..request import messagereply, messages as anthropic_request, responses, responseshape
from . import anthropic, webpage
from .access import AccessMiddleware, AccessRules
from .metrics import Metrics
from .responsestore import MAX_BYTES, MAX_RESPONSES, ResponseStore
from .worker import QueueFull, Scheduler

MAX_BODY = 16 * 1024 * 1024  # a prompt this long in bytes cannot fit any context we load
MAX_NESTING = 128  # JSON levels in a body: a schema may nest 32 subschemas (request/grammarlimits.py)
PREPARE_TIMEOUT = 60.0  # seconds a request's preparation may take before the client gets a 503
KEEPALIVE_S = 10  # a Responses stream's `: keep-alive` comment while a long prompt is read (docs/server.md)


def error_response(status: int, message: str, kind: str = "invalid_request_error", param=None, code=None,
                   headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class _ApiKey:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <key>` or, as
    Anthropic's clients send it, `x-api-key: <key>` (401 if not), compared in constant time;
    `/health` and the chat page's static files stay open (a browser
    cannot send a key with a page load; the page asks for the key on its first 401).
    Pure ASGI (not BaseHTTPMiddleware) so that streaming responses and disconnects pass through."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self._open(scope):
            headers = dict(scope["headers"])
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            bearer = scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key)
            if not bearer and not hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key):
                resp = error_response(401, "invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key: "
                                           "<key>') with the key given to `specgguf serve --api-key`",
                                      code="invalid_api_key")
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)

    def _open(self, scope) -> bool:
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            return False
        return path in ("/health", "/") or (path.startswith("/webui/") and "/" not in path[len("/webui/"):])


async def _json_body(request: Request) -> dict:
    data = bytearray()
    try:
        async for part in request.stream():
            data += part
            if len(data) > MAX_BODY:
                raise RequestError(f"the request body is over {MAX_BODY // (1024 * 1024)} MiB", status=413,
                                   code="request_too_large")
    except ClientDisconnect:  # nobody will read the answer; end the request quietly
        raise RequestError("the client closed the request while sending it", status=499,
                           code="cancelled") from None
    # a large body: parsed and measured on a thread (json's C parser holds the GIL, ~2 ms per MiB,
    # but walking a big body for its depth is a Python loop the event loop must not wait for)
    return _parse(data) if len(data) < 65536 else await asyncio.to_thread(_parse, bytes(data))


def _parse(data: bytes) -> dict:
    try:
        body = json.loads(data)
    except RecursionError:
        raise RequestError(f"the request body nests JSON more than {MAX_NESTING} levels deep, the limit",
                           code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}"[:300], code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    if _nesting(body) > MAX_NESTING:
        raise RequestError(f"the request body nests JSON more than {MAX_NESTING} levels deep, the limit",
                           code="invalid_json")
    return body


def _nesting(value) -> int:
    """How deep lists and objects nest in a parsed JSON value (without recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            return deepest
        todo.extend((x, depth + 1) for x in v)
    return deepest


def create_app(llm, model_id: str | None = None, api_key: str | None = None, max_waiting: int = 64,
               access: AccessRules | None = None, strict_model_name: bool = False, workers: int | None = None,
               webui: bool = True) -> Starlette:
    """The ASGI app serving `llm`; its scheduler is `app.state.scheduler` (close it after use).

    A request may name any model: most OpenAI clients send a fixed name (`gpt-4o-mini`, or
    whatever the app was written for), so the one model answers, under its real name, as
    llama-server and llama-cpp-python's server do. strict_model_name: 404 for any other name.

    access: which Host names and browser origins get in (server/access.py); the default admits
    IP literals and localhost as Host, and the user's own local tools and the page as origins.
    workers: requests generated at once (default: the model's parallel slots, llm.n_parallel).
    webui: serve the chat page at / (server/webpage.py)."""
    model_id = model_id or llm.model_name
    scheduler = Scheduler(max_waiting, workers or llm.n_parallel)

    def queue_status() -> dict:
        return {**scheduler.status(), **(llm.slots_status() or {})}
    # Checking a request (schema to grammar, grammar compilation), rendering its template and
    # tokenizing it read the model's vocabulary only, so they run beside the worker's decode, on
    # the scheduler's helper threads: the event loop keeps answering /health and the other clients.
    # (llama_tokenize keeps no state in the vocabulary; the model is freed after scheduler.close().)
    async def off_loop(fn, *args, **kwargs):
        future = asyncio.get_running_loop().run_in_executor(scheduler.helpers, lambda: fn(*args, **kwargs))
        try:
            return await asyncio.wait_for(future, PREPARE_TIMEOUT)
        except asyncio.TimeoutError:
            raise RequestError(f"preparing the request took over {PREPARE_TIMEOUT:.0f} s; retry later or send a "
                               "smaller one", status=503, kind="server_error", code="timeout") from None
    metrics = Metrics()
    created = int(time.time())
    draft = llm.drafter.describe() if llm.drafter is not None else None

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "specgguf",
                "specgguf": {"draft": draft, "draft_max": llm.engine.draft_max, "n_ctx": llm.n_ctx()}}

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": model_id, "queue": queue_status()})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request):
        if request.path_params["model"] != model_id:
            return _unknown_model(request.path_params["model"])
        return JSONResponse(model_card())

    def _unknown_model(name) -> JSONResponse:
        return error_response(404, f"the model {name!r} does not exist; this server has {model_id!r}",
                              param="model", code="model_not_found")

    def wrong_model(body: dict) -> JSONResponse | None:
        """The 404 for a body naming another model under --strict-model-name, else None (any
        name gets the one model); a name that is not a string is a 400."""
        name = body.get("model")
        if name is not None and not isinstance(name, str):
            raise RequestError(f"'model' must be a string (got {type(name).__name__})", param="model",
                               code="invalid_type")
        return _unknown_model(name) if strict_model_name and name not in (None, model_id) else None

    async def complete(request: Request, chat: bool):
        body = await _json_body(request)
        refused = wrong_model(body)
        if refused is not None:
            return refused
        req = await off_loop(llm.prepare, body, chat=chat)
        req.model = model_id
        if req.stream:
            job = scheduler.submit(lambda cancelled: llm.response_chunks(req, cancelled))
            return EventSourceResponse(_sse(job, metrics), sep="\n", ping=15, send_timeout=60)
        return await whole(request, lambda cancelled: llm.response(req, cancelled))

    async def whole(request: Request, work, then=None):
        """A response that is not streamed: work(cancelled) on a worker, cancelled on disconnect;
        then(response), if given, sees the response dict before it is sent."""
        item = await _whole(request, scheduler.submit(lambda cancelled: [work(cancelled)]))
        if item is None:  # cancelled: the client has gone, nobody reads this
            return error_response(499, "the client closed the request", code="cancelled")
        metrics.observe(item.get("specgguf"))
        if then is not None:
            then(item)
        return JSONResponse(item)

    async def messages(request: Request):
        """Anthropic's POST /v1/messages, translated into a chat completion (request/messages.py);
        errors leave in Anthropic's shape (server/anthropic.py)."""
        body = await _json_body(request)
        if strict_model_name and isinstance(body.get("model"), str) and body["model"] != model_id:
            return _unknown_model(body["model"])
        req, asked = await off_loop(anthropic_request.prepare, llm, body)
        req.model = model_id
        if req.stream:
            start = messagereply.start_event(req, messagereply.message_id(), model_id)
            job = scheduler.submit(lambda cancelled: messagereply.events(llm, req, asked, cancelled))
            return EventSourceResponse(anthropic.events(job, start, metrics), sep="\n", ping=anthropic.PING_INTERVAL,
                                       ping_message_factory=anthropic.ping_event, send_timeout=60)
        return await whole(request, lambda cancelled: messagereply.message(llm, req, asked, cancelled))

    async def count_tokens(request: Request):
        """Anthropic's POST /v1/messages/count_tokens: {"input_tokens"} of the same body."""
        body = await _json_body(request)
        if strict_model_name and isinstance(body.get("model"), str) and body["model"] != model_id:
            return _unknown_model(body["model"])
        return JSONResponse(await off_loop(anthropic_request.count_tokens, llm, body))

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    # Tokenizing reads the vocabulary only: it runs beside the worker, off the loop (see off_loop).
    async def tokenize(request: Request):
        """llama-server's POST /tokenize: content, add_special (false), parse_special (true),
        with_pieces (false) -> {"tokens": [ids, or {"id", "piece"} with with_pieces]}."""
        body = await _json_body(request)
        text = _field(body, "content", str)
        add_special = _field(body, "add_special", bool, False)
        parse_special = _field(body, "parse_special", bool, True)
        with_pieces = _field(body, "with_pieces", bool, False)

        def work():
            tokens = llm.tokenize(text, add_bos=add_special, special=parse_special)
            if with_pieces:
                tokens = [{"id": t, "piece": _piece(llm.detokenize([t]))} for t in tokens]
            return _list_json("tokens", tokens)
        return _json_bytes(await off_loop(work))

    async def detokenize(request: Request):
        """llama-server's POST /detokenize: tokens -> {"content"}."""
        body = await _json_body(request)
        tokens = _field(body, "tokens", list)
        text = await off_loop(lambda: llm.detokenize(tokens).decode("utf-8", "replace"))
        return JSONResponse({"content": text})

    async def extras_tokenize(request: Request):
        """llama-cpp-python's POST /extras/tokenize (and /count): input -> {"tokens"} or {"count"}."""
        body = await _json_body(request)
        refused = wrong_model(body)
        if refused is not None:
            return refused
        text, count = _field(body, "input", str), request.url.path.endswith("/count")

        def work():
            tokens = llm.tokenize(text, special=True)
            return json.dumps({"count": len(tokens)}).encode() if count else _list_json("tokens", tokens)
        return _json_bytes(await off_loop(work))

    async def extras_detokenize(request: Request):
        """llama-cpp-python's POST /extras/detokenize: tokens -> {"text"}."""
        body = await _json_body(request)
        refused = wrong_model(body)
        if refused is not None:
            return refused
        tokens = _field(body, "tokens", list)
        text = await off_loop(lambda: llm.detokenize(tokens).decode("utf-8", "replace"))
        return JSONResponse({"text": text})

    async def profile(request: Request):
        """The cost profile auto draft lengths have measured so far (the chat page's cost curve)."""
        return JSONResponse(await off_loop(llm.cost_profile))

    # -- the Responses API (docs/server.md): request/responses.py translates, responseshape.py shapes
    store = ResponseStore()

    def stored(response_id: str, param: str | None = None):
        found = store.get(response_id)
        if found is None:
            raise RequestError(f"no stored response has the id {response_id[:80]!r}: it was made with store: false, "
                               f"deleted, or evicted (this server keeps the last {MAX_RESPONSES} responses, "
                               f"{MAX_BYTES >> 20} MiB)", status=404, param=param, code="response_not_found")
        return found

    async def create_response(request: Request):
        body = await _json_body(request)
        refused = wrong_model(body)
        if refused is not None:
            return refused
        previous = responses.previous_id(body)
        history = None if previous is None else stored(previous, "previous_response_id")[1]
        turn = await off_loop(responses.prepare, llm, body, history)
        turn.req.model = model_id

        def kept(response: dict) -> None:
            if turn.store:
                store.put(response, turn.items)

        def keep(response: dict) -> None:  # a stream's last response: what whole() does for the rest
            metrics.observe(response.get("specgguf"))
            kept(response)
        if turn.stream:
            stream = responseshape.Events(turn, model_id)
            opening = stream.opening()  # sent at once, before the job waits its turn and reads the prompt
            job = scheduler.submit(lambda cancelled: responseshape.events(
                turn, model_id, llm.response_chunks(turn.req, cancelled), cancelled, stream))
            return EventSourceResponse(_response_sse(opening, job, stream, keep), sep="\n", ping=KEEPALIVE_S,
                                       ping_message_factory=_keepalive, send_timeout=60)
        def work(cancelled):
            chat = llm.response(turn.req, cancelled)
            return None if chat is None else responseshape.response(turn, model_id, chat)
        return await whole(request, work, kept)

    async def stored_response(request: Request):
        response_id = request.path_params["response_id"]
        response = stored(response_id)[0]
        if request.method == "DELETE":
            store.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        return JSONResponse(response)

    async def metrics_text(request: Request):
        return PlainTextResponse(metrics.render(queue_status()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/extras/tokenize", extras_tokenize, methods=["POST"]),
        Route("/extras/tokenize/count", extras_tokenize, methods=["POST"]),
        Route("/extras/detokenize", extras_detokenize, methods=["POST"]),
        Route("/metrics", metrics_text, methods=["GET"]),
        Route("/specgguf/profile", profile, methods=["GET"]),
    ]
    if webui:
        routes += webpage.routes()
    handlers = {RequestError: _request_error, UserError: _user_error, QueueFull: _queue_full, HTTPException: _http_error,
                RecursionError: _too_deep, Exception: _internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    if api_key:
        app.add_middleware(_ApiKey, key=api_key)
    # added after the key check, so outside it: a bad Host or Origin is refused, and a preflight answered, first
    app.add_middleware(AccessMiddleware, rules=access or AccessRules())
    app.add_middleware(anthropic.AnthropicErrors)  # outermost: every error on /v1/messages in Anthropic's shape
    app.state.scheduler, app.state.metrics = scheduler, metrics
    return app


def _field(body: dict, name: str, kind: type, default=None):
    """A field of a small JSON body: required when default is None, of the given JSON type."""
    value = body.get(name, default)
    if value is None:
        raise RequestError(f"'{name}' is required", param=name, code="missing_field")
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RequestError(f"'{name}' must be a {dict(str='string', bool='boolean', list='list').get(kind.__name__)}",
                           param=name, code="invalid_type")
    return value


def _list_json(key: str, items: list) -> bytes:
    """{key: items} as JSON, encoded in slices: one json.dumps of a million tokens holds the GIL
    (and so the event loop) for a quarter of a second; slices let it answer in between."""
    parts = [json.dumps(items[i:i + 20000])[1:-1].encode() for i in range(0, len(items), 20000)]
    return b"".join([b"{", json.dumps(key).encode(), b": [", b", ".join(parts), b"]}"])


def _json_bytes(data: bytes):
    from starlette.responses import Response

    return Response(data, media_type="application/json")


def _piece(raw: bytes):
    """A token's text, or its bytes when they are not valid UTF-8 alone (as llama-server)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def _sse(job, metrics: Metrics):
    """Chunks as server-sent events, then `[DONE]`; leaving early (a disconnect) cancels the job."""
    try:
        async for chunk in job:
            metrics.observe(chunk.get("specgguf"))
            yield {"data": json.dumps(chunk)}
        yield {"data": "[DONE]"}
    except Exception as exc:  # a failure mid-stream: the status is sent already, so say it in-band
        yield {"data": json.dumps({"error": {"message": f"generation failed: {exc}", "type": "server_error",
                                             "param": None, "code": None}})}
    finally:
        job.cancel()


async def _whole(request: Request, job):
    """The one item of a job that is not streamed (None when cancelled); a disconnect cancels it."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        items = [item async for item in job]
    finally:
        watcher.cancel()
    return items[0] if items else None


def _keepalive():
    from sse_starlette.event import ServerSentEvent

    return ServerSentEvent(comment="keep-alive", sep="\n")


async def _response_sse(opening, job, stream, keep):
    """A Responses stream as named server-sent events (`event: <type>`); no [DONE]. A failure
    mid-stream ends it with response.failed; leaving early (a disconnect) cancels the job."""
    try:
        for kind, event in opening:
            yield {"event": kind, "data": json.dumps(event)}
        async for kind, event in job:
            if kind in ("response.completed", "response.incomplete"):
                keep(event["response"])
            yield {"event": kind, "data": json.dumps(event)}
    except Exception as exc:  # the status is sent already: say it in-band
        kind, event = stream.failed(f"generation failed: {exc}")
        yield {"event": kind, "data": json.dumps(event)}
    finally:
        job.cancel()


async def _cancel_on_disconnect(request: Request, job) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _request_error(request, exc: RequestError):
    return error_response(exc.status, str(exc), exc.kind, exc.param, exc.code)


async def _user_error(request, exc: UserError):
    return error_response(400, str(exc), param=exc.param)


async def _too_deep(request, exc: RecursionError):  # a safety net: bodies are checked for depth first
    return error_response(400, "the request nests too deeply to be read; flatten it", code="invalid_value")


async def _queue_full(request, exc: QueueFull):
    return error_response(503, str(exc), "server_error", code="queue_full",
                          headers={"Retry-After": str(exc.retry_after)})


async def _http_error(request, exc: HTTPException):
    messages = {404: f"no such endpoint: {request.method} {request.url.path}",
                405: f"method {request.method} is not allowed on {request.url.path}"}
    return error_response(exc.status_code, messages.get(exc.status_code, str(exc.detail)),
                          code="not_found" if exc.status_code == 404 else None, headers=exc.headers)


async def _internal_error(request, exc: Exception):
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
