"""Is this draft working at all? (issue 43: "is this drafter even working?")

A draft file that was exported wrongly (untrained norms, a head switched off) or made for
another target or tokenizer still runs losslessly: it only drafts tokens the target rejects,
and nothing says so. `DraftHealth` watches a draft model's first draft position over its last
WINDOW drafting rounds; when the target accepted under FLOOR of them, which a draft that works
(a first-position acceptance of 20% or more) does by chance less than once in a thousand
windows (binomial: 3 or fewer of 64 at p = 0.2), it says so once per draft file and process,
on stderr and in the generation's stats (`draft_warning`, and /metrics). Lookups (ngram,
suffix) and predictions are not watched: a lookup that finds nothing useful is no fault.
"""

from __future__ import annotations

import sys
import threading
from collections import deque

WINDOW = 64  # drafting rounds looked at
FLOOR = 0.05  # first-position acceptance below this over WINDOW rounds: say so

_warned: dict[str, str] = {}  # draft file -> the warning given (once per process)
_lock = threading.Lock()


class DraftHealth:
    """The recent first-position outcomes of one drafter that runs a draft file."""

    def __init__(self, drafter, notify=None):
        self.path = drafter.model_path
        self.notify = notify or _stderr
        self.recent: deque = deque(maxlen=WINDOW)

    @classmethod
    def watch(cls, drafter) -> "DraftHealth | None":
        """A monitor for `drafter`, or None when it has no draft file to doubt (a lookup)."""
        if drafter is None or drafter.lookup or drafter.model_path is None:
            return None
        return cls(drafter)

    @property
    def warning(self) -> str | None:
        return _warned.get(self.path)

    def observe(self, n_drafted: int, n_accepted: int) -> str | None:
        """One round; the warning when this round makes the case (and only then)."""
        if n_drafted <= 0:
            return None
        self.recent.append(n_accepted > 0)
        if len(self.recent) < WINDOW or self.path in _warned:
            return None
        rate = sum(self.recent) / len(self.recent)
        if rate >= FLOOR:
            return None
        with _lock:
            if self.path in _warned:
                return None
            name = self.path.rsplit("/", 1)[-1]
            message = (f"this draft ({name}) had its first token accepted in {rate:.0%} of its last {WINDOW} "
                       "rounds: is it made for this target and tokenizer? (`specgguf inspect DRAFT --target "
                       "TARGET` checks the file)")
            _warned[self.path] = message
        self.notify(f"specgguf: warning: {message}")
        return message


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
