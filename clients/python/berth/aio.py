"""The asyncio Berth client: the same methods as :class:`berth.Client`, as coroutines.

.. code-block:: python

    import berth.aio

    async with berth.aio.Client("http://127.0.0.1:7070") as client:
        session = await client.create_session(user="alice", agent="coder")
        result = await client.exec(session.workspace_id, ["true"])

Channels are created lazily on the running event loop (a client belongs to that loop).
Streams: :meth:`Client.exec_stream`, :meth:`Client.read_file_stream` and
:meth:`Client.download_tree` are async iterators; :meth:`Client.write_file_stream` takes
an (async) iterable of chunks.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

import grpc
import grpc.aio

from berth.v1 import admin_pb2, admin_pb2_grpc, contract_pb2, contract_pb2_grpc, types_pb2, workspace_pb2
from berth.v1 import workspace_pb2_grpc

from . import _convert as conv
from . import _trees
from . import _types as t
from ._errors import NotFoundError, from_rpc_error
from ._transport import (
    DEFAULT_TIMEOUT,
    Deadline,
    EndpointRing,
    RetryPolicy,
    call_metadata,
    channel_options,
    credentials_for,
    parse_endpoints,
    read_ca,
    should_retry,
)

T = TypeVar("T")

_STUBS = {
    "workspace": workspace_pb2_grpc.WorkspaceServiceStub,
    "contract": contract_pb2_grpc.ContractServiceStub,
    "admin": admin_pb2_grpc.AdminServiceStub,
}


class _Channels:
    def __init__(self, endpoints: str | Sequence[str], ca_cert: str | bytes | None) -> None:
        self.ring = EndpointRing(parse_endpoints(endpoints))
        self._ca = read_ca(ca_cert)
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[int, str], Any] = {}

    def stub(self, index: int, service: str) -> Any:
        key = (index, service)
        if key not in self._stubs:
            channel = self._channels.get(index)
            if channel is None:
                endpoint = self.ring.endpoints[index]
                credentials = credentials_for(endpoint, self._ca)
                if credentials is None:
                    channel = grpc.aio.insecure_channel(endpoint.target, options=channel_options())
                else:
                    channel = grpc.aio.secure_channel(endpoint.target, credentials, options=channel_options())
                self._channels[index] = channel
            self._stubs[key] = _STUBS[service](channel)
        return self._stubs[key]

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close()


async def _aiter(chunks: Iterable[bytes] | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    if hasattr(chunks, "__aiter__"):
        async for chunk in chunks:  # type: ignore[union-attr]
            yield chunk
    else:
        for chunk in chunks:  # type: ignore[union-attr]
            yield chunk


class Client:
    """An asyncio client of a Berth cluster; arguments as :class:`berth.Client`."""

    def __init__(
        self,
        endpoint_or_endpoints: str | Sequence[str],
        *,
        token: str | None = None,
        act_as: str | None = None,
        ca_cert: str | bytes | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        _channels: _Channels | None = None,
    ) -> None:
        self._channels = _channels or _Channels(endpoint_or_endpoints, ca_cert)
        self._owns_channels = _channels is None
        self._token = token
        self._metadata = call_metadata(token, act_as)
        self.act_as = act_as
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    def with_act_as(self, user: str | None) -> "Client":
        """A client for the same cluster (same channels) acting for ``user``."""
        return Client([], token=self._token, act_as=user, timeout=self.timeout, retry=self.retry, _channels=self._channels)

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.url for endpoint in self._channels.ring.endpoints]

    async def close(self) -> None:
        if self._owns_channels:
            await self._channels.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- call machinery --------------------------------------------------------------------------

    async def _attempts(
        self, method: str, timeout: float | None, replayable: bool, attempt: Callable[[int, float], Awaitable[T]]
    ) -> T:
        deadline = Deadline(timeout if timeout is not None else self.timeout)
        ring = self._channels.ring
        index = ring.current()
        tries = 0
        while True:
            tries += 1
            try:
                return await attempt(index, deadline.remaining())
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error, ring.endpoints[index].url)
            decision = should_retry(error, method, replayable=replayable)
            if decision is None or tries >= self.retry.max_attempts * max(1, len(ring.endpoints)):
                raise error
            if decision == "failover":
                index = ring.advance(index)
                pause = 0.0 if tries < len(ring.endpoints) else self.retry.backoff(tries - len(ring.endpoints) + 1)
            else:
                pause = self.retry.backoff(tries)
            if not deadline.allows(pause):
                raise error
            if pause:
                await asyncio.sleep(pause)

    async def _unary(self, service: str, method: str, request: Any, timeout: float | None = None) -> Any:
        async def attempt(index: int, remaining: float) -> Any:
            call = getattr(self._channels.stub(index, service), method)
            return await call(request, timeout=remaining, metadata=self._metadata)

        return await self._attempts(method, timeout, True, attempt)

    async def _server_stream(self, service: str, method: str, request: Any, timeout: float | None = None) -> AsyncIterator[Any]:
        async def attempt(index: int, remaining: float) -> tuple[Any, Any]:
            call = getattr(self._channels.stub(index, service), method)(
                request, timeout=remaining, metadata=self._metadata
            )
            first = await call.read()
            return call, first

        call, first = await self._attempts(method, timeout, True, attempt)
        if first is grpc.aio.EOF:
            return
        yield first
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                yield message
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None
        finally:
            call.cancel()

    async def _client_stream(
        self, service: str, method: str, requests: Callable[[], Any], *, replayable: bool, timeout: float | None = None
    ) -> Any:
        async def attempt(index: int, remaining: float) -> Any:
            call = getattr(self._channels.stub(index, service), method)
            return await call(requests(), timeout=remaining, metadata=self._metadata)

        return await self._attempts(method, timeout, replayable, attempt)

    # ---- sessions and workspaces ------------------------------------------------------------------

    async def create_session(
        self,
        *,
        user: str | None = None,
        agent: str,
        session: str | None = None,
        backend: str | None = None,
        workspace_id: str | None = None,
        spec: t.WorkspaceSpec | None = None,
        timeout: float | None = None,
    ) -> t.Session:
        """See :meth:`berth.Client.create_session`."""
        request = workspace_pb2.CreateSessionRequest(
            user_id=user or "",
            agent_id=agent,
            session_id=session or "",
            workspace_id=workspace_id or "",
            backend=backend or "",
            spec=conv.spec(spec),
        )
        return conv.session(await self._unary("workspace", "CreateSession", request, timeout))

    async def get_session(self, session_id: str) -> t.Session:
        request = workspace_pb2.GetSessionRequest(session_id=session_id)
        return conv.session(await self._unary("workspace", "GetSession", request))

    async def close_session(self, session_id: str) -> None:
        await self._unary("workspace", "CloseSession", workspace_pb2.CloseSessionRequest(session_id=session_id))

    async def get_workspace(self, workspace_id: str) -> t.Workspace:
        request = workspace_pb2.GetWorkspaceRequest(workspace_id=workspace_id)
        return conv.workspace(await self._unary("workspace", "GetWorkspace", request))

    async def list_workspaces(self, *, user: str | None = None, agent: str | None = None) -> list[t.Workspace]:
        found: list[t.Workspace] = []
        token = ""
        while True:
            request = workspace_pb2.ListWorkspacesRequest(
                user_id=user or "", agent_id=agent or "", page_size=1000, page_token=token
            )
            response = await self._unary("workspace", "ListWorkspaces", request)
            found.extend(conv.workspace(item) for item in response.workspaces)
            token = response.next_page_token
            if not token:
                return found

    async def close_workspace(self, workspace_id: str, *, destroy: bool = False) -> None:
        request = workspace_pb2.CloseWorkspaceRequest(workspace_id=workspace_id, destroy=destroy)
        await self._unary("workspace", "CloseWorkspace", request)

    async def share_workspace(self, workspace_id: str, user: str) -> t.Workspace:
        request = workspace_pb2.ShareWorkspaceRequest(workspace_id=workspace_id, user_id=user)
        return conv.workspace(await self._unary("workspace", "ShareWorkspace", request))

    async def unshare_workspace(self, workspace_id: str, user: str) -> t.Workspace:
        request = workspace_pb2.UnshareWorkspaceRequest(workspace_id=workspace_id, user_id=user)
        return conv.workspace(await self._unary("workspace", "UnshareWorkspace", request))

    # ---- exec ------------------------------------------------------------------------------

    async def exec(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> t.ExecResult:
        """See :meth:`berth.Client.exec`."""
        request = conv.exec_request(
            workspace_id, argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output_bytes=max_output_bytes
        )
        deadline = (timeout if timeout is not None else DEFAULT_TIMEOUT) + 30.0
        return conv.exec_result(await self._unary("workspace", "Exec", request, deadline))

    async def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[t.ExecEvent]:
        request = conv.exec_request(
            workspace_id, argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output_bytes=max_output_bytes
        )
        deadline = (timeout if timeout is not None else DEFAULT_TIMEOUT) + 30.0
        async for message in self._server_stream("workspace", "ExecStream", request, deadline):
            yield conv.exec_event(message)

    # ---- files -------------------------------------------------------------------------------

    async def read_file_stream(self, workspace_id: str, path: str, *, chunk_size: int = 0) -> AsyncIterator[bytes]:
        request = types_pb2.ReadFileRequest(workspace_id=workspace_id, path=path, chunk_size=chunk_size)
        async for message in self._server_stream("workspace", "ReadFile", request):
            yield message.data

    async def read_file(self, workspace_id: str, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.read_file_stream(workspace_id, path)])

    async def write_file(self, workspace_id: str, path: str, data: bytes, *, mode: int = 0) -> int:
        payload = bytes(data)
        response = await self._client_stream(
            "workspace",
            "WriteFile",
            lambda: conv.write_messages(workspace_id, path, conv.split(payload), mode),
            replayable=True,
        )
        return response.bytes_written

    async def write_file_stream(
        self, workspace_id: str, path: str, chunks: Iterable[bytes] | AsyncIterable[bytes], *, mode: int = 0
    ) -> int:
        """Writes a stream of chunks atomically; a stream is sent once (no retry after send)."""

        async def requests() -> AsyncIterator[Any]:
            yield types_pb2.WriteFileRequest(
                header=types_pb2.WriteFileHeader(workspace_id=workspace_id, path=path, mode=mode)
            )
            total = 0
            async for chunk in _aiter(chunks):
                if chunk:
                    total += len(chunk)
                    yield types_pb2.WriteFileRequest(chunk=bytes(chunk))
            yield types_pb2.WriteFileRequest(commit=types_pb2.WriteFileCommit(size=total))

        response = await self._client_stream("workspace", "WriteFile", requests, replayable=False)
        return response.bytes_written

    async def stat(self, workspace_id: str, path: str) -> t.FileInfo:
        request = types_pb2.StatRequest(workspace_id=workspace_id, path=path)
        return conv.file_info(await self._unary("workspace", "Stat", request))

    async def exists(self, workspace_id: str, path: str) -> bool:
        try:
            await self.stat(workspace_id, path)
        except NotFoundError:
            return False
        return True

    async def ls(self, workspace_id: str, path: str = "") -> list[t.FileInfo]:
        request = types_pb2.ListDirRequest(workspace_id=workspace_id, path=path)
        return [conv.file_info(entry) for entry in (await self._unary("workspace", "ListDir", request)).entries]

    list_dir = ls

    async def rm(self, workspace_id: str, path: str, *, recursive: bool = False) -> bool:
        request = types_pb2.RemovePathRequest(workspace_id=workspace_id, path=path, recursive=recursive)
        return (await self._unary("workspace", "RemovePath", request)).existed

    async def mkdir(self, workspace_id: str, path: str, *, parents: bool = True) -> None:
        request = types_pb2.MakeDirRequest(workspace_id=workspace_id, path=path, parents=parents)
        await self._unary("workspace", "MakeDir", request)

    # ---- trees -------------------------------------------------------------------------------

    async def upload_tree(self, workspace_id: str, path: str, archive: bytes, *, overwrite: bool = False) -> t.TreeStats:
        payload = bytes(archive)

        def requests() -> Any:
            header = contract_pb2.UploadTreeHeader(workspace_id=workspace_id, path=path, overwrite=overwrite)
            yield contract_pb2.UploadTreeRequest(header=header)
            for chunk in conv.split(payload):
                yield contract_pb2.UploadTreeRequest(chunk=chunk)

        return conv.tree_stats(await self._client_stream("contract", "UploadTree", requests, replayable=True))

    async def download_tree(self, workspace_id: str, path: str = "") -> AsyncIterator[bytes]:
        request = contract_pb2.DownloadTreeRequest(workspace_id=workspace_id, path=path)
        async for message in self._server_stream("contract", "DownloadTree", request):
            yield message.data

    async def push(self, workspace_id: str, local_dir: str | os.PathLike[str], path: str = "", *, overwrite: bool = True) -> t.TreeStats:
        archive = await asyncio.to_thread(_trees.pack_bytes, local_dir)
        return await self.upload_tree(workspace_id, path, archive, overwrite=overwrite)

    async def pull(self, workspace_id: str, path: str, local_dir: str | os.PathLike[str]) -> int:
        chunks = [chunk async for chunk in self.download_tree(workspace_id, path)]
        return await asyncio.to_thread(_trees.unpack, chunks, local_dir)

    # ---- MCP -----------------------------------------------------------------------------------

    async def add_mcp(self, workspace_id: str, server: t.McpServer, *, replace: bool = False) -> t.McpServer:
        request = contract_pb2.AddMcpRequest(workspace_id=workspace_id, server=conv.mcp_server(server), replace=replace)
        return conv.mcp_server_from((await self._unary("contract", "AddMcp", request)).server)

    async def remove_mcp(self, workspace_id: str, name: str) -> bool:
        request = contract_pb2.RemoveMcpRequest(workspace_id=workspace_id, name=name)
        return (await self._unary("contract", "RemoveMcp", request)).existed

    async def list_mcps(self, workspace_id: str) -> list[t.McpServerStatus]:
        response = await self._unary("contract", "ListMcps", contract_pb2.ListMcpsRequest(workspace_id=workspace_id))
        return [t.McpServerStatus(conv.mcp_server_from(item.server), item.live) for item in response.servers]

    async def list_mcp_tools(self, workspace_id: str, server: str, *, timeout: float | None = None) -> list[t.McpTool]:
        request = contract_pb2.ListMcpToolsRequest(
            workspace_id=workspace_id, server=server, timeout_ms=int((timeout or 0) * 1000)
        )
        response = await self._unary("contract", "ListMcpTools", request, (timeout or DEFAULT_TIMEOUT) + 30.0)
        return [conv.mcp_tool(tool) for tool in response.tools]

    async def call_mcp_tool(
        self,
        workspace_id: str,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> t.McpCallResult:
        request = contract_pb2.CallMcpToolRequest(
            workspace_id=workspace_id,
            server=server,
            tool=tool,
            arguments_json=json.dumps(dict(arguments or {})),
            timeout_ms=int((timeout or 0) * 1000),
        )
        response = await self._unary("contract", "CallMcpTool", request, (timeout or DEFAULT_TIMEOUT) + 30.0)
        return conv.mcp_call(response)

    # ---- skills ------------------------------------------------------------------------------

    async def add_skill(self, workspace_id: str, archive: bytes, *, name: str = "", replace: bool = False) -> t.AddedSkill:
        payload = bytes(archive)

        def requests() -> Any:
            header = contract_pb2.AddSkillHeader(workspace_id=workspace_id, name=name, replace=replace)
            yield contract_pb2.AddSkillRequest(header=header)
            for chunk in conv.split(payload):
                yield contract_pb2.AddSkillRequest(chunk=chunk)

        response = await self._client_stream("contract", "AddSkill", requests, replayable=True)
        return t.AddedSkill(conv.skill_info(response.skill), response.files, response.bytes)

    async def add_skill_dir(
        self, workspace_id: str, local_dir: str | os.PathLike[str], *, name: str = "", replace: bool = False
    ) -> t.AddedSkill:
        archive = await asyncio.to_thread(_trees.pack_bytes, local_dir)
        return await self.add_skill(workspace_id, archive, name=name, replace=replace)

    async def remove_skill(self, workspace_id: str, name: str) -> bool:
        request = contract_pb2.RemoveSkillRequest(workspace_id=workspace_id, name=name)
        return (await self._unary("contract", "RemoveSkill", request)).existed

    async def list_skills(self, workspace_id: str) -> list[t.SkillInfo]:
        request = contract_pb2.ListSkillsRequest(workspace_id=workspace_id)
        return [conv.skill_info(skill) for skill in (await self._unary("contract", "ListSkills", request)).skills]

    async def get_skill(self, workspace_id: str, name: str) -> t.Skill:
        request = contract_pb2.GetSkillRequest(workspace_id=workspace_id, name=name)
        response = await self._unary("contract", "GetSkill", request)
        return t.Skill(conv.skill_info(response.skill), response.body)

    # ---- offload -----------------------------------------------------------------------------

    async def offload_context(self, workspace_id: str, session_id: str, messages: Sequence[Any]) -> t.ContextOffloaded:
        encoded = [item if isinstance(item, str) else json.dumps(item) for item in messages]
        request = contract_pb2.OffloadContextRequest(
            workspace_id=workspace_id, session_id=session_id, messages_json=encoded
        )
        response = await self._unary("contract", "OffloadContext", request)
        return t.ContextOffloaded(response.path, response.messages, response.bytes_appended, tuple(response.data_refs))

    async def offload_tool_result(
        self,
        workspace_id: str,
        session_id: str,
        tool_call_id: str,
        content: bytes | str,
        *,
        threshold_bytes: int = 0,
        preview_bytes: int = 0,
    ) -> t.ToolResultOffloaded:
        data = content.encode() if isinstance(content, str) else bytes(content)
        request = contract_pb2.OffloadToolResultRequest(
            workspace_id=workspace_id,
            session_id=session_id,
            tool_call_id=tool_call_id,
            content=data,
            threshold_bytes=threshold_bytes,
            preview_bytes=preview_bytes,
        )
        r = await self._unary("contract", "OffloadToolResult", request)
        return t.ToolResultOffloaded(r.offloaded, r.path, r.size_bytes, r.head, r.tail, r.preview)

    # ---- admin -------------------------------------------------------------------------------

    async def list_nodes(self) -> list[t.NodeInfo]:
        response = await self._unary("admin", "ListNodes", admin_pb2.ListNodesRequest())
        return [conv.node_info(node) for node in response.nodes]

    async def status(self) -> t.ClusterStatus:
        return conv.cluster_status(await self._unary("admin", "GetClusterStatus", admin_pb2.GetClusterStatusRequest()))

    async def drain_node(self, node_id: str, *, force: bool = False) -> list[str]:
        response = await self._unary("admin", "DrainNode", admin_pb2.DrainNodeRequest(node_id=node_id, force=force))
        return [item.workspace_id for item in response.released]

    async def undrain_node(self, node_id: str) -> bool:
        return (await self._unary("admin", "UndrainNode", admin_pb2.UndrainNodeRequest(node_id=node_id))).was_drained


__all__ = ["Client"]
