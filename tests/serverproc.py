"""Start `specgguf serve` as a user would (a subprocess, port 0 on loopback) and stop it again.

Shared by the server tests, the README test and scripts/load_test_server.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

_READY = re.compile(r"on (http://[^ ]+/v1)")


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, base_url: str, log: list[str]):
        self.proc, self.base_url, self.log = proc, base_url, log
        self.root = base_url[: -len("/v1")]
        self.port = int(base_url.rsplit(":", 1)[1].split("/")[0])

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextmanager
def start_server(*args, timeout: float = 180.0, env: dict | None = None):
    """Yield a ServerProcess for `specgguf serve *args --port 0`; SIGINT (Ctrl-C) at the end."""
    args = [*map(str, args)]
    host = [] if "--host" in args else ["--host", "127.0.0.1"]  # a test of other addresses names its own
    cmd = [sys.executable, "-m", "specgguf", "serve", *args, *host, "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    log: list[str] = []
    ready = threading.Event()

    def drain():  # keep reading so that the pipe never fills and blocks the server
        for line in proc.stderr:
            log.append(line)
            if _READY.search(line):
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + timeout
        while not ready.wait(0.2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready in {timeout} s: {''.join(log)}")
        match = next((m for m in map(_READY.search, log) if m), None)
        if match is None:
            raise RuntimeError(f"server did not start (exit {proc.poll()}): {''.join(log)}")
        yield ServerProcess(proc, match.group(1), log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
