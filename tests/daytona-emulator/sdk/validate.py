"""The official Daytona SDK (daytona==0.226.1) against the Berth Daytona emulator.

Run by tests/sdk_validation.rs with DAYTONA_API_URL / DAYTONA_API_KEY pointing at the
emulator. Prints "ok <step>" per flow and "ALL OK" at the end; any failure raises.
"""

import os
import time

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConfig,
    FileUpload,
    ListSandboxesQuery,
    SessionExecuteRequest,
)


def ok(step):
    print(f"ok {step}", flush=True)


def main():
    daytona = Daytona(DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"]))
    run = f"sdk-{os.getpid()}"
    labels = {"berth.sdk.run": run, "role": "first"}
    sandbox = daytona.create(
        CreateSandboxFromSnapshotParams(labels=labels, env_vars={"BERTH_SDK_ENV": "from-create"}), timeout=60
    )
    assert sandbox.state == "started", sandbox.state
    assert sandbox.labels["berth.sdk.run"] == run
    ok("create")

    response = sandbox.process.exec("echo hello; echo oops >&2; exit 3")
    assert response.exit_code == 3, response
    assert "hello" in response.result and "oops" in response.result, response.result
    ok("process.exec")
    response = sandbox.process.exec('printf %s "$BERTH_SDK_ENV|$EXTRA"', env={"EXTRA": "per-call"})
    assert response.result == "from-create|per-call", response.result
    home = sandbox.get_user_home_dir()
    os.makedirs("/tmp", exist_ok=True)
    response = sandbox.process.exec("pwd", cwd=home)
    assert response.result.strip() == home, (response.result, home)
    ok("process.exec.env_cwd")

    payload = bytes(range(256)) * 4096 + b"tail"
    sandbox.fs.upload_file(payload, f"{home}/dir/data.bin")
    sandbox.fs.upload_files(
        [FileUpload(source=b"one", destination=f"{home}/multi/one.txt"), FileUpload(source=b"two", destination=f"{home}/multi/two.txt")]
    )
    assert sandbox.fs.download_file(f"{home}/dir/data.bin") == payload
    streamed = b"".join(sandbox.fs.download_file_stream(f"{home}/multi/two.txt"))
    assert streamed == b"two", streamed
    results = sandbox.fs.download_files([])
    assert results == []
    ok("fs.upload_download")

    names = sorted(entry.name for entry in sandbox.fs.list_files(f"{home}/multi"))
    assert names == ["one.txt", "two.txt"], names
    info = sandbox.fs.get_file_info(f"{home}/dir/data.bin")
    assert info.size == len(payload) and not info.is_dir, info
    sandbox.fs.create_folder(f"{home}/made", "755")
    assert sandbox.fs.get_file_info(f"{home}/made").is_dir
    sandbox.fs.move_files(f"{home}/multi/one.txt", f"{home}/made/one.txt")
    assert sandbox.fs.download_file(f"{home}/made/one.txt") == b"one"
    sandbox.fs.delete_file(f"{home}/made", recursive=True)
    try:
        sandbox.fs.get_file_info(f"{home}/made")
        raise AssertionError("a deleted folder is still there")
    except Exception as error:  # DaytonaNotFoundError
        assert "not found" in str(error).lower() or "no such" in str(error).lower(), error
    ok("fs.ops")

    sandbox.process.create_session("berth-sdk")
    started = sandbox.process.execute_session_command(
        "berth-sdk", SessionExecuteRequest(command="read line; echo got:$line; echo err >&2; exit 4", run_async=True)
    )
    sandbox.process.send_session_command_input("berth-sdk", started.cmd_id, "hi\n")
    deadline = time.time() + 20
    while sandbox.process.get_session_command("berth-sdk", started.cmd_id).exit_code is None:
        assert time.time() < deadline, "the session command did not end"
        time.sleep(0.05)
    assert sandbox.process.get_session_command("berth-sdk", started.cmd_id).exit_code == 4
    logs = sandbox.process.get_session_command_logs("berth-sdk", started.cmd_id)
    assert logs.stdout == "got:hi\n" and logs.stderr == "err\n", logs
    finished = sandbox.process.execute_session_command("berth-sdk", SessionExecuteRequest(command="echo sync"))
    assert finished.exit_code == 0 and finished.stdout == "sync\n", finished
    assert any(session.session_id == "berth-sdk" for session in sandbox.process.list_sessions())
    sandbox.process.delete_session("berth-sdk")
    ok("process.sessions")

    second = daytona.create(CreateSandboxFromSnapshotParams(labels={"berth.sdk.run": run, "role": "second"}))
    third = daytona.create(CreateSandboxFromSnapshotParams(labels={"berth.sdk.run": "someone-else"}))
    found = sorted(s.id for s in daytona.list(ListSandboxesQuery(labels={"berth.sdk.run": run}, limit=1)))
    assert found == sorted([sandbox.id, second.id]), found
    only = [s.id for s in daytona.list(ListSandboxesQuery(labels={"berth.sdk.run": run, "role": "second"}))]
    assert only == [second.id], only
    assert daytona.get(sandbox.id).labels["role"] == "first"
    sandbox.set_labels({"berth.sdk.run": run, "role": "replaced"})
    assert daytona.get(sandbox.id).labels == {"berth.sdk.run": run, "role": "replaced"}
    ok("list.labels_paging")

    sandbox.stop()
    assert daytona.get(sandbox.id).state == "stopped"
    sandbox.start()
    assert daytona.get(sandbox.id).state == "started"
    assert sandbox.fs.download_file(f"{home}/dir/data.bin") == payload
    ok("stop.start")

    for each in (sandbox, second, third):
        daytona.delete(each)
    remaining = [s.id for s in daytona.list(ListSandboxesQuery(labels={"berth.sdk.run": run}))]
    assert remaining == [], remaining
    try:
        daytona.get(sandbox.id)
        raise AssertionError("a deleted sandbox is still there")
    except Exception as error:
        assert "not found" in str(error).lower(), error
    ok("delete")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
