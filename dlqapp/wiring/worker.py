"""The worker process (`faust -A dlqapp worker`): Faust's, told when it is asked to stop.

A SIGTERM or Ctrl-C marks the stop as requested before Faust begins it: from then on no
failure restarts the worker in place (dlqapp.wiring.restart), and a stop that overruns
DLQ_DRAIN_TIMEOUT plus a few seconds ends the process anyway.

Its log lines take dlqapp's format from the first one (DLQ_LOG_FORMAT, the libraries' INFO
detail hidden): Faust's "[^Worker]: Starting..." came before the app could set it, as the
one plain-text line of a JSON log.

Once the worker has stopped, the process ends with its exit code at once, without the
interpreter's teardown, which only destroys objects: native ones have crashed it after a
clean stop (dlqapp.wiring.process.end_process).

It shows no progress spinner: Faust's spins once per log record, so at Faust's default
level (WARN, no `-l`) it set the root logger to DEBUG for the life of the worker, and every
debug line of aiokafka, Faust and mode (one per partition per fetch) was built and handed
to it: an idle worker of 12 partitions spent about 17 % of a core instead of 12 %.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from faust.worker import Worker

from dlqapp.observability.logs import apply_log_format
from dlqapp.wiring.process import end_process, exit_code_of


class DlqWorker(Worker):
    """Faust's worker, whose signal handlers first tell the app a stop was asked for, whose
    lines take dlqapp's log format from the first, without the progress spinner, and whose
    process ends once it has stopped (module doc)."""

    def execute_from_commandline(self) -> NoReturn:
        """Run the worker until it has stopped; then end the process with its exit code,
        without the interpreter's teardown (`end_process`)."""
        try:
            super().execute_from_commandline()
        except SystemExit as exit:
            end_process(exit_code_of(exit))
        raise AssertionError("Worker.execute_from_commandline returned")  # it always raises SystemExit

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None  # never the spinner's handler, nor the root logger at DEBUG for it
        super().on_setup_root_logger(logger, level)
        settings = getattr(getattr(self, "app", None), "dlq_settings", None)
        if settings is not None:
            apply_log_format(settings, logger)

    def _on_sigint(self) -> None:
        self._stop_requested()
        super()._on_sigint()

    def _on_sigterm(self) -> None:
        self._stop_requested()
        super()._on_sigterm()

    def _stop_requested(self) -> None:
        app: Any = self.app
        request = getattr(app, "stop_requested", None)
        if request is not None:
            request()
