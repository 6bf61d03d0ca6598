"""Drives the official OpenSandbox Python SDK against a real opensandbox-server whose sandboxes
run Berth's execd stand-in, to keep the stand-in honest: every flow below is the SDK's own
code path (lifecycle REST on the server, execd API in the sandbox).

Run by tests/sdk_validation.rs with the venv of .ci/requirements/opensandbox.txt:
    python sdk_validation.py SERVER_PORT API_KEY IMAGE LABEL_PREFIX
Prints one "ok <check>" line per check and "sdk validation: N checks passed" at the end;
any failure raises (exit code 1). Every sandbox it creates is killed before it exits.
"""

import sys
from datetime import timedelta

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.filesystem import DirectoryListEntry, MoveEntry, WriteEntry
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync
from opensandbox.sync.sandbox import SandboxSync

port, api_key, image, prefix = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
config = ConnectionConfigSync(
    api_key=api_key,
    domain=f"127.0.0.1:{port}",
    protocol="http",
    request_timeout=timedelta(seconds=30),
)
checks = []


def ok(name):
    checks.append(name)
    print(f"ok {name}", flush=True)


def text(logs):
    return "".join(message.text for message in logs)


created = []
try:
    label = {"sdk.berth.test/run": prefix}
    sandbox = SandboxSync.create(
        image,
        entrypoint=["tail", "-f", "/dev/null"],
        metadata=label,
        timeout=None,
        ready_timeout=timedelta(seconds=60),
        connection_config=config,
    )
    created.append(sandbox.id)
    ok("create with metadata (the SDK pinged the stand-in through the server's endpoint)")

    manager = SandboxManagerSync.create(connection_config=config)
    listed = manager.list_sandbox_infos(SandboxFilter(metadata=label))
    assert [info.id for info in listed.sandbox_infos] == [sandbox.id], listed
    assert listed.sandbox_infos[0].metadata.get("sdk.berth.test/run") == prefix
    ok("list by metadata")

    again = SandboxSync.connect(sandbox.id, connection_config=config)
    assert again.id == sandbox.id
    ok("connect")

    execution = again.commands.run("echo out; echo err >&2; exit 3")
    assert text(execution.logs.stdout) == "out\n", execution.logs.stdout
    assert text(execution.logs.stderr) == "err\n", execution.logs.stderr
    assert execution.error is not None and execution.error.value == "3", execution.error
    ok("command: stdout, stderr, exit code")

    execution = again.commands.run("printf 'a b'")
    assert execution.error is None and text(execution.logs.stdout) == "a b", execution
    ok("command: success")

    again.files.write_files([WriteEntry(path="/tmp/sdk/hello.txt", data="hello sdk\n", mode=644)])
    assert again.files.read_file("/tmp/sdk/hello.txt") == "hello sdk\n"
    payload = bytes(range(256)) * 4096
    again.files.write_files([WriteEntry(path="/tmp/sdk/blob.bin", data=payload, mode=600)])
    assert again.files.read_bytes("/tmp/sdk/blob.bin") == payload
    ok("files: write, read (text and 1 MiB binary)")

    info = again.files.get_file_info(["/tmp/sdk/blob.bin"])["/tmp/sdk/blob.bin"]
    assert info.size == len(payload) and info.mode == 600, info
    ok("files: info")

    entries = again.files.list_directory(DirectoryListEntry(path="/tmp/sdk"))
    assert sorted(entry.path for entry in entries) == ["/tmp/sdk/blob.bin", "/tmp/sdk/hello.txt"], entries
    ok("files: list")

    again.files.move_files([MoveEntry(src="/tmp/sdk/hello.txt", dest="/tmp/sdk/moved.txt")])
    assert again.files.read_file("/tmp/sdk/moved.txt") == "hello sdk\n"
    ok("files: move")

    again.files.delete_files(["/tmp/sdk/moved.txt"])
    names = [entry.path for entry in again.files.list_directory(DirectoryListEntry(path="/tmp/sdk"))]
    assert names == ["/tmp/sdk/blob.bin"], names
    again.files.delete_directories(["/tmp/sdk"])
    assert "sdk" not in text(again.commands.run("ls /tmp").logs.stdout).split()
    ok("files: remove")

    again.kill()
    created.remove(sandbox.id)
    remaining = manager.list_sandbox_infos(SandboxFilter(metadata=label)).sandbox_infos
    assert all(info.status.state not in ("Running", "Paused") for info in remaining), remaining
    ok("kill")
    manager.close()
finally:
    for sandbox_id in created:
        try:
            SandboxManagerSync.create(connection_config=config).kill_sandbox(sandbox_id)
        except Exception as problem:  # report, keep cleaning
            print(f"cleanup of {sandbox_id} failed: {problem}", file=sys.stderr)

print(f"sdk validation: {len(checks)} checks passed", flush=True)
