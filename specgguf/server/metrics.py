"""Totals since the server started, for `GET /metrics` in Prometheus' text format.

Every finished generation adds its `specgguf` stats (the field each response carries); the
queue's own counts (served, cancelled, failed, rejected) come from the scheduler. Ratios are
computed from the totals at read time: acceptance = accepted / drafted, tau = (accepted +
rounds) / rounds, tokens/s = completion tokens / decode seconds.
"""

from __future__ import annotations

import threading

# name, type, help; the value is read from the totals below
_COUNTERS = (
    ("prompt_tokens_total", "prompt_tokens", "Prompt tokens read (each choice of n > 1 reads its prompt)."),
    ("completion_tokens_total", "generated_tokens", "Tokens generated (verified by the target)."),
    ("rounds_total", "rounds", "Target verification passes."),
    ("drafted_tokens_total", "drafted", "Tokens proposed by the draft."),
    ("accepted_tokens_total", "accepted", "Drafted tokens the target accepted."),
    ("prompt_seconds_total", "prefill_s", "Seconds spent reading prompts."),
    ("decode_seconds_total", "decode_s", "Seconds spent in the generation loop (after the prompt)."),
)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.totals = {key: 0 for _, key, _ in _COUNTERS}
        self.generations = 0
        self.draft_warning: str | None = None  # decoding/health.py's, once a generation reported one

    def observe(self, stats: dict | None) -> None:
        """Add one response's `specgguf` stats (None: nothing to add)."""
        if not stats:
            return
        with self._lock:
            self.generations += 1
            self.draft_warning = stats.get("draft_warning") or self.draft_warning
            for _, key, _ in _COUNTERS:
                self.totals[key] += stats.get(key, 0) or 0

    def render(self, queue: dict) -> str:
        with self._lock:
            t, generations = dict(self.totals), self.generations
        lines = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP specgguf_{name} {help_}")
            lines.append(f"# TYPE specgguf_{name} {kind}")
            for labels, value in samples:
                lines.append(f"specgguf_{name}{labels} {_num(value)}")

        metric("requests_total", "counter", "Requests that reached the model, by outcome.",
               [(f'{{outcome="{o}"}}', queue.get(o, 0)) for o in ("served", "cancelled", "failed", "rejected")])
        metric("generations_total", "counter", "Responses whose statistics are in these totals.",
               [("", generations)])
        for name, key, help_ in _COUNTERS:
            metric(name, "counter", help_, [("", t[key])])
        rounds, drafted, accepted = t["rounds"], t["drafted"], t["accepted"]
        metric("acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
               [("", accepted / drafted if drafted else 0.0)])
        metric("tau", "gauge", "Mean tokens committed per target pass since start (accepted + rounds) / rounds.",
               [("", (accepted + rounds) / rounds if rounds else 0.0)])
        metric("tokens_per_second", "gauge", "Completion tokens per second of generation loop since start.",
               [("", t["generated_tokens"] / t["decode_s"] if t["decode_s"] else 0.0)])
        metric("requests_waiting", "gauge", "Requests waiting in the queue.", [("", queue.get("waiting", 0))])
        metric("requests_running", "gauge", "Requests being generated (at most the slots).",
               [("", queue.get("running_jobs", int(bool(queue.get("running")))))])
        warning = self.draft_warning
        metric("draft_warning", "gauge", "1 when the draft accepts next to nothing (its text in the label).",
               [("" if warning is None else '{message="%s"}' % warning.replace("\\", "\\\\").replace('"', '\\"'),
                 int(warning is not None))])
        if "slots" in queue:
            metric("slots", "gauge", "Sequences the model decodes at once (serve --parallel).", [("", queue["slots"])])
            metric("slots_busy", "gauge", "Slots holding a generation now.", [("", queue["slots_busy"])])
            metric("batch_width", "gauge", "Rows in the last target pass (every busy slot's pending token and draft).",
                   [("", queue["batch_width"])])
        return "\n".join(lines) + "\n"


def _num(value) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)
