"""AgentScope 2.0.11's service app with ``BerthWorkspaceManager``, driven through
AgentScope's own HTTP API, workspace API and builtin tools, against real Berth processes
and a real Redis (AgentScope's storage)."""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import shutil
import tempfile

import pytest

from agentscope.app import create_app  # noqa: E402
from agentscope.app.message_bus import InMemoryMessageBus  # noqa: E402
from agentscope.app.storage import RedisStorage  # noqa: E402
from agentscope.message import Msg, TextBlock, ToolResultBlock  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

import berth  # noqa: E402
import harness  # noqa: E402
from berth.agentscope import BerthWorkspace, BerthWorkspaceManager, IsolationPolicy  # noqa: E402
from conftest import MCP_ECHO, unique  # noqa: E402


@pytest.fixture(scope="module")
def redis_port():
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed (Debian's redis-server): AgentScope's storage needs it"
    port = harness.free_port()
    workdir = tempfile.mkdtemp(prefix="berth-py-redis-")
    process = harness.Process("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir])
    import socket

    def answers() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")

    assert harness.wait_until(10, answers), process.tail()
    yield port
    process.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def make_app(endpoint: str, redis_port: int, **manager_args):
    manager = BerthWorkspaceManager(endpoint, **manager_args)
    app = create_app(
        storage=RedisStorage(host="127.0.0.1", port=redis_port),
        message_bus=InMemoryMessageBus(),
        workspace_manager=manager,
        enable_index_worker=False,
        enable_channel_worker=False,
        enable_scheduler=False,
    )
    return app, manager


async def run_tool(tool, **arguments):
    """Calls an AgentScope tool and returns (text, state) of its final chunk."""
    outcome = await tool(**arguments)
    if inspect.isasyncgen(outcome):
        chunks = [chunk async for chunk in outcome]
        outcome = chunks[-1]
    text = "".join(block.text for block in outcome.content if hasattr(block, "text"))
    return text, outcome.state.value if hasattr(outcome.state, "value") else str(outcome.state)


def test_service_app_drives_a_berth_workspace(up, redis_port, tmp_path):
    app, manager = make_app(up.endpoint, redis_port)
    user = unique("alice")
    headers = {"X-User-ID": user}
    with TestClient(app) as http:
        agent_id = http.post("/agent/", json={"name": "coder"}, headers=headers).json()["agent_id"]
        created = http.post("/sessions/", json={"agent_id": agent_id}, headers=headers)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]

        async def workspace_of() -> BerthWorkspace:
            record = await app.state.storage.get_session(user, agent_id, session_id)
            return await manager.get_workspace(user, agent_id, session_id, record.config.workspace_id)

        workspace = http.portal.call(workspace_of)
        assert isinstance(workspace, BerthWorkspace)
        with berth.Client(up.endpoint) as direct:
            assert direct.get_workspace(workspace.workspace_id).owner_user_id == user
            # The same user and agent through Berth's own API: the same workspace.
            assert direct.create_session(user=user, agent=agent_id).workspace_id == workspace.workspace_id

        # ---- AgentScope's builtin tools, running in the Berth workspace ----
        tools = {tool.name: tool for tool in http.portal.call(workspace.list_tools)}
        assert set(tools) == {"Bash", "Edit", "Glob", "Grep", "Read", "Write"}
        target = f"{workspace.workdir}/src/app.py"
        text, state = http.portal.call(lambda: run_tool(tools["Write"], file_path=target, content="def greet():\n    return 'hello'\n"))
        assert state != "error", text
        text, state = http.portal.call(lambda: run_tool(tools["Read"], file_path=target))
        assert "return 'hello'" in text, text
        text, state = http.portal.call(
            lambda: run_tool(tools["Edit"], file_path=target, old_string="'hello'", new_string="'hello from berth'")
        )
        assert state != "error", text
        with berth.Client(up.endpoint) as direct:
            assert b"hello from berth" in direct.read_file(workspace.workspace_id, "src/app.py")
        text, state = http.portal.call(lambda: run_tool(tools["Grep"], pattern="hello from", path=workspace.workdir))
        assert "app.py" in text, text
        text, state = http.portal.call(lambda: run_tool(tools["Glob"], pattern="**/*.py", path=workspace.workdir))
        assert "src/app.py" in text, text
        text, state = http.portal.call(lambda: run_tool(tools["Bash"], command="cd src && grep -c berth app.py; exit 7"))
        assert state == "error" and "Command failed" in text and "1" in text, text
        text, state = http.portal.call(lambda: run_tool(tools["Bash"], command="sleep 20", timeout=500))
        assert state == "error" and "timed out" in text, text
        text, state = http.portal.call(lambda: run_tool(tools["Bash"], command="pwd"))
        assert text.strip() == workspace.workdir

        # ---- MCP through AgentScope's HTTP API: a stdio server inside the workspace ----
        with berth.Client(up.endpoint) as direct:
            direct.write_file(workspace.workspace_id, "tools/mcp_echo.py", MCP_ECHO)
        query = {"agent_id": agent_id, "session_id": session_id}
        mcp = {
            "name": "echo",
            "is_stateful": True,
            "mcp_config": {"type": "stdio_mcp", "command": "python3", "args": ["tools/mcp_echo.py"]},
        }
        added = http.post("/workspace/mcp", params=query, json=mcp, headers=headers)
        assert added.status_code == 201, added.text
        listed = http.get("/workspace/mcp", params=query, headers=headers).json()
        assert listed[0]["is_healthy"], listed[0].get("error")
        assert {tool["name"] for tool in listed[0]["tools"]} == {"mcp__echo__echo", "mcp__echo__add"}

        async def call_add():
            (client,) = await workspace.list_mcps(agent_id=agent_id, session_id=session_id)
            tool = await client.get_tool("add")
            return await run_tool(tool, a=20, b=22)

        text, state = http.portal.call(call_add)
        assert text == "42" and state != "error"
        removed = http.delete("/workspace/mcp/echo", params=query, headers=headers)
        assert removed.status_code == 204
        with berth.Client(up.endpoint) as direct:
            assert direct.list_mcps(workspace.workspace_id) == []

        # ---- a skill through the service's (path-based) skill API ----
        skill_dir = tmp_path / "greeter"
        skill_dir.mkdir()
        (skill_dir / "SKILL.md").write_text("---\nname: greeter\ndescription: Greets people\n---\nSay hello.\n")
        assert http.post("/workspace/skill", params=query, json={"skill_path": str(skill_dir)}, headers=headers).status_code == 201
        skills = http.get("/workspace/skill", params=query, headers=headers).json()
        assert [(s["name"], s["description"]) for s in skills] == [("greeter", "Greets people")]
        assert "Say hello." in skills[0]["markdown"]
        assert http.delete("/workspace/skill/greeter", params=query, headers=headers).status_code == 204
        assert http.get("/workspace/skill", params=query, headers=headers).json() == []

        # ---- offload ----
        msgs = [
            Msg(name="user", content=[TextBlock(text="hello")], role="user"),
            Msg(name="coder", content=[TextBlock(text="hi!")], role="assistant"),
        ]
        path = http.portal.call(lambda: workspace.offload_context(session_id, msgs))
        assert path == f"{workspace.workdir}/sessions/{session_id}/context.jsonl"
        big = ToolResultBlock(id="call-1", name="Bash", output=[TextBlock(text="x" * 50_000)])
        result_path = http.portal.call(lambda: workspace.offload_tool_result(session_id, big))
        with berth.Client(up.endpoint) as direct:
            lines = direct.read_file(workspace.workspace_id, f"sessions/{session_id}/context.jsonl").splitlines()
            assert [json.loads(line)["role"] for line in lines] == ["user", "assistant"]
            relative = result_path[len(workspace.workdir) + 1 :]
            assert direct.read_file(workspace.workspace_id, relative) == b"x" * 50_000


def test_two_apps_on_two_replicas_resolve_one_workspace(cluster, redis_port):
    app_a, _ = make_app(cluster.endpoints[0], redis_port)
    app_b, _ = make_app(cluster.endpoints[1], redis_port)
    user = unique("bob")
    headers = {"X-User-ID": user}
    with TestClient(app_a) as http_a, TestClient(app_b) as http_b:
        agent_id = http_a.post("/agent/", json={"name": "coder"}, headers=headers).json()["agent_id"]

        def first_session(http):
            answer = http.post("/sessions/", json={"agent_id": agent_id}, headers=headers)
            assert answer.status_code == 201, answer.text
            return answer.json()["session_id"]

        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            sessions = list(pool.map(first_session, [http_a, http_b, http_a, http_b]))

        async def workspaces():
            return {(await app_a.state.storage.get_session(user, agent_id, sid)).config.workspace_id for sid in sessions}

        ids = http_a.portal.call(workspaces)
    assert len(ids) == 1, ids
    assert cluster.workspace_dirs().count(ids.pop()) == 1


def test_isolation_policy_must_match_the_replicas(up):
    import asyncio

    async def main():
        manager = BerthWorkspaceManager(up.endpoint, isolation=IsolationPolicy.PER_USER)
        try:
            with pytest.raises(RuntimeError, match="--isolation per-user"):
                await manager.get_workspace(unique("u"), "coder", "")
        finally:
            await manager.__aexit__(None, None, None)

    asyncio.run(main())


def test_bash_exit_code_through_the_backend(up):
    import asyncio

    async def main():
        async with BerthWorkspaceManager(up.endpoint) as manager:
            workspace = await manager.get_workspace(unique("u"), "coder", "s1")
            backend = workspace.get_backend()
            result = await backend.exec_shell(["sh", "-c", "echo out; exit 9"])
            assert (result.exit_code, result.stdout) == (9, b"out\n")
            timed = await backend.exec_shell(["sleep", "10"], timeout=0.3)
            assert (timed.exit_code, timed.stderr) == (-1, b"timed out")
            missing = await backend.exec_shell(["no-such-program-here"])
            assert missing.exit_code != 0
            # Outside the root (sandbox-local paths) goes through the sandbox.
            await backend.write_file("/tmp/berth-py-outside.txt", b"outside")
            assert await backend.read_file("/tmp/berth-py-outside.txt") == b"outside"
            await backend.delete_path("/tmp/berth-py-outside.txt")
            assert not await backend.file_exists("/tmp/berth-py-outside.txt")
            # Inside the root: native RPCs, including recursive listings and streams.
            await backend.write_file(f"{workspace.workdir}/a/b/c.txt", b"c")
            assert f"{workspace.workdir}/a/b/c.txt" in await backend.list_dir(f"{workspace.workdir}/a", recursive=True)
            assert (await backend.stat(f"{workspace.workdir}/a")).is_dir
            with pytest.raises(FileNotFoundError):
                await backend.read_file(f"{workspace.workdir}/nope")

    asyncio.run(main())

