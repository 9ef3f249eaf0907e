"""dlqapp: LLM inference requests from Kafka, retried through delay tiers, never lost.

`faust -A dlqapp worker` finds `app` here. The app is built on first access to
`dlqapp.app` (which registers every agent, table, view and command), so importing a
pure module such as `dlqapp.settings` or `dlqapp.mock_llm` builds nothing.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["app", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from dlqapp import agents, cli, web  # noqa: F401  (registration side effects)
        from dlqapp.app import app

        globals()["app"] = app  # shadow the submodule of the same name from now on
        return app
    raise AttributeError(f"module 'dlqapp' has no attribute {name!r}")
