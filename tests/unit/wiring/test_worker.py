"""The worker process: its log lines take dlqapp's format from the first, and Faust's
progress spinner never puts the root logger at DEBUG."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace

import pytest
from faust.utils import terminal
from faust.worker import Worker

from dlqapp.wiring.worker import DlqWorker


def _root_set_up(worker_class: type[Worker], level: int, log_format: str | None = None) -> logging.Logger:
    """A root-like logger as Faust's worker sets it up at `level` (one handler, as mode adds)."""
    worker = object.__new__(worker_class)  # only its logging set-up is exercised
    if log_format is not None:
        worker.app = SimpleNamespace(dlq_settings=SimpleNamespace(log_format=log_format))
    worker.spinner = terminal.Spinner(file=io.StringIO())
    logger = logging.Logger(f"root-of-{worker_class.__name__}", level)
    logger.addHandler(logging.StreamHandler(io.StringIO()))
    worker.on_setup_root_logger(logger, level)
    return logger


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_faust_default_level_keeps_debug_records_unbuilt(level: int) -> None:
    logger = _root_set_up(DlqWorker, level)
    assert logger.level == level
    assert not logger.isEnabledFor(logging.DEBUG)
    assert not any(isinstance(h, terminal.SpinnerHandler) for h in logger.handlers)


def test_faust_own_worker_would_put_the_root_at_debug() -> None:
    """What the override prevents (and why this test file can fail)."""
    logger = _root_set_up(Worker, logging.WARNING)
    assert logger.isEnabledFor(logging.DEBUG)
    assert any(isinstance(h, terminal.SpinnerHandler) for h in logger.handlers)


def test_info_level_is_left_as_faust_sets_it() -> None:
    logger = _root_set_up(DlqWorker, logging.INFO)
    assert logger.level == logging.INFO
    assert not logger.isEnabledFor(logging.DEBUG)


def _line(logger: logging.Logger, name: str, message: str) -> str:
    """What the logger's handler writes for one INFO record of logger `name`."""
    handler = logger.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.stream = io.StringIO()
    logger.handle(logger.makeRecord(name, logging.INFO, __file__, 1, message, (), None))
    return str(handler.stream.getvalue())


def test_a_json_log_is_json_from_its_first_line_and_faust_start_lines_are_detail() -> None:
    logger = _root_set_up(DlqWorker, logging.INFO, log_format="json")
    assert _line(logger, "mode.worker", "[^DlqWorker]: Starting...") == ""  # before the app starts
    written = _line(logger, "dlqapp.wiring.faust_app", "topics_ready checked=17")
    assert json.loads(written)["event"] == "topics_ready checked=17"


def test_a_text_log_hides_faust_start_lines_from_the_first() -> None:
    logger = _root_set_up(DlqWorker, logging.INFO, log_format="text")
    assert _line(logger, "mode.worker", "[^DlqWorker]: Starting...") == ""
    assert _line(logger, "dlqapp.wiring.faust_app", "ready").strip().endswith("ready")


class Ended(Exception):
    """What the fake `exit` raises: the process would have ended here."""


def test_a_stopped_worker_ends_with_its_code_after_its_exit_handlers_without_the_teardown(monkeypatch) -> None:
    """Faust's worker ends with SystemExit, and the interpreter's teardown that followed has
    crashed a cleanly stopped worker in native destructors: the process ends right after
    the exit handlers (a restart in place is one), with the same code."""
    from dlqapp.wiring import process

    done: list[object] = []

    def stopped(self) -> None:
        raise SystemExit(3)

    def exit(code: int) -> None:
        done.append(("exit", code))
        raise Ended

    monkeypatch.setattr(Worker, "execute_from_commandline", stopped)
    worker = object.__new__(DlqWorker)
    real_end = process.end_process

    def end(code: int) -> None:
        real_end(code, exit=exit, exit_handlers=lambda: done.append("handlers"))

    monkeypatch.setattr("dlqapp.wiring.worker.end_process", end)
    with pytest.raises(Ended):
        worker.execute_from_commandline()
    assert done == ["handlers", ("exit", 3)]


@pytest.mark.parametrize(("code", "expected"), [(None, 0), (0, 0), (2, 2), ("bad setting", 1)])
def test_the_exit_code_of_a_system_exit(code: object, expected: int) -> None:
    from dlqapp.wiring.process import exit_code_of

    assert exit_code_of(SystemExit(code)) == expected
