"""dlqapp: LLM inference requests from Kafka, retried through delay tiers, never lost.

`faust -A dlqapp worker` finds `app` here; importing the package registers every agent,
table, view and command on it.
"""

__version__ = "0.1.0"

from dlqapp.app import app  # noqa: E402
from dlqapp import agents, cli, web  # noqa: E402,F401

__all__ = ["app", "__version__"]
