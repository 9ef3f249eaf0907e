"""dlqapp: LLM inference requests from Kafka, retried through delay tiers, never lost.

`faust -A dlqapp worker` finds `app` here: the first access builds it from the
environment (`dlqapp.wiring.composition.build_app`). Importing dlqapp, or any of its
modules, builds nothing.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from dlqapp.wiring.composition import build_app

        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module 'dlqapp' has no attribute {name!r}")
