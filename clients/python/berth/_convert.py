"""Conversions between the wire messages (berth.v1) and the client's types."""

from __future__ import annotations

import datetime as _dt
from typing import Iterable, Iterator, Mapping

from berth.v1 import admin_pb2, contract_pb2, types_pb2, workspace_pb2

from . import _types as t

#: File data is sent in chunks of this size (the replica's message limit is far larger).
CHUNK_SIZE = 256 * 1024


def timestamp(value: object) -> _dt.datetime | None:
    if value is None or not getattr(value, "seconds", 0) and not getattr(value, "nanos", 0):
        return None
    return value.ToDatetime(tzinfo=_dt.timezone.utc)  # type: ignore[attr-defined]


def _enum(enum_cls: type, proto_enum: object, number: int, prefix: str):
    name = proto_enum.Name(number)  # type: ignore[attr-defined]
    try:
        return enum_cls(name[len(prefix) :].lower())
    except ValueError:
        return enum_cls("unspecified")


def session(message: types_pb2.Session) -> t.Session:
    return t.Session(
        session_id=message.session_id,
        workspace_id=message.workspace_id,
        user_id=message.user_id,
        agent_id=message.agent_id,
        created_at=timestamp(message.created_at),
    )


def workspace(message: types_pb2.Workspace) -> t.Workspace:
    return t.Workspace(
        workspace_id=message.workspace_id,
        owner_user_id=message.owner_user_id,
        agent_id=message.agent_id,
        policy=_enum(t.IsolationPolicy, types_pb2.IsolationPolicy, message.policy, "ISOLATION_POLICY_"),
        backend=message.backend,
        state=_enum(t.WorkspaceState, types_pb2.WorkspaceState, message.state, "WORKSPACE_STATE_"),
        node_id=message.node_id,
        generation=message.generation,
        created_at=timestamp(message.created_at),
        updated_at=timestamp(message.updated_at),
        failure=message.failure,
        shared_with=tuple(message.shared_with),
        origin=_enum(t.WorkspaceOrigin, types_pb2.WorkspaceOrigin, message.origin, "WORKSPACE_ORIGIN_"),
        origin_reason=message.origin_reason,
        origin_generation=message.origin_generation,
    )


def spec(value: t.WorkspaceSpec | None) -> types_pb2.WorkspaceSpec | None:
    if value is None:
        return None
    return types_pb2.WorkspaceSpec(
        image=value.image,
        cpu_millis=value.cpu_millis,
        memory_bytes=value.memory_bytes,
        pids=value.pids,
        network=value.network,
        env=dict(value.env),
        labels=dict(value.labels),
        read_only_root=value.read_only_root,
        file_size_bytes=value.file_size_bytes,
        cpu_time_secs=value.cpu_time_secs,
    )


def exec_result(message: types_pb2.ExecResult, stdout: bytes | None = None, stderr: bytes | None = None) -> t.ExecResult:
    return t.ExecResult(
        exit_code=message.exit_code,
        stdout=message.stdout if stdout is None else stdout,
        stderr=message.stderr if stderr is None else stderr,
        timed_out=message.timed_out,
        stdout_truncated=message.stdout_truncated,
        stderr_truncated=message.stderr_truncated,
        duration_ms=message.duration_ms,
        signal=message.signal,
    )


def exec_event(message: types_pb2.ExecChunk) -> t.ExecEvent:
    which = message.WhichOneof("kind")
    if which == "stdout":
        return t.ExecEvent(stdout=message.stdout)
    if which == "stderr":
        return t.ExecEvent(stderr=message.stderr)
    return t.ExecEvent(exit=exec_result(message.exit))


def exec_request(
    workspace_id: str,
    argv: Iterable[str],
    *,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | None,
    max_output_bytes: int | None,
) -> types_pb2.ExecRequest:
    argv = [str(arg) for arg in argv]
    if not argv:
        raise ValueError("argv must name a program")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return types_pb2.ExecRequest(
        workspace_id=workspace_id,
        argv=argv,
        cwd=cwd or "",
        env=dict(env or {}),
        stdin=stdin or b"",
        # Round up: a 0.2 s timeout must not become 0 (= the server default).
        timeout_ms=0 if timeout is None else max(1, int(timeout * 1000 + 0.999)),
        max_output_bytes=max_output_bytes or 0,
    )


def file_info(message: types_pb2.FileInfo) -> t.FileInfo:
    return t.FileInfo(
        path=message.path,
        name=message.name,
        kind=_enum(t.FileKind, types_pb2.FileKind, message.kind, "FILE_KIND_"),
        size=message.size,
        mode=message.mode,
        modified=timestamp(message.modified),
    )


