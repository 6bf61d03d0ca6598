from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class McpValue(_message.Message):
    __slots__ = ("value", "secret")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    value: str
    secret: bool
    def __init__(self, value: _Optional[str] = ..., secret: _Optional[bool] = ...) -> None: ...

class McpStdio(_message.Message):
    __slots__ = ("command", "args", "env", "cwd", "sha256")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: McpValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[McpValue, _Mapping]] = ...) -> None: ...
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    command: str
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.MessageMap[str, McpValue]
    cwd: str
    sha256: str
    def __init__(self, command: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, McpValue]] = ..., cwd: _Optional[str] = ..., sha256: _Optional[str] = ...) -> None: ...

class McpHttp(_message.Message):
    __slots__ = ("url", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: McpValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[McpValue, _Mapping]] = ...) -> None: ...
    URL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    url: str
    headers: _containers.MessageMap[str, McpValue]
    def __init__(self, url: _Optional[str] = ..., headers: _Optional[_Mapping[str, McpValue]] = ...) -> None: ...

class McpServer(_message.Message):
    __slots__ = ("name", "stdio", "http")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STDIO_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    name: str
    stdio: McpStdio
    http: McpHttp
    def __init__(self, name: _Optional[str] = ..., stdio: _Optional[_Union[McpStdio, _Mapping]] = ..., http: _Optional[_Union[McpHttp, _Mapping]] = ...) -> None: ...

class AddMcpRequest(_message.Message):
    __slots__ = ("workspace_id", "server", "replace")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    server: McpServer
    replace: bool
    def __init__(self, workspace_id: _Optional[str] = ..., server: _Optional[_Union[McpServer, _Mapping]] = ..., replace: _Optional[bool] = ...) -> None: ...

