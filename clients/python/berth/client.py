"""The synchronous Berth client.

.. code-block:: python

    import berth

    with berth.Client("http://127.0.0.1:7070") as client:
        session = client.create_session(user="alice", agent="coder")
        result = client.exec(session.workspace_id, ["sh", "-c", "echo hi; exit 3"])
        assert result.exit_code == 3 and result.stdout == b"hi\\n"

Every method raises a :class:`berth.BerthError` subclass on failure. See
:mod:`berth._transport` for which calls are retried or moved to the next replica.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import grpc

from berth.v1 import admin_pb2, admin_pb2_grpc, contract_pb2, contract_pb2_grpc, types_pb2, workspace_pb2
from berth.v1 import workspace_pb2_grpc

from . import _convert as conv
from . import _trees
from . import _types as t
from ._errors import BerthError, NotFoundError, from_rpc_error
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
    """One lazily created channel (and its stubs) per endpoint, shared by derived clients."""

    def __init__(self, endpoints: str | Sequence[str], ca_cert: str | bytes | None) -> None:
        self.ring = EndpointRing(parse_endpoints(endpoints))
        self._ca = read_ca(ca_cert)
        self._lock = threading.Lock()
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[tuple[int, str], Any] = {}

    def stub(self, index: int, service: str) -> Any:
        with self._lock:
            key = (index, service)
            if key not in self._stubs:
                channel = self._channels.get(index)
                if channel is None:
                    endpoint = self.ring.endpoints[index]
                    credentials = credentials_for(endpoint, self._ca)
                    if credentials is None:
                        channel = grpc.insecure_channel(endpoint.target, options=channel_options())
                    else:
                        channel = grpc.secure_channel(endpoint.target, credentials, options=channel_options())
                    self._channels[index] = channel
                self._stubs[key] = _STUBS[service](channel)
            return self._stubs[key]

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()


class Client:
    """A synchronous client of a Berth cluster.

    Args:
        endpoint_or_endpoints: one replica URL (``http://host:7070``, ``https://…`` for
            TLS), a comma-separated list, or a sequence of them. Calls fail over across
            them.
        token: bearer token (``--auth token`` / ``--auth jwt``); ``None`` for ``--auth none``.
        act_as: the user a service principal acts for (``x-berth-act-as``).
        ca_cert: CA certificate (a PEM path or PEM bytes) that signed the replicas'
            certificates; implies TLS.
        timeout: default deadline (seconds) of a call and its retries.
        retry: how often and how fast retryable calls are repeated.
    """

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
        self._act_as = act_as
        self._metadata = call_metadata(token, act_as)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    # ---- lifecycle ---------------------------------------------------------------------------

    def with_act_as(self, user: str | None) -> "Client":
        """A client for the same cluster (same channels) acting for ``user``."""
        return Client(
            [],
            token=self._token,
            act_as=user,
            timeout=self.timeout,
            retry=self.retry,
            _channels=self._channels,
        )

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.url for endpoint in self._channels.ring.endpoints]

    def close(self) -> None:
        """Closes the channels (a client made by :meth:`with_act_as` leaves them open)."""
        if self._owns_channels:
            self._channels.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- call machinery --------------------------------------------------------------------------

    def _attempts(self, method: str, timeout: float | None, replayable: bool, attempt: Callable[[int, float], T]) -> T:
        """Runs ``attempt(endpoint index, remaining seconds)`` with failover and retries."""
        deadline = Deadline(timeout if timeout is not None else self.timeout)
        ring = self._channels.ring
        index = ring.current()
        tries = 0
        while True:
            tries += 1
            try:
                return attempt(index, deadline.remaining())
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
                time.sleep(pause)

    def _unary(self, service: str, method: str, request: Any, timeout: float | None = None) -> Any:
        def attempt(index: int, remaining: float) -> Any:
            call = getattr(self._channels.stub(index, service), method)
            return call(request, timeout=remaining, metadata=self._metadata)

        return self._attempts(method, timeout, True, attempt)

    def _server_stream(self, service: str, method: str, request: Any, timeout: float | None = None) -> Iterator[Any]:
        """Yields the messages; a failure before the first one is retried like a unary call."""

        def attempt(index: int, remaining: float) -> tuple[Any, Any]:
            call = getattr(self._channels.stub(index, service), method)(
                request, timeout=remaining, metadata=self._metadata
            )
            first = next(call, None)
            return call, first

        call, first = self._attempts(method, timeout, True, attempt)
        if first is None:
            return
        try:
            yield first
            yield from call
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None
        finally:
            # A consumer that stops early (or fails) ends the call instead of leaving it open.
            call.cancel()

    def _client_stream(
        self,
        service: str,
        method: str,
        requests: Callable[[], Iterator[Any]],
        *,
        replayable: bool,
        timeout: float | None = None,
    ) -> Any:
        def attempt(index: int, remaining: float) -> Any:
            call = getattr(self._channels.stub(index, service), method)
            return call(requests(), timeout=remaining, metadata=self._metadata)

        return self._attempts(method, timeout, replayable, attempt)

    # ---- sessions and workspaces ------------------------------------------------------------------

    def create_session(
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
        """Binds ``(user, agent, session)`` to a workspace and waits until it is READY.

        The workspace follows the replicas' isolation policy unless ``workspace_id`` names
        one to join (or a new non-policy one to create). However many callers race on the
        first request, they get one workspace. ``user`` defaults to the caller's own user
        (or ``act_as``); ``session`` is minted by the server when omitted.
        """
        request = workspace_pb2.CreateSessionRequest(
            user_id=user or "",
            agent_id=agent,
            session_id=session or "",
            workspace_id=workspace_id or "",
            backend=backend or "",
            spec=conv.spec(spec),
        )
        return conv.session(self._unary("workspace", "CreateSession", request, timeout))

    def get_session(self, session_id: str) -> t.Session:
        return conv.session(self._unary("workspace", "GetSession", workspace_pb2.GetSessionRequest(session_id=session_id)))

    def close_session(self, session_id: str) -> None:
        """Deletes the session binding only; the workspace stays."""
        self._unary("workspace", "CloseSession", workspace_pb2.CloseSessionRequest(session_id=session_id))

    def get_workspace(self, workspace_id: str) -> t.Workspace:
        request = workspace_pb2.GetWorkspaceRequest(workspace_id=workspace_id)
        return conv.workspace(self._unary("workspace", "GetWorkspace", request))

    def list_workspaces(self, *, user: str | None = None, agent: str | None = None) -> list[t.Workspace]:
        """Every workspace the caller may see (all pages), optionally filtered."""
        found: list[t.Workspace] = []
        token = ""
        while True:
            request = workspace_pb2.ListWorkspacesRequest(
                user_id=user or "", agent_id=agent or "", page_size=1000, page_token=token
            )
            response = self._unary("workspace", "ListWorkspaces", request)
            found.extend(conv.workspace(item) for item in response.workspaces)
            token = response.next_page_token
            if not token:
                return found

    def close_workspace(self, workspace_id: str, *, destroy: bool = False) -> None:
        """Stops the runtime (IDLE, data kept) or, with ``destroy``, removes it and its data."""
        request = workspace_pb2.CloseWorkspaceRequest(workspace_id=workspace_id, destroy=destroy)
        self._unary("workspace", "CloseWorkspace", request)

    def share_workspace(self, workspace_id: str, user: str) -> t.Workspace:
        request = workspace_pb2.ShareWorkspaceRequest(workspace_id=workspace_id, user_id=user)
        return conv.workspace(self._unary("workspace", "ShareWorkspace", request))

    def unshare_workspace(self, workspace_id: str, user: str) -> t.Workspace:
        request = workspace_pb2.UnshareWorkspaceRequest(workspace_id=workspace_id, user_id=user)
        return conv.workspace(self._unary("workspace", "UnshareWorkspace", request))

    # ---- exec ------------------------------------------------------------------------------

    @staticmethod
    def _exec_deadline(timeout: float | None) -> float:
        # The call's deadline outlives the command's own timeout, so a timeout comes back
        # as a result (timed_out) rather than a DEADLINE_EXCEEDED.
        return (timeout if timeout is not None else DEFAULT_TIMEOUT) + 30.0

    def exec(
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
        """Runs ``argv`` (no shell unless argv asks for one) in the workspace.

        ``timeout`` (seconds; server default 60 s) kills the process tree and returns
        ``timed_out=True`` with exit code -1. ``cwd`` is relative to the workspace root.
        """
        request = conv.exec_request(
            workspace_id, argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output_bytes=max_output_bytes
        )
        return conv.exec_result(self._unary("workspace", "Exec", request, self._exec_deadline(timeout)))

    def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[t.ExecEvent]:
        """Like :meth:`exec`, yielding output chunks as they come, then one ``exit`` event."""
        request = conv.exec_request(
            workspace_id, argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output_bytes=max_output_bytes
        )
        for message in self._server_stream("workspace", "ExecStream", request, self._exec_deadline(timeout)):
            yield conv.exec_event(message)

    # ---- files -------------------------------------------------------------------------------

    def read_file_stream(self, workspace_id: str, path: str, *, chunk_size: int = 0) -> Iterator[bytes]:
        """The file's bytes in chunks (NotFoundError when absent)."""
        request = types_pb2.ReadFileRequest(workspace_id=workspace_id, path=path, chunk_size=chunk_size)
        for message in self._server_stream("workspace", "ReadFile", request):
            yield message.data

    def read_file(self, workspace_id: str, path: str) -> bytes:
        """The whole file (NotFoundError when absent)."""
        return b"".join(self.read_file_stream(workspace_id, path))

    def write_file(self, workspace_id: str, path: str, data: bytes, *, mode: int = 0) -> int:
        """Writes ``data`` atomically (old content or all of the new), creating parents."""
        payload = bytes(data)
        response = self._client_stream(
            "workspace",
            "WriteFile",
            lambda: conv.write_messages(workspace_id, path, conv.split(payload), mode),
            replayable=True,
        )
        return response.bytes_written

    def write_file_stream(self, workspace_id: str, path: str, chunks: Iterable[bytes], *, mode: int = 0) -> int:
        """Writes a stream of chunks atomically; the file appears only when all arrived."""
        used = []

        def requests() -> Iterator[Any]:
            if used:
                raise RuntimeError("a write stream cannot be replayed")
            used.append(True)
            return conv.write_messages(workspace_id, path, chunks, mode)

        return self._client_stream("workspace", "WriteFile", requests, replayable=False).bytes_written

    def stat(self, workspace_id: str, path: str) -> t.FileInfo:
        return conv.file_info(self._unary("workspace", "Stat", types_pb2.StatRequest(workspace_id=workspace_id, path=path)))

    def exists(self, workspace_id: str, path: str) -> bool:
        try:
            self.stat(workspace_id, path)
        except NotFoundError:
            return False
        return True

    def ls(self, workspace_id: str, path: str = "") -> list[t.FileInfo]:
        """The entries of a directory (empty path = the workspace root)."""
        request = types_pb2.ListDirRequest(workspace_id=workspace_id, path=path)
        return [conv.file_info(entry) for entry in self._unary("workspace", "ListDir", request).entries]

    list_dir = ls

    def rm(self, workspace_id: str, path: str, *, recursive: bool = False) -> bool:
        """Removes a file (or, with ``recursive``, a tree); returns whether it existed."""
        request = types_pb2.RemovePathRequest(workspace_id=workspace_id, path=path, recursive=recursive)
        return self._unary("workspace", "RemovePath", request).existed

    def mkdir(self, workspace_id: str, path: str, *, parents: bool = True) -> None:
        request = types_pb2.MakeDirRequest(workspace_id=workspace_id, path=path, parents=parents)
        self._unary("workspace", "MakeDir", request)

    # ---- trees -------------------------------------------------------------------------------

    def upload_tree(self, workspace_id: str, path: str, archive: bytes, *, overwrite: bool = False) -> t.TreeStats:
        """Unpacks a tar / tar.gz into ``path`` (whole or not at all)."""
        payload = bytes(archive)

        def requests() -> Iterator[Any]:
            header = contract_pb2.UploadTreeHeader(workspace_id=workspace_id, path=path, overwrite=overwrite)
            yield contract_pb2.UploadTreeRequest(header=header)
            for chunk in conv.split(payload):
                yield contract_pb2.UploadTreeRequest(chunk=chunk)

        return conv.tree_stats(self._client_stream("contract", "UploadTree", requests, replayable=True))

    def download_tree(self, workspace_id: str, path: str = "") -> Iterator[bytes]:
        """A tar of a directory (files and directories), in chunks."""
        request = contract_pb2.DownloadTreeRequest(workspace_id=workspace_id, path=path)
        for message in self._server_stream("contract", "DownloadTree", request):
            yield message.data

    def push(self, workspace_id: str, local_dir: str | os.PathLike[str], path: str = "", *, overwrite: bool = True) -> t.TreeStats:
        """Copies a local directory's content into ``path`` in the workspace."""
        return self.upload_tree(workspace_id, path, _trees.pack_bytes(local_dir), overwrite=overwrite)

    def pull(self, workspace_id: str, path: str, local_dir: str | os.PathLike[str]) -> int:
        """Copies a workspace directory into ``local_dir``; returns the entries written."""
        return _trees.unpack(self.download_tree(workspace_id, path), local_dir)

    # ---- MCP -----------------------------------------------------------------------------------

    def add_mcp(self, workspace_id: str, server: t.McpServer, *, replace: bool = False) -> t.McpServer:
        """Declares an MCP server in the workspace's ``.mcp`` (secrets stay on the node)."""
        request = contract_pb2.AddMcpRequest(workspace_id=workspace_id, server=conv.mcp_server(server), replace=replace)
        return conv.mcp_server_from(self._unary("contract", "AddMcp", request).server)

    def remove_mcp(self, workspace_id: str, name: str) -> bool:
        request = contract_pb2.RemoveMcpRequest(workspace_id=workspace_id, name=name)
        return self._unary("contract", "RemoveMcp", request).existed

    def list_mcps(self, workspace_id: str) -> list[t.McpServerStatus]:
        response = self._unary("contract", "ListMcps", contract_pb2.ListMcpsRequest(workspace_id=workspace_id))
        return [t.McpServerStatus(conv.mcp_server_from(item.server), item.live) for item in response.servers]

    def list_mcp_tools(self, workspace_id: str, server: str, *, timeout: float | None = None) -> list[t.McpTool]:
        request = contract_pb2.ListMcpToolsRequest(
            workspace_id=workspace_id, server=server, timeout_ms=int((timeout or 0) * 1000)
        )
        deadline = (timeout or DEFAULT_TIMEOUT) + 30.0
        return [conv.mcp_tool(tool) for tool in self._unary("contract", "ListMcpTools", request, deadline).tools]

    def call_mcp_tool(
        self,
        workspace_id: str,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> t.McpCallResult:
        """Calls a tool (starting the server on first use); a tool error is a result."""
        request = contract_pb2.CallMcpToolRequest(
            workspace_id=workspace_id,
            server=server,
            tool=tool,
            arguments_json=json.dumps(dict(arguments or {})),
            timeout_ms=int((timeout or 0) * 1000),
        )
        deadline = (timeout or DEFAULT_TIMEOUT) + 30.0
        return conv.mcp_call(self._unary("contract", "CallMcpTool", request, deadline))

    # ---- skills ------------------------------------------------------------------------------

    def add_skill(self, workspace_id: str, archive: bytes, *, name: str = "", replace: bool = False) -> t.AddedSkill:
        """Installs a skill from a tar / tar.gz holding ``SKILL.md`` (at its top or in one dir)."""
        payload = bytes(archive)

        def requests() -> Iterator[Any]:
            header = contract_pb2.AddSkillHeader(workspace_id=workspace_id, name=name, replace=replace)
            yield contract_pb2.AddSkillRequest(header=header)
            for chunk in conv.split(payload):
                yield contract_pb2.AddSkillRequest(chunk=chunk)

        response = self._client_stream("contract", "AddSkill", requests, replayable=True)
        return t.AddedSkill(conv.skill_info(response.skill), response.files, response.bytes)

    def add_skill_dir(self, workspace_id: str, local_dir: str | os.PathLike[str], *, name: str = "", replace: bool = False) -> t.AddedSkill:
        """Installs a local skill directory (one holding ``SKILL.md``)."""
        return self.add_skill(workspace_id, _trees.pack_bytes(local_dir), name=name, replace=replace)

    def remove_skill(self, workspace_id: str, name: str) -> bool:
        request = contract_pb2.RemoveSkillRequest(workspace_id=workspace_id, name=name)
        return self._unary("contract", "RemoveSkill", request).existed

    def list_skills(self, workspace_id: str) -> list[t.SkillInfo]:
        response = self._unary("contract", "ListSkills", contract_pb2.ListSkillsRequest(workspace_id=workspace_id))
        return [conv.skill_info(skill) for skill in response.skills]

    def get_skill(self, workspace_id: str, name: str) -> t.Skill:
        response = self._unary("contract", "GetSkill", contract_pb2.GetSkillRequest(workspace_id=workspace_id, name=name))
        return t.Skill(conv.skill_info(response.skill), response.body)

    # ---- offload -----------------------------------------------------------------------------

    def offload_context(self, workspace_id: str, session_id: str, messages: Sequence[Any]) -> t.ContextOffloaded:
        """Appends messages (JSON values, or JSON text) to ``sessions/<id>/context.jsonl``."""
        encoded = [item if isinstance(item, str) else json.dumps(item) for item in messages]
        request = contract_pb2.OffloadContextRequest(
            workspace_id=workspace_id, session_id=session_id, messages_json=encoded
        )
        response = self._unary("contract", "OffloadContext", request)
        return t.ContextOffloaded(response.path, response.messages, response.bytes_appended, tuple(response.data_refs))

    def offload_tool_result(
        self,
        workspace_id: str,
        session_id: str,
        tool_call_id: str,
        content: bytes | str,
        *,
        threshold_bytes: int = 0,
        preview_bytes: int = 0,
    ) -> t.ToolResultOffloaded:
        """Writes a large tool result to ``sessions/<id>/tool_result-<call>.txt``."""
        data = content.encode() if isinstance(content, str) else bytes(content)
        request = contract_pb2.OffloadToolResultRequest(
            workspace_id=workspace_id,
            session_id=session_id,
            tool_call_id=tool_call_id,
            content=data,
            threshold_bytes=threshold_bytes,
            preview_bytes=preview_bytes,
        )
        r = self._unary("contract", "OffloadToolResult", request)
        return t.ToolResultOffloaded(r.offloaded, r.path, r.size_bytes, r.head, r.tail, r.preview)

    # ---- admin -------------------------------------------------------------------------------

    def list_nodes(self) -> list[t.NodeInfo]:
        """Nodes as the answering replica sees them (admin only)."""
        return [conv.node_info(node) for node in self._unary("admin", "ListNodes", admin_pb2.ListNodesRequest()).nodes]

    def status(self) -> t.ClusterStatus:
        """Replicas, nodes, workspaces by state and backend, registry health (admin only)."""
        return conv.cluster_status(self._unary("admin", "GetClusterStatus", admin_pb2.GetClusterStatusRequest()))

    def drain_node(self, node_id: str, *, force: bool = False) -> list[str]:
        """Stops placements on a node and releases its workspaces; returns their ids."""
        response = self._unary("admin", "DrainNode", admin_pb2.DrainNodeRequest(node_id=node_id, force=force))
        return [item.workspace_id for item in response.released]

    def undrain_node(self, node_id: str) -> bool:
        return self._unary("admin", "UndrainNode", admin_pb2.UndrainNodeRequest(node_id=node_id)).was_drained


__all__ = ["Client", "BerthError", "types_pb2"]
