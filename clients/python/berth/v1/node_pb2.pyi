import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from berth.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeMessage(_message.Message):
    __slots__ = ("register", "report")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    report: HeartbeatReport
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., report: _Optional[_Union[HeartbeatReport, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "address", "backends", "default_backend", "labels", "version", "lease_id", "node_generation", "capacity_workspaces", "workspaces", "key_prefix", "snapshots")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    backends: _containers.RepeatedScalarFieldContainer[str]
    default_backend: str
    labels: _containers.ScalarMap[str, str]
    version: str
    lease_id: int
    node_generation: int
    capacity_workspaces: int
    workspaces: _containers.RepeatedCompositeFieldContainer[LocalWorkspace]
    key_prefix: str
    snapshots: bool
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., backends: _Optional[_Iterable[str]] = ..., default_backend: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ..., lease_id: _Optional[int] = ..., node_generation: _Optional[int] = ..., capacity_workspaces: _Optional[int] = ..., workspaces: _Optional[_Iterable[_Union[LocalWorkspace, _Mapping]]] = ..., key_prefix: _Optional[str] = ..., snapshots: _Optional[bool] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("workspaces", "running", "execs_in_flight", "load_avg_1m", "mem_available_bytes")
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXECS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LOAD_AVG_1M_FIELD_NUMBER: _ClassVar[int]
    MEM_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    workspaces: int
    running: int
    execs_in_flight: int
    load_avg_1m: float
    mem_available_bytes: int
    def __init__(self, workspaces: _Optional[int] = ..., running: _Optional[int] = ..., execs_in_flight: _Optional[int] = ..., load_avg_1m: _Optional[float] = ..., mem_available_bytes: _Optional[int] = ...) -> None: ...

class LocalWorkspace(_message.Message):
    __slots__ = ("workspace_id", "generation", "backend", "running", "last_access_unix_ms", "idle_for_ms", "execs_in_flight", "mcp_clients_live")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCESS_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    EXECS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MCP_CLIENTS_LIVE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    generation: int
    backend: str
    running: bool
    last_access_unix_ms: int
    idle_for_ms: int
    execs_in_flight: int
    mcp_clients_live: int
    def __init__(self, workspace_id: _Optional[str] = ..., generation: _Optional[int] = ..., backend: _Optional[str] = ..., running: _Optional[bool] = ..., last_access_unix_ms: _Optional[int] = ..., idle_for_ms: _Optional[int] = ..., execs_in_flight: _Optional[int] = ..., mcp_clients_live: _Optional[int] = ...) -> None: ...

class HeartbeatReport(_message.Message):
    __slots__ = ("seq", "load", "workspaces", "snapshots")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    load: NodeLoad
    workspaces: _containers.RepeatedCompositeFieldContainer[LocalWorkspace]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotTaken]
    def __init__(self, seq: _Optional[int] = ..., load: _Optional[_Union[NodeLoad, _Mapping]] = ..., workspaces: _Optional[_Iterable[_Union[LocalWorkspace, _Mapping]]] = ..., snapshots: _Optional[_Iterable[_Union[SnapshotTaken, _Mapping]]] = ...) -> None: ...

