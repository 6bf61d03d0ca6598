"""Berth's Python client.

- :class:`berth.Client` — synchronous; :class:`berth.aio.Client` — asyncio, same methods.
- Typed results (:class:`ExecResult`, :class:`Session`, :class:`FileInfo`, …) and typed
  exceptions (:class:`BerthError` and one subclass per gRPC status code).
- :mod:`berth.agentscope` (extra ``berth-client[agentscope]``) and :mod:`berth.openhands`
  (extra ``berth-client[openhands]``): drop-in workspaces for those frameworks.
"""

from ._errors import (
    AbortedError,
    AlreadyExistsError,
    BerthError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from ._transport import RetryPolicy
from ._types import (
    AddedSkill,
    ClusterStatus,
    ContextOffloaded,
    ExecEvent,
    ExecResult,
    FileInfo,
    FileKind,
    IsolationPolicy,
    McpCallResult,
    McpHttp,
    McpServer,
    McpServerStatus,
    McpStdio,
    McpTool,
    NodeInfo,
    Session,
    Skill,
    SkillInfo,
    ToolResultOffloaded,
    TreeStats,
    Workspace,
    WorkspaceOrigin,
    WorkspaceSpec,
    WorkspaceState,
)
from .client import Client
from . import aio

__version__ = "0.1.0"

__all__ = [
    "AbortedError",
    "AddedSkill",
    "AlreadyExistsError",
    "BerthError",
    "CancelledError",
    "Client",
    "ClusterStatus",
    "ContextOffloaded",
    "DataLossError",
    "DeadlineExceededError",
    "ExecEvent",
    "ExecResult",
    "FailedPreconditionError",
    "FileInfo",
    "FileKind",
    "InternalError",
    "InvalidArgumentError",
    "IsolationPolicy",
    "McpCallResult",
    "McpHttp",
    "McpServer",
    "McpServerStatus",
    "McpStdio",
    "McpTool",
    "NodeInfo",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RetryPolicy",
    "Session",
    "Skill",
    "SkillInfo",
    "ToolResultOffloaded",
    "TreeStats",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "Workspace",
    "WorkspaceOrigin",
    "WorkspaceSpec",
    "WorkspaceState",
    "aio",
]
