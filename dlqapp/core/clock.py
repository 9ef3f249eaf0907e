"""Time, injectable: production uses the wall clock, tests a fixed one."""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds."""


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000
