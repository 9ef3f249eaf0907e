"""GET /livez and GET /readyz on real workers: unready (503, with the reason) while a worker
owns no partition and while it stops, ready (200) once it owns partitions and has recovered;
alive throughout; answered whatever the Host header says."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from typing import Any

from tests.kafka_io import produce, request_bytes
from tests.support import Worker, http_json, unique, wait_until

# One partition, so the second worker owns nothing while the first runs; a backend call
# that outlasts a long drain, so the first worker's stop can be watched.
ENV = {
    "DLQ_PARTITIONS": "1",
    "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
    "DLQ_SIMULATED_LATENCY": "60s",
    "DLQ_SIMULATED_JITTER": "0ms",
    "DLQ_DRAIN_TIMEOUT": "20s",
}


def probe(worker: Worker, path: str, host: str | None = None) -> tuple[int, Any] | None:
    """(status, body) of a probe, or None while nothing answers on the port."""
    try:
        return http_json(worker.url + path, headers={"Host": host} if host else None, timeout=3)
    except OSError:
        return None


def test_probes_follow_workers_through_start_takeover_and_stop(make_worker):
    first = make_worker(env_extra=ENV).start()
    assert probe(first, "/readyz") == (200, {"ready": True, "reason": "ready"})
    assert probe(first, "/livez") == (200, {"alive": True})
    # a probe by any name (a load balancer's, a Service's) is answered; other routes are not
    assert probe(first, "/readyz", host="dlqapp.prod.svc.cluster.local:6066")[0] == 200
    assert probe(first, "/livez", host="evil.example")[0] == 200
    assert probe(first, "/", host="evil.example")[0] == 403

    second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=ENV).start(wait=False)
    wait_until(lambda: "partitions_assigned" in second.log_path.read_text(errors="replace"), 120, "the second to join")
    answers: list[Any] = []

    def unready_without_partitions() -> bool:
        answers.append(probe(second, "/readyz"))
        status, body = answers[-1]
        assert status == 503 and body["ready"] is False, answers  # never ready while the first owns everything
        return body["reason"].startswith("no partitions assigned")

    wait_until(unready_without_partitions, 60, lambda: f"the joined worker's rebalance to end ({answers[-3:]})")
    assert probe(second, "/livez") == (200, {"alive": True})
    wait_until(
        lambda: probe(first, "/readyz") == (200, {"ready": True, "reason": "ready"}), 60, "the first ready again"
    )

    rid = unique("probe")
    produce(first.bootstrap, first.topic("input"), [(rid.encode(), request_bytes(rid))])
    wait_until(lambda: first.get("/")[1]["in_flight"] >= 1, 60, "a call in flight on the first worker")
    first.process.send_signal(signal.SIGTERM)
    seen: list[Any] = []

    def stopping() -> bool:
        seen.append(probe(first, "/readyz"))
        return seen[-1] is not None and seen[-1][0] == 503 and seen[-1][1]["reason"] == "stopping"

    wait_until(stopping, 15, lambda: f"the stopping worker to answer 503 stopping (answers: {seen[-5:]})", 0.05)
    assert probe(first, "/livez") == (200, {"alive": True})  # draining, still alive
    try:
        assert first.process.wait(timeout=90) == 0, first.log_tail()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the first worker did not stop:\n{first.log_tail()}") from None

    answers.clear()

    def ready() -> bool:
        answers.append(probe(second, "/readyz"))
        return answers[-1] == (200, {"ready": True, "reason": "ready"})

    wait_until(ready, 120, lambda: f"the second worker ready with the partition (last answers: {answers[-3:]})")
    assert all(a is not None and a[0] in (200, 503) for a in answers), answers
    assert http_json(second.url + "/")[1]["ready"] is True
    assert "dlqapp_worker_ready 1.0" in metrics_text(second)


def metrics_text(worker: Worker) -> str:
    with urllib.request.urlopen(worker.url + "/metrics", timeout=5) as response:
        return response.read().decode()
