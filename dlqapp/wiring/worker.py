"""The worker process (`faust -A dlqapp worker`): Faust's, told when it is asked to stop.

A SIGTERM or Ctrl-C marks the stop as requested before Faust begins it: from then on no
failure restarts the worker in place (dlqapp.wiring.restart), and a stop that overruns
DLQ_DRAIN_TIMEOUT plus a few seconds ends the process anyway.
"""

from __future__ import annotations

from typing import Any

from faust.worker import Worker


class DlqWorker(Worker):
    """Faust's worker, whose signal handlers first tell the app a stop was asked for."""

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
