"""Real Berth processes for the Python tests: ``berth up``, etcd, ``berth control-plane``
replicas and ``berth node-agent``s on free loopback ports, each with its own temp dir,
killed by PID and cleaned up by the fixture that started them.

A test that needs a binary (berth, etcd) and finds none fails loudly; it never skips.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import grpc

import berth

REPO = Path(__file__).resolve().parents[3]

_LIVE: dict[int, "Process"] = {}


def berth_binary() -> str:
    """``$BERTH_BIN``, else the repository's ``target/debug/berth`` (``cargo build --bins``)."""
    path = os.environ.get("BERTH_BIN") or str(REPO / "target" / "debug" / "berth")
    if not os.access(path, os.X_OK):
        raise AssertionError(f"the berth binary is not at {path}: run `cargo build --bins` first or set BERTH_BIN")
    return path


def etcd_binary() -> str:
    path = os.environ.get("BERTH_ETCD_BIN") or shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(path, os.X_OK):
        raise AssertionError("etcd is not installed (Debian's etcd-server): the cluster tests need it")
    return path


def wait_connection_lost(client: berth.Client, index: int, timeout: float = 10.0) -> bool:
    """Waits until ``client``'s channel to endpoint ``index`` has left READY.

    After a replica is killed the client learns of it only when its connection's close
    arrives; a call sent on the connection before that reaches a dead socket and may, as
    far as the client can tell, have run, so it is not repeated. A test that wants a call
    to fail over waits for this first.
    """
    channel = client._channels._channels[index]
    left = threading.Event()

    def seen(state: grpc.ChannelConnectivity) -> None:
        if state is not grpc.ChannelConnectivity.READY:
            left.set()

    channel.subscribe(seen, try_to_connect=False)
    try:
        return left.wait(timeout)
    finally:
        channel.unsubscribe(seen)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(timeout: float, predicate: Callable[[], bool], interval: float = 0.05) -> bool:
    """Polls ``predicate`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - a probe may fail while the service starts
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class Process:
    """A child process with its log in its own temp dir; ``kill()`` by PID, then cleanup."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"berth-py-{name}-"))
        self.log_path = self.dir / "log"
        full_env = {key: value for key, value in os.environ.items() if not key.startswith(("BERTH_", "ETCD_"))}
        full_env.update(env or {})
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True
            )
        self.pid = self.popen.pid
        _LIVE[self.pid] = self

    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL by PID (the whole process group), reap it."""
        if self.running():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.pop(self.pid, None)

    def stop(self) -> None:
        """Kills the process and removes its temp dir."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_LIVE.values()):
        process.stop()


def _wait_listed(
    endpoint: str, process: Process, token: str | None, nodes: int, timeout: float = 30.0, ca_cert: str | None = None
) -> None:
    client = berth.Client(endpoint, token=token, timeout=2.0, ca_cert=ca_cert)
    try:
        ok = wait_until(timeout, lambda: not process.running() or len(client.list_nodes()) >= nodes, interval=0.1)
    finally:
        client.close()
    if not ok or not process.running():
        raise AssertionError(f"{process.name} did not serve with {nodes} node(s) on {endpoint}; log:\n{process.tail()}")


class BerthUp:
    """``berth up`` on a free port with its own data dir."""

    def __init__(
        self, extra: Iterable[str] = (), *, token: str | None = None, scheme: str = "http", ca_cert: str | None = None
    ) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="berth-py-up-data-"))
        self.port = free_port()
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}"
        argv = [berth_binary(), "up", "--data-dir", str(self.data_dir), "--listen", f"127.0.0.1:{self.port}", *extra]
        self.process = Process("up", argv, {"RUST_LOG": "info"})
        try:
            # An admin token (or none) lists nodes: the node agent registers a moment after serving.
            _wait_listed(self.endpoint, self.process, token, 1, ca_cert=ca_cert)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Etcd:
    """A single-member etcd on free ports."""

    def __init__(self) -> None:
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self.data = Path(tempfile.mkdtemp(prefix="berth-py-etcd-"))
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            etcd_binary(),
            "--name=py",
            f"--data-dir={self.data / 'data'}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=py={peer}",
            f"--initial-cluster-token=py-{os.getpid()}-{self.client_port}",
            "--initial-cluster-state=new",
        ]
        self.process = Process("etcd", argv)
        import urllib.request

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as response:
                return b'"true"' in response.read()

        if not wait_until(20, healthy, 0.1):
            tail = self.process.tail()
            self.stop()
            raise AssertionError(f"etcd did not become healthy; log:\n{tail}")

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.data, ignore_errors=True)