class SnapshotTaken(_message.Message):
    __slots__ = ("workspace_id", "snapshot_id", "generation", "created_unix_ms", "files", "bytes", "uploaded_bytes", "deduplicated_bytes", "duration_ms")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    snapshot_id: str
    generation: int
    created_unix_ms: int
    files: int
    bytes: int
    uploaded_bytes: int
    deduplicated_bytes: int
    duration_ms: int
    def __init__(self, workspace_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., generation: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., uploaded_bytes: _Optional[int] = ..., deduplicated_bytes: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class SnapshotRefused(_message.Message):
    __slots__ = ("workspace_id", "snapshot_id", "generation", "record_generation", "reason")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RECORD_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    snapshot_id: str
    generation: int
    record_generation: int
    reason: str
    def __init__(self, workspace_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., generation: _Optional[int] = ..., record_generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("registered", "ack", "fence", "command", "snapshot_refused")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REFUSED_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    ack: HeartbeatAck
    fence: Fence
    command: NodeCommand
    snapshot_refused: SnapshotRefused
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., fence: _Optional[_Union[Fence, _Mapping]] = ..., command: _Optional[_Union[NodeCommand, _Mapping]] = ..., snapshot_refused: _Optional[_Union[SnapshotRefused, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("lease_id", "node_generation", "lease_ttl_ms", "heartbeat_interval_ms", "replica_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    node_generation: int
    lease_ttl_ms: int
    heartbeat_interval_ms: int
    replica_id: str
    def __init__(self, lease_id: _Optional[int] = ..., node_generation: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., replica_id: _Optional[str] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("seq", "lease_ttl_ms")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    lease_ttl_ms: int
    def __init__(self, seq: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class Fence(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class NodeCommand(_message.Message):
    __slots__ = ("destroy_stale",)
    DESTROY_STALE_FIELD_NUMBER: _ClassVar[int]
    destroy_stale: DestroyStale
    def __init__(self, destroy_stale: _Optional[_Union[DestroyStale, _Mapping]] = ...) -> None: ...

class DestroyStale(_message.Message):
    __slots__ = ("workspace_id", "generation")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    generation: int
    def __init__(self, workspace_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class ListLabelledRequest(_message.Message):
    __slots__ = ("backend",)
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    backend: str
    def __init__(self, backend: _Optional[str] = ...) -> None: ...

class LabelledSandbox(_message.Message):
    __slots__ = ("provider_id", "workspace_id", "generation", "created_at_unix_ms")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    workspace_id: str
    generation: int
    created_at_unix_ms: int
    def __init__(self, provider_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., generation: _Optional[int] = ..., created_at_unix_ms: _Optional[int] = ...) -> None: ...

class ListLabelledResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[LabelledSandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[LabelledSandbox, _Mapping]]] = ...) -> None: ...

class RemoveLabelledRequest(_message.Message):
    __slots__ = ("backend", "sandbox")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    backend: str
    sandbox: LabelledSandbox
    def __init__(self, backend: _Optional[str] = ..., sandbox: _Optional[_Union[LabelledSandbox, _Mapping]] = ...) -> None: ...

class RemoveLabelledResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQuarantineRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QuarantineEntry(_message.Message):
    __slots__ = ("entry", "workspace_id", "generation", "backend", "reason", "quarantined_at", "bytes")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_AT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    entry: str
    workspace_id: str
    generation: int
    backend: str
    reason: str
    quarantined_at: _timestamp_pb2.Timestamp
    bytes: int
    def __init__(self, entry: _Optional[str] = ..., workspace_id: _Optional[str] = ..., generation: _Optional[int] = ..., backend: _Optional[str] = ..., reason: _Optional[str] = ..., quarantined_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bytes: _Optional[int] = ...) -> None: ...

class ListQuarantineResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[QuarantineEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[QuarantineEntry, _Mapping]]] = ...) -> None: ...

class RestoreQuarantineRequest(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: str
    def __init__(self, entry: _Optional[str] = ...) -> None: ...

class RestoreQuarantineResponse(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ProvisionRequest(_message.Message):
    __slots__ = ("workspace_id", "generation", "backend", "spec", "fresh", "owner", "restore_snapshots", "restore_required")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESTORE_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    generation: int
    backend: str
    spec: _types_pb2.WorkspaceSpec
    fresh: bool
    owner: str
    restore_snapshots: _containers.RepeatedScalarFieldContainer[str]
    restore_required: bool
    def __init__(self, workspace_id: _Optional[str] = ..., generation: _Optional[int] = ..., backend: _Optional[str] = ..., spec: _Optional[_Union[_types_pb2.WorkspaceSpec, _Mapping]] = ..., fresh: _Optional[bool] = ..., owner: _Optional[str] = ..., restore_snapshots: _Optional[_Iterable[str]] = ..., restore_required: _Optional[bool] = ...) -> None: ...

class ProvisionResponse(_message.Message):
    __slots__ = ("created", "backend", "restored", "restore_failures")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    created: bool
    backend: str
    restored: SnapshotTaken
    restore_failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, created: _Optional[bool] = ..., backend: _Optional[str] = ..., restored: _Optional[_Union[SnapshotTaken, _Mapping]] = ..., restore_failures: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: SnapshotTaken
    def __init__(self, snapshot: _Optional[_Union[SnapshotTaken, _Mapping]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class DestroyRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class DestroyResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class ListLocalRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLocalResponse(_message.Message):
    __slots__ = ("workspaces",)
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    workspaces: _containers.RepeatedCompositeFieldContainer[LocalWorkspace]
    def __init__(self, workspaces: _Optional[_Iterable[_Union[LocalWorkspace, _Mapping]]] = ...) -> None: ...
