"""A worker whose exactly-once transaction failed restarts itself, or, when it was never
ready, exits with the error (dlqapp.wiring.restart)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from dlqapp.wiring import restart


class FakeApp:
    def __init__(self) -> None:
        self.crashed: list[BaseException] = []

    def _crash(self, reason: BaseException) -> None:
        self.crashed.append(reason)


def wait_for(calls: list[tuple], entry: tuple) -> None:
    """Until the grace timer (a thread) has made `entry`: never return before it fired,
    or it could fire after the fakes are gone."""
    deadline = time.monotonic() + 5
    while entry not in calls and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    made: list[tuple] = []
    monkeypatch.setattr(restart, "_pending", [])
    monkeypatch.setattr(restart, "GRACE_S", 0.01)
    monkeypatch.setattr(restart.os, "execv", lambda path, argv: made.append(("execv", path, tuple(argv))))
    monkeypatch.setattr(restart.os, "_exit", lambda code: made.append(("exit", code)))
    monkeypatch.setattr(restart.atexit, "register", lambda hook: made.append(("atexit", hook.__name__)))
    return made


def test_a_ready_worker_stops_then_runs_its_own_command_line_again_once(calls):
    async def run():
        app = FakeApp()
        restart.restart_after_stop(app, RuntimeError("ProducerFenced"), ready=True)
        restart.restart_after_stop(app, RuntimeError("a second partition failed too"), ready=True)
        return app

    app = asyncio.run(run())
    wait_for(calls, ("execv", sys.executable, tuple(sys.orig_argv)))
    assert [str(r) for r in app.crashed] == ["ProducerFenced"]
    assert calls == [("atexit", "_exec_self"), ("execv", sys.executable, tuple(sys.orig_argv))]


def test_a_worker_that_was_never_ready_exits_with_its_code_instead_of_looping(calls):
    async def run():
        app = FakeApp()
        restart.restart_after_stop(app, RuntimeError("TransactionalIdAuthorizationFailed"), ready=False)
        return app

    app = asyncio.run(run())
    wait_for(calls, ("exit", restart.FAILED_AT_START_EXIT_CODE))
    assert len(app.crashed) == 1 and calls == [("exit", restart.FAILED_AT_START_EXIT_CODE)]


def test_the_restart_happens_even_when_the_crash_path_stopped_the_event_loop(calls):
    async def crash_and_return():
        restart.restart_after_stop(FakeApp(), RuntimeError("ProducerFenced"), ready=True)

    asyncio.run(crash_and_return())  # the loop is gone (Faust stopped it, or it is stuck)
    wait_for(calls, ("execv", sys.executable, tuple(sys.orig_argv)))
    assert ("execv", sys.executable, tuple(sys.orig_argv)) in calls
