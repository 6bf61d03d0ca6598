"""``BerthWorkspace``: an AgentScope workspace held by Berth.

The workspace's files and processes live wherever Berth placed it (``local``,
``bubblewrap``, ``docker`` — any backend); this object is a handle: AgentScope's builtin
tools run through :class:`BerthBackend`, MCP servers through Berth's MCP RPCs, skills
through Berth's skill RPCs (``skills/<name>``), offload through Berth's offload RPCs.

Differences from AgentScope's own workspaces, by design:

- Skills are per workspace (Berth's layout), not partitioned per agent: ``agent_id`` is
  accepted and ignored. With ``PER_AGENT`` isolation a workspace belongs to one agent.
- AgentScope's per-session MCP declarations are kept in ``.agentscope/mcp.json``; Berth's
  own ``.mcp`` holds the servers Berth runs (one per agent and session, see ``_mcp.py``).
"""

from __future__ import annotations

import asyncio
import posixpath
from copy import deepcopy
from typing import AsyncIterator, Literal

from agentscope._logging import logger
from agentscope.mcp import MCPClient
from agentscope.message import Base64Source, ContentBlock, DataBlock, HintBlock, Msg, TextBlock, ToolResultBlock
from agentscope.skill import Skill
from agentscope.workspace import WorkspaceBase
from agentscope.workspace._base import DEFAULT_MAX_EXTRACTED_BYTES
from agentscope.workspace._utils import _read_glob_helper_bytes

import berth
import berth.aio
from berth import _trees

from ._backend import BerthBackend
from ._mcp import BerthMCPClient, berth_server_name

#: Where AgentScope's own bookkeeping lives inside the workspace.
STATE_DIR = ".agentscope"


