"""`specgguf serve`: the OpenAI-compatible server from the command line.

Kept apart from specgguf/server/ so that `specgguf --help` works without the `server` extra; the
HTTP libraries load only when the command runs, and their absence is one `error:` line.
"""

from __future__ import annotations

import ipaddress
import socket

import click

from ..errors import UserError
from .options import model_options, open_model

EXTRA_HINT = "pip install 'specgguf[server]'"


def _server_modules():
    try:
        import uvicorn

        from ..server import app as server
    except ImportError as exc:
        raise UserError(f"`specgguf serve` needs the server extra ({exc.name} is missing): {EXTRA_HINT}") from None
    return uvicorn, server


def _bind(host: str, port: int) -> socket.socket:
    """Bind here (not in uvicorn) so that a busy port is one clear line, and port 0 works."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --port or --host") from None
    sock.listen(128)
    return sock


@click.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 exposes the server to your network: use --api-key).")
@click.option("--port", type=int, default=8080, show_default=True, help="Port (0: any free one, printed).")
@click.option("--api-key", default=None, envvar="SPECGGUF_API_KEY",
              help="Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY', as Anthropic's clients send "
                   "it) on every request (also $SPECGGUF_API_KEY).")
@click.option("--parallel", "-np", type=int, default=1, show_default=True, metavar="N",
              help="Requests decoded at once, in one batch per round (continuous batching), each with "
                   "--ctx tokens of its own and its own prompt cache; more wait in the queue. Any "
                   "--draft (a draft model is loaded once for all slots). Default 1: on a small CPU a pass of 4 rows costs "
                   "nearly 3 passes of one (docs/loop.md §9), so slots pay only with several busy "
                   "clients; on a GPU, where a few rows cost about one, use 4 or more.")
@click.option("--max-queue", type=int, default=64, show_default=True,
              help="Requests that may wait behind the running ones; more get 503 with Retry-After.")
@click.option("--model-id", default=None, help="Model name the server reports (default: the target's file name).")
@click.option("--strict-model-name", is_flag=True,
              help="Answer 404 to a request naming another model (default: any name gets this model).")
@click.option("--cache-ram", type=int, default=None, metavar="MIB",
              help="Prompt cache beyond the live context: up to MIB of saved cache states, so that "
                   "clients alternating between long prompts (documents, system prompts) are not "
                   "re-read (0: keep only the live contexts, which every request reuses). Default 2048; "
                   "with --parallel > 1 the slots share it (a state saved by one loads into any).")
@click.option("--allowed-hosts", default=None, metavar="NAMES",
              help="Host names requests may use beyond IP addresses and localhost (comma-separated, "
                   "*.example.com for sub-names), e.g. a reverse proxy's name; '*' turns the Host check off.")
@click.option("--cors-origins", default=None, metavar="ORIGINS",
              help="Web apps' origins allowed to call the server (CORS), comma-separated, e.g. "
                   "'https://app.example.com', added to the default: the server's own page and local tools "
                   "(http://localhost:*, 127.0.0.1, [::1]). '*': every origin, without credentials; "
                   "'none': the server's own page only.")
@click.option("--no-webui", "no_webui", is_flag=True,
              help="Do not serve the chat page at / (it shows each token's origin, tokens/s and acceptance live).")
def serve(host, port, api_key, parallel, max_queue, model_id, strict_model_name, cache_ram, allowed_hosts, cors_origins,
          no_webui, **opts):
    """Serve TARGET (default: the embedded SmolLM2-135M-Instruct) over an OpenAI-compatible HTTP
    API (/v1/completions, /v1/chat/completions)."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535 (got {port})")
    if max_queue < 1:
        raise UserError(f"--max-queue must be at least 1 (got {max_queue})")
    from ..api import MAX_PARALLEL

    if not 1 <= parallel <= MAX_PARALLEL:
        raise UserError(f"--parallel must be in 1..{MAX_PARALLEL} (got {parallel})")
    cache_ram = 2048 if cache_ram is None else cache_ram
    if not 0 <= cache_ram <= 1 << 30:
        raise UserError(f"--cache-ram must be a number of MiB >= 0 (got {cache_ram})")
    access = _access_rules(allowed_hosts, cors_origins)
    uvicorn, server = _server_modules()
    sock = _bind(host, port)
    try:
        with open_model(**opts, chat=True, n_parallel=parallel) as llm:
            llm.set_cache_bytes(cache_ram << 20)
            app = server.create_app(llm, model_id=model_id, api_key=api_key, max_waiting=max_queue, workers=parallel,
                                    strict_model_name=strict_model_name,
                                    access=access, webui=not no_webui)
            bound_host, bound_port = sock.getsockname()[:2]
            draft = llm.drafter.describe() if llm.drafter is not None else "none (plain decoding)"
            slots = f", {parallel} parallel slots" if parallel > 1 else ""
            page = "" if no_webui else f" ; chat page http://{_url_host(bound_host)}:{bound_port}/"
            click.echo(f"specgguf: serving {model_id or llm.model_name} (draft: {draft}{slots}) on "
                       f"http://{_url_host(bound_host)}:{bound_port}/v1{page} ; Ctrl-C stops", err=True)
            if not api_key and not _loopback(bound_host):
                click.echo(f"specgguf: warning: listening on {bound_host} without --api-key: anyone who can reach "
                           f"this machine on port {bound_port} can use the model; set --api-key KEY", err=True)
            config = uvicorn.Config(app, log_level="info" if opts.get("verbose") else "warning",
                                    timeout_graceful_shutdown=5, access_log=bool(opts.get("verbose")))
            try:
                uvicorn.Server(config).run(sockets=[sock])
            finally:
                app.state.scheduler.close()  # the worker must stop before the model is freed
    finally:
        sock.close()


def _access_rules(allowed_hosts, cors_origins):
    from ..server.access import AccessRules, parse_allowed_hosts, parse_cors_origins

    mode, origins = parse_cors_origins(cors_origins)
    return AccessRules(allowed_hosts=parse_allowed_hosts(allowed_hosts), cors=mode, origins=origins)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _url_host(host: str) -> str:
    """A bound address as a URL's host: IPv6 in brackets."""
    return f"[{host}]" if ":" in host else host