class AddMcpResponse(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: McpServer
    def __init__(self, server: _Optional[_Union[McpServer, _Mapping]] = ...) -> None: ...

class RemoveMcpRequest(_message.Message):
    __slots__ = ("workspace_id", "name")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class RemoveMcpResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class ListMcpsRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class McpServerStatus(_message.Message):
    __slots__ = ("server", "live")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    server: McpServer
    live: bool
    def __init__(self, server: _Optional[_Union[McpServer, _Mapping]] = ..., live: _Optional[bool] = ...) -> None: ...

class ListMcpsResponse(_message.Message):
    __slots__ = ("servers", "reseeded")
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    RESEEDED_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[McpServerStatus]
    reseeded: bool
    def __init__(self, servers: _Optional[_Iterable[_Union[McpServerStatus, _Mapping]]] = ..., reseeded: _Optional[bool] = ...) -> None: ...

class ListMcpToolsRequest(_message.Message):
    __slots__ = ("workspace_id", "server", "timeout_ms")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    server: str
    timeout_ms: int
    def __init__(self, workspace_id: _Optional[str] = ..., server: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class McpTool(_message.Message):
    __slots__ = ("name", "description", "input_schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ...) -> None: ...

class ListMcpToolsResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[McpTool]
    def __init__(self, tools: _Optional[_Iterable[_Union[McpTool, _Mapping]]] = ...) -> None: ...

class CallMcpToolRequest(_message.Message):
    __slots__ = ("workspace_id", "server", "tool", "arguments_json", "timeout_ms")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    server: str
    tool: str
    arguments_json: str
    timeout_ms: int
    def __init__(self, workspace_id: _Optional[str] = ..., server: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class CallMcpToolResponse(_message.Message):
    __slots__ = ("is_error", "content_json", "structured_content_json", "text", "started", "duration_ms")
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    is_error: bool
    content_json: str
    structured_content_json: str
    text: str
    started: bool
    duration_ms: int
    def __init__(self, is_error: _Optional[bool] = ..., content_json: _Optional[str] = ..., structured_content_json: _Optional[str] = ..., text: _Optional[str] = ..., started: _Optional[bool] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class AddSkillHeader(_message.Message):
    __slots__ = ("workspace_id", "name", "replace")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    replace: bool
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ..., replace: _Optional[bool] = ...) -> None: ...

class AddSkillRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: AddSkillHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[AddSkillHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class SkillInfo(_message.Message):
    __slots__ = ("name", "description", "sha256", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    sha256: str
    path: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., sha256: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class AddSkillResponse(_message.Message):
    __slots__ = ("skill", "files", "bytes")
    SKILL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    skill: SkillInfo
    files: int
    bytes: int
    def __init__(self, skill: _Optional[_Union[SkillInfo, _Mapping]] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class RemoveSkillRequest(_message.Message):
    __slots__ = ("workspace_id", "name")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class RemoveSkillResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class ListSkillsRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class ListSkillsResponse(_message.Message):
    __slots__ = ("skills",)
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    skills: _containers.RepeatedCompositeFieldContainer[SkillInfo]
    def __init__(self, skills: _Optional[_Iterable[_Union[SkillInfo, _Mapping]]] = ...) -> None: ...

class GetSkillRequest(_message.Message):
    __slots__ = ("workspace_id", "name")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetSkillResponse(_message.Message):
    __slots__ = ("skill", "body")
    SKILL_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    skill: SkillInfo
    body: str
    def __init__(self, skill: _Optional[_Union[SkillInfo, _Mapping]] = ..., body: _Optional[str] = ...) -> None: ...

class OffloadContextRequest(_message.Message):
    __slots__ = ("workspace_id", "session_id", "messages_json")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    session_id: str
    messages_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workspace_id: _Optional[str] = ..., session_id: _Optional[str] = ..., messages_json: _Optional[_Iterable[str]] = ...) -> None: ...

class OffloadContextResponse(_message.Message):
    __slots__ = ("path", "messages", "bytes_appended", "data_refs")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_APPENDED_FIELD_NUMBER: _ClassVar[int]
    DATA_REFS_FIELD_NUMBER: _ClassVar[int]
    path: str
    messages: int
    bytes_appended: int
    data_refs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, path: _Optional[str] = ..., messages: _Optional[int] = ..., bytes_appended: _Optional[int] = ..., data_refs: _Optional[_Iterable[str]] = ...) -> None: ...

class OffloadToolResultRequest(_message.Message):
    __slots__ = ("workspace_id", "session_id", "tool_call_id", "content", "threshold_bytes", "preview_bytes")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    session_id: str
    tool_call_id: str
    content: bytes
    threshold_bytes: int
    preview_bytes: int
    def __init__(self, workspace_id: _Optional[str] = ..., session_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., content: _Optional[bytes] = ..., threshold_bytes: _Optional[int] = ..., preview_bytes: _Optional[int] = ...) -> None: ...

class OffloadToolResultResponse(_message.Message):
    __slots__ = ("offloaded", "path", "size_bytes", "head", "tail", "preview")
    OFFLOADED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    offloaded: bool
    path: str
    size_bytes: int
    head: str
    tail: str
    preview: str
    def __init__(self, offloaded: _Optional[bool] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., head: _Optional[str] = ..., tail: _Optional[str] = ..., preview: _Optional[str] = ...) -> None: ...

class UploadTreeHeader(_message.Message):
    __slots__ = ("workspace_id", "path", "overwrite")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    overwrite: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., overwrite: _Optional[bool] = ...) -> None: ...

class UploadTreeRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UploadTreeHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[UploadTreeHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class UploadTreeResponse(_message.Message):
    __slots__ = ("files", "directories", "symlinks", "bytes")
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIRECTORIES_FIELD_NUMBER: _ClassVar[int]
    SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    files: int
    directories: int
    symlinks: int
    bytes: int
    def __init__(self, files: _Optional[int] = ..., directories: _Optional[int] = ..., symlinks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class DownloadTreeRequest(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class TreeChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
