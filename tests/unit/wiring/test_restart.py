"""A worker whose exactly-once transaction failed restarts itself, backing off; when it was
never ready it exits with the error; when it was asked to stop it never restarts, and a
stop that overruns its bound ends the process (dlqapp.wiring.restart)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from dlqapp.wiring import restart
from dlqapp.wiring.restart import RESTARTS_ENV, Restarts, StopWatch, backoff_s

armed: list[float | None] = []
"""What the restarts under test asked the hang watchdog for (it would end the test process)."""


class FakeApp:
    def __init__(self) -> None:
        self.crashed: list[BaseException] = []

    def fail(self, reason: BaseException) -> None:
        self.crashed.append(reason)


def wait_for(calls: list[tuple], kind: str, timeout: float = 5) -> None:
    """Until the grace timer (a thread) has made a call of `kind`: never return before it
    fired, or it could fire after the fakes are gone."""
    deadline = time.monotonic() + timeout
    while not any(call[0] == kind for call in calls) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    made: list[tuple] = []
    monkeypatch.setattr(restart, "GRACE_S", 0.01)
    monkeypatch.setattr(
        restart.os, "execve", lambda path, argv, env: made.append(("execve", path, tuple(argv), env[RESTARTS_ENV]))
    )
    monkeypatch.setattr(restart.os, "_exit", lambda code: made.append(("exit", code)))
    monkeypatch.setattr(restart.atexit, "register", lambda hook: made.append(("atexit", hook.__name__)))
    return made


def test_a_ready_worker_stops_then_runs_its_own_command_line_again_once(calls):
    restarts = Restarts({}, watchdog=armed.append)

    async def run():
        app = FakeApp()
        restarts.restart_after_stop(app, RuntimeError("ProducerFenced"), ready=True)
        restarts.restart_after_stop(app, RuntimeError("a second partition failed too"), ready=True)
        return app

    app = asyncio.run(run())
    wait_for(calls, "execve")
    restarts.exec_self()  # the exit path gets there too: once is enough
    assert [str(r) for r in app.crashed] == ["ProducerFenced"]
    assert calls == [("atexit", "exec_self"), ("execve", sys.executable, tuple(sys.orig_argv), "1")]


def test_a_worker_that_was_never_ready_exits_with_its_code_instead_of_looping(calls):
    async def run():
        app = FakeApp()
        Restarts({}, watchdog=armed.append).restart_after_stop(
            app, RuntimeError("TransactionalIdAuthorizationFailed"), ready=False
        )
        return app

    app = asyncio.run(run())
    wait_for(calls, "exit")
    assert len(app.crashed) == 1 and calls == [("exit", restart.FAILED_AT_START_EXIT_CODE)]


def test_the_restart_happens_even_when_the_crash_path_stopped_the_event_loop(calls):
    async def crash_and_return():
        Restarts({}, watchdog=armed.append).restart_after_stop(FakeApp(), RuntimeError("ProducerFenced"), ready=True)

    asyncio.run(crash_and_return())  # the loop is gone (Faust stopped it, or it is stuck)
    wait_for(calls, "execve")
    assert any(call[0] == "execve" for call in calls)


def test_a_worker_asked_to_stop_never_restarts_even_with_a_failure_on_its_way(calls):
    """Issue 39: SIGTERM during a burst of dead letters ended in 'restarting the worker ...
    NotOwned' and a worker that was still running 30 s later."""
    restarts = Restarts({}, watchdog=armed.append)
    restarts.request_stop()
    app = FakeApp()
    restarts.restart_after_stop(app, RuntimeError("NotOwned: partition 6 was handed back"), ready=True)
    time.sleep(0.05)
    restarts.exec_self()  # even should the exit path try
    assert calls == [] and app.crashed == []


def test_a_stop_asked_for_during_the_backoff_cancels_the_restart(calls, monkeypatch):
    restarts = Restarts({RESTARTS_ENV: "3"}, watchdog=armed.append)  # the fourth in a row waits 4 s
    app = FakeApp()
    restarts.restart_after_stop(app, RuntimeError("ProducerFenced"), ready=True)
    time.sleep(0.2)  # the grace timer's thread is waiting out the backoff
    restarts.request_stop()
    time.sleep(0.3)
    assert not any(call[0] == "execve" for call in calls)


def test_restarts_in_a_row_back_off_and_a_stable_worker_starts_counting_again(calls, monkeypatch):
    assert [backoff_s(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    monkeypatch.setattr(restart, "backoff_s", lambda n: 0.0)  # counted, not waited, here
    restarts = Restarts({RESTARTS_ENV: "5"}, watchdog=armed.append)
    restarts.ready_at = time.monotonic() - restart.STABLE_S - 1  # ready for over a minute
    restarts.restart_after_stop(FakeApp(), RuntimeError("broker restarted"), ready=True)
    wait_for(calls, "execve")
    assert calls[-1][-1] == "1"  # counting from zero again, not the sixth in a row


def test_a_stop_that_overruns_its_bound_ends_the_process():
    exits: list[int] = []
    watch = StopWatch(0.05, exit=exits.append)
    watch.bound_s = 0.05
    watch.start()
    watch.start()  # a second signal: one timer
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert exits == [0]


def test_a_restart_arms_the_hang_watchdog_beyond_its_grace_and_backoff(calls):
    armed.clear()
    Restarts({RESTARTS_ENV: "3"}, watchdog=armed.append).restart_after_stop(FakeApp(), RuntimeError("x"), ready=True)
    assert [restart.GRACE_S + backoff_s(3) + restart.HANG_MARGIN_S] == armed
    wait_for(calls, "execve", timeout=10)


def test_the_hang_watchdog_ends_a_process_that_hangs_and_says_where():
    script = (
        "import sys, time; from dlqapp.wiring.restart import hang_watchdog\n"
        "class Proxy:  # what mode makes of sys.stderr in a worker\n"
        "    def write(self, text): pass\n"
        "    def fileno(self): raise NotImplementedError()\n"
        "sys.stderr = Proxy()\n"
        "def stuck_in_a_stop():\n    time.sleep(60)\n"
        "hang_watchdog(0.5); stuck_in_a_stop()"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "stuck_in_a_stop" in done.stderr


def test_a_stop_asked_for_during_a_restart_disarms_its_hang_watchdog(calls):
    armed.clear()
    restarts = Restarts({RESTARTS_ENV: "5"}, watchdog=armed.append)
    restarts.restart_after_stop(FakeApp(), RuntimeError("x"), ready=True)
    restarts.request_stop()
    assert armed == [restart.GRACE_S + backoff_s(5) + restart.HANG_MARGIN_S, None]


def test_a_watchdog_that_cannot_be_armed_does_not_stop_the_restart(calls):
    def broken(seconds):
        raise NotImplementedError("no file descriptor")

    Restarts({}, watchdog=broken).restart_after_stop(FakeApp(), RuntimeError("ProducerFenced"), ready=True)
    wait_for(calls, "execve")
    assert any(call[0] == "execve" for call in calls)
