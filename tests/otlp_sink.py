"""A small OTLP/HTTP endpoint: `POST /v1/traces` with protobuf bodies, as a collector receives
them, decoded with opentelemetry-proto; for the traces test and the bench's trace_cost."""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    """One span as an OTLP exporter sent it, ids as lowercase hex."""

    name: str
    start_ns: int
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    links: list[tuple[str, str, dict[str, Any]]]
    """(trace id, span id, attributes) of each link."""
    resource: dict[str, Any]

    @property
    def traceparent_prefix(self) -> str:
        """`00-<trace id>-<span id>-`: what a record this span wrote starts its traceparent with."""
        return f"00-{self.trace_id}-{self.span_id}-"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class OtlpSink:
    """Runs on a thread until `stop()`; `spans` holds every span received, `posts` counts requests.

    With `decode=False` it only counts bodies (the bench, where decoding would cost the
    machine CPU that the worker should get)."""

    decode: bool = True
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0
    bytes_received: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> OtlpSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                sink.received(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def endpoint(self) -> str:
        """The base URL (OTEL_EXPORTER_OTLP_ENDPOINT); the exporter adds `/v1/traces`."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def received(self, body: bytes) -> None:
        spans: list[ReceivedSpan] = []
        if self.decode:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            ReceivedSpan(
                                name=span.name,
                                start_ns=span.start_time_unix_nano,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                attributes=_attributes(span.attributes),
                                status_code=span.status.code,
                                status_message=span.status.message,
                                links=[
                                    (li.trace_id.hex(), li.span_id.hex(), _attributes(li.attributes))
                                    for li in span.links
                                ],
                                resource=resource,
                            )
                        )
        with self._lock:
            self.posts += 1
            self.bytes_received += len(body)
            self.spans.extend(spans)

    def of_request(self, request_id: str) -> list[ReceivedSpan]:
        """The spans of one request, in the order they started."""
        with self._lock:
            found = [s for s in self.spans if s.attributes.get("dlqapp.request_id") == request_id]
        return sorted(found, key=lambda s: s.start_ns)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
