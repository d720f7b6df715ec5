"""Who may use the local server from a browser: the Host check and CORS (docs/server.md, "Who gets in").

A server on 127.0.0.1 is still reachable by every web page the user opens, two ways:
- **DNS rebinding**: a site points its own name at 127.0.0.1, and the browser then treats the
  server as that site's own origin, CORS or not. Only the Host header tells the two apart, so a
  request must name the server by a name public DNS cannot point here (an IP literal, `localhost`,
  `*.localhost`) or by one the user declared (`--allowed-hosts`, for a reverse proxy).
- **cross-site requests**: a page on another origin may send requests and, if CORS allows it,
  read the answers. By default only the user's own tools' origins (`http://localhost:*`,
  `http://127.0.0.1:*`, `http://[::1]:*`) and the server's own origin (its chat page) get in;
  a website's origin must be named with `--cors-origins`. `'*'` lets every origin in, with a
  literal `*` and never credentials.

This module has no HTTP-library imports, so the CLI can check options before the server extra
loads; `AccessMiddleware` is plain ASGI and sits outermost, before the API-key check, because
a browser sends its preflight without a key.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

from ..errors import RequestError, UserError

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # an HTTP header name
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([^/?#\s@]+)")
LOOPBACK_ORIGIN_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ALLOW_METHODS = "GET, POST, OPTIONS"
DEFAULT_ALLOW_HEADERS = "authorization, content-type"


@dataclass(frozen=True)
class AccessRules:
    """allowed_hosts: names admitted beyond IP literals and localhost (`*.example.com` for its
    sub-names), or ("*",) for no Host check. cors: "local" (the user's own tools plus `origins`),
    "*" (every origin, no credentials) or "none" (same origin only). origins: named origins,
    admitted with credentials."""
    allowed_hosts: tuple[str, ...] = ()
    cors: str = "local"
    origins: tuple[str, ...] = ()

    def host_allowed(self, host: str | None) -> bool:
        if host is None:
            return False
        if self.allowed_hosts == ("*",):
            return True
        if host.startswith("["):
            return True  # an IPv6 literal: split_host checked it
        name = host[:-1] if host.endswith(".") else host
        try:
            ipaddress.IPv4Address(name)
            return True
        except ValueError:
            pass
        if name == "localhost" or name.endswith(".localhost"):
            return True
        for allowed in self.allowed_hosts:
            if name == allowed or (allowed.startswith("*.") and name.endswith(allowed[1:])):
                return True
        return False

    def origin_grant(self, origin: str, host_header: str) -> tuple[str, bool] | None:
        """(the Access-Control-Allow-Origin value, whether credentials are allowed), or None when
        this origin may not use the server. The server's own origin gets ("", False): a
        same-origin request needs no CORS header."""
        if self.cors == "*":
            return "*", False
        normalized = normalize_origin(origin)
        if normalized is None:
            return None  # "null" (sandboxed frames, file:// pages) or garbage
        if normalized in self.origins:
            return origin, True
        scheme, netloc = normalized.split("://", 1)
        if scheme in ("http", "https") and netloc == host_header.lower():
            return "", False
        if self.cors == "local" and scheme in ("http", "https") and split_host(netloc) in LOOPBACK_ORIGIN_HOSTS:
            return origin, False
        return None


def split_host(value: str) -> str | None:
    """The lower-cased host name of a Host header (port dropped), or None when it is empty or
    malformed: `:PORT`, an unclosed `[`, a bare IPv6 address, a bad port, odd characters."""
    value = value.strip().lower()
    if not value or not value.isascii():
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1:]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
        if not _NAME.fullmatch(name[:-1] if name.endswith(".") else name):
            return None
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6 and int(rest[1:]) <= 65535):
        return None
    return name


def normalize_origin(origin: str) -> str | None:
    """`scheme://host[:port]` lower-cased, or None if the value is not such an origin."""
    origin = origin.strip().lower().rstrip("/")
    match = _ORIGIN.fullmatch(origin)
    return origin if match else None


def parse_allowed_hosts(value: str | None) -> tuple[str, ...]:
    """--allowed-hosts: names like proxy.example.com, `*.example.com`, or '*' (no Host check)."""
    if value is None:
        return ()
    names = tuple(n.strip().lower().rstrip(".") for n in value.split(",") if n.strip())
    if not names:
        raise UserError("--allowed-hosts is empty: give host names like proxy.example.com (or '*' to turn the "
                        "Host check off)")
    if "*" in names:
        if len(names) > 1:
            raise UserError("--allowed-hosts: '*' turns the Host check off, so give it alone")
        return names
    for name in names:
        bare = name[2:] if name.startswith("*.") else name
        if not _NAME.fullmatch(bare) or ":" in name:
            raise UserError(f"--allowed-hosts: {name!r} is not a host name: write names like proxy.example.com "
                            "or *.example.com, without scheme or port")
    return names


def parse_cors_origins(value: str | None) -> tuple[str, tuple[str, ...]]:
    """--cors-origins: (mode, named origins). None: the default (the user's own tools, local
    origins); '*' every origin; 'none' same origin only; else origins added to the default."""
    if value is None:
        return "local", ()
    if value.strip().lower() == "none":
        return "none", ()
    items = [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
    if not items:
        raise UserError("--cors-origins is empty: give origins like https://app.example.com, '*' or 'none'")
    if "*" in items:
        if len(items) > 1:
            raise UserError("--cors-origins: '*' lets every origin in, so give it alone")
        return "*", ()
    origins = []
    for item in items:
        normalized = normalize_origin(item)
        if normalized is None:
            raise UserError(f"--cors-origins: {item!r} is not an origin: write scheme://host[:port], "
                            "like https://app.example.com (or '*' for all, 'none' for none)")
        origins.append(normalized)
    return "local", tuple(origins)


def _refusal(status: int, message: str, code: str) -> tuple[dict, bytes]:
    body = json.dumps(RequestError(message, code=code, status=status).to_dict()).encode()  # OpenAI's error shape
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    return start, body


class AccessMiddleware:
    """ASGI middleware: 403 for a Host or Origin the rules refuse, preflights answered here, and
    the CORS headers added to every answer for an admitted cross-origin caller (401s and 503s
    included, so a page can read why)."""

    def __init__(self, app, rules: AccessRules):
        self.app, self.rules = app, rules

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {}
        for key, val in scope["headers"]:
            headers.setdefault(key.decode("latin-1").lower(), val.decode("latin-1"))
        host_header = headers.get("host", "")
        refusal = None
        if not self.rules.host_allowed(split_host(host_header)):
            shown = host_header if host_header.strip() else "(empty)"
            refusal = _refusal(403, f"Host {shown[:200]!r} is not allowed: a name other than localhost or an IP "
                                    "address must be declared with `specgguf serve --allowed-hosts NAME` "
                                    "(this check stops DNS-rebinding attacks from web pages)",
                               "host_not_allowed")
        origin = headers.get("origin")
        grant = None
        if refusal is None and origin is not None:
            grant = self.rules.origin_grant(origin, host_header.strip())
            if grant is None:
                refusal = _refusal(403, f"Origin {origin[:200]!r} may not use this server: start it with "
                                        "`specgguf serve --cors-origins ORIGIN` to let that web app in",
                                   "origin_not_allowed")
        if refusal is not None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            start, body = refusal
            await send(start)
            return await send({"type": "http.response.body", "body": body})
        if grant is None or not grant[0]:  # no Origin, or the server's own
            return await self.app(scope, receive, send)
        cors = [(b"access-control-allow-origin", grant[0].encode("latin-1")), (b"vary", b"Origin")]
        if grant[1]:
            cors.append((b"access-control-allow-credentials", b"true"))
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(headers, cors, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors,
                                                  (b"access-control-expose-headers", b"Retry-After")]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)

    @staticmethod
    async def _preflight(headers: dict, cors: list, send) -> None:
        asked = headers.get("access-control-request-headers", "")
        names = [h.strip().lower() for h in asked.split(",") if h.strip()]
        allow = ", ".join(names) if names and all(_TOKEN.fullmatch(n) for n in names) else DEFAULT_ALLOW_HEADERS
        out = [*cors, (b"access-control-allow-methods", ALLOW_METHODS.encode()),
               (b"access-control-allow-headers", allow.encode("latin-1")), (b"access-control-max-age", b"600"),
               (b"vary", b"Access-Control-Request-Method, Access-Control-Request-Headers"),
               (b"content-length", b"0")]
        if headers.get("access-control-request-private-network", "").strip().lower() == "true":
            out.append((b"access-control-allow-private-network", b"true"))  # Chrome's Private Network Access
        await send({"type": "http.response.start", "status": 200, "headers": out})
        await send({"type": "http.response.body", "body": b""})
