"""``BerthWorkspace``: an OpenHands SDK workspace held by Berth.

Use it where an agent would use ``LocalWorkspace`` or ``RemoteWorkspace``:

.. code-block:: python

    from berth.openhands import BerthWorkspace

    with BerthWorkspace(endpoint="http://127.0.0.1:7070", user="alice", agent="openhands") as ws:
        result = ws.execute_command("git status")
        ws.file_upload("local.txt", "remote.txt")

Commands run with ``bash`` when the sandbox has it (``sh`` otherwise) in the workspace
Berth placed on any backend; files move over Berth's file RPCs; git changes and diffs are
computed by ``git`` inside the workspace.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from openhands.sdk.git.models import GitChange, GitChangeStatus, GitDiff
from openhands.sdk.workspace.base import BaseWorkspace
from openhands.sdk.workspace.models import CommandResult, FileOperationResult
from pydantic import Field, PrivateAttr, SecretStr

import berth

#: git's empty tree: the base of a repository without commits.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

#: Prints the ref to compare against: the fork point from the upstream (or origin's
#: default branch), else HEAD, else the empty tree.
_BASE_REF = f"""
up=$(git rev-parse --abbrev-ref --symbolic-full-name '@{{upstream}}' 2>/dev/null || git rev-parse --abbrev-ref origin/HEAD 2>/dev/null || true)
if [ -n "$up" ] && base=$(git merge-base HEAD "$up" 2>/dev/null); then echo "$base"
elif git rev-parse --verify -q HEAD >/dev/null; then echo HEAD
else echo {EMPTY_TREE}; fi
"""

_STATUS = {"A": GitChangeStatus.ADDED, "D": GitChangeStatus.DELETED, "M": GitChangeStatus.UPDATED, "U": GitChangeStatus.UPDATED}


class BerthCommandResult(CommandResult):
    """OpenHands' command result plus how long the command ran."""

    duration_ms: int = Field(default=0, description="How long the command ran, as Berth measured it")


