"""The OpenTelemetry variables dlqapp reads itself: which span exporters (OTEL_TRACES_EXPORTER)
and, for `otlp`, which protocol. Everything else an exporter or the SDK needs (the endpoint,
headers, sampler, batch sizes, resource attributes) the OpenTelemetry SDK reads from the
environment on its own, as in any program that uses it.

Exporters are found like the SDK finds them: by name among the installed packages' entry
points in the group `opentelemetry_traces_exporter` (`console` ships with the SDK,
`otlp_proto_http` with the OTLP/HTTP exporter, `otlp_proto_grpc` with the gRPC one).
"""

from __future__ import annotations

from importlib.metadata import entry_points

EXPORTER_GROUP = "opentelemetry_traces_exporter"
OTLP = "otlp"
PROTOCOLS = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
"""OTLP protocol → the exporter's entry point name."""
DEFAULT_PROTOCOL = "http/protobuf"
"""The OpenTelemetry specification's default (the Python SDK's own configurator defaults to grpc,
whose exporter dlqapp does not install)."""


def installed_exporters() -> set[str]:
    """Names of the span exporters installed (entry points of `opentelemetry_traces_exporter`)."""
    return {ep.name for ep in entry_points(group=EXPORTER_GROUP)}


def parse_exporters(text: str) -> tuple[str, ...]:
    """OTEL_TRACES_EXPORTER: a comma-separated list of exporter names; `none` (or nothing) exports
    nothing. `otlp` and `console` are always known; another name must be an installed exporter."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip() and n.strip() != "none"))
    unknown = [n for n in names if n not in (OTLP, "console")]
    if unknown:
        installed = installed_exporters()
        missing = [n for n in unknown if n not in installed]
        if missing:
            known = ", ".join(sorted({OTLP, "console", "none", *installed}))
            raise ValueError(f"no span exporter named {', '.join(missing)} is installed (known: {known})")
    return names


def parse_protocol(text: str) -> str:
    """OTEL_EXPORTER_OTLP_PROTOCOL and its traces-only twin: `http/protobuf` or `grpc` (empty: unset)."""
    value = text.strip().lower()
    if value == "http/json":
        raise ValueError("'http/json' has no OpenTelemetry Python exporter: use http/protobuf")
    if value and value not in PROTOCOLS:
        raise ValueError(f"{text!r} is not one of: {', '.join(PROTOCOLS)}")
    return value


def exporter_entry_points(exporters: tuple[str, ...], protocol: str) -> tuple[str, ...]:
    """The entry point name of each exporter: `otlp` becomes the one of `protocol`.

    Raises ValueError when the protocol's exporter is not installed (grpc, without
    opentelemetry-exporter-otlp-proto-grpc)."""
    names = tuple(PROTOCOLS[protocol] if name == OTLP else name for name in exporters)
    if OTLP in exporters and PROTOCOLS[protocol] not in installed_exporters():
        package = "opentelemetry-exporter-otlp-proto-" + ("grpc" if protocol == "grpc" else "http")
        raise ValueError(f"the {protocol} OTLP exporter is not installed ({package}); use http/protobuf")
    return names
