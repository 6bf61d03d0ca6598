"""Drives the E2B emulator with the official E2B Python SDK (pinned in
.ci/requirements/e2b.txt): create with metadata and env, list by metadata with paging,
commands (exit codes, stdout / stderr, env, cwd, stdin, kill), files (write as multipart and
as octet-stream, read, list, stat, make_dir, rename, remove), pause and connect (resume,
files kept), kill, and injected faults (429, 401) reaching the SDK as E2B's errors. Every step prints "ok <step>"; the last line is "ALL OK". Any mismatch
raises, so the process exits non-zero.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the Rust test sets them).
"""

import json
import os
import sys
import urllib.request
import uuid

from e2b import CommandExitException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, RateLimitException


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def step(name):
    print(f"ok {name}", flush=True)


def knob(method, fault=None):
    """The emulator's fault knob (POST a fault, DELETE them all)."""
    body = json.dumps(fault).encode() if fault else None
    request = urllib.request.Request(f"{os.environ['E2B_API_URL']}/_emulator/faults", data=body, method=method)
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request).close()


def faults():
    """Injected faults reach the SDK as E2B's own errors: 429 is rate limiting (retried by
    the SDK, so a lasting one), 401 an authentication failure."""
    knob("POST", {"target": "api", "status": 429, "count": 50, "method": "GET", "path_prefix": "/v2/sandboxes"})
    try:
        Sandbox.list().next_items()
        raise AssertionError("a lasting 429 did not raise")
    except RateLimitException:
        pass
    knob("DELETE")
    knob("POST", {"target": "api", "status": 401, "count": 1, "message": "Invalid API key"})
    try:
        Sandbox.list().next_items()
        raise AssertionError("a 401 did not raise")
    except AuthenticationException:
        pass
    Sandbox.list().next_items()


def main():
    cluster = f"sdk-{uuid.uuid4().hex[:8]}"
    meta = {"berth.workspace.id": "ws-sdk", "berth.cluster": cluster}
    sandbox = Sandbox.create(template="base", metadata=meta, envs={"SDK_VALUE": "from create"}, timeout=300)
    step("create")

    result = sandbox.commands.run("echo $SDK_VALUE; pwd; id -u")
    lines = result.stdout.splitlines()
    check(lines == ["from create", "/home/user", "1000"], f"stdout {result.stdout!r}")
    check(result.exit_code == 0, f"exit {result.exit_code}")
    step("commands.run")

    try:
        sandbox.commands.run("printf out; printf err >&2; exit 3", envs={"X": "1"})
        raise AssertionError("exit 3 did not raise")
    except CommandExitException as error:
        check(error.exit_code == 3, f"exit code {error.exit_code}")
        check(error.stdout == "out" and error.stderr == "err", f"{error.stdout!r} {error.stderr!r}")
    step("commands.exit_code")

    result = sandbox.commands.run("pwd", cwd="/tmp")
    check(result.stdout.strip() == "/tmp", result.stdout)
    step("commands.cwd")

    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "ping\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    check(result.stdout == "ping\n", f"stdin echo {result.stdout!r}")
    step("commands.stdin")

    handle = sandbox.commands.run("sleep 30", background=True)
    pids = [process.pid for process in sandbox.commands.list()]
    check(handle.pid in pids, f"{handle.pid} not in {pids}")
    check(sandbox.commands.kill(handle.pid), "kill returned False")
    try:
        handle.wait()
        raise AssertionError("a killed command exited cleanly")
    except CommandExitException as error:
        check(error.exit_code == -1, f"killed exit code {error.exit_code}")
    step("commands.kill")

    sandbox.files.write("/home/user/dir/small.txt", "hello")
    check(sandbox.files.read("/home/user/dir/small.txt") == "hello", "multipart write")
    sandbox.files.write("/home/user/dir/streamed.bin", iter([b"a" * 100_000, b"b" * 3]))
    data = sandbox.files.read("/home/user/dir/streamed.bin", format="bytes")
    check(len(data) == 100_003 and data.endswith(b"abbb"), f"octet-stream write {len(data)}")
    step("files.write_read")

    names = sorted(entry.name for entry in sandbox.files.list("/home/user/dir"))
    check(names == ["small.txt", "streamed.bin"], f"list {names}")
    info = sandbox.files.get_info("/home/user/dir/small.txt")
    check(info.size == 5 and info.type.value == "file", f"info {info}")
    check(sandbox.files.exists("/home/user/dir/small.txt"), "exists")
    check(not sandbox.files.exists("/home/user/nope"), "exists on missing")
    check(sandbox.files.make_dir("/home/user/made/deep"), "make_dir")
    check(not sandbox.files.make_dir("/home/user/made/deep"), "make_dir twice")
    sandbox.files.rename("/home/user/dir/small.txt", "/home/user/made/moved.txt")
    check(sandbox.commands.run("cat /home/user/made/moved.txt").stdout == "hello", "rename visible to commands")
    sandbox.files.remove("/home/user/made")
    check(not sandbox.files.exists("/home/user/made"), "remove")
    step("files.ops")

    others = [Sandbox.create(template="base", metadata={"berth.cluster": cluster, "n": str(n)}) for n in range(2)]
    found = []
    paginator = Sandbox.list(query=SandboxQuery(metadata={"berth.cluster": cluster}), limit=1)
    pages = 0
    while paginator.has_next:
        found.extend(item.sandbox_id for item in paginator.next_items())
        pages += 1
    expected = sorted([sandbox.sandbox_id] + [other.sandbox_id for other in others])
    check(sorted(found) == expected, f"listed {found} expected {expected}")
    check(pages == 3, f"{pages} pages of one")
    only = Sandbox.list(query=SandboxQuery(metadata=meta)).next_items()
    check([item.sandbox_id for item in only] == [sandbox.sandbox_id], f"metadata filter {only}")
    check(only[0].metadata == meta, f"metadata {only[0].metadata}")
    step("list.metadata_paging")

    sandbox.pause()
    paused = Sandbox.list(query=SandboxQuery(metadata=meta, state=[SandboxState.PAUSED])).next_items()
    check([item.sandbox_id for item in paused] == [sandbox.sandbox_id], f"paused list {paused}")
    resumed = Sandbox.connect(sandbox.sandbox_id)
    check(resumed.files.read("/home/user/dir/streamed.bin", format="bytes")[:3] == b"aaa", "files kept over pause")
    check(resumed.commands.run("echo back").stdout == "back\n", "commands after resume")
    step("pause.connect")

    for other in others:
        other.kill()
    Sandbox.kill(sandbox.sandbox_id)
    left = Sandbox.list(query=SandboxQuery(metadata={"berth.cluster": cluster})).next_items()
    check(left == [], f"left after kill {left}")
    check(not resumed.is_running(), "is_running after kill")
    step("kill")
    faults()
    step("faults")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - the Rust test prints it
        print(f"FAILED: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise
