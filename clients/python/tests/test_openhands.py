"""The OpenHands SDK's workspace operations through ``berth.openhands.BerthWorkspace``
against a real ``berth up``: commands, upload, download, git changes and diff."""

from __future__ import annotations

import os

from openhands.sdk.git.models import GitChangeStatus
from openhands.sdk.workspace import BaseWorkspace, CommandResult

import berth
from berth.openhands import BerthWorkspace
from conftest import unique


def test_commands_files_and_git(up, tmp_path):
    with BerthWorkspace(endpoint=up.endpoint, user=unique("oh"), agent="openhands", working_dir="project") as workspace:
        assert isinstance(workspace, BaseWorkspace)
        assert workspace.working_dir == f"{workspace.root}/project"

        result = workspace.execute_command("echo out; echo err >&2; pwd; exit 3")
        assert isinstance(result, CommandResult)
        assert (result.exit_code, result.stderr, result.timeout_occurred) == (3, "err\n", False)
        assert result.stdout == f"out\n{workspace.working_dir}\n"
        assert result.duration_ms >= 0
        timed = workspace.execute_command("sleep 30", timeout=0.5)
        assert timed.timeout_occurred and timed.exit_code == -1
        assert workspace.execute_command("pwd", cwd="/tmp").stdout.strip() == "/tmp"

        local = tmp_path / "upload.bin"
        payload = os.urandom(3 * 1024 * 1024 + 5)
        local.write_bytes(payload)
        uploaded = workspace.file_upload(local, "data/upload.bin")
        assert uploaded.success and uploaded.file_size == len(payload), uploaded.error
        assert workspace.execute_command("wc -c < data/upload.bin").stdout.strip() == str(len(payload))
        downloaded = workspace.file_download("data/upload.bin", tmp_path / "back" / "download.bin")
        assert downloaded.success and (tmp_path / "back" / "download.bin").read_bytes() == payload
        missing = workspace.file_download("data/nope.bin", tmp_path / "nope.bin")
        assert not missing.success and "not found" in missing.error
        outside = workspace.file_upload(local, "/etc/evil.bin")
        assert not outside.success

        setup = workspace.execute_command(
            "git init -q -b main . && git config user.email t@example.com && git config user.name t && "
            "printf 'one\\n' > tracked.txt && printf 'gone\\n' > removed.txt && git add . && git commit -qm base && "
            "printf 'two\\n' > tracked.txt && rm removed.txt && printf 'new\\n' > added.txt"
        )
        assert setup.exit_code == 0, setup.stderr
        changes = {(change.status, str(change.path)) for change in workspace.git_changes(".")}
        assert (GitChangeStatus.UPDATED, "tracked.txt") in changes
        assert (GitChangeStatus.DELETED, "removed.txt") in changes
        assert (GitChangeStatus.ADDED, "added.txt") in changes
        diff = workspace.git_diff("tracked.txt")
        assert (diff.original, diff.modified) == ("one\n", "two\n")
        new_file = workspace.git_diff("added.txt")
        assert (new_file.original, new_file.modified) == (None, "new\n")

        workspace_id = workspace.workspace_id
        workspace.pause()
        with berth.Client(up.endpoint) as direct:
            assert direct.get_workspace(workspace_id).state is berth.WorkspaceState.IDLE
        workspace.resume()
        assert workspace.execute_command("cat tracked.txt").stdout == "two\n"


def test_explicit_workspace_is_joined(up):
    with berth.Client(up.endpoint) as direct:
        session = direct.create_session(user=unique("oh"), agent="coder")
        direct.write_file(session.workspace_id, "hello.txt", b"hi")
    with BerthWorkspace(endpoint=up.endpoint, workspace_id=session.workspace_id) as workspace:
        assert workspace.execute_command("cat hello.txt").stdout == "hi"
