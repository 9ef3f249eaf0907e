"""A worker that must drop its local state restarts itself: same process, same command line.

Under exactly_once, a transaction that cannot commit (the broker restarted and aborted it,
or the worker was frozen past its session and fenced as a zombie) leaves the worker's local
tables holding writes that never became visible. Nothing is lost (those steps' events were
not acked, their outputs never visible), but the tables must be rebuilt from the committed
changelogs, which a worker does at start. Kafka Streams closes such tasks "dirty" and
rejoins; dlqapp re-executes its own command line (`os.execv`): the process keeps its pid
and its terminal (Ctrl-C still reaches it), drops every socket and file (Python opens them
close-on-exec), wipes its tables and joins the group again.

Only a worker that had been ready restarts: one that fails before (a missing ACL, a broker
it cannot reach) exits with `FAILED_AT_START_EXIT_CODE` and the error, never a restart loop.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

FAILED_AT_START_EXIT_CODE = 75
"""Exit code of a worker whose transactions failed before it was ever ready (EX_TEMPFAIL)."""

GRACE_S = 10.0
"""How long the worker may take to stop its services before it restarts (or exits) anyway."""

_pending: list[str] = []


def restart_after_stop(app: Any, reason: BaseException, ready: bool) -> None:
    """Stop `app` the way Faust stops it on a crash, then re-execute the worker (or, when it
    was never `ready`, exit). Called again while a restart is pending, it does nothing."""
    if _pending:
        return
    _pending.append(f"{type(reason).__name__}: {reason}")
    if ready:
        log.warning("restarting the worker to rebuild its tables from the committed changelogs: %s", _pending[0])
        atexit.register(_exec_self)
        then: Any = _exec_self
    else:
        log.critical("exactly-once transactions failed before the worker was ready, stopping it: %s", _pending[0])
        then = lambda: os._exit(FAILED_AT_START_EXIT_CODE)  # noqa: E731
    app._crash(reason)
    after_grace(GRACE_S, then)


def after_grace(seconds: float, then: Callable[[], Any]) -> None:
    """Call `then` after `seconds` on a thread of its own: Faust's crash path may stop the
    event loop, or block it joining the consumer thread, and `then` must run all the same."""
    timer = threading.Timer(seconds, then)
    timer.daemon = True
    timer.start()


def _exec_self() -> None:
    """Replace this process with a fresh run of the same command line."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream: nothing to flush
            stream.flush()
    os.execv(sys.executable, list(sys.orig_argv))
