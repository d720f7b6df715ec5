"""Worker threads that run the model's generations, and a bounded queue of jobs in front of them.

A blocking decode must not run on the HTTP event loop, so every request becomes a `Job` handed
to a worker thread: one for a `SpecGGUF` with one sequence (its generations run one at a time),
N for one made with n_parallel=N (`serve --parallel N`: each worker's generation holds a slot,
and their rounds share target passes, decoding/sharedctx.py, decoding/slots.py). A worker pushes the job's results back to the event loop as they
come, and asks the job's `cancelled` flag after every chunk, which lets a client that went
away stop its generation at the next round (the engine's generator is closed on the thread
that runs it, never from another one). No HTTP here: the server is a thin layer on top.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, Iterable

Work = Callable[[Callable[[], bool]], Iterable]  # work(cancelled) -> items to send back
HELPER_THREADS = 2  # requests checked, tokenized and compiled at once beside the worker


class QueueFull(Exception):
    """Too many requests wait already; `retry_after` estimates seconds until there is room."""

    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"the server is busy: {waiting} requests are waiting; retry in {retry_after} s")
        self.waiting, self.retry_after = waiting, retry_after


class Job:
    """One queued piece of work; iterate it (async) on the event loop for its items."""

    _END = object()

    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop):
        self.work, self._loop = work, loop
        self.cancelled = threading.Event()
        self._items: asyncio.Queue = asyncio.Queue()

    def cancel(self) -> None:
        self.cancelled.set()

    def _send(self, item) -> None:  # worker thread -> event loop
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed (server shutting down): nobody is listening
            self.cancel()

    async def __aiter__(self) -> AsyncIterator:
        while True:
            item = await self._items.get()
            if item is Job._END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Scheduler:
    """Runs jobs on `workers` threads, first come first served; at most `max_waiting` wait
    behind the running ones."""

    def __init__(self, max_waiting: int = 64, workers: int = 1):
        if max_waiting < 1:
            raise ValueError("max_waiting must be at least 1")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.max_waiting, self.workers = max_waiting, workers
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._durations: deque = deque(maxlen=32)  # recent job times, for Retry-After
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0}
        self._current: set[Job] = set()  # the jobs running now
        self._threads = [threading.Thread(target=self._loop, name=f"specgguf-worker-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()
        # the work before a job (checks, templates, tokenizing, grammars): off the event loop, and
        # done before the model may be freed (close() waits for it)
        self.helpers = ThreadPoolExecutor(HELPER_THREADS, thread_name_prefix="specgguf-prepare")

    def submit(self, work: Work, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Queue `work`; raises QueueFull when max_waiting jobs wait already."""
        with self._lock:
            if self._waiting >= self.max_waiting:
                self.counts["rejected"] += 1
                raise QueueFull(self._waiting, self._retry_after())
            self._waiting += 1
        job = Job(work, loop or asyncio.get_running_loop())
        self._queue.put(job)
        return job

    def _retry_after(self) -> int:
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, min(300, math.ceil(mean * (self._waiting + 1))))

    @property
    def running(self) -> bool:
        return bool(self._current)

    def status(self) -> dict:
        with self._lock:
            return {"waiting": self._waiting, "max_waiting": self.max_waiting, "running": bool(self._current),
                    "running_jobs": len(self._current), "workers": self.workers, **self.counts}

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._current.add(job)
            t0 = time.monotonic()
            try:
                if not job.cancelled.is_set():  # its client left while it waited: skip it
                    for item in job.work(job.cancelled.is_set):
                        job._send(item)
                outcome = "cancelled" if job.cancelled.is_set() else "served"
            except BaseException as exc:  # reported to the request; the worker lives on
                job._send(_Failure(exc))
                outcome = "failed"
            with self._lock:  # counted before the end is sent: a client that reads /metrics on its answer sees it
                self._current.discard(job)
                self.counts[outcome] += 1
                if outcome == "served":
                    self._durations.append(time.monotonic() - t0)
            job._send(Job._END)

    def close(self) -> None:
        """Cancel what waits, let the running job stop at its next round (or prefill chunk), and
        wait for the thread (and the helpers) to end: the model must not be freed under them."""
        with self._lock:
            for job in self._current:
                job.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job._send(Job._END)
                with self._lock:
                    self._waiting -= 1
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self.helpers.shutdown(wait=True, cancel_futures=True)
