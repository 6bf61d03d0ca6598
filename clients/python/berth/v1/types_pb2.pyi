import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IsolationPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ISOLATION_POLICY_UNSPECIFIED: _ClassVar[IsolationPolicy]
    ISOLATION_POLICY_PER_AGENT: _ClassVar[IsolationPolicy]
    ISOLATION_POLICY_PER_SESSION: _ClassVar[IsolationPolicy]
    ISOLATION_POLICY_PER_USER: _ClassVar[IsolationPolicy]
    ISOLATION_POLICY_GLOBAL: _ClassVar[IsolationPolicy]

class WorkspaceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKSPACE_STATE_UNSPECIFIED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_PROVISIONING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_READY: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_IDLE: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_LOST: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_FAILED: _ClassVar[WorkspaceState]

class WorkspaceOrigin(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKSPACE_ORIGIN_UNSPECIFIED: _ClassVar[WorkspaceOrigin]
    WORKSPACE_ORIGIN_FRESH: _ClassVar[WorkspaceOrigin]
    WORKSPACE_ORIGIN_RESUMED: _ClassVar[WorkspaceOrigin]
    WORKSPACE_ORIGIN_RESTORED: _ClassVar[WorkspaceOrigin]
    WORKSPACE_ORIGIN_RECREATED_EMPTY: _ClassVar[WorkspaceOrigin]

class FileKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_KIND_UNSPECIFIED: _ClassVar[FileKind]
    FILE_KIND_FILE: _ClassVar[FileKind]
    FILE_KIND_DIRECTORY: _ClassVar[FileKind]
    FILE_KIND_SYMLINK: _ClassVar[FileKind]
    FILE_KIND_OTHER: _ClassVar[FileKind]
ISOLATION_POLICY_UNSPECIFIED: IsolationPolicy
ISOLATION_POLICY_PER_AGENT: IsolationPolicy
ISOLATION_POLICY_PER_SESSION: IsolationPolicy
ISOLATION_POLICY_PER_USER: IsolationPolicy
ISOLATION_POLICY_GLOBAL: IsolationPolicy
WORKSPACE_STATE_UNSPECIFIED: WorkspaceState
WORKSPACE_STATE_PROVISIONING: WorkspaceState
WORKSPACE_STATE_READY: WorkspaceState
WORKSPACE_STATE_IDLE: WorkspaceState
WORKSPACE_STATE_LOST: WorkspaceState
WORKSPACE_STATE_FAILED: WorkspaceState
WORKSPACE_ORIGIN_UNSPECIFIED: WorkspaceOrigin
WORKSPACE_ORIGIN_FRESH: WorkspaceOrigin
WORKSPACE_ORIGIN_RESUMED: WorkspaceOrigin
WORKSPACE_ORIGIN_RESTORED: WorkspaceOrigin
WORKSPACE_ORIGIN_RECREATED_EMPTY: WorkspaceOrigin
FILE_KIND_UNSPECIFIED: FileKind
FILE_KIND_FILE: FileKind
FILE_KIND_DIRECTORY: FileKind
FILE_KIND_SYMLINK: FileKind
FILE_KIND_OTHER: FileKind

class WorkspaceSpec(_message.Message):
    __slots__ = ("image", "cpu_millis", "memory_bytes", "pids", "network", "env", "labels", "read_only_root", "file_size_bytes", "cpu_time_secs")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_ROOT_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_TIME_SECS_FIELD_NUMBER: _ClassVar[int]
    image: str
    cpu_millis: int
    memory_bytes: int
    pids: int
    network: bool
    env: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    read_only_root: bool
    file_size_bytes: int
    cpu_time_secs: int
    def __init__(self, image: _Optional[str] = ..., cpu_millis: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., pids: _Optional[int] = ..., network: _Optional[bool] = ..., env: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., read_only_root: _Optional[bool] = ..., file_size_bytes: _Optional[int] = ..., cpu_time_secs: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "workspace_id", "user_id", "agent_id", "created_at")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    workspace_id: str
    user_id: str
    agent_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("workspace_id", "owner_user_id", "agent_id", "policy", "backend", "spec", "state", "node_id", "generation", "created_at", "updated_at", "failure", "shared_with", "origin", "origin_reason", "origin_snapshot_id", "origin_snapshot_time", "origin_generation")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    SHARED_WITH_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_REASON_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SNAPSHOT_TIME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    owner_user_id: str
    agent_id: str
    policy: IsolationPolicy
    backend: str
    spec: WorkspaceSpec
    state: WorkspaceState
    node_id: str
    generation: int
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    failure: str
    shared_with: _containers.RepeatedScalarFieldContainer[str]
    origin: WorkspaceOrigin
    origin_reason: str
    origin_snapshot_id: str
    origin_snapshot_time: _timestamp_pb2.Timestamp
    origin_generation: int
    def __init__(self, workspace_id: _Optional[str] = ..., owner_user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., policy: _Optional[_Union[IsolationPolicy, str]] = ..., backend: _Optional[str] = ..., spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., state: _Optional[_Union[WorkspaceState, str]] = ..., node_id: _Optional[str] = ..., generation: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure: _Optional[str] = ..., shared_with: _Optional[_Iterable[str]] = ..., origin: _Optional[_Union[WorkspaceOrigin, str]] = ..., origin_reason: _Optional[str] = ..., origin_snapshot_id: _Optional[str] = ..., origin_snapshot_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin_generation: _Optional[int] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("workspace_id", "argv", "cwd", "env", "stdin", "timeout_ms", "max_output_bytes")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    stdin: bytes
    timeout_ms: int
    max_output_bytes: int
    def __init__(self, workspace_id: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., stdin: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., max_output_bytes: _Optional[int] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("exit_code", "stdout", "stderr", "timed_out", "stdout_truncated", "stderr_truncated", "duration_ms", "signal")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    signal: int
    def __init__(self, exit_code: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., timed_out: _Optional[bool] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., duration_ms: _Optional[int] = ..., signal: _Optional[int] = ...) -> None: ...

class ExecChunk(_message.Message):
    __slots__ = ("stdout", "stderr", "exit")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    exit: ExecResult
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., exit: _Optional[_Union[ExecResult, _Mapping]] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "chunk_size")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    chunk_size: int
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WriteFileHeader(_message.Message):
    __slots__ = ("workspace_id", "path", "mode")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    mode: int
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("header", "chunk", "commit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    header: WriteFileHeader
    chunk: bytes
    commit: WriteFileCommit
    def __init__(self, header: _Optional[_Union[WriteFileHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., commit: _Optional[_Union[WriteFileCommit, _Mapping]] = ...) -> None: ...

class WriteFileCommit(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "name", "kind", "size", "mode", "modified")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    kind: FileKind
    size: int
    mode: int
    modified: _timestamp_pb2.Timestamp
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[FileKind, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., modified: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListDirResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class RemovePathRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "recursive")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    recursive: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class RemovePathResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class MakeDirRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "parents")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    parents: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., parents: _Optional[bool] = ...) -> None: ...

class MakeDirResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
