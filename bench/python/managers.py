"""The workspace managers the Python bench compares, each set up for real on this machine.

- ``agentscope-local``: AgentScope's ``LocalWorkspaceManager`` (host directories, no sandbox).
- ``agentscope-bubblewrap``: AgentScope's ``BubblewrapWorkspaceManager`` (a bwrap sandbox
  per command, an MCP gateway process per workspace).
- ``berth-local`` / ``berth-bubblewrap``: ``BerthWorkspaceManager`` against a ``berth up``
  with the ``local`` / ``bubblewrap`` backend (embedded registry, one node agent).

AgentScope's bubblewrap workspace bootstraps its gateway by downloading ``uv`` from the
internet on first use, which this machine cannot reach; the bench instead installs the
gateway's runtime once from PyPI (``/usr/local/lib/berth-bench/…``, visible inside the
sandbox through its read-only ``/usr``) and lays the gateway files into each workspace
directory before first use — what a prepared image would carry. Everything after that
(sandbox probe, gateway launch and health wait, every command) is AgentScope's own code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

import harness  # noqa: E402  (the client tests' process harness: free ports, kill by PID)

GATEWAY_RUNTIME = Path("/usr/local/lib/berth-bench/agentscope-gateway-2.0.11")


@dataclass
class Subject:
    """One manager under test, with how to count its workspaces on disk and clean up."""

    name: str
    manager: Any
    count_on_disk: Callable[[], int]
    before_first_use: Callable[[str, str], None] = lambda user, agent: None
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for step in reversed(self.cleanup):
            step()


def _dirs(path: Path, depth: int = 1) -> int:
    if not path.is_dir():
        return 0
    if depth == 1:
        return sum(1 for entry in path.iterdir() if entry.is_dir())
    return sum(_dirs(entry, depth - 1) for entry in path.iterdir() if entry.is_dir())


def agentscope_local() -> Subject:
    from agentscope.app.workspace_manager import LocalWorkspaceManager

    base = Path(tempfile.mkdtemp(prefix="berth-bench-as-local-"))
    subject = Subject("agentscope-local", LocalWorkspaceManager(str(base)), lambda: _dirs(base))
    subject.cleanup.append(lambda: shutil.rmtree(base, ignore_errors=True))
    return subject


def ensure_gateway_runtime() -> Path:
    """A venv of the AgentScope MCP gateway's requirements under /usr/local (cached)."""
    from agentscope.workspace._utils import _GATEWAY_BASE_REQUIREMENTS

    stamp = GATEWAY_RUNTIME / ".berth-bench-stamp"
    want = hashlib.sha256("\n".join([*_GATEWAY_BASE_REQUIREMENTS, "uv", "agentscope==2.0.11"]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return GATEWAY_RUNTIME
    print(f"installing the AgentScope gateway runtime into {GATEWAY_RUNTIME} (once)", file=sys.stderr)
    shutil.rmtree(GATEWAY_RUNTIME, ignore_errors=True)
    GATEWAY_RUNTIME.parent.mkdir(parents=True, exist_ok=True)
    # The sandbox sees the host's /usr only: the venv must use the system interpreter.
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(GATEWAY_RUNTIME)], check=True)
    pip = [str(GATEWAY_RUNTIME / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # uv too: AgentScope checks its gateway home has a working uv (it installs with it).
    subprocess.run([*pip, *_GATEWAY_BASE_REQUIREMENTS, "uv", "agentscope==2.0.11"], check=True)
    stamp.write_text(want)
    return GATEWAY_RUNTIME


def agentscope_bubblewrap() -> Subject:
    from agentscope.app.workspace_manager import BubblewrapWorkspaceManager
    from agentscope.workspace._utils import (
        DEFAULT_GATEWAY_SCRIPT,
        DEFAULT_GATEWAY_VENV,
        DEFAULT_GLOB_HELPER_SCRIPT,
        _read_gateway_script_bytes,
        _read_glob_helper_bytes,
    )

    runtime = ensure_gateway_runtime()
    base = Path(tempfile.mkdtemp(prefix="berth-bench-as-bwrap-"))
    manager = BubblewrapWorkspaceManager(str(base))

    def lay_gateway(user: str, agent: str) -> None:
        workspace_id = hashlib.blake2b(f"{user}::{agent}".encode(), digest_size=8).hexdigest()
        home = Path(manager._workdir_for(user, workspace_id)) / ".agentscope"
        if (home / DEFAULT_GATEWAY_SCRIPT).exists():
            return
        home.mkdir(parents=True, exist_ok=True)
        (home / DEFAULT_GATEWAY_VENV).symlink_to(runtime)
        (home / "bin").mkdir(exist_ok=True)
        (home / "bin" / "uv").symlink_to(runtime / "bin" / "uv")
        (home / "bin" / "rg").symlink_to(shutil.which("rg") or "/usr/bin/rg")
        (home / DEFAULT_GLOB_HELPER_SCRIPT).write_bytes(_read_glob_helper_bytes())
        (home / DEFAULT_GATEWAY_SCRIPT).write_bytes(_read_gateway_script_bytes())

    subject = Subject("agentscope-bubblewrap", manager, lambda: _dirs(base, 2), lay_gateway)
    subject.cleanup.append(lambda: shutil.rmtree(base, ignore_errors=True))
    return subject


def berth(backend: str, berth_bin: str | None) -> Subject:
    from berth.agentscope import BerthWorkspaceManager

    if berth_bin:
        os.environ["BERTH_BIN"] = berth_bin
    extra = [] if backend == "local" else ["--backend", backend]
    up = harness.BerthUp(extra)
    # bubblewrap: each workspace's sandbox uid must traverse the directories above its root.
    os.chmod(up.data_dir, 0o711)
    workspaces = up.data_dir / "node" / "workspaces"

    def count() -> int:
        roots = [workspaces] if workspaces.is_dir() else list(up.data_dir.glob("**/workspaces"))
        return sum(_dirs(root) for root in roots)

    subject = Subject(f"berth-{backend}", BerthWorkspaceManager(up.endpoint), count)
    subject.cleanup.append(up.stop)
    return subject

