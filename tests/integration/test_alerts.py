"""Dead-letter alerts reach a webhook, batched per window, retried when it fails."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.kafka_io import produce, request_bytes
from tests.support import unique, wait_until


class Receiver:
    """A local webhook that fails its first `failures` posts, then records them."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.bodies: list[dict] = []
        self.attempts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.attempts += 1
                if receiver.attempts <= receiver.failures:
                    self.send_response(500)
                else:
                    receiver.bodies.append(body)
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def test_dead_letters_are_batched_into_webhook_messages_and_retried(make_worker):
    receiver = Receiver(failures=1)
    worker = make_worker(
        env_extra={"DLQ_ALERT_WEBHOOK_URL": receiver.url, "DLQ_ALERT_WINDOW": "1s", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}
    ).start()
    ids = [unique("alert") for _ in range(4)]
    errors = ["auth_error", "auth_error", "auth_error", "content_filter"]
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [
            (rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": 1, "error": e}}))
            for rid, e in zip(ids, errors, strict=True)
        ],
    )
    wait_until(lambda: sum(b["dlqapp"]["total"] for b in receiver.bodies) >= 4, 60, "4 dead letters to be alerted")
    totals: dict[str, int] = {}
    for body in receiver.bodies:
        assert body["text"].startswith(":rotating_light:")
        for cls, n in body["dlqapp"]["by_error_class"].items():
            totals[cls] = totals.get(cls, 0) + n
    assert totals == {"auth_error": 3, "content_filter": 1}
    assert receiver.attempts == len(receiver.bodies) + 1  # the failed post was retried, nothing lost
    assert len(receiver.bodies) < 4  # batched, not one message per dead letter
    receiver.server.shutdown()
