"""Files the worker writes beside its tables (the crash journal, the dead-letter log), off the event loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def _nothing() -> None:
    return None


class FileWriter:
    """One thread of its own that runs file writes in the order they were queued: the event
    loop never waits for the disk, and a later write never lands before an earlier one."""

    def __init__(self, name: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._closed = False

    def submit(self, write: Callable[..., None], *args: Any) -> Future[None]:
        """Queue `write(*args)`; the future resolves once it ran."""
        return self._thread.submit(write, *args)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write queued so far ran (or failed), at most `timeout_s` (None: as long as it takes)."""
        if not self._closed:
            with contextlib.suppress(TimeoutError):
                self._thread.submit(_nothing).result(timeout_s)  # behind every write queued

    def close(self) -> None:
        """Run what is queued, then end the thread."""
        self._closed = True
        self._thread.shutdown(wait=True)
