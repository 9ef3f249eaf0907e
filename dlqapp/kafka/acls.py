"""The ACLs a deployment needs, least privilege, from its settings.

`required(settings)` lists each resource pattern dlqapp touches and the operations it
needs there; `kafka_acls_lines` prints them as arguments of Kafka's `kafka-acls` tool
(`faust -A dlqapp acls --principal User:NAME`); `missing` compares them with what a broker
says a principal may do (dlqapp.kafka.access checks that at start).

What each grant is for:
- dlqapp's topics (input, the tiers, dlq, the due and commands topics): READ (the agents
  consume them), WRITE (outcomes, retries, replays to input), CREATE (a missing topic is
  created at start), DESCRIBE_CONFIGS (the DLQ must be compacted; min.insync.replicas is
  checked). `results` is written, never read: no READ.
- Topics named `<app id>-` (prefixed): Faust's changelogs, the leader topic and each
  worker's reply topic, whose names are generated: the same four operations.
- Topics named `<app id>-reply-` (prefixed): DELETE, optional and not checked at start: a
  worker deletes its reply topic when it stops (dlqapp.kafka.replies); without it the topic
  is left, with a WARNING line at the stop.
- The consumer group `<app id>`: READ (join, commit offsets).
- Under DLQ_PROCESSING_GUARANTEE=exactly_once, transactional ids named `<app id>-`
  (prefixed; one per partition number): WRITE (transactions) and DESCRIBE.
Nothing on the cluster: since Kafka 3.0 an idempotent producer needs WRITE on a topic, not
IDEMPOTENT_WRITE, and dlqapp never creates ACLs or quotas.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlqapp.settings import Settings


class Operation(IntEnum):
    """Kafka's AclOperation codes (the bit positions of `authorized_operations`)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11

    @property
    def tool_name(self) -> str:
        """The name `kafka-acls --operation` takes: `Read`, `DescribeConfigs`."""
        return "".join(part.capitalize() for part in self.name.split("_"))


TOPIC_OPS = (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE_CONFIGS)
WRITE_ONLY_OPS = (Operation.WRITE, Operation.CREATE, Operation.DESCRIBE_CONFIGS)


@dataclass(frozen=True)
class Grant:
    """Operations needed on one resource pattern."""

    resource: str
    """`topic` or `group`."""
    name: str
    prefixed: bool
    operations: tuple[Operation, ...]
    optional: bool = False
    """Printed by `acls`, not checked at start: the worker runs without it."""

    def covers(self, resource: str, name: str) -> bool:
        return resource == self.resource and (name.startswith(self.name) if self.prefixed else name == self.name)

    def describe(self) -> str:
        pattern = f"{self.name}*" if self.prefixed else self.name
        return f"{', '.join(op.name for op in self.operations)} on {self.resource} {pattern}"


def internal_prefix(settings: Settings) -> str:
    """Where Faust's generated topics live: changelogs, the leader topic, reply topics."""
    return f"{settings.app_id}-"


def reply_prefix(settings: Settings) -> str:
    """The workers' reply topics (Faust's `reply_to_prefix`)."""
    return f"{settings.app_id}-reply-"


def required(settings: Settings) -> list[Grant]:
    """Every grant this deployment needs (module doc), the internal prefix first."""
    prefix = internal_prefix(settings)
    grants = [
        Grant("topic", prefix, True, TOPIC_OPS),
        Grant("topic", reply_prefix(settings), True, (Operation.DELETE,), optional=True),
    ]
    for topic in settings.all_topics():
        if topic.startswith(prefix):
            continue  # already covered by the prefixed grant
        grants.append(Grant("topic", topic, False, WRITE_ONLY_OPS if topic == settings.results else TOPIC_OPS))
    grants.append(Grant("group", settings.app_id, False, (Operation.READ,)))
    if settings.exactly_once:
        grants.append(Grant("transactional-id", prefix, True, (Operation.WRITE, Operation.DESCRIBE)))
    return grants


def kafka_acls_lines(grants: list[Grant], principal: str) -> list[str]:
    """One line per grant: arguments of `kafka-acls` without the connection options."""
    lines = []
    for grant in grants:
        ops = " ".join(f"--operation {op.tool_name}" for op in grant.operations)
        pattern = " --resource-pattern-type prefixed" if grant.prefixed else ""
        lines.append(f"--add --allow-principal {principal} {ops} --{grant.resource} {grant.name}{pattern}")
    return lines


def implied(allowed: set[Operation]) -> set[Operation]:
    """Kafka's implications: READ, WRITE, DELETE and ALTER allow DESCRIBE; ALTER_CONFIGS allows DESCRIBE_CONFIGS."""
    result = set(allowed)
    if allowed & {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}:
        result.add(Operation.DESCRIBE)
    if Operation.ALTER_CONFIGS in allowed:
        result.add(Operation.DESCRIBE_CONFIGS)
    return result


def operations_of(bits: int) -> set[Operation]:
    """The operations an `authorized_operations` bit field allows."""
    return {op for op in Operation if bits >= 0 and bits & (1 << op.value)}


def missing(grants: list[Grant], resource: str, *, name: str, bits: int) -> list[Operation]:
    """Operations `grants` need on one resource that `bits` (the broker's answer) lacks; an
    optional grant's are not needed."""
    allowed = implied(operations_of(bits))
    needed = {op for grant in grants if grant.covers(resource, name) and not grant.optional for op in grant.operations}
    return sorted(needed - allowed)
