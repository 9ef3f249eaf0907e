"""How every Kafka client dlqapp makes connects: TLS, SASL, and the secrets they need.

One `KafkaSecurity` value, built from the DLQ_KAFKA_* settings and checked once at
start, gives the options of aiokafka's clients (`client_options`) and Faust's broker
credentials (`faust_credentials`), so the worker, the topic checks, the due hop, the
CLI and the maintenance commands all connect the same way. Values use Kafka's own names
(`SASL_SSL`, `SCRAM-SHA-512`). Passwords are kept as `Secret`s, which print as stars.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

log = logging.getLogger(__name__)


class Secret:
    """A password: `str()` and `repr()` show stars; `reveal()` gives the value to a client."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('********')" if self._value else "Secret('')"

    __str__ = __repr__


class SecurityError(ValueError):
    """An inconsistent or unusable Kafka security setting; the message names it."""


@dataclass(frozen=True)
class KafkaSecurity:
    """The DLQ_KAFKA_* security settings, consistent by construction (`check`)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: Secret = field(default_factory=lambda: Secret(""))
    password_file: str = ""
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def check(self) -> None:
        """Refuse combinations that cannot work, naming the setting to fix; load the files."""
        if self.protocol not in PROTOCOLS:
            raise SecurityError(f"DLQ_KAFKA_SECURITY_PROTOCOL={self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.uses_sasl:
            if not self.mechanism:
                raise SecurityError(
                    f"DLQ_KAFKA_SASL_MECHANISM is required with DLQ_KAFKA_SECURITY_PROTOCOL={self.protocol} "
                    f"(one of {', '.join(MECHANISMS)})"
                )
            if self.mechanism not in MECHANISMS:
                raise SecurityError(
                    f"DLQ_KAFKA_SASL_MECHANISM={self.mechanism!r} is not one of {', '.join(MECHANISMS)}"
                )
            if not self.username:
                raise SecurityError(
                    f"DLQ_KAFKA_SASL_USERNAME is required with DLQ_KAFKA_SASL_MECHANISM={self.mechanism}"
                )
            if self.password and self.password_file:
                raise SecurityError("set DLQ_KAFKA_SASL_PASSWORD or DLQ_KAFKA_SASL_PASSWORD_FILE, not both")
            if not self.password and not self.password_file:
                raise SecurityError(
                    "DLQ_KAFKA_SASL_PASSWORD or DLQ_KAFKA_SASL_PASSWORD_FILE is required with "
                    f"DLQ_KAFKA_SASL_MECHANISM={self.mechanism}"
                )
        else:
            for name, value in (
                ("DLQ_KAFKA_SASL_MECHANISM", self.mechanism),
                ("DLQ_KAFKA_SASL_USERNAME", self.username),
                ("DLQ_KAFKA_SASL_PASSWORD", self.password),
                ("DLQ_KAFKA_SASL_PASSWORD_FILE", self.password_file),
            ):
                if value:
                    raise SecurityError(
                        f"{name} is set but DLQ_KAFKA_SECURITY_PROTOCOL={self.protocol} uses no SASL: "
                        "set it to SASL_SSL or SASL_PLAINTEXT"
                    )
        if not self.uses_tls:
            for name, value in (
                ("DLQ_KAFKA_SSL_CAFILE", self.cafile),
                ("DLQ_KAFKA_SSL_CERTFILE", self.certfile),
                ("DLQ_KAFKA_SSL_KEYFILE", self.keyfile),
            ):
                if value:
                    raise SecurityError(
                        f"{name} is set but DLQ_KAFKA_SECURITY_PROTOCOL={self.protocol} uses no TLS: "
                        "set it to SSL or SASL_SSL"
                    )
        if bool(self.certfile) != bool(self.keyfile):
            raise SecurityError(
                "DLQ_KAFKA_SSL_CERTFILE and DLQ_KAFKA_SSL_KEYFILE go together "
                "(a client certificate and its private key)"
            )
        for name, path in (
            ("DLQ_KAFKA_SASL_PASSWORD_FILE", self.password_file),
            ("DLQ_KAFKA_SSL_CAFILE", self.cafile),
            ("DLQ_KAFKA_SSL_CERTFILE", self.certfile),
            ("DLQ_KAFKA_SSL_KEYFILE", self.keyfile),
        ):
            if path and not Path(path).is_file():
                raise SecurityError(f"{name}={path}: no such file")
        if self.uses_sasl and self.password_file and not self.sasl_password:
            raise SecurityError(f"DLQ_KAFKA_SASL_PASSWORD_FILE={self.password_file} is empty")
        self.ssl_context  # noqa: B018 - loads the CA, certificate and key now, so a bad file fails at start

    @cached_property
    def sasl_password(self) -> str:
        """The password, read from DLQ_KAFKA_SASL_PASSWORD_FILE when that is set (trailing newline dropped)."""
        if self.password_file:
            try:
                return Path(self.password_file).read_text().rstrip("\r\n")
            except OSError as exc:
                raise SecurityError(f"DLQ_KAFKA_SASL_PASSWORD_FILE={self.password_file}: {exc.strerror}") from None
        return self.password.reveal()

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of every client (None without TLS): the system's CAs or
        DLQ_KAFKA_SSL_CAFILE, a client certificate for mutual TLS, hostname checks on
        unless DLQ_KAFKA_SSL_CHECK_HOSTNAME=false."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.cafile or None)
        except (OSError, ssl.SSLError) as exc:
            raise SecurityError(f"DLQ_KAFKA_SSL_CAFILE={self.cafile}: not a PEM CA certificate ({exc})") from None
        if self.certfile:
            try:
                context.load_cert_chain(self.certfile, self.keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise SecurityError(
                    f"DLQ_KAFKA_SSL_CERTFILE={self.certfile} / DLQ_KAFKA_SSL_KEYFILE={self.keyfile}: "
                    f"not a PEM certificate and its key ({exc})"
                ) from None
        if not self.check_hostname:
            context.check_hostname = False
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of aiokafka's producer, consumer and admin client."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context
        if self.uses_sasl:
            options.update(
                sasl_mechanism=self.mechanism, sasl_plain_username=self.username, sasl_plain_password=self.sasl_password
            )
        return options

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials` (None on PLAINTEXT)."""
        import faust

        if self.uses_sasl:
            return faust.SASLCredentials(
                username=self.username,
                password=self.sasl_password,
                ssl_context=self.ssl_context,
                mechanism=self.mechanism,
            )
        if self.uses_tls:
            return faust.SSLCredentials(self.ssl_context)
        return None

    def describe(self) -> str:
        """How it connects, without secrets: `SASL_SSL SCRAM-SHA-512 as dlqapp`."""
        words = [self.protocol]
        if self.uses_sasl:
            words += [self.mechanism, f"as {self.username}"]
        if self.certfile:
            words.append("with a client certificate")
        if self.uses_tls and not self.check_hostname:
            words.append("without hostname verification")
        return " ".join(words)
