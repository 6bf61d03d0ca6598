"""The synchronous client against a real ``berth up``: every RPC family."""

from __future__ import annotations

import io
import json
import os
import tarfile

import grpc
import pytest

import berth
from berth._errors import BerthError, never_sent
from berth._transport import should_retry
from conftest import MCP_ECHO, unique


def test_same_user_and_agent_get_one_workspace(client):
    user = unique("alice")
    first = client.create_session(user=user, agent="coder")
    second = client.create_session(user=user, agent="coder")
    other_agent = client.create_session(user=user, agent="reviewer")
    assert first.workspace_id == second.workspace_id
    assert first.session_id != second.session_id
    assert other_agent.workspace_id != first.workspace_id
    assert client.get_session(first.session_id).workspace_id == first.workspace_id
    workspace = client.get_workspace(first.workspace_id)
    assert workspace.state is berth.WorkspaceState.READY
    assert workspace.owner_user_id == user
    assert workspace.policy is berth.IsolationPolicy.PER_AGENT
    assert workspace.origin is berth.WorkspaceOrigin.FRESH
    assert workspace.origin_generation == workspace.generation > 0
    assert first.workspace_id in {item.workspace_id for item in client.list_workspaces(user=user)}
    client.close_session(first.session_id)
    with pytest.raises(berth.NotFoundError):
        client.get_session(first.session_id)


def test_session_id_is_create_if_absent(client):
    user, session = unique("u"), unique("s")
    made = client.create_session(user=user, agent="a", session=session)
    again = client.create_session(user=user, agent="a", session=session)
    assert made.session_id == again.session_id == session
    with pytest.raises(berth.AlreadyExistsError):
        client.create_session(user=user, agent="another-agent", session=session)


def test_exec_exit_code_output_env_cwd_stdin(client, workspace):
    result = client.exec(workspace, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, b"out\n", b"err\n", False)
    assert not result.ok
    client.mkdir(workspace, "sub/dir")
    cwd = client.exec(workspace, ["sh", "-c", 'basename "$PWD"; echo "$GREETING"'], cwd="sub/dir", env={"GREETING": "hi"})
    assert cwd.stdout == b"dir\nhi\n"
    piped = client.exec(workspace, ["cat"], stdin=b"from stdin")
    assert piped.ok and piped.stdout == b"from stdin"


def test_exec_timeout_is_a_typed_result(client, workspace):
    result = client.exec(workspace, ["sleep", "30"], timeout=0.5)
    assert result.timed_out
    assert result.exit_code == -1
    assert result.duration_ms < 10_000


def test_exec_stream_yields_chunks_then_exit(client, workspace):
    events = list(client.exec_stream(workspace, ["sh", "-c", "echo one; echo two >&2; exit 4"]))
    assert events[-1].exit is not None and events[-1].exit.exit_code == 4
    assert b"".join(event.stdout for event in events) == b"one\n"
    assert b"".join(event.stderr for event in events) == b"two\n"
    assert all(event.exit is None for event in events[:-1])


def test_files_round_trip_stream_stat_ls_rm(client, workspace):
    data = os.urandom(3 * 1024 * 1024 + 17)
    assert client.write_file(workspace, "big/blob.bin", data) == len(data)
    assert client.read_file(workspace, "big/blob.bin") == data
    chunks = list(client.read_file_stream(workspace, "big/blob.bin", chunk_size=64 * 1024))
    assert len(chunks) > 1 and b"".join(chunks) == data

    streamed = client.write_file_stream(workspace, "streamed.txt", (f"line {i}\n".encode() for i in range(1000)))
    assert streamed == sum(len(f"line {i}\n") for i in range(1000))
    info = client.stat(workspace, "streamed.txt")
    assert info.is_file and info.size == streamed and info.name == "streamed.txt"
    assert client.stat(workspace, "big").is_dir

    names = {entry.name for entry in client.ls(workspace)}
    assert {"big", "streamed.txt", ".mcp", "skills", "data", "sessions"} <= names
    assert client.rm(workspace, "streamed.txt") is True
    assert client.rm(workspace, "streamed.txt") is False
    assert not client.exists(workspace, "streamed.txt")
    assert client.rm(workspace, "big", recursive=True)
    with pytest.raises(berth.NotFoundError):
        client.read_file(workspace, "big/blob.bin")


def test_paths_are_confined_to_the_workspace(client, workspace):
    with pytest.raises(berth.InvalidArgumentError) as refused:
        client.read_file(workspace, "../etc/passwd")
    assert "parent components" in refused.value.message
    with pytest.raises(berth.InvalidArgumentError):
        client.write_file(workspace, "/etc/evil", b"x")


def test_unknown_workspace_is_not_found(client):
    with pytest.raises(berth.NotFoundError):
        client.exec("no-such-workspace", ["true"])
    with pytest.raises(berth.NotFoundError):
        client.get_workspace("no-such-workspace")