class Cluster:
    """R ``berth control-plane`` replicas and N ``berth node-agent``s on one etcd."""

    def __init__(
        self, etcd: Etcd, replicas: int = 3, nodes: int = 1, isolation: str = "per-agent", lost_node_grace: str = "0s"
    ) -> None:
        self.prefix = f"/berth-py-{os.getpid()}-{free_port()}"
        self.replicas: list[Process] = []
        self.endpoints: list[str] = []
        self.nodes: list[Process] = []
        self.node_dirs: list[Path] = []
        self.node_argv: list[list[str]] = []
        for index in range(replicas):
            port = free_port()
            argv = [
                berth_binary(), "control-plane",
                "--etcd", etcd.endpoint,
                "--replica-id", f"replica-{index}",
                "--key-prefix", self.prefix,
                "--replica-lease-ttl", "3s",
                "--node-lease-ttl", "3s",
                "--heartbeat-interval", "500ms",
                "--lost-node-grace", lost_node_grace,
                "--isolation", isolation,
                "--listen", f"127.0.0.1:{port}",
            ]  # fmt: skip
            self.replicas.append(Process(f"replica-{index}", argv, {"RUST_LOG": "info"}))
            self.endpoints.append(f"http://127.0.0.1:{port}")
        for index in range(nodes):
            data_dir = Path(tempfile.mkdtemp(prefix=f"berth-py-node-{index}-"))
            port = free_port()
            argv = [
                berth_binary(), "node-agent",
                "--control-plane", ",".join(self.endpoints),
                "--data-dir", str(data_dir),
                "--node-id", f"node-{index}",
                "--allow-unsandboxed",
                "--listen", f"127.0.0.1:{port}",
            ]  # fmt: skip
            self.nodes.append(Process(f"node-{index}", argv, {"RUST_LOG": "info"}))
            self.node_dirs.append(data_dir)
            self.node_argv.append(argv)
        try:
            for endpoint, replica in zip(self.endpoints, self.replicas):
                _wait_listed(endpoint, replica, None, nodes)
            # Listed is not yet serving: wait until a workspace can be made and used.
            probe = berth.Client(self.endpoints, timeout=5)
            try:
                ok = wait_until(30, lambda: probe.create_session(user="probe", agent="probe").workspace_id != "", 0.2)
            finally:
                probe.close()
            if not ok:
                raise AssertionError("the cluster never served a session:\n" + self.logs())
        except BaseException:
            self.stop()
            raise

    def restart_node(self, index: int) -> None:
        """Starts node ``index`` again (after a kill) with its id and data directory."""
        self.nodes[index].stop()
        self.nodes[index] = Process(f"node-{index}", self.node_argv[index], {"RUST_LOG": "info"})

    def workspace_dirs(self) -> list[str]:
        """Workspace directories on the nodes' disks (the ground truth)."""
        found = []
        for data_dir in self.node_dirs:
            root = data_dir / "workspaces"
            if root.is_dir():
                found.extend(sorted(entry.name for entry in root.iterdir()))
        return found

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}:\n{p.tail(20)}" for p in [*self.replicas, *self.nodes])

    def stop(self) -> None:
        for process in [*self.nodes, *self.replicas]:
            process.stop()
        for data_dir in self.node_dirs:
            shutil.rmtree(data_dir, ignore_errors=True)
