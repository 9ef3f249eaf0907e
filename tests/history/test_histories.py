"""The history checker (issue #39) against real workers and a real Kafka.

- `make test`: the named histories but the clean control (tests/history/generate.py NAMED:
  the three cases of the issue, two more the checker found) and HISTORIES (default 1)
  small random one from HISTORY_SEED (default 1000): about three minutes.
- `make chaos` (CHAOS_FULL=1): every named history and HISTORIES (default 50) large random
  ones, one JSON line each appended to CHAOS_REPORT when set.
- `HISTORY_REPLAY=<file> scripts/test tests/history -k replay -s`: one saved history again.

A failing history prints its seed, its violations, where what it collected was saved,
and the shortest failing history shrinking found within HISTORY_SHRINK_RUNS reruns and
HISTORY_SHRINK_BUDGET_S seconds (5 and 150 s in make test, 20 and 900 s in make chaos),
with the command line that replays it.

All histories of this file share one broker of their own (tests/history/run.py,
ProxiedKafka), so a broker restart or a slow broker touches no other test; the file
runs on one xdist worker like every file (tests/conftest.py groups tests by file).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.ledger import FULL
from tests.history.generate import NAMED, History, generate
from tests.history.run import ProxiedKafka
from tests.history.shrink import Outcome, play, report_line, shrink, write_failure

SIZE = "large" if FULL else "small"
HISTORIES = int(os.environ.get("HISTORIES") or (50 if FULL else 1))
BASE_SEED = int(os.environ.get("HISTORY_SEED") or 1000)
SHRINK_RUNS = int(os.environ.get("HISTORY_SHRINK_RUNS") or (20 if FULL else 5))
SHRINK_BUDGET_S = float(os.environ.get("HISTORY_SHRINK_BUDGET_S") or (900 if FULL else 150))

pytestmark = pytest.mark.timeout(3600 if FULL else 900)


@pytest.fixture(scope="module")
def history_kafka(tmp_path_factory: pytest.TempPathFactory):
    kafka = ProxiedKafka(tmp_path_factory.mktemp("history-kafka")).start()
    try:
        yield kafka
    finally:
        kafka.stop()


def judge(history: History, kafka: ProxiedKafka, tmp_path: Path, shrink_runs: int = SHRINK_RUNS) -> Outcome:
    outcome = play(history, kafka, tmp_path / "run")
    report_line(outcome)
    if outcome.failed:
        shrunk = None
        if shrink_runs:
            shrunk = shrink(
                outcome, lambda h, i: play(h, kafka, tmp_path / f"shrink-{i}"), SHRINK_BUDGET_S, shrink_runs
            )
        pytest.fail(write_failure(outcome, shrunk), pytrace=False)
    return outcome


IN_MAKE_TEST = sorted(name for name in NAMED if FULL or name != "clean")
"""`make test` leaves the clean control to `make chaos`: the three minutes go to the cases."""


@pytest.mark.parametrize("name", IN_MAKE_TEST)
def test_named_history(name: str, history_kafka: ProxiedKafka, tmp_path: Path) -> None:
    """The named histories, as written (hand-made and small: nothing to shrink)."""
    judge(NAMED[name](), history_kafka, tmp_path, shrink_runs=0)


@pytest.mark.parametrize("seed", range(BASE_SEED, BASE_SEED + HISTORIES))
def test_random_history(seed: int, history_kafka: ProxiedKafka, tmp_path: Path) -> None:
    judge(generate(seed, SIZE), history_kafka, tmp_path)


@pytest.mark.skipif(not os.environ.get("HISTORY_REPLAY"), reason="set HISTORY_REPLAY=<history.json>")
def test_replay(history_kafka: ProxiedKafka, tmp_path: Path) -> None:
    history = History.from_json(Path(os.environ["HISTORY_REPLAY"]).read_text())
    print(history.describe())
    judge(history, history_kafka, tmp_path, shrink_runs=int(os.environ.get("HISTORY_SHRINK_RUNS") or 0))
