"""Endpoints, credentials and the retry decision shared by the sync and asyncio clients.

A client holds a list of replica endpoints. Calls go to the current one; a call that
provably never reached a replica (connection refused, unresolvable) moves to the next
endpoint and is tried there. A call the server marked retryable (``x-berth-retryable``)
is repeated with backoff within its deadline. A read-only call whose transport broke
after it was sent may be repeated too; any other call that may have reached a replica is
never repeated: the error is raised to the caller.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import grpc

from ._errors import ACT_AS_KEY, BerthError, never_sent, transport_failure

#: Replicas accept up to 32 MiB messages; file data is chunked far below that.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Default deadline of a call that has no deadline of its own.
DEFAULT_TIMEOUT = 60.0

#: The RPCs that change nothing (the server names them so, docs/design.md §5): a broken
#: transport after send may be retried for these only.
READ_ONLY_PREFIXES = ("Get", "List", "Read", "Stat", "Watch", "Download")


@dataclass(frozen=True)
class Endpoint:
    """One replica address: ``target`` for gRPC and whether it speaks TLS."""

    url: str
    target: str
    tls: bool


def parse_endpoint(url: str) -> Endpoint:
    """``http://host:port`` (plaintext), ``https://host:port`` (TLS) or ``host:port``."""
    text = url.strip()
    if not text:
        raise ValueError("empty endpoint")
    tls = False
    if text.startswith("https://"):
        tls, text = True, text[len("https://") :]
    elif text.startswith("http://"):
        text = text[len("http://") :]
    text = text.rstrip("/")
    if "/" in text or ":" not in text:
        raise ValueError(f"endpoint {url!r} is not [http[s]://]host:port")
    return Endpoint(url=url.strip(), target=text, tls=tls)


def parse_endpoints(endpoints: str | Sequence[str]) -> list[Endpoint]:
    """A comma-separated string or a sequence of endpoint URLs."""
    if isinstance(endpoints, str):
        items = [item for item in endpoints.split(",") if item.strip()]
    else:
        items = list(endpoints)
    if not items:
        raise ValueError("at least one endpoint is needed")
    return [parse_endpoint(item) for item in items]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast calls are repeated (always within the call's deadline)."""

    max_attempts: int = 6
    initial_backoff: float = 0.05
    max_backoff: float = 1.0

    def backoff(self, attempt: int) -> float:
        base = min(self.max_backoff, self.initial_backoff * (2 ** max(0, attempt - 1)))
        return base * (0.5 + random.random() / 2)


def read_only(method: str) -> bool:
    return method.startswith(READ_ONLY_PREFIXES)


def should_retry(error: BerthError, method: str, *, replayable: bool = True) -> str | None:
    """``"failover"`` (try the next endpoint now), ``"retry"`` (back off, then try again) or None.

    ``replayable`` is False for a stream whose requests cannot be produced again.
    """
    if never_sent(error):
        return "failover"
    if not replayable:
        return None
    if error.retryable:
        return "retry"
    if read_only(method) and (transport_failure(error) or error.code is grpc.StatusCode.DEADLINE_EXCEEDED):
        return "failover"
    return None


class EndpointRing:
    """The endpoints and which one is current; thread-safe, shared by all calls of a client."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self._current = 0
        self._lock = threading.Lock()

    def current(self) -> int:
        with self._lock:
            return self._current

    def advance(self, failed: int) -> int:
        """Moves past ``failed`` (unless another call already did) and returns the new index."""
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self.endpoints)
            return self._current


def channel_options() -> list[tuple[str, object]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Fail fast on a dead replica instead of waiting out the deadline in reconnects.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 0),
        ("grpc.keepalive_time_ms", 30_000),
    ]


def read_ca(ca_cert: str | bytes | None) -> bytes | None:
    """PEM bytes from a path or the PEM itself."""
    if ca_cert is None:
        return None
    if isinstance(ca_cert, bytes):
        return ca_cert
    if ca_cert.lstrip().startswith("-----BEGIN"):
        return ca_cert.encode()
    with open(ca_cert, "rb") as handle:
        return handle.read()


def credentials_for(endpoint: Endpoint, ca_pem: bytes | None) -> grpc.ChannelCredentials | None:
    """TLS credentials for an https endpoint (or any endpoint when a CA is given)."""
    if endpoint.tls or ca_pem is not None:
        return grpc.ssl_channel_credentials(root_certificates=ca_pem)
    return None


def call_metadata(token: str | None, act_as: str | None) -> tuple[tuple[str, str], ...]:
    """The bearer token and act-as header every call carries."""
    metadata: list[tuple[str, str]] = []
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    if act_as:
        metadata.append((ACT_AS_KEY, act_as))
    return tuple(metadata)


class Deadline:
    """An absolute deadline for a call and its retries."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.expires = time.monotonic() + self.timeout

    def remaining(self) -> float:
        return max(0.0, self.expires - time.monotonic())

    def allows(self, pause: float) -> bool:
        return self.remaining() > pause + 0.01
