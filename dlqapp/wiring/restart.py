"""How a worker stops: restarted in place when its state must be rebuilt, never when asked to stop.

Under exactly_once, a transaction that cannot commit (the broker restarted and aborted it,
or the worker was frozen past its session and fenced as a zombie) leaves the worker's local
tables holding writes that never became visible. Nothing is lost (those steps' events were
not acked, their outputs never visible), but the tables must be rebuilt from the committed
changelogs, which a worker does at start. Kafka Streams closes such tasks "dirty" and
rejoins; dlqapp re-executes its own command line (`os.execve`): the process keeps its pid
and its terminal (Ctrl-C still reaches it), drops every socket and file (Python opens them
close-on-exec), wipes its tables and joins the group again.

- Only a worker that had been ready restarts: one that fails before (a missing ACL, a
  broker it cannot reach) exits with `FAILED_AT_START_EXIT_CODE` and the error.
- Restarts back off: the n-th restart in a row waits `backoff_s(n)` first (0 s, then 1, 2,
  4, ... up to `MAX_BACKOFF_S`); a worker that stayed ready for `STABLE_S` starts counting
  again. The count travels to the new process in `RESTARTS_ENV`.
- A worker asked to stop (SIGTERM, Ctrl-C) never re-executes itself, even when a failure
  is on its way at that moment; and it is gone within DLQ_DRAIN_TIMEOUT plus
  `STOP_MARGIN_S` whatever it is doing (`StopWatch`).
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dlqapp.wiring.process import STDERR_FD, flush_standard_streams

log = logging.getLogger(__name__)

FAILED_AT_START_EXIT_CODE = 75
"""Exit code of a worker whose transactions failed before it was ever ready (EX_TEMPFAIL)."""

GRACE_S = 10.0
"""How long the worker may take to stop its services before it restarts (or exits) anyway."""

RESTARTS_ENV = "DLQAPP_RESTARTS_IN_A_ROW"
"""Set by a restart in place for the new process: how many restarts came just before."""

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
"""A worker ready this long before it fails restarts at once, like a first failure."""

HANG_MARGIN_S = 20.0
"""Beyond the grace and the backoff, how long a restart may take to re-execute before the
process is taken for hung: every thread's stack goes to stderr and the process exits 1."""

STOP_MARGIN_S = 4.0
"""Beyond DLQ_DRAIN_TIMEOUT, how long a requested stop may take before the process ends anyway
(the promise is DLQ_DRAIN_TIMEOUT plus 5 s: a second left for the exit itself)."""


def backoff_s(restarts_before: int) -> float:
    """How long the next restart waits, after `restarts_before` restarts in a row."""
    return 0.0 if restarts_before <= 0 else min(MAX_BACKOFF_S, 2.0 ** (restarts_before - 1))


def after_grace(seconds: float, then: Callable[[], Any]) -> threading.Timer:
    """Call `then` after `seconds` on a thread of its own: Faust's crash path may stop the
    event loop, or block it joining the consumer thread, and `then` must run all the same."""
    timer = threading.Timer(seconds, then)
    timer.daemon = True
    timer.start()
    return timer


def hang_watchdog(seconds: float | None) -> None:
    """In `seconds`, unless this process image is replaced first, write every thread's stack
    to the process's stderr (file descriptor 2) and exit 1 (None: not any more). The
    interpreter's own watchdog thread (`faulthandler`) needs neither the event loop nor the
    GIL, so it fires where a `threading.Timer` could not. Writes to descriptor 2 itself:
    the worker's `sys.stderr` is mode's logging proxy, which has no file descriptor."""
    if seconds is None:
        faulthandler.cancel_dump_traceback_later()
    else:
        faulthandler.dump_traceback_later(seconds, exit=True, file=STDERR_FD)