def write_messages(workspace_id: str, path: str, chunks: Iterable[bytes], mode: int) -> Iterator[types_pb2.WriteFileRequest]:
    """Header, chunks, then the commit naming the total: the file appears only on commit."""
    yield types_pb2.WriteFileRequest(header=types_pb2.WriteFileHeader(workspace_id=workspace_id, path=path, mode=mode))
    total = 0
    for chunk in chunks:
        if not chunk:
            continue
        total += len(chunk)
        yield types_pb2.WriteFileRequest(chunk=bytes(chunk))
    yield types_pb2.WriteFileRequest(commit=types_pb2.WriteFileCommit(size=total))


def split(data: bytes, size: int = CHUNK_SIZE) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start : start + size])


# ---- MCP ---------------------------------------------------------------------------------


def _values(plain: Mapping[str, str], secret: Mapping[str, str]) -> dict[str, contract_pb2.McpValue]:
    values = {key: contract_pb2.McpValue(value=value) for key, value in plain.items()}
    for key, value in secret.items():
        values[key] = contract_pb2.McpValue(value=value, secret=True)
    return values


def mcp_server(server: t.McpServer) -> contract_pb2.McpServer:
    transport = server.transport
    if isinstance(transport, t.McpStdio):
        return contract_pb2.McpServer(
            name=server.name,
            stdio=contract_pb2.McpStdio(
                command=transport.command,
                args=list(transport.args),
                env=_values(transport.env, transport.secret_env),
                cwd=transport.cwd,
                sha256=transport.sha256,
            ),
        )
    if isinstance(transport, t.McpHttp):
        return contract_pb2.McpServer(
            name=server.name,
            http=contract_pb2.McpHttp(url=transport.url, headers=_values(transport.headers, transport.secret_headers)),
        )
    raise TypeError(f"unknown MCP transport {type(transport).__name__}")


def _split_values(values: Mapping[str, contract_pb2.McpValue]) -> tuple[dict[str, str], dict[str, str]]:
    plain = {key: value.value for key, value in values.items() if not value.secret}
    secret = {key: value.value for key, value in values.items() if value.secret}
    return plain, secret


def mcp_server_from(message: contract_pb2.McpServer) -> t.McpServer:
    if message.WhichOneof("transport") == "http":
        headers, secret_headers = _split_values(message.http.headers)
        return t.McpServer(message.name, t.McpHttp(message.http.url, headers, secret_headers))
    env, secret_env = _split_values(message.stdio.env)
    stdio = message.stdio
    return t.McpServer(
        message.name, t.McpStdio(stdio.command, tuple(stdio.args), env, secret_env, stdio.cwd, stdio.sha256)
    )


def mcp_tool(message: contract_pb2.McpTool) -> t.McpTool:
    return t.McpTool(message.name, message.description, message.input_schema_json)


def mcp_call(message: contract_pb2.CallMcpToolResponse) -> t.McpCallResult:
    return t.McpCallResult(
        is_error=message.is_error,
        content_json=message.content_json,
        structured_content_json=message.structured_content_json,
        text=message.text,
        started=message.started,
        duration_ms=message.duration_ms,
    )


# ---- skills, offload, trees, admin -----------------------------------------------------------


def skill_info(message: contract_pb2.SkillInfo) -> t.SkillInfo:
    return t.SkillInfo(message.name, message.description, message.sha256, message.path)


def tree_stats(message: contract_pb2.UploadTreeResponse) -> t.TreeStats:
    return t.TreeStats(message.files, message.directories, message.symlinks, message.bytes)


def node_info(message: admin_pb2.NodeInfo) -> t.NodeInfo:
    return t.NodeInfo(
        node_id=message.node_id,
        address=message.address,
        backends=tuple(message.backends),
        labels=dict(message.labels),
        workspaces=message.workspaces,
        state=admin_pb2.NodeState.Name(message.state)[len("NODE_STATE_") :].lower(),
        last_heartbeat=timestamp(message.last_heartbeat),
        version=message.version,
        replica_id=message.replica_id,
    )


def cluster_status(message: admin_pb2.ClusterStatus) -> t.ClusterStatus:
    return t.ClusterStatus(
        answered_by=message.answered_by,
        replicas=tuple(t.ReplicaInfo(r.replica_id, r.address, timestamp(r.started_at)) for r in message.replicas),
        nodes=tuple(node_info(node) for node in message.nodes),
        workspaces={(count.state, count.backend): count.count for count in message.workspaces},
        registry=t.RegistryHealth(
            message.registry.registry,
            message.registry.healthy,
            message.registry.read_latency_micros,
            message.registry.error,
        ),
        drained_nodes=tuple(message.drained_nodes),
    )


__all__ = ["workspace_pb2"]
