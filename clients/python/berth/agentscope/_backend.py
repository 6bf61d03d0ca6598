"""``BerthBackend``: AgentScope's :class:`BackendBase` over Berth RPCs.

Paths inside the workspace root (the sandbox's view of it, e.g. ``/workspace`` on
bubblewrap, the host directory on ``local``) go through Berth's file RPCs — ReadFile,
WriteFile, Stat, ListDir, RemovePath — never a shell round trip. Paths outside the root
(``/tmp`` inside a sandbox, say) exist only inside the sandbox, so they go through Exec
there, exactly as on AgentScope's other sandboxed backends.
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import AsyncIterator

from agentscope.tool import BackendBase, ExecResult
from agentscope.tool._builtin._backend import DEFAULT_READ_CHUNK_SIZE, DirEntry

import berth
import berth.aio
from berth._types import FileInfo, FileKind

#: Largest output Exec may return for a file read through the sandbox (Berth's ceiling).
_MAX_OUTPUT = 64 * 1024 * 1024

#: Errors that mean "the command could not start" (a shell would say 127).
_NOT_STARTED = (berth.InvalidArgumentError, berth.NotFoundError, berth.FailedPreconditionError)


class BerthBackend(BackendBase):
    """Exec and files of one Berth workspace, as AgentScope's builtin tools expect them.

    Args:
        client: an asyncio client acting for the workspace's user.
        workspace_id: the Berth workspace.
        root: the workspace root as commands inside the sandbox see it (``pwd`` of an exec
            with no cwd).
        default_timeout: seconds a command may run when the caller names no timeout
            (AgentScope's ``None`` means "no limit"; Berth always bounds an exec).
    """

    _path_module = posixpath
    os_name = "posix"

    def __init__(self, client: berth.aio.Client, workspace_id: str, root: str, *, default_timeout: float = 3600.0) -> None:
        self.client = client
        self.workspace_id = workspace_id
        self.root = posixpath.normpath(root)
        self.default_timeout = default_timeout

    # ---- paths -------------------------------------------------------------------------------

    def relative(self, path: str) -> str | None:
        """The workspace-relative form of ``path``, or None when it lies outside the root."""
        text = str(path)
        absolute = posixpath.normpath(text if text.startswith("/") else posixpath.join(self.root, text))
        if absolute == self.root:
            return ""
        if absolute.startswith(self.root.rstrip("/") + "/"):
            return absolute[len(self.root.rstrip("/")) + 1 :]
        return None

    # ---- the three primitives ------------------------------------------------------------------

    async def exec_shell(self, command: list[str], *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        argv = [str(arg) for arg in command]
        relative_cwd = "" if cwd is None else self.relative(cwd)
        if relative_cwd is None:
            # A cwd outside the root exists only inside the sandbox: cd there first.
            argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(cwd), *argv]
            relative_cwd = ""
        return await self._exec(argv, relative_cwd, timeout)

    async def _exec(self, argv: list[str], cwd: str, timeout: float | None, stdin: bytes | None = None, max_output: int | None = None) -> ExecResult:
        try:
            result = await self.client.exec(
                self.workspace_id,
                argv,
                cwd=cwd,
                timeout=timeout if timeout is not None else self.default_timeout,
                stdin=stdin,
                max_output_bytes=max_output,
            )
        except _NOT_STARTED as error:
            return ExecResult(exit_code=127, stdout=b"", stderr=error.message.encode())
        if result.timed_out:
            # AgentScope's convention for a timeout (the Bash tool checks exactly this).
            return ExecResult(exit_code=-1, stdout=result.stdout, stderr=b"timed out")
        return ExecResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def read_file(self, path: str) -> bytes:
        relative = self.relative(path)
        if relative is None:
            result = await self._exec(["cat", "--", str(path)], "", 300.0, max_output=_MAX_OUTPUT)
            if not result.ok():
                raise FileNotFoundError(f"{path}: {result.stderr.decode(errors='replace').strip()}")
            return result.stdout
        try:
            return await self.client.read_file(self.workspace_id, relative)
        except berth.NotFoundError as error:
            raise FileNotFoundError(f"{path}: {error.message}") from None

    async def write_file(self, path: str, data: bytes) -> None:
        relative = self.relative(path)
        if relative is None:
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
            result = await self._exec(["sh", "-c", script, "sh", str(path)], "", 300.0, stdin=bytes(data))
            if not result.ok():
                raise OSError(f"write {path}: {result.stderr.decode(errors='replace').strip()}")
            return
        await self.client.write_file(self.workspace_id, relative, bytes(data))

    # ---- streams -----------------------------------------------------------------------------

    async def write_stream(self, path: str, stream: AsyncIterator[bytes]) -> None:
        relative = self.relative(path)
        if relative is None:
            await self.write_file(path, b"".join([chunk async for chunk in stream]))
            return
        await self.client.write_file_stream(self.workspace_id, relative, stream)

    async def read_stream(self, path: str, chunk_size: int = DEFAULT_READ_CHUNK_SIZE) -> AsyncIterator[bytes]:
        relative = self.relative(path)
        if relative is None:
            data = await self.read_file(path)
            for start in range(0, len(data), chunk_size):
                yield data[start : start + chunk_size]
            return
        try:
            async for chunk in self.client.read_file_stream(self.workspace_id, relative, chunk_size=min(chunk_size, 4 << 20)):
                yield chunk
        except berth.NotFoundError as error:
            raise FileNotFoundError(f"{path}: {error.message}") from None

    # ---- derived operations, natively ------------------------------------------------------------

    async def getcwd(self) -> str:
        return self.root

    async def _stat(self, relative: str) -> FileInfo | None:
        try:
            return await self.client.stat(self.workspace_id, relative)
        except berth.NotFoundError:
            return None

    async def stat(self, path: str) -> DirEntry | None:
        relative = self.relative(path)
        if relative is None:
            return await super().stat(path)
        info = await self._stat(relative)
        if info is not None and info.kind is FileKind.SYMLINK:
            # AgentScope follows links; Berth's Stat does not: ask the sandbox.
            return await super().stat(path)
        if info is None:
            return None
        return _entry(info, posixpath.basename(str(path).rstrip("/")) or info.name)

    async def file_exists(self, path: str) -> bool:
        return await self.stat(path) is not None

    async def is_dir(self, path: str) -> bool:
        entry = await self.stat(path)
        return entry is not None and entry.is_dir

    async def stat_mtime(self, path: str) -> float | None:
        entry = await self.stat(path)
        return None if entry is None else entry.mtime

    async def _ls(self, relative: str) -> list[FileInfo]:
        try:
            return await self.client.ls(self.workspace_id, relative)
        except (berth.NotFoundError, berth.InvalidArgumentError, berth.FailedPreconditionError):
            return []

    async def list_dir(self, path: str, *, recursive: bool = False) -> list[str]:
        relative = self.relative(path)
        if relative is None:
            return await super().list_dir(path, recursive=recursive)
        if not recursive:
            return [entry.name for entry in await self._ls(relative)]
        # Files under the tree, one ListDir per directory, a level at a time.
        files: list[str] = []
        level = [(relative, str(path).rstrip("/") or "/")]
        while level:
            listings = await asyncio.gather(*(self._ls(rel) for rel, _ in level))
            next_level = []
            for (rel, shown), entries in zip(level, listings):
                for entry in entries:
                    child_shown = posixpath.join(shown, entry.name)
                    if entry.kind is FileKind.DIRECTORY:
                        next_level.append((posixpath.join(rel, entry.name) if rel else entry.name, child_shown))
                    elif entry.kind is FileKind.FILE:
                        files.append(child_shown)
            level = next_level
        return files

    async def scandir(self, path: str) -> list[DirEntry]:
        relative = self.relative(path)
        if relative is None:
            return await super().scandir(path)
        return [_entry(info, info.name) for info in await self._ls(relative)]

    async def delete_path(self, path: str) -> None:
        relative = self.relative(path)
        if relative is None:
            await super().delete_path(path)
            return
        if relative == "":
            raise PermissionError("refusing to delete the workspace root")
        await self.client.rm(self.workspace_id, relative, recursive=True)


def _entry(info: FileInfo, name: str) -> DirEntry:
    is_dir = info.kind is FileKind.DIRECTORY
    mtime = info.modified.timestamp() if info.modified is not None else None
    return DirEntry(name=name, is_dir=is_dir, size_bytes=None if is_dir else info.size, mtime=mtime)