def test_push_and_pull_trees(client, workspace, tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("print('hi')\n")
    (source / "README").write_text("readme\n")
    stats = client.push(workspace, source, "project")
    assert stats.files == 2 and stats.directories >= 1
    assert client.read_file(workspace, "project/pkg/mod.py") == b"print('hi')\n"
    out = tmp_path / "out"
    assert client.pull(workspace, "project", out) >= 2
    assert (out / "pkg" / "mod.py").read_text() == "print('hi')\n"
    assert (out / "README").read_text() == "readme\n"


def test_mcp_stdio_server_tools(client, workspace):
    client.write_file(workspace, "tools/mcp_echo.py", MCP_ECHO)
    server = berth.McpServer("echo", berth.McpStdio(command="python3", args=("tools/mcp_echo.py",)))
    stored = client.add_mcp(workspace, server)
    assert stored.name == "echo" and stored.transport.command == "python3"
    with pytest.raises(berth.AlreadyExistsError):
        client.add_mcp(workspace, server)
    assert [status.server.name for status in client.list_mcps(workspace)] == ["echo"]
    tools = {tool.name: tool for tool in client.list_mcp_tools(workspace, "echo")}
    assert set(tools) == {"echo", "add"}
    assert json.loads(tools["add"].input_schema_json)["required"] == ["a", "b"]
    result = client.call_mcp_tool(workspace, "echo", "add", {"a": 2, "b": 40})
    assert result.text == "42" and not result.is_error
    assert client.list_mcps(workspace)[0].live
    assert client.remove_mcp(workspace, "echo") is True
    assert client.list_mcps(workspace) == []


def _skill_tar(name: str, description: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        body = f"---\nname: {name}\ndescription: {description}\n---\n# {name}\nDo the thing.\n".encode()
        member = tarfile.TarInfo(f"{name}/SKILL.md")
        member.size = len(body)
        archive.addfile(member, io.BytesIO(body))
    return buffer.getvalue()


def test_skills(client, workspace):
    added = client.add_skill(workspace, _skill_tar("greeter", "Greets people"))
    assert added.skill.name == "greeter" and added.skill.path == "skills/greeter"
    assert [skill.name for skill in client.list_skills(workspace)] == ["greeter"]
    skill = client.get_skill(workspace, "greeter")
    assert skill.info.description == "Greets people" and "Do the thing." in skill.body
    with pytest.raises(berth.AlreadyExistsError):
        client.add_skill(workspace, _skill_tar("greeter", "again"))
    assert client.remove_skill(workspace, "greeter")
    assert client.list_skills(workspace) == []


def test_offload(client, workspace):
    offloaded = client.offload_context(workspace, "s1", [{"role": "user", "content": "hi"}, '{"role":"assistant"}'])
    assert offloaded.path == "sessions/s1/context.jsonl" and offloaded.messages == 2
    lines = client.read_file(workspace, offloaded.path).decode().splitlines()
    assert [json.loads(line)["role"] for line in lines] == ["user", "assistant"]
    big = "x" * 40_000
    result = client.offload_tool_result(workspace, "s1", "call-1", big)
    assert result.offloaded and result.path.startswith("sessions/s1/tool_result-call-1")
    assert client.read_file(workspace, result.path) == big.encode()
    small = client.offload_tool_result(workspace, "s1", "call-2", "tiny")
    assert not small.offloaded and small.preview == "tiny"


def test_admin_nodes_and_status(client):
    nodes = client.list_nodes()
    assert len(nodes) == 1 and nodes[0].state == "live" and "local" in nodes[0].backends
    status = client.status()
    assert status.registry.healthy and status.registry.registry == "embedded"
    assert status.answered_by and len(status.nodes) == 1


def test_asyncio_client(up):
    import asyncio

    async def main() -> None:
        async with berth.aio.Client(up.endpoint) as aclient:
            session = await aclient.create_session(user=unique("async"), agent="coder")
            workspace = session.workspace_id
            result = await aclient.exec(workspace, ["sh", "-c", "exit 5"])
            assert result.exit_code == 5
            timed = await aclient.exec(workspace, ["sleep", "10"], timeout=0.3)
            assert timed.timed_out
            events = [event async for event in aclient.exec_stream(workspace, ["echo", "streamed"])]
            assert events[-1].exit.exit_code == 0 and b"".join(e.stdout for e in events) == b"streamed\n"
            data = os.urandom(1024 * 1024)
            assert await aclient.write_file(workspace, "a.bin", data) == len(data)
            assert await aclient.read_file(workspace, "a.bin") == data

            async def chunks():
                for _ in range(4):
                    yield b"abcd" * 1000

            assert await aclient.write_file_stream(workspace, "s.bin", chunks()) == 16_000
            assert (await aclient.stat(workspace, "s.bin")).size == 16_000
            assert "a.bin" in {entry.name for entry in await aclient.ls(workspace)}
            assert await aclient.rm(workspace, "a.bin")
            with pytest.raises(berth.NotFoundError):
                await aclient.read_file(workspace, "a.bin")
            assert len(await aclient.list_nodes()) == 1

    asyncio.run(main())


def _error(code, message="", retryable=False, kind=None) -> BerthError:
    return berth.BerthError(message, code=code, retryable=retryable, kind=kind)


def test_retry_decisions():
    refused = _error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: Connection refused")
    assert never_sent(refused)
    assert should_retry(refused, "Exec") == "failover"
    # The server marked it: any call may be repeated.
    marked = _error(grpc.StatusCode.UNAVAILABLE, "node node-1 is away", retryable=True)
    assert should_retry(marked, "Exec") == "retry"
    assert should_retry(_error(grpc.StatusCode.ABORTED, "lock busy", retryable=True), "CreateSession") == "retry"
    # A broken transport after send: only read-only calls are repeated.
    reset = _error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert should_retry(reset, "Exec") is None
    assert should_retry(reset, "WriteFile") is None
    assert should_retry(reset, "ReadFile") == "failover"
    # The outcome is unknown, or a plain error: never repeated.
    assert should_retry(_error(grpc.StatusCode.UNKNOWN, "outcome unknown"), "Stat") is None
    assert should_retry(_error(grpc.StatusCode.NOT_FOUND, "no such"), "GetWorkspace") is None
    assert should_retry(marked, "WriteFile", replayable=False) is None
