"""The dead-letter log: one JSON line per dead letter, for `tail -f` and log shippers."""

from __future__ import annotations

import logging
import os

from dlqapp.observability.file_writer import FileWriter
from dlqapp.observability.logs import log_event

log = logging.getLogger("dlqapp.deadletters.log_file")


FLUSH_WAIT_S = 2.0
"""How long `flush` (a stop) waits for the lines queued: a stalled disk does not hold a stop."""


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
    on its topic and in the table either way). A stop waits for the lines queued
    (`flush`); a restart in place or a forced exit may leave the last ones unwritten."""

    def __init__(self, path: str, max_bytes: int = 64 * 1024 * 1024, backups: int = 5) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._writer = FileWriter("dlqapp-dead-letter-log")

    def append(self, line: str) -> None:
        """Queue one line (without its newline)."""
        self._writer.submit(self._append, line)

    def flush(self, timeout_s: float = FLUSH_WAIT_S) -> None:
        """Wait until every line queued so far is written (or failed), at most `timeout_s`."""
        self._writer.flush(timeout_s)

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
