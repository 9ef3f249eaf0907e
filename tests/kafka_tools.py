"""Kafka's own command-line tools (the jars scripts/kafka-local fetches), for tests that
check dlqapp against software nobody here wrote."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

from tests.support import ROOT

CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def kafka_jars() -> Path:
    """The jar cache of scripts/kafka-local (same defaults: KAFKA_JARS_DIR, XDG_CACHE_HOME)."""
    if os.environ.get("KAFKA_JARS_DIR"):
        return Path(os.environ["KAFKA_JARS_DIR"])
    pom = (ROOT / "scripts" / "kafka" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>(.+?)</kafka.version>", pom).group(1)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dlqapp" / f"kafka-{version}"


def run_tool(
    main_class: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = 120,
    jvm: tuple[str, ...] = ("-Xmx256m", "-Dlog4j2.level=WARN"),
) -> str:
    """Run one Kafka tool; its stdout (fails with its stderr)."""
    command = ["java", "-XX:TieredStopAtLevel=1", *jvm, "-cp", f"{kafka_jars()}/*", main_class, *args]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{main_class} exited {done.returncode}:\n{done.stderr[-2000:]}"
    return done.stdout


def committed_keys(bootstrap: str, topics: list[str], count: int, timeout_s: float = 120) -> Counter[str]:
    """How often each key appears among the non-empty records of `topics`, as Kafka's console
    consumer reads them with `--isolation-level read_committed`: up to `count` + 1 records
    (one more than expected, so a duplicate shows), or what came before 10 s went by without one."""
    out = run_tool(
        CONSOLE_CONSUMER,
        "--bootstrap-server",
        bootstrap,
        "--include",
        "|".join(re.escape(t) for t in topics),
        "--from-beginning",
        "--isolation-level",
        "read_committed",
        "--timeout-ms",
        "10000",
        "--max-messages",
        str(count + 1),
        "--property",
        "print.key=true",
        "--property",
        "key.separator=\x1e",
        timeout=timeout_s,
        jvm=("-Xmx256m", "-Dlog4j2.level=OFF"),  # its timeout is logged as an ERROR, on stdout
    )
    keys: Counter[str] = Counter()
    for line in filter(None, out.split("\n")):  # not splitlines(): it splits at \x1d-\x1f too
        key, value = line.split("\x1e", 1)
        if value != "null":  # a tombstone (a replay's, on dlq)
            keys[key] += 1
    return keys


def transaction_states(bootstrap: str) -> dict[str, str]:
    """Transactional id → its state at its coordinator (`Ongoing`, `PrepareAbort`,
    `CompleteCommit`, ...), as Kafka's own TransactionsCommand lists them."""
    out = run_tool("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", bootstrap, "list")
    rows = [[cell.strip() for cell in line.split("\t")] for line in out.splitlines()[1:] if line.strip()]
    return {row[0]: row[3] for row in rows if len(row) >= 4}