class BerthWorkspace(BaseWorkspace):
    """An OpenHands workspace whose commands and files live in a Berth workspace.

    Either name ``workspace_id``, or ``user`` and ``agent`` (and optionally ``session``)
    to bind one under the replicas' isolation policy. ``working_dir`` is the agent's
    directory: empty means the workspace root; a relative path is under the root.
    """

    endpoint: str | list[str] = Field(description="Berth replica URL(s); calls fail over across them")
    token: SecretStr | None = Field(default=None, description="Bearer token (None for --auth none)")
    act_as: str | None = Field(default=None, description="User a service token acts for")
    ca_cert: str | None = Field(default=None, description="CA certificate (path) of the replicas' TLS")
    user: str | None = Field(default=None, description="User of the session (default: the caller's)")
    agent: str = Field(default="openhands", description="Agent id of the session")
    session: str | None = Field(default=None, description="Session id (minted by Berth when omitted)")
    workspace_id: str | None = Field(default=None, description="Explicit Berth workspace to use")
    backend: str | None = Field(default=None, description="Berth backend for a new workspace")
    working_dir: str = Field(default="", description="Agent directory; empty = the workspace root")

    _client: Any = PrivateAttr(default=None)
    _root: str = PrivateAttr(default="")

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        token = self.token.get_secret_value() if self.token is not None else None
        self._client = berth.Client(self.endpoint, token=token, act_as=self.act_as, ca_cert=self.ca_cert)
        if not self.workspace_id or self.user:
            bound = self._client.create_session(
                user=self.user, agent=self.agent, session=self.session, workspace_id=self.workspace_id, backend=self.backend
            )
            self.workspace_id = bound.workspace_id
            self.session = bound.session_id
        probe = self._client.exec(self.workspace_id, ["pwd"], timeout=60)
        root = probe.stdout.decode().strip()
        if probe.exit_code != 0 or not root.startswith("/"):
            raise RuntimeError(f"workspace {self.workspace_id}: cannot find its root: {probe.stderr!r}")
        self._root = root
        working = self.working_dir or root
        if not working.startswith("/"):
            working = posixpath.join(root, working)
        self.working_dir = posixpath.normpath(working)
        relative = self._relative(self.working_dir)
        if relative:
            self._client.mkdir(self.workspace_id, relative)

    # ---- helpers -------------------------------------------------------------------------------

    @property
    def client(self) -> berth.Client:
        return self._client

    @property
    def root(self) -> str:
        """The workspace root as commands inside the sandbox see it."""
        return self._root

    def _absolute(self, path: str | Path) -> str:
        text = str(path)
        return posixpath.normpath(text if text.startswith("/") else posixpath.join(self.working_dir, text))

    def _relative(self, path: str | Path) -> str | None:
        absolute = self._absolute(path)
        if absolute == self._root:
            return ""
        prefix = self._root.rstrip("/") + "/"
        return absolute[len(prefix) :] if absolute.startswith(prefix) else None

    def _run(self, script: str, cwd: str, timeout: float) -> berth.ExecResult:
        wrapper = 'cd "$1" || exit 1; shift; if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; fi; exec sh -c "$1"'
        return self._client.exec(self.workspace_id, ["sh", "-c", wrapper, "sh", cwd, script], timeout=timeout)

    # ---- BaseWorkspace -------------------------------------------------------------------------

    def execute_command(self, command: str, cwd: str | Path | None = None, timeout: float = 30.0) -> CommandResult:
        """Runs a shell command in the workspace; a timeout kills its process tree."""
        directory = self._absolute(cwd) if cwd is not None else self.working_dir
        started = time.monotonic()
        result = self._run(command, directory, timeout)
        return BerthCommandResult(
            command=command,
            exit_code=-1 if result.timed_out else result.exit_code,
            stdout=result.stdout.decode("utf-8", "replace"),
            stderr=result.stderr.decode("utf-8", "replace"),
            timeout_occurred=result.timed_out,
            duration_ms=result.duration_ms or int((time.monotonic() - started) * 1000),
        )

    def file_upload(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        """Copies a local file into the workspace (atomically, streamed)."""
        destination = self._absolute(destination_path)
        try:
            relative = self._relative(destination)
            if relative is None or relative == "":
                raise ValueError(f"{destination} is outside the workspace {self._root}")

            def chunks():
                with open(source_path, "rb") as handle:
                    while block := handle.read(1 << 20):
                        yield block

            size = self._client.write_file_stream(self.workspace_id, relative, chunks())
            return FileOperationResult(success=True, source_path=str(source_path), destination_path=destination, file_size=size)
        except (OSError, ValueError, berth.BerthError) as error:
            return FileOperationResult(success=False, source_path=str(source_path), destination_path=destination, error=str(error))

    def file_download(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        """Copies a workspace file to a local path (written to a temp file, then renamed)."""
        source = self._absolute(source_path)
        destination = Path(destination_path)
        try:
            relative = self._relative(source)
            if relative is None:
                raise ValueError(f"{source} is outside the workspace {self._root}")
            destination.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in self._client.read_file_stream(self.workspace_id, relative):
                        out.write(chunk)
                os.replace(temp, destination)
            except BaseException:
                os.unlink(temp)
                raise
            return FileOperationResult(
                success=True, source_path=source, destination_path=str(destination), file_size=destination.stat().st_size
            )
        except (OSError, ValueError, berth.BerthError) as error:
            return FileOperationResult(success=False, source_path=source, destination_path=str(destination), error=str(error))

    def _git(self, directory: str, script: str) -> str:
        result = self._run(script, directory, 120.0)
        if result.exit_code != 0:
            raise RuntimeError(f"git in {directory} failed ({result.exit_code}): {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode("utf-8", "surrogateescape")

    def git_changes(self, path: str | Path) -> list[GitChange]:
        """Files changed in the repository at ``path`` against its base (untracked = added)."""
        directory = self._absolute(path)
        script = (
            "git rev-parse --show-toplevel >/dev/null || exit 3\n"
            f"ref=$({_BASE_REF})\n"
            'git --no-pager diff --no-renames --name-status -z "$ref" --\n'
            "printf '\\0--untracked--\\0'\n"
            "git --no-pager ls-files --others --exclude-standard -z\n"
        )
        fields = self._git(directory, script).split("\0")
        marker = fields.index("--untracked--")
        tracked, untracked = fields[:marker], fields[marker + 1 :]
        changes = []
        for status, name in zip(tracked[0::2], tracked[1::2]):
            if status and name:
                changes.append(GitChange(status=_STATUS.get(status[0], GitChangeStatus.UPDATED), path=Path(name)))
        changes.extend(GitChange(status=GitChangeStatus.ADDED, path=Path(name)) for name in untracked if name)
        return changes

    def git_diff(self, path: str | Path) -> GitDiff:
        """The file's content at the base (``original``) and now (``modified``)."""
        absolute = self._absolute(path)
        directory, name = posixpath.split(absolute)
        script = (
            "git rev-parse --show-toplevel >/dev/null 2>&1 || exit 3\n"
            f"ref=$({_BASE_REF})\n"
            f'rel="$(git rev-parse --show-prefix)"{shlex.quote(name)}\n'
            'git --no-pager show "$ref:$rel" 2>/dev/null || exit 4\n'
        )
        result = self._run(script, directory, 120.0)
        if result.exit_code == 3:
            raise RuntimeError(f"{absolute} is not in a git repository")
        original = result.stdout.decode("utf-8", "replace") if result.exit_code == 0 else None
        relative = self._relative(absolute)
        modified: str | None = None
        if relative is not None:
            try:
                modified = self._client.read_file(self.workspace_id, relative).decode("utf-8", "replace")
            except berth.NotFoundError:
                modified = None
        return GitDiff(modified=modified, original=original)

    def pause(self) -> None:
        """Stops the workspace's runtime; its files stay (Berth state IDLE)."""
        self._client.close_workspace(self.workspace_id)

    def resume(self) -> None:
        """Starts the runtime again over the kept files."""
        self._client.exec(self.workspace_id, ["true"], timeout=60)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self._send_completion_callback(exc_type, exc_val)
        if self._client is not None:
            self._client.close()