class Restarts:
    """Whether and when this worker restarts itself (module doc); one per process."""

    def __init__(
        self, environ: Mapping[str, str] = os.environ, *, watchdog: Callable[[float | None], Any] = hang_watchdog
    ) -> None:
        """`watchdog(seconds)` ends the process should a restart not re-execute it in time."""
        self._watchdog = watchdog
        try:
            self.in_a_row = max(0, int(environ.get(RESTARTS_ENV, "0")))
        except ValueError:
            self.in_a_row = 0
        self.stop_requested = False
        self.pending: str | None = None
        self.ready_at: float | None = None
        self._exec_lock = threading.Lock()

    def ready(self) -> None:
        """The worker became ready (the clock of `STABLE_S` starts)."""
        self.ready_at = time.monotonic()

    def request_stop(self) -> None:
        """SIGTERM or Ctrl-C: stop, and never restart from now on (the stop's own bound,
        `StopWatch`, replaces a restart's hang watchdog)."""
        self.stop_requested = True
        if self.pending is not None:
            self._watchdog(None)

    def restart_after_stop(self, app: Any, reason: BaseException, ready: bool) -> None:
        """Stop `app` the way Faust stops it on a crash, then re-execute the worker (or, when it
        was never `ready`, exit; when a stop was requested, just stop). Called again while a
        restart is pending, it does nothing."""
        if self.pending is not None:
            return
        self.pending = f"{type(reason).__name__}: {reason}"
        if self.stop_requested:
            log.info("stopping as asked, not restarting after: %s", self.pending)
            return
        if ready:
            if self.ready_at is not None and time.monotonic() - self.ready_at >= STABLE_S:
                self.in_a_row = 0
            wait = backoff_s(self.in_a_row)
            log.warning(
                "restarting the worker%s to rebuild its tables from the committed changelogs: %s",
                f" in {wait:g} s" if wait else "",
                self.pending,
            )
            atexit.register(self.exec_self)
            then: Callable[[], Any] = self.exec_self
        else:
            log.critical("exactly-once transactions failed before the worker was ready, stopping it: %s", self.pending)
            wait = 0.0
            then = lambda: os._exit(FAILED_AT_START_EXIT_CODE)  # noqa: E731
        after_grace(GRACE_S, then)
        app.fail(reason)
        # should neither the stop nor the grace timer end this image, say where it hangs and
        # exit; a safety net only, so it can never stand in the way of the restart itself
        try:
            self._watchdog(GRACE_S + wait + HANG_MARGIN_S)
        except Exception as exc:  # any failure to arm it is only logged
            log.warning("no hang watchdog for this restart: %r", exc)

    def exec_self(self) -> None:
        """Replace this process with a fresh run of the same command line, after the backoff;
        not at all once a stop was requested (then, or during the backoff)."""
        if not self._exec_lock.acquire(blocking=False):
            return  # the grace timer and the exit path both got here: once is enough
        wait = backoff_s(self.in_a_row)
        if wait and threading.current_thread() is threading.main_thread():
            # a SIGTERM or Ctrl-C during the wait ends the process as it would any other
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        deadline = time.monotonic() + wait
        while not self.stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if self.stop_requested:
            return
        env = {**os.environ, RESTARTS_ENV: str(self.in_a_row + 1)}
        log.info("restart_exec restarts_in_a_row=%d from=%s", self.in_a_row + 1, threading.current_thread().name)
        flush_standard_streams()
        os.execve(sys.executable, list(sys.orig_argv), env)


class StopWatch:
    """Ends the process if a requested stop overruns its bound (DLQ_DRAIN_TIMEOUT plus a margin)."""

    def __init__(self, drain_timeout_s: float, exit: Callable[[int], Any] = os._exit) -> None:
        self.bound_s = drain_timeout_s + STOP_MARGIN_S
        self._exit = exit
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self._timer is None:
            self._timer = after_grace(self.bound_s, self._overrun)

    def _overrun(self) -> None:
        log.warning(
            "the stop took longer than %.0f s (DLQ_DRAIN_TIMEOUT + %.0f s): exiting now", self.bound_s, STOP_MARGIN_S
        )
        flush_standard_streams()
        self._exit(0)
