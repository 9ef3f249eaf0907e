"""The dead-letter log: one JSON line per dead letter, for `tail -f` and log shippers."""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor

from dlqapp.observability.logs import log_event

log = logging.getLogger("dlqapp.deadletters.log_file")


def rotate(path: str, backups: int) -> None:
    """`path` becomes `path.1`, `path.1` becomes `path.2`, …; the oldest beyond `backups` goes."""
    for n in range(backups - 1, 0, -1):
        if os.path.exists(f"{path}.{n}"):
            os.replace(f"{path}.{n}", f"{path}.{n + 1}")
    os.replace(path, f"{path}.1")


class DeadLetterLog:
    """Appends lines to `path` in order, on a thread of its own, and rotates the file once it
    reaches `max_bytes` (`backups` older files kept).

    The event loop never waits for the disk: a burst of dead letters wrote one file append
    each on it. A line that cannot be written is logged, never raised (the dead letter is
    on its topic and in the table either way); lines queued at exit are still written."""

    def __init__(self, path: str, max_bytes: int = 64 * 1024 * 1024, backups: int = 5) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlqapp-dead-letter-log")
        self._last: Future[None] | None = None

    def append(self, line: str) -> None:
        """Queue one line (without its newline)."""
        self._last = self._writer.submit(self._append, line)

    def flush(self) -> None:
        """Wait until every line queued so far is written (or failed)."""
        if self._last is not None:
            self._last.result()

    def _append(self, line: str) -> None:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                size = f.tell()
            if size >= self.max_bytes:
                rotate(self.path, self.backups)
        except OSError as exc:
            log_event(log, logging.WARNING, "dead_letter_log_not_written", path=self.path, error=repr(exc))
