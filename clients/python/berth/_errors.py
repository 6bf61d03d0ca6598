"""Typed exceptions for Berth calls, mapped once from gRPC statuses.

Every failed call raises a :class:`BerthError` subclass chosen by the status code. The
server's retry facts travel as status metadata (``x-berth-retryable``, ``x-berth-error``)
and are exposed as :attr:`BerthError.retryable` and :attr:`BerthError.kind`; the client
retries only calls the server marked retryable, or calls that provably never reached a
replica (the connection was refused).
"""

from __future__ import annotations

from typing import Any

import grpc

#: Status metadata: "true" when the same call may succeed if retried.
RETRYABLE_KEY = "x-berth-retryable"
#: Status metadata: a stable, machine-readable error kind.
ERROR_KIND_KEY = "x-berth-error"
#: Request metadata: act for this user (a service principal allowed to act for users).
ACT_AS_KEY = "x-berth-act-as"


class BerthError(Exception):
    """A Berth call failed.

    Attributes:
        code: the gRPC status code.
        message: the server's message (or the transport's, when no server answered).
        retryable: the server marked the call as safe to repeat.
        kind: the stable error kind from ``x-berth-error`` (``limit-exceeded``,
            ``path-escapes-root``, ``wrong-generation``, ``node-fenced``,
            ``stale-generation``, ``mcp-server-failed``), or ``None``.
        endpoint: the replica that answered (or failed to).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        retryable: bool = False,
        kind: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retryable = retryable
        self.kind = kind
        self.endpoint = endpoint

    def __str__(self) -> str:
        name = self.code.name.lower().replace("_", " ") if self.code else "error"
        return f"{name}: {self.message}"


class CancelledError(BerthError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(BerthError):
    """The outcome is unknown (e.g. the node may have run the call): do not blindly retry."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(BerthError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(BerthError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(BerthError):
    """The workspace, session, file or node does not exist, or the caller may not see it."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(BerthError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(BerthError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(BerthError):
    """A budget or quota is used up right now (``kind == "limit-exceeded"``)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(BerthError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(BerthError):
    code = grpc.StatusCode.ABORTED


class OutOfRangeError(BerthError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(BerthError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(BerthError):
    code = grpc.StatusCode.INTERNAL


class UnavailableError(BerthError):
    """No replica answered, or the server is temporarily unable to serve (often retryable)."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(BerthError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(BerthError):
    """The token is missing, unknown or expired."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[BerthError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}

# Transport messages of a call that never left this process: no replica saw it, so any
# call may go to the next endpoint. Anything else after a send is ambiguous.
_NOT_SENT_MARKERS = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "dns resolution failed",
    "name resolution",
    "no route to host",
)


def _metadata(error: grpc.RpcError) -> dict[str, str]:
    trailing: Any = None
    try:
        trailing = error.trailing_metadata()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a transport error may carry none
        trailing = None
    found: dict[str, str] = {}
    for key, value in trailing or ():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        found[key.lower()] = value
    return found


def from_rpc_error(error: grpc.RpcError, endpoint: str | None = None) -> BerthError:
    """The typed exception for a failed gRPC call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = error.details() if hasattr(error, "details") else str(error)  # type: ignore[attr-defined]
    metadata = _metadata(error)
    cls = _BY_CODE.get(code, BerthError)
    return cls(
        details or code.name,
        code=code,
        retryable=metadata.get(RETRYABLE_KEY) == "true",
        kind=metadata.get(ERROR_KIND_KEY),
        endpoint=endpoint,
    )


def never_sent(error: BerthError) -> bool:
    """True when the call provably never reached a replica (connect failures only).

    A server-side answer always carries metadata or a server message; a refused or
    unresolvable connection is reported by the gRPC core with one of a few phrases.
    """
    if error.code is not grpc.StatusCode.UNAVAILABLE or error.kind is not None or error.retryable:
        return False
    text = error.message.lower()
    return any(marker in text for marker in _NOT_SENT_MARKERS)


def transport_failure(error: BerthError) -> bool:
    """True for an UNAVAILABLE the transport reported (not a server's answer)."""
    return error.code is grpc.StatusCode.UNAVAILABLE and error.kind is None and not error.retryable