class BerthWorkspace(WorkspaceBase):
    """An AgentScope workspace backed by a Berth workspace.

    Args:
        client: an asyncio client acting for the workspace's user.
        workspace_id: the Berth workspace id.
        default_mcps: MCPs seeded into every agent / session that declared none.
        skill_paths: local skill directories installed once into a workspace with no skills.
        exec_timeout: seconds a command may run when AgentScope names no timeout.
    """

    def __init__(
        self,
        *,
        client: berth.aio.Client,
        workspace_id: str,
        default_mcps: list[MCPClient] | None = None,
        skill_paths: list[str] | None = None,
        max_live_stateful_mcps: int | None = None,
        exec_timeout: float = 3600.0,
    ) -> None:
        super().__init__(
            workspace_id=workspace_id,
            default_mcps=default_mcps,
            skill_paths=skill_paths,
            max_live_stateful_mcps=max_live_stateful_mcps,
        )
        self.client = client
        self.exec_timeout = exec_timeout
        self.workdir = ""
        self._init_lock = asyncio.Lock()

    # ---- paths -------------------------------------------------------------------------------

    @property
    def _mcp_file(self) -> str:
        # Not Berth's `.mcp` (its format and validation are Berth's): AgentScope's own file.
        return posixpath.join(self.workdir, STATE_DIR, "mcp.json")

    @property
    def _glob_helper_path(self) -> str:
        return posixpath.join(self.workdir, STATE_DIR, "glob_helper.py")

    def _absolute(self, relative: str) -> str:
        return posixpath.join(self.workdir, relative) if relative else self.workdir

    # ---- lifecycle -----------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Finds the workspace root, restores MCP declarations, seeds skills. Idempotent."""
        async with self._init_lock:
            if self.is_alive:
                return
            probe = await self.client.exec(self.workspace_id, ["pwd"], timeout=60)
            root = probe.stdout.decode().strip()
            if probe.exit_code != 0 or not root.startswith("/"):
                raise RuntimeError(f"workspace {self.workspace_id}: cannot find its root: {probe.stderr!r}")
            self.workdir = root
            self._backend = BerthBackend(self.client, self.workspace_id, root, default_timeout=self.exec_timeout)
            helper = self._glob_helper_path
            if not await self._backend.file_exists(helper):
                await self._backend.write_file(helper, _read_glob_helper_bytes())
            self._mcp_specs = await self._restore_mcp_specs()
            await self._setup_skills()
            self.is_alive = True

    async def close(self) -> None:
        """Drops the live MCP handles; Berth keeps the workspace (its idle sweeper stops it)."""
        self._mcp_instances.clear()
        self._mcp_last_used.clear()
        self.is_alive = False

    async def get_instructions(self) -> str:
        return (
            f"Your workspace is the directory {self.workdir}; every command and file operation "
            "runs inside it (a Berth workspace). Offloaded context lives under sessions/, "
            "data under data/, skills under skills/."
        )

    async def reset(self) -> None:
        """Removes every MCP, skill, session file and data payload (a clean workspace)."""
        backend = self.get_backend()
        async with self._mcp_lock, self._skill_lock:
            await self._close_all_mcp_instances()
            self._mcp_specs.clear()
            for status in await self.client.list_mcps(self.workspace_id):
                await self.client.remove_mcp(self.workspace_id, status.server.name)
            for skill in await self.client.list_skills(self.workspace_id):
                await self.client.remove_skill(self.workspace_id, skill.name)
            for relative in ("sessions", "data", STATE_DIR + "/mcp.json"):
                await backend.delete_path(self._absolute(relative))

    # ---- MCP -----------------------------------------------------------------------------------

    def _proxy(self, spec: MCPClient, agent_id: str, session_id: str) -> BerthMCPClient:
        proxy = BerthMCPClient.model_validate(spec.model_dump(mode="json"))
        return proxy.attach(self.client, self.workspace_id, berth_server_name(spec.name, agent_id, session_id), self.workdir)

    async def list_mcps(self, *, agent_id: str | None = None, session_id: str | None = None) -> list[MCPClient]:
        """Berth-hosted MCP handles for one agent / session (declared on first use)."""
        agent_id, session_id = agent_id or "", session_id or ""
        async with self._mcp_lock:
            self._mcp_last_used[(agent_id, session_id)] = asyncio.get_running_loop().time()
            live = self._mcp_instances.setdefault((agent_id, session_id), {})
            specs = self._declared_specs(agent_id, session_id)
            for spec in specs:
                if spec.name in live:
                    continue
                await self._enforce_mcp_capacity(agent_id, session_id, spec)
                try:
                    proxy = self._proxy(spec, agent_id, session_id)
                    await proxy.connect()
                    live[spec.name] = proxy
                except Exception as error:  # noqa: BLE001 - one broken MCP must not hide the rest
                    logger.warning("Failed to declare MCP %r in Berth workspace %s: %s", spec.name, self.workspace_id, error)
            return [live[spec.name] for spec in specs if spec.name in live]

    async def add_mcp(self, mcp_client: MCPClient, *, agent_id: str | None = None, session_id: str | None = None) -> MCPClient:
        agent_id, session_id = agent_id or "", session_id or ""
        async with self._mcp_lock:
            specs = self._declared_specs(agent_id, session_id)
            if any(spec.name == mcp_client.name for spec in specs):
                raise ValueError(f"MCP {mcp_client.name!r} already exists for agent={agent_id!r} session={session_id!r}.")
            await self._enforce_mcp_capacity(agent_id, session_id, mcp_client)
            proxy = self._proxy(mcp_client, agent_id, session_id)
            await proxy.connect()
            self._mcp_instances.setdefault((agent_id, session_id), {})[proxy.name] = proxy
            self._mcp_specs[(agent_id, session_id)] = [*specs, mcp_client]
            await self._save_mcp_file()
            return proxy

    async def remove_mcp(self, name: str, *, agent_id: str | None = None, session_id: str | None = None) -> None:
        agent_id, session_id = agent_id or "", session_id or ""
        async with self._mcp_lock:
            specs = self._declared_specs(agent_id, session_id)
            if not any(spec.name == name for spec in specs):
                logger.warning("MCP %r not found for agent=%r session=%r", name, agent_id, session_id)
                return
            instance = self._mcp_instances.get((agent_id, session_id), {}).pop(name, None)
            if instance is not None:
                await self._close_mcp_instance(instance)
            else:
                await self.client.remove_mcp(self.workspace_id, berth_server_name(name, agent_id, session_id))
            self._mcp_specs[(agent_id, session_id)] = [spec for spec in specs if spec.name != name]
            await self._save_mcp_file()

    # ---- skills (Berth's skills/<name>) ------------------------------------------------------------

    async def list_skills(self, *, agent_id: str | None = None) -> list[Skill]:
        del agent_id  # Berth's skills are per workspace
        infos = await self.client.list_skills(self.workspace_id)
        bodies = await asyncio.gather(*(self.client.get_skill(self.workspace_id, info.name) for info in infos))
        return [
            Skill(
                name=info.name,
                description=info.description,
                dir=self._absolute(info.path),
                markdown=skill.body,
                updated_at=0.0,
            )
            for info, skill in zip(infos, bodies)
        ]

    async def add_skill(self, skill_path: str, *, agent_id: str | None = None) -> None:
        del agent_id
        try:
            await self.client.add_skill_dir(self.workspace_id, skill_path)
        except berth.AlreadyExistsError as error:
            raise ValueError(str(error)) from None
        except berth.InvalidArgumentError as error:
            raise ValueError(f"Invalid skill at {skill_path!r}: {error.message}") from None

    async def add_skill_archive(
        self,
        stream: AsyncIterator[bytes],
        fmt: Literal["zip", "tar", "tar.gz"],
        dir_name: str,
        max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES,
        *,
        agent_id: str | None = None,
    ) -> None:
        """Installs a skill archive with Berth's checked extraction (whole or not at all).

        The skill is named by its ``SKILL.md`` front matter; ``dir_name`` is used when the
        front matter has no name.
        """
        del agent_id
        chunks: list[bytes] = []
        size = 0
        async for chunk in stream:
            size += len(chunk)
            if size > max_extracted_bytes:
                raise ValueError(f"the skill archive is larger than {max_extracted_bytes} bytes")
            chunks.append(chunk)
        archive = b"".join(chunks)
        if fmt == "zip":
            archive = await asyncio.to_thread(_trees.zip_to_tar, archive, max_extracted_bytes)
        try:
            await self.client.add_skill(self.workspace_id, archive)
        except berth.InvalidArgumentError as error:
            if "no name" not in error.message:
                raise ValueError(error.message) from None
            await self.client.add_skill(self.workspace_id, archive, name=dir_name)
        except berth.AlreadyExistsError as error:
            raise ValueError(str(error)) from None

    async def remove_skill(self, name: str, *, agent_id: str | None = None) -> None:
        del agent_id
        if not await self.client.remove_skill(self.workspace_id, name):
            available = [skill.name for skill in await self.client.list_skills(self.workspace_id)]
            raise KeyError(f"Skill {name!r} not found. Available: {available}")

    async def _setup_skills(self) -> None:
        """Installs ``skill_paths`` once, into a workspace that has no skills yet."""
        if not self.skill_paths or await self.client.list_skills(self.workspace_id):
            return
        for path in self.skill_paths:
            try:
                await self.client.add_skill_dir(self.workspace_id, path)
            except (berth.BerthError, OSError) as error:
                logger.warning("Skip skill %r: %s", path, error)

    # ---- offload (Berth's append-only OffloadContext, create-exclusive tool results) -----------

    async def offload_context(self, session_id: str, msgs: list[Msg]) -> str:
        async def offload_block(block: ContentBlock) -> ContentBlock:
            if isinstance(block, DataBlock) and isinstance(block.source, Base64Source):
                return await self.offload_data_block(block)
            if isinstance(block, ToolResultBlock) and isinstance(block.output, list):
                block.output = [await offload_block(item) for item in block.output]
            elif isinstance(block, HintBlock) and isinstance(block.hint, list):
                block.hint = [await offload_block(item) for item in block.hint]
            return block

        lines = []
        for msg in deepcopy(msgs):
            if not isinstance(msg.content, str):
                msg.content = [await offload_block(block) for block in msg.content]
            lines.append(msg.model_dump_json())
        if not lines:
            return self._absolute(posixpath.join("sessions", session_id, "context.jsonl"))
        result = await self.client.offload_context(self.workspace_id, session_id, lines)
        return self._absolute(result.path)

    async def offload_tool_result(self, session_id: str, tool_result: ToolResultBlock) -> str:
        parts: list[str] = []
        if isinstance(tool_result.output, str):
            parts.append(tool_result.output)
        else:
            for block in tool_result.output:
                if isinstance(block, TextBlock):
                    parts.append(block.text)
                elif isinstance(block, DataBlock):
                    source = block.source
                    if isinstance(source, Base64Source):
                        source = (await self.offload_data_block(block)).source
                    parts.append(f"<data url='{source.url}' name='{block.name}' media_type='{source.media_type}'/>")
        content = "".join(parts).encode()
        # Threshold 1: AgentScope always wants the file (Berth skips small results otherwise).
        result = await self.client.offload_tool_result(
            self.workspace_id, session_id, tool_result.id, content, threshold_bytes=1
        )
        if result.offloaded:
            return self._absolute(result.path)
        path = self._absolute(posixpath.join("sessions", session_id, f"tool_result-{tool_result.id}.txt"))
        await self.get_backend().write_file(path, content)
        return path
