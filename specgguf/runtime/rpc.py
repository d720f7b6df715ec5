"""llama.cpp RPC servers (`ggml-rpc-server`) as places for target layers: `--rpc HOST:PORT,...`.

specgguf adds no distribution layer of its own: llama.cpp's RPC backend (a GGML_RPC build)
sends the offloaded layers' weights and graphs to the servers. Two things it does badly are
handled here, before llama.cpp is asked: it aborts the whole process when a server cannot be
reached or speaks another protocol version, and it connects without a timeout. So every
endpoint is parsed and greeted first, from Python, with a timeout: a wrong, dead, busy or
foreign server becomes one line naming it. (`ggml-rpc-server` serves one client at a time;
the greeting is the protocol's first message, HELLO, after which the server takes the next
client, here llama.cpp itself.)
"""

from __future__ import annotations

import socket
import struct

from ..errors import UserError

# The RPC protocol of the pinned llama.cpp (ggml-rpc.h): HELLO is command 14 and carries 24
# bytes of transport capabilities; the reply is major, minor, patch, padding and 24 bytes.
PROTO_MAJOR, PROTO_MINOR = 7, 0
_HELLO, _CAPS = 14, 24
TIMEOUT_S = 10.0


def parse_endpoints(value, param: str = "rpc_servers") -> list[str]:
    """'HOST:PORT,HOST:PORT' (or a list of them) -> ['HOST:PORT', ...], checked."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise UserError(f"{param} must be 'HOST:PORT' or a comma-separated list of them (got {value!r})", param=param)
    if not items or any(not v for v in items):
        raise UserError(f"{param} holds an empty entry ({value!r}): give HOST:PORT[,HOST:PORT...]", param=param)
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(f"{param} entry {item!r} is not HOST:PORT (a host name or IPv4 address, a port "
                            "1-65535), e.g. 192.168.1.20:50052", param=param)
        if ":" in host:
            raise UserError(f"{param} entry {item!r}: llama.cpp's RPC client takes IPv4 addresses and host "
                            "names only, not IPv6", param=param)
    if len(set(items)) != len(items):
        raise UserError(f"{param} names a server twice ({value!r})", param=param)
    return items


def greet(endpoint: str, timeout: float = TIMEOUT_S, param: str = "rpc_servers") -> tuple[int, int, int]:
    """Connect to `endpoint`, exchange HELLO, disconnect; the server's protocol version.
    A server that cannot be reached, does not answer or answers another version: UserError."""
    host, _, port = endpoint.rpartition(":")
    start = ("start one there with `ggml-rpc-server -H 0.0.0.0 -p PORT` (see the README's Scale-out), "
             "or leave it out of " + param)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _recv(sock, 8))[0]
            if size != 4 + _CAPS:
                raise UserError(f"{endpoint} is not a llama.cpp RPC server (its reply to HELLO has {size} bytes); "
                                + start, param=param)
            major, minor, patch = _recv(sock, size)[:3]
    except socket.gaierror as exc:
        raise UserError(f"RPC server {endpoint}: unknown host {host!r} ({exc.strerror})", param=param) from None
    except socket.timeout:
        raise UserError(f"RPC server {endpoint} did not answer within {timeout:.0f} s (busy with another client? "
                        "ggml-rpc-server serves one at a time); " + start, param=param) from None
    except (ConnectionError, OSError) as exc:
        raise UserError(f"cannot reach RPC server {endpoint} ({exc.strerror or exc}); " + start,
                        param=param) from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise UserError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this llama.cpp speaks "
                        f"{PROTO_MAJOR}.{PROTO_MINOR}: run the ggml-rpc-server of llama-cpp-python 0.3.36's "
                        "llama.cpp there (scripts/build_llama_cpp_tools.sh builds it)", param=param)
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data
