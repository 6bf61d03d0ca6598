import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from berth.v1 import node_pb2 as _node_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_LIVE: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_LIVE: NodeState
NODE_STATE_DRAINING: NodeState

class AdminListQuarantineRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class AdminRestoreQuarantineRequest(_message.Message):
    __slots__ = ("node_id", "entry")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    entry: str
    def __init__(self, node_id: _Optional[str] = ..., entry: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "address", "backends", "labels", "workspaces", "last_heartbeat", "state", "load", "version", "node_generation", "replica_id")
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
    LABELS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    backends: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    workspaces: int
    last_heartbeat: _timestamp_pb2.Timestamp
    state: NodeState
    load: _node_pb2.NodeLoad
    version: str
    node_generation: int
    replica_id: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., backends: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., workspaces: _Optional[int] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[NodeState, str]] = ..., load: _Optional[_Union[_node_pb2.NodeLoad, _Mapping]] = ..., version: _Optional[str] = ..., node_generation: _Optional[int] = ..., replica_id: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "address", "started_at")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkspaceCount(_message.Message):
    __slots__ = ("state", "backend", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: str
    backend: str
    count: int
    def __init__(self, state: _Optional[str] = ..., backend: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class RegistryHealth(_message.Message):
    __slots__ = ("registry", "healthy", "read_latency_micros", "error")
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    READ_LATENCY_MICROS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    registry: str
    healthy: bool
    read_latency_micros: int
    error: str
    def __init__(self, registry: _Optional[str] = ..., healthy: _Optional[bool] = ..., read_latency_micros: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("answered_by", "replicas", "nodes", "workspaces", "registry", "drained_nodes")
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    DRAINED_NODES_FIELD_NUMBER: _ClassVar[int]
    answered_by: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    workspaces: _containers.RepeatedCompositeFieldContainer[WorkspaceCount]
    registry: RegistryHealth
    drained_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, answered_by: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., workspaces: _Optional[_Iterable[_Union[WorkspaceCount, _Mapping]]] = ..., registry: _Optional[_Union[RegistryHealth, _Mapping]] = ..., drained_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "force")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    force: bool
    def __init__(self, node_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DrainedWorkspace(_message.Message):
    __slots__ = ("workspace_id", "state", "owner")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    state: str
    owner: str
    def __init__(self, workspace_id: _Optional[str] = ..., state: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("released", "moved")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    released: _containers.RepeatedCompositeFieldContainer[DrainedWorkspace]
    moved: _containers.RepeatedCompositeFieldContainer[DrainProgress]
    def __init__(self, released: _Optional[_Iterable[_Union[DrainedWorkspace, _Mapping]]] = ..., moved: _Optional[_Iterable[_Union[DrainProgress, _Mapping]]] = ...) -> None: ...

class DrainProgress(_message.Message):
    __slots__ = ("index", "total", "workspace_id", "to_node_id", "snapshot_id", "bytes", "uploaded_bytes", "duration_ms", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    total: int
    workspace_id: str
    to_node_id: str
    snapshot_id: str
    bytes: int
    uploaded_bytes: int
    duration_ms: int
    error: str
    def __init__(self, index: _Optional[int] = ..., total: _Optional[int] = ..., workspace_id: _Optional[str] = ..., to_node_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., bytes: _Optional[int] = ..., uploaded_bytes: _Optional[int] = ..., duration_ms: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UndrainNodeResponse(_message.Message):
    __slots__ = ("was_drained",)
    WAS_DRAINED_FIELD_NUMBER: _ClassVar[int]
    was_drained: bool
    def __init__(self, was_drained: _Optional[bool] = ...) -> None: ...
