"""Plain result types of the Berth client (frozen dataclasses, no gRPC types leak out)."""

from __future__ import annotations

import datetime as _dt
import enum
from dataclasses import dataclass, field
from typing import Mapping


class IsolationPolicy(str, enum.Enum):
    """How ``(user, agent, session)`` maps to a workspace id (a replica's ``--isolation``)."""

    UNSPECIFIED = "unspecified"
    PER_AGENT = "per_agent"
    PER_SESSION = "per_session"
    PER_USER = "per_user"
    GLOBAL = "global"


class WorkspaceState(str, enum.Enum):
    UNSPECIFIED = "unspecified"
    PROVISIONING = "provisioning"
    READY = "ready"
    IDLE = "idle"
    LOST = "lost"
    FAILED = "failed"


class WorkspaceOrigin(str, enum.Enum):
    """How the copy of a workspace came to be: a client can tell one that came back empty."""

    UNSPECIFIED = "unspecified"
    FRESH = "fresh"
    RESUMED = "resumed"
    RESTORED = "restored"
    RECREATED_EMPTY = "recreated_empty"


class FileKind(str, enum.Enum):
    UNSPECIFIED = "unspecified"
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


@dataclass(frozen=True)
class WorkspaceSpec:
    """What the sandbox of a workspace looks like; zero values mean "node default"."""

    image: str = ""
    cpu_millis: int = 0
    memory_bytes: int = 0
    pids: int = 0
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    read_only_root: bool = False
    file_size_bytes: int = 0
    cpu_time_secs: int = 0


@dataclass(frozen=True)
class Session:
    session_id: str
    workspace_id: str
    user_id: str
    agent_id: str
    created_at: _dt.datetime | None


@dataclass(frozen=True)
class Workspace:
    workspace_id: str
    owner_user_id: str
    agent_id: str
    policy: IsolationPolicy
    backend: str
    state: WorkspaceState
    node_id: str
    generation: int
    created_at: _dt.datetime | None
    updated_at: _dt.datetime | None
    failure: str
    shared_with: tuple[str, ...]
    origin: WorkspaceOrigin
    origin_reason: str
    #: The generation at which the current files began: the same value before a write and
    #: after a read means no placement in between lost the files.
    origin_generation: int = 0


@dataclass(frozen=True)
class ExecResult:
    """The outcome of a command. A timeout is a result (``timed_out``), not an exception."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    signal: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ExecEvent:
    """One event of a streamed exec: an output chunk, or (last) the exit."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit: ExecResult | None = None


@dataclass(frozen=True)
class FileInfo:
    path: str
    name: str
    kind: FileKind
    size: int
    mode: int
    modified: _dt.datetime | None

    @property
    def is_dir(self) -> bool:
        return self.kind is FileKind.DIRECTORY

    @property
    def is_file(self) -> bool:
        return self.kind is FileKind.FILE


@dataclass(frozen=True)
class McpStdio:
    """A stdio MCP server started inside the workspace's sandbox.

    ``secret_env`` values are kept in the node's private store and never reach the
    workspace; a workspace-path ``command`` with secrets needs its ``sha256`` pin.
    """

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    sha256: str = ""


@dataclass(frozen=True)
class McpHttp:
    """A streamable-HTTP MCP server, connected from the node agent (SSRF-guarded)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    secret_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class McpServer:
    name: str
    transport: McpStdio | McpHttp


@dataclass(frozen=True)
class McpServerStatus:
    server: McpServer
    live: bool


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema_json: str


@dataclass(frozen=True)
class McpCallResult:
    is_error: bool
    content_json: str
    structured_content_json: str
    text: str
    started: bool
    duration_ms: int


@dataclass(frozen=True)
class SkillInfo:
    name: str
    description: str
    sha256: str
    path: str


@dataclass(frozen=True)
class AddedSkill:
    skill: SkillInfo
    files: int
    bytes: int


@dataclass(frozen=True)
class Skill:
    info: SkillInfo
    body: str


@dataclass(frozen=True)
class ContextOffloaded:
    path: str
    messages: int
    bytes_appended: int
    data_refs: tuple[str, ...]


@dataclass(frozen=True)
class ToolResultOffloaded:
    offloaded: bool
    path: str
    size_bytes: int
    head: str
    tail: str
    preview: str


@dataclass(frozen=True)
class TreeStats:
    files: int
    directories: int
    symlinks: int
    bytes: int


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    backends: tuple[str, ...]
    labels: Mapping[str, str]
    workspaces: int
    state: str
    last_heartbeat: _dt.datetime | None
    version: str
    replica_id: str


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    address: str
    started_at: _dt.datetime | None


@dataclass(frozen=True)
class RegistryHealth:
    registry: str
    healthy: bool
    read_latency_micros: int
    error: str


@dataclass(frozen=True)
class ClusterStatus:
    answered_by: str
    replicas: tuple[ReplicaInfo, ...]
    nodes: tuple[NodeInfo, ...]
    workspaces: Mapping[tuple[str, str], int]
    registry: RegistryHealth
    drained_nodes: tuple[str, ...]
