"""The chat page `specgguf serve` answers at `/` (`--no-webui` turns it off).

Static files shipped in the package (server/webui/: HTML, one script, one stylesheet); no
build step, nothing fetched from any other host, so it works offline. The page is sent with a
Content-Security-Policy that lets it load and call nothing but this server, and run no inline
script: even a model answer that smuggled markup into the page could not run or phone out
(the script only ever inserts the model's text as text).
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response
from starlette.routing import Route

FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "style.css": "text/css; charset=utf-8"}
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def _file(name: str) -> bytes:
    return (resources.files("specgguf.server") / "webui" / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_file(name), media_type=FILES[name], headers=HEADERS)


async def _index(request):
    return _serve("index.html")


async def _asset(request):
    name = request.path_params["name"]
    if name not in FILES:
        from starlette.exceptions import HTTPException

        raise HTTPException(404)
    return _serve(name)


def routes() -> list[Route]:
    return [Route("/", _index, methods=["GET"]), Route("/webui/{name}", _asset, methods=["GET"])]
