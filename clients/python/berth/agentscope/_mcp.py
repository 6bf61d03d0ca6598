"""AgentScope MCP clients whose servers run in a Berth workspace.

Berth runs a stdio MCP server inside the workspace's sandbox (an HTTP one is reached from
the node agent through its SSRF guard) and keeps one live client per declared server on
the node. AgentScope declares MCPs per agent and session, so each (agent, session) gets a
declaration of its own, named ``<name>@<hash of agent and session>``: their state never
leaks across sessions, exactly as with AgentScope's own workspaces.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

import mcp.types
from agentscope.mcp import MCPClient
from agentscope.mcp._config import HttpMCPConfig, StdioMCPConfig
from agentscope.message import TextBlock, ToolResultState
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import ToolBase, ToolChunk
from pydantic import PrivateAttr

import berth
import berth.aio


def berth_server_name(name: str, agent_id: str, session_id: str) -> str:
    """The Berth declaration name of an AgentScope MCP of one agent and session."""
    if not agent_id and not session_id:
        return name
    digest = hashlib.blake2b(f"{agent_id}\0{session_id}".encode(), digest_size=6).hexdigest()
    return f"{name}@{digest}"


def declaration(client: MCPClient, berth_name: str, root: str) -> berth.McpServer:
    """The Berth declaration of an AgentScope MCP config."""
    config = client.mcp_config
    if isinstance(config, StdioMCPConfig):
        cwd = ""
        if config.cwd:
            text = posixpath.normpath(str(config.cwd) if str(config.cwd).startswith("/") else posixpath.join(root, str(config.cwd)))
            if text != root and not text.startswith(root.rstrip("/") + "/"):
                raise ValueError(f"MCP {client.name!r}: cwd {config.cwd!r} is outside the workspace {root!r}")
            cwd = text[len(root.rstrip("/")) + 1 :] if text != root else ""
        return berth.McpServer(
            berth_name,
            berth.McpStdio(command=config.command, args=tuple(config.args or ()), env=dict(config.env or {}), cwd=cwd),
        )
    if isinstance(config, HttpMCPConfig):
        # Headers usually carry credentials: keep them in the node's secret store, never in .mcp.
        return berth.McpServer(berth_name, berth.McpHttp(url=config.url, secret_headers=dict(config.headers or {})))
    raise TypeError(f"unsupported MCP config {type(config).__name__}")


class BerthMCPTool(ToolBase):
    """One tool of a Berth-hosted MCP server; a call is one CallMcpTool RPC."""

    is_mcp: bool = True
    is_state_injected: bool = False

    def __init__(self, mcp_name: str, tool: mcp.types.Tool, owner: "BerthMCPClient") -> None:
        self.mcp_name = mcp_name
        self.name = f"mcp__{mcp_name}__{tool.name}"
        self.description = tool.description or ""
        schema = dict(tool.input_schema) if tool.input_schema else {}
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        self.input_schema = schema
        self.is_concurrency_safe = False
        self.is_external_tool = False
        self.is_read_only = bool(tool.annotations and tool.annotations.read_only_hint)
        self._tool = tool
        self._owner = owner

    async def check_permissions(self, *_args: Any, **_kwargs: Any) -> PermissionDecision:
        if self.is_read_only:
            return PermissionDecision(behavior=PermissionBehavior.ALLOW, message="This is a read-only MCP tool.")
        return PermissionDecision(behavior=PermissionBehavior.ASK, message="MCP tools must be explicitly allowed by the user.")

    async def __call__(self, **kwargs: Any) -> ToolChunk:
        owner = self._owner
        try:
            result = await owner._berth.call_mcp_tool(
                owner._workspace_id, owner._berth_name, self._tool.name, kwargs, timeout=owner.execution_timeout
            )
        except berth.BerthError as error:
            return ToolChunk(content=[TextBlock(text=str(error))], state=ToolResultState.ERROR)
        state = ToolResultState.ERROR if result.is_error else ToolResultState.RUNNING
        return ToolChunk(content=[TextBlock(text=result.text)], state=state, is_last=True)


class BerthMCPClient(MCPClient):
    """An :class:`MCPClient` whose server is declared in, and runs for, a Berth workspace.

    ``connect`` declares it (AddMcp, replacing an older declaration of the same name),
    ``close`` removes the declaration, tools are listed and called over Berth RPCs.
    """

    _berth: Any = PrivateAttr(default=None)
    _workspace_id: str = PrivateAttr(default="")
    _berth_name: str = PrivateAttr(default="")
    _root: str = PrivateAttr(default="")

    def attach(self, client: berth.aio.Client, workspace_id: str, berth_name: str, root: str) -> "BerthMCPClient":
        self._berth = client
        self._workspace_id = workspace_id
        self._berth_name = berth_name
        self._root = root
        return self

    @property
    def berth_name(self) -> str:
        return self._berth_name

    async def connect(self) -> None:
        if self._is_connected:
            raise RuntimeError(f"MCP {self.name!r} is already connected. Call close() before reconnecting.")
        server = declaration(self, self._berth_name, self._root)
        await self._berth.add_mcp(self._workspace_id, server, replace=True)
        self._is_connected = True

    async def close(self, ignore_errors: bool = True) -> None:
        if not self._is_connected:
            if ignore_errors:
                return
            raise RuntimeError(f"MCP {self.name!r} is not connected. Call connect() first.")
        try:
            await self._berth.remove_mcp(self._workspace_id, self._berth_name)
        except berth.BerthError:
            if not ignore_errors:
                raise
        self._is_connected = False

    async def set_runtime_headers(self, headers: dict[str, str]) -> None:
        raise ValueError("runtime headers are not supported for MCP servers hosted by Berth")

    async def list_raw_tools(self) -> list[mcp.types.Tool]:
        listed = await self._berth.list_mcp_tools(self._workspace_id, self._berth_name, timeout=self.execution_timeout)
        tools = [
            mcp.types.Tool(
                name=tool.name,
                description=tool.description or None,
                input_schema=json.loads(tool.input_schema_json or "{}") or {"type": "object"},
            )
            for tool in listed
        ]
        self._cached_tools = tools
        if self.enable_tools is not None:
            tools = [tool for tool in tools if tool.name in self.enable_tools]
        if self.disable_tools is not None:
            tools = [tool for tool in tools if tool.name not in self.disable_tools]
        return tools

    async def get_tool(self, name: str) -> BerthMCPTool:  # type: ignore[override]
        if self._cached_tools is None:
            await self.list_raw_tools()
        for tool in self._cached_tools or []:
            if tool.name == name:
                return BerthMCPTool(self.name, tool, self)
        raise ValueError(f"Tool {name!r} not found in MCP {self.name!r}.")
