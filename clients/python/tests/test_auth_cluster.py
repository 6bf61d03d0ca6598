"""Auth against ``berth up --auth token``, and the 3-replica cluster on etcd: failover
when a replica is killed, one workspace under a race across replicas, streams across
replicas, no repeat of a call that may have run."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import threading
import time

import pytest

import berth
import harness
from conftest import TOKENS, unique


def test_token_auth_and_error_mapping(auth_up):
    endpoint = auth_up.endpoint
    with berth.Client(endpoint) as anonymous:
        with pytest.raises(berth.UnauthenticatedError):
            anonymous.create_session(agent="coder")
    with berth.Client(endpoint, token="not-a-token-0123456789") as wrong:
        with pytest.raises(berth.UnauthenticatedError):
            wrong.list_workspaces()
    with berth.Client(endpoint, token=TOKENS["alice"]) as alice, berth.Client(endpoint, token=TOKENS["bob"]) as bob:
        session = alice.create_session(agent=unique("coder"))
        assert session.user_id == "alice"
        alice.write_file(session.workspace_id, "secret.txt", b"alice only")
        # Another user cannot see the workspace: NOT_FOUND, exactly as if it did not exist.
        with pytest.raises(berth.NotFoundError):
            bob.read_file(session.workspace_id, "secret.txt")
        # A user cannot act for another user.
        with pytest.raises(berth.PermissionDeniedError):
            bob.create_session(user="alice", agent="coder")
        with pytest.raises(berth.PermissionDeniedError):
            alice.list_nodes()
        alice.share_workspace(session.workspace_id, "bob")
        assert bob.read_file(session.workspace_id, "secret.txt") == b"alice only"


def test_service_acts_for_users(auth_up):
    with berth.Client(auth_up.endpoint, token=TOKENS["service"]) as service:
        agent = unique("agent")
        for_carol = service.create_session(user="carol", agent=agent)
        assert for_carol.user_id == "carol"
        as_carol = service.with_act_as("carol")
        as_carol.write_file(for_carol.workspace_id, "f", b"1")
        assert as_carol.read_file(for_carol.workspace_id, "f") == b"1"
        # Acting for dave, carol's workspace is invisible.
        with pytest.raises(berth.NotFoundError):
            service.with_act_as("dave").read_file(for_carol.workspace_id, "f")
        # The act-as header and a different user_id in the body disagree.
        with pytest.raises(berth.InvalidArgumentError):
            as_carol.create_session(user="dave", agent=agent)
    with berth.Client(auth_up.endpoint, token=TOKENS["admin"]) as admin:
        assert admin.status().registry.healthy


def test_race_across_replicas_gets_one_workspace(cluster):
    user, agent = unique("racer"), "coder"
    clients = [berth.Client(endpoint) for endpoint in cluster.endpoints]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
            futures = [pool.submit(clients[i % 3].create_session, user=user, agent=agent) for i in range(12)]
            ids = {future.result().workspace_id for future in futures}
        assert len(ids) == 1
        (workspace_id,) = ids
        assert cluster.workspace_dirs().count(workspace_id) == 1
        # A write through one replica is read through another.
        data = os.urandom(2 * 1024 * 1024)
        clients[0].write_file(workspace_id, "shared.bin", data)
        assert clients[2].read_file(workspace_id, "shared.bin") == data
        events = list(clients[1].exec_stream(workspace_id, ["sh", "-c", "for i in 1 2 3; do echo $i; done"]))
        assert b"".join(event.stdout for event in events) == b"1\n2\n3\n"
    finally:
        for client in clients:
            client.close()


def test_failover_when_a_replica_is_killed(etcd):
    # A cluster of its own: this test kills a replica.
    own = harness.Cluster(etcd, replicas=3, nodes=1)
    try:
        with berth.Client(own.endpoints, timeout=20) as client:
            session = client.create_session(user=unique("fo"), agent="coder")
            workspace = session.workspace_id
            client.write_file(workspace, "before.txt", b"kept")
            current = client._channels.ring.current()
            own.replicas[current].kill()
            # Once the client has seen the connection close, every call family (an exec
            # too, which is never repeated after it may have been sent) goes to the
            # remaining replicas. Before that, a call may be written into the dead socket.
            assert harness.wait_connection_lost(client, current)
            assert client.exec(workspace, ["cat", "before.txt"]).stdout == b"kept"
            assert client._channels.ring.current() != current
            client.write_file(workspace, "after.txt", b"written after the kill")
            assert client.read_file(workspace, "after.txt") == b"written after the kill"
            assert {entry.name for entry in client.ls(workspace)} >= {"before.txt", "after.txt"}
            assert client.create_session(user=session.user_id, agent="coder").workspace_id == workspace

            # A call that may have run is not repeated: kill the replica serving an exec.
            serving = client._channels.ring.current()
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                future = pool.submit(client.exec, workspace, ["sh", "-c", "echo ran >> runs.log; sleep 5"])
                assert harness.wait_until(5, lambda: client.read_file(workspace, "runs.log") == b"ran\n")
                own.replicas[serving].kill()
                with pytest.raises(berth.BerthError) as failed:
                    future.result(timeout=30)
            assert failed.value.code.name in {"UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL"}
            assert time.monotonic() - started < 30
            assert client.read_file(workspace, "runs.log") == b"ran\n"
    finally:
        own.stop()


def test_a_call_the_server_marks_retryable_is_retried(etcd):
    # With a lost-node grace, once the node's lease is gone the replica answers UNAVAILABLE
    # marked retryable ("node away"): the client repeats the exec until the node is back.
    own = harness.Cluster(etcd, replicas=1, nodes=1, lost_node_grace="60s")
    try:
        with berth.Client(own.endpoints, timeout=10, retry=berth.RetryPolicy(max_attempts=1)) as once:
            session = once.create_session(user=unique("away"), agent="coder")
            once.write_file(session.workspace_id, "kept.txt", b"still here")
            own.nodes[0].kill()

            def marked_away() -> bool:
                try:
                    once.exec(session.workspace_id, ["true"])
                except berth.UnavailableError as error:
                    return error.retryable
                return False

            # Until the node's lease expires the replica answers an unmarked UNAVAILABLE
            # (reported: a node connect failure never reached the node, yet is not marked).
            assert harness.wait_until(20, marked_away, 0.2), own.logs()
        retrying = berth.RetryPolicy(max_attempts=200, initial_backoff=0.05, max_backoff=0.5)
        with berth.Client(own.endpoints, timeout=45, retry=retrying) as client:
            restart = threading.Timer(1.0, own.restart_node, [0])
            started = time.monotonic()
            restart.start()
            try:
                result = client.exec(session.workspace_id, ["cat", "kept.txt"])
            finally:
                restart.join()
            # It answered only after the node came back: the retryable answers were repeated.
            assert time.monotonic() - started > 1.0
            assert result.stdout == b"still here"
    finally:
        own.stop()


def test_all_replicas_down_is_unavailable(etcd):
    own = harness.Cluster(etcd, replicas=1, nodes=1)
    endpoints = own.endpoints
    own.stop()
    with berth.Client(endpoints, timeout=3) as client:
        with pytest.raises(berth.UnavailableError) as failed:
            client.get_workspace("ws-anything")
    assert failed.value.endpoint in endpoints


def test_tls_with_a_ca_file(tmp_path):
    # A self-signed server certificate, trusted by naming it as the CA file. (`berth up`
    # makes its in-process node agent trust the --tls-cert itself, so a certificate issued
    # by a separate CA, as deploy/certs/make-dev-certs.sh makes, leaves that node unable to
    # heartbeat: reported, see the Python client's notes.)
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "extendedKeyUsage=serverAuth",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = harness.BerthUp(["--tls-cert", str(cert), "--tls-key", str(key)], scheme="https", ca_cert=str(cert))
    try:
        with berth.Client(server.endpoint, ca_cert=str(cert)) as client:
            session = client.create_session(user=unique("tls"), agent="coder")
            assert client.exec(session.workspace_id, ["echo", "over tls"]).stdout == b"over tls\n"
        with berth.Client(server.endpoint, ca_cert=cert.read_bytes()) as from_bytes:
            assert len(from_bytes.list_nodes()) == 1
        # Without the certificate the server is not trusted: the call fails, typed.
        with berth.Client(server.endpoint, timeout=3) as untrusting:
            with pytest.raises(berth.UnavailableError):
                untrusting.list_nodes()
        # Plaintext to a TLS listener fails too.
        with berth.Client(server.endpoint.replace("https://", "http://"), timeout=3) as plain:
            with pytest.raises(berth.BerthError):
                plain.list_nodes()
    finally:
        server.stop()
