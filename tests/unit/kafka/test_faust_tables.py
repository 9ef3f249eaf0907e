"""Which partitions of a table this worker actively owns, read from Faust's own assignor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust.assignor.client_assignment import ClientAssignment
from faust.assignor.partition_assignor import PartitionAssignor

from dlqapp.kafka.faust_tables import active_partitions

ASSIGNMENTS = [
    ClientAssignment(actives={}, standbys={}),
    ClientAssignment(
        actives={"app-parked-changelog": [7, 0, 3], "input": [0, 3, 7], "app-requests-changelog": [1]},
        standbys={"app-parked-changelog": [1, 2]},
    ),
    ClientAssignment(actives={"app-requests-changelog": [0]}, standbys={"app-parked-changelog": [0]}),
]


def _table(assignor: PartitionAssignor, changelog: str) -> SimpleNamespace:
    return SimpleNamespace(
        changelog_topic=SimpleNamespace(get_topic_name=lambda: changelog), app=SimpleNamespace(assignor=assignor)
    )


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_same_partitions_as_faust_assigned_actives_say_standbys_excluded(assignment: ClientAssignment) -> None:
    assignor = object.__new__(PartitionAssignor)  # only its assignment is read
    assignor._assignment = assignment
    for changelog in ("app-parked-changelog", "app-requests-changelog", "missing"):
        expected = sorted(tp.partition for tp in assignor.assigned_actives() if tp.topic == changelog)
        assert active_partitions(_table(assignor, changelog)) == expected


def test_a_new_assignment_is_seen_at_once() -> None:
    assignor = object.__new__(PartitionAssignor)
    table = _table(assignor, "app-parked-changelog")
    assignor._assignment = ASSIGNMENTS[1]
    assert active_partitions(table) == [0, 3, 7]
    assignor._assignment = ASSIGNMENTS[2]
    assert active_partitions(table) == []
