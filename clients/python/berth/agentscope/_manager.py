"""``BerthWorkspaceManager``: AgentScope's workspace manager over a Berth cluster.

The workspace id of a first session is Berth's: ``assign_workspace_id`` is a Berth
CreateSession, whose id is a pure function of the replicas' isolation policy and
``(user, agent[, session])``, and whose bind makes exactly one workspace however many
replicas race. So several AgentScope service processes, each talking to a different
replica, resolve one user's first session to one workspace — which AgentScope's own
managers cannot promise (their minting and reservation are process-local).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from typing import Sequence

from agentscope._logging import logger
from agentscope.app.workspace_manager import IsolationPolicy, WorkspaceManagerBase
from agentscope.mcp import MCPClient

import berth
import berth.aio

from ._workspace import BerthWorkspace

#: AgentScope's isolation grains and the Berth policy each one needs on the replicas.
POLICY_FOR = {
    IsolationPolicy.PER_AGENT: berth.IsolationPolicy.PER_AGENT,
    IsolationPolicy.PER_SESSION: berth.IsolationPolicy.PER_SESSION,
    IsolationPolicy.PER_USER: berth.IsolationPolicy.PER_USER,
}

_ID = re.compile(r"[A-Za-z0-9._@:-]{1,128}")


def berth_id(value: str, prefix: str) -> str:
    """``value`` when it is a valid Berth id, else a stable hash of it."""
    if _ID.fullmatch(value) and not value.startswith((".", "-")):
        return value
    return f"{prefix}-{hashlib.blake2b(value.encode(), digest_size=16).hexdigest()}"


class BerthWorkspaceManager(WorkspaceManagerBase):
    """Workspaces of an AgentScope service held by Berth (any backend, any replica).

    Args:
        endpoint: one replica URL, a comma-separated list or a sequence (failover).
        token: the service's bearer token (a ``service`` token with ``act_for_users``:
            every call then acts for the AgentScope user). ``None`` for ``--auth none``.
        isolation: AgentScope's grain; the replicas must run the same policy
            (``berth … --isolation per-agent|per-session|per-user``), which the manager
            checks on the first workspace it is given and refuses otherwise.
        ca_cert: CA of the replicas' TLS certificates.
        backend: the Berth backend new workspaces ask for (``None``: the node default).
        spec: the sandbox of new workspaces (limits, network, env).
        default_mcps / skill_paths: seeded into workspaces, as AgentScope's managers do.
        exec_timeout: seconds a command may run when AgentScope names no timeout.
        ttl: seconds an unused workspace handle stays cached in this process.
        act_as_users: send ``x-berth-act-as: <user>`` on workspace calls (needed with a
            service token; harmless for an admin or ``--auth none``).
    """

    def __init__(
        self,
        endpoint: str | Sequence[str],
        *,
        token: str | None = None,
        isolation: IsolationPolicy = IsolationPolicy.PER_AGENT,
        ca_cert: str | bytes | None = None,
        backend: str | None = None,
        spec: berth.WorkspaceSpec | None = None,
        default_mcps: list[MCPClient] | None = None,
        skill_paths: list[str] | None = None,
        exec_timeout: float = 3600.0,
        ttl: float = 3600.0,
        act_as_users: bool = True,
    ) -> None:
        super().__init__(isolation=isolation)
        self._client = berth.aio.Client(endpoint, token=token, ca_cert=ca_cert)
        self._backend_name = backend
        self._spec = spec
        self._default_mcps = list(default_mcps or [])
        self._skill_paths = list(skill_paths or [])
        self._exec_timeout = exec_timeout
        self._ttl = ttl
        self._act_as_users = act_as_users
        self._policy_checked = False
        # (workspace id, user) -> (workspace, last use); a workspace handle acts for its user.
        self._cache: dict[tuple[str, str], tuple[BerthWorkspace, float]] = {}
        self._lock = asyncio.Lock()
        self._building: dict[tuple[str, str], asyncio.Future[BerthWorkspace]] = {}

    @property
    def client(self) -> berth.aio.Client:
        """The manager's own client (the service principal)."""
        return self._client

    def _for_user(self, user_id: str) -> berth.aio.Client:
        return self._client.with_act_as(user_id) if self._act_as_users else self._client

    async def _check_policy(self, workspace_id: str, user_id: str) -> None:
        if self._policy_checked:
            return
        wanted = POLICY_FOR[self._isolation]
        actual = (await self._for_user(user_id).get_workspace(workspace_id)).policy
        if actual is not wanted:
            raise RuntimeError(
                f"BerthWorkspaceManager(isolation={self._isolation.value}) needs replicas started with "
                f"--isolation {wanted.value.replace('_', '-')}, but they run {actual.value.replace('_', '-')}"
            )
        self._policy_checked = True

    async def _bind(self, user_id: str, agent_id: str, session_id: str, workspace_id: str | None) -> berth.Session:
        # Berth session ids are global; AgentScope's are only unique for their user / agent.
        key = f"{user_id}\0{agent_id}\0{session_id}".encode()
        session = f"as-{hashlib.blake2b(key, digest_size=16).hexdigest()}" if session_id else None
        return await self._for_user(user_id).create_session(
            user=user_id,
            agent=berth_id(agent_id, "agent"),
            session=session,
            workspace_id=workspace_id or None,
            backend=self._backend_name,
            spec=self._spec,
        )

    async def assign_workspace_id(self, *, user_id: str, agent_id: str, session_id: str) -> str:
        """Berth's workspace for ``(user, agent, session)`` under the replicas' policy."""
        bound = await self._bind(user_id, agent_id, session_id, None)
        await self._check_policy(bound.workspace_id, user_id)
        return bound.workspace_id

    async def get_workspace(
        self,
        user_id: str,
        agent_id: str,
        session_id: str,
        workspace_id: str | None = None,
    ) -> BerthWorkspace:
        """An initialized handle of the user's workspace (made READY by Berth on first use)."""
        if not workspace_id:
            workspace_id = await self.assign_workspace_id(user_id=user_id, agent_id=agent_id, session_id=session_id)
            known = True
        else:
            known = False
        key = (workspace_id, user_id)
        expired = []
        async with self._lock:
            now = time.monotonic()
            for other, (handle, used) in list(self._cache.items()):
                if now - used > self._ttl and other != key:
                    expired.append(self._cache.pop(other)[0])
            cached = self._cache.get(key)
            if cached is not None:
                self._cache[key] = (cached[0], now)
        for handle in expired:
            await handle.close()
        if cached is not None:
            return cached[0]
        # One handle per (workspace, user) however many first requests race in this process.
        async with self._lock:
            building = self._building.get(key)
            if building is None:
                building = asyncio.ensure_future(self._open(key, user_id, agent_id, session_id, joined=known))
                self._building[key] = building
        try:
            return await asyncio.shield(building)
        finally:
            if building.done():
                async with self._lock:
                    if self._building.get(key) is building:
                        del self._building[key]

    async def _open(self, key: tuple[str, str], user_id: str, agent_id: str, session_id: str, *, joined: bool) -> BerthWorkspace:
        workspace_id = key[0]
        if not joined:
            # Joins the workspace (authorized for this user) and makes sure it is READY.
            await self._bind(user_id, agent_id, session_id, workspace_id)
        workspace = BerthWorkspace(
            client=self._for_user(user_id),
            workspace_id=workspace_id,
            default_mcps=self._default_mcps,
            skill_paths=self._skill_paths,
            exec_timeout=self._exec_timeout,
        )
        await workspace.initialize()
        async with self._lock:
            self._cache[key] = (workspace, time.monotonic())
        return workspace

    async def close(self, workspace_id: str) -> None:
        """Drops this process's handles of the workspace (Berth keeps the workspace)."""
        async with self._lock:
            handles = [self._cache.pop(key)[0] for key in list(self._cache) if key[0] == workspace_id]
        for handle in handles:
            await handle.close()

    async def close_all(self) -> None:
        async with self._lock:
            handles = [handle for handle, _ in self._cache.values()]
            self._cache.clear()
        results = await asyncio.gather(*(handle.close() for handle in handles), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.warning("closing a Berth workspace handle failed: %s", result)

    async def __aexit__(self, *exc: object) -> None:
        await self.close_all()
        await self._client.close()
