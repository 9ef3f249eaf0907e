"""The Python process a worker runs in: its settings read once, its event loop, its garbage
collector, and what it keeps on disk between runs."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from dlqapp.settings import Settings, SettingsError

GC_YOUNG_THRESHOLD = 50_000
"""Allocations between two collections of the youngest generation (CPython's default is 700).
Each request allocates a few hundred short-lived objects (events, futures, dicts), so the
default collected about every two requests; at 50,000 a busy worker spent about 4 % less CPU
per request (bench `overhead`, side by side), for a few MiB more garbage at the peak."""


STDERR_FD = 2
"""The process's standard error as a descriptor: mode replaces `sys.stderr` in a worker with a
logging proxy that has no `fileno()`, and the interpreter's fault handler needs one."""


def report_fatal_errors() -> None:
    """Should the process die of a fatal signal (a segmentation fault in a native library,
    an abort), print every thread's Python stack to stderr first, so the log says where."""
    faulthandler.enable(file=STDERR_FD, all_threads=True)


def install_event_loop(settings: Settings) -> None:
    """Make DLQ_EVENT_LOOP the loop the worker runs on (before anything creates a loop).

    uvloop runs the same asyncio code with its transports and scheduling in C: the
    per-request cost of the loop itself (sockets to Kafka and the backend, task switches)
    is a large share of a worker's CPU (bench/results/profiles/)."""
    if settings.event_loop == "uvloop":
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def load_settings() -> Settings:
    """Settings from the environment; exit with a message naming the bad variable."""
    try:
        return Settings.from_env()
    except SettingsError as exc:
        print(f"dlqapp: invalid setting: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def wipe_local_tables(settings: Settings, tabledir: Any) -> None:
    """Under exactly_once: start from the changelogs (committed writes only), never from local
    RocksDB, which may hold writes of a transaction that never committed."""
    path = Path(str(tabledir))
    if settings.exactly_once and path.exists():
        shutil.rmtree(path)


def tune_garbage_collector() -> None:
    """Once the worker has started: what exists now lives as long as the process (`gc.freeze`,
    never scanned again), and young objects are collected less often (GC_YOUNG_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def flush_standard_streams() -> None:
    """Flush stdout and stderr (mode's proxies and the real ones) before the process ends or is replaced."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a closed stream, or none: nothing to flush there
            if stream is not None:
                stream.flush()


def exit_code_of(exit: SystemExit) -> int:
    """The process exit code a SystemExit asks for (a message is printed, and is 1)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def end_process(
    code: int, exit: Callable[[int], Any] = os._exit, exit_handlers: Callable[[], None] = atexit._run_exitfuncs
) -> NoReturn:
    """End a worker whose stop is complete: run the exit handlers (logging's flush, the trace
    exporter's), flush the standard streams, and exit without tearing the interpreter down.

    The teardown only destroys objects, and native ones (uvloop's handles, RocksDB's shared
    block cache and its background threads) have crashed it: a worker that had stopped
    cleanly ended with SIGSEGV, after the interpreter's fault handler was gone."""
    exit_handlers()  # a restart in place is one (dlqapp.wiring.restart): it re-executes the worker
    flush_standard_streams()
    exit(code)
    raise AssertionError("exit returned")  # only a test's `exit` does
