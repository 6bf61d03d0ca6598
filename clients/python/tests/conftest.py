"""Fixtures: real ``berth up`` processes and a 3-replica cluster on etcd, started once
per test session and killed by PID at its end."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

# openhands-sdk imports LiteLLM, which fetches a model price list from the internet at
# import unless told to use its bundled copy: the tests reach nothing beyond loopback.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import berth  # noqa: E402
import harness  # noqa: E402

TOKENS = {
    "alice": "alice-token-0123456789abcdef",
    "bob": "bob-token-0123456789abcdef",
    "service": "service-token-0123456789abcdef",
    "admin": "admin-token-0123456789abcdef",
}

MCP_ECHO = (Path(__file__).parent / "mcp_echo.py").read_bytes()


def unique(prefix: str) -> str:
    """An id no other test uses (tests share the session's servers)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def up():
    """``berth up`` with ``--auth none`` and the local backend."""
    server = harness.BerthUp()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def auth_up(tmp_path_factory):
    """``berth up --auth token`` with a user, a second user, a service and an admin."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.toml"
    tokens.write_text(
        f"""
[[token]]
secret = "{TOKENS['alice']}"
user = "alice"
backends = ["local"]
[[token]]
secret = "{TOKENS['bob']}"
user = "bob"
backends = ["local"]
[[token]]
secret = "{TOKENS['service']}"
service = "agent-platform"
act_for_users = true
backends = ["local"]
[[token]]
secret = "{TOKENS['admin']}"
admin = true
"""
    )
    server = harness.BerthUp(["--auth", "token", "--tokens-file", str(tokens), "--allow-unsandboxed"], token=TOKENS["admin"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd():
    server = harness.Etcd()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cluster(etcd):
    """3 ``berth control-plane`` replicas + 1 node agent on one etcd."""
    running = harness.Cluster(etcd, replicas=3, nodes=1)
    yield running
    running.stop()


@pytest.fixture()
def client(up):
    with berth.Client(up.endpoint) as made:
        yield made


@pytest.fixture()
def workspace(client):
    """A fresh workspace (its own user) on ``berth up``."""
    return client.create_session(user=unique("user"), agent="coder").workspace_id
