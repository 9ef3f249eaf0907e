"""The worker process: Faust's progress spinner never puts the root logger at DEBUG."""

from __future__ import annotations

import io
import logging

import pytest
from faust.utils import terminal
from faust.worker import Worker

from dlqapp.wiring.worker import DlqWorker


def _root_set_up(worker_class: type[Worker], level: int) -> logging.Logger:
    """A root-like logger as Faust's worker sets it up at `level` (one handler, as mode adds)."""
    worker = object.__new__(worker_class)  # only its logging set-up is exercised
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
