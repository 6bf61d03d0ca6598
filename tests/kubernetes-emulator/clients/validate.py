"""The official Kubernetes Python client against Berth's API-server emulator.

Run by tests/client_validation.rs with KUBECONFIG pointing at the emulator; prints
"ok STEP" per step and "ALL OK" at the end, exits non-zero on the first failure.
"""

import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from websocket import ABNF

NS = sys.argv[1] if len(sys.argv) > 1 else "default"


def step(name):
    print(f"ok {name}", flush=True)


def main():
    config.load_kube_config()
    core = client.CoreV1Api()

    version = client.VersionApi().get_code()
    assert version.major == "1", version
    step("version")

    pvc = client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name="py-data", labels={"app": "py", "berth.workspace.id": "ws-py"}),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        ),
    )
    created = core.create_namespaced_persistent_volume_claim(NS, pvc)
    assert created.metadata.resource_version, created.metadata
    try:
        core.create_namespaced_persistent_volume_claim(NS, pvc)
        raise AssertionError("a second create of the same name succeeded")
    except ApiException as error:
        assert error.status == 409, error
    step("pvc.create")

    security = client.V1SecurityContext(
        run_as_non_root=True, run_as_user=1000, run_as_group=1000, allow_privilege_escalation=False,
        read_only_root_filesystem=True, capabilities=client.V1Capabilities(drop=["ALL"]),
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="py-pod", labels={"app": "py"}),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            containers=[client.V1Container(
                name="main", image="busybox", command=["sh", "-c", "sleep 3600"], security_context=security,
                volume_mounts=[client.V1VolumeMount(name="data", mount_path="/data")],
            )],
            volumes=[client.V1Volume(
                name="data",
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name="py-data"),
            )],
        ),
    )
    core.create_namespaced_pod(NS, pod)
    deadline = time.time() + 30
    while core.read_namespaced_pod(name="py-pod", namespace=NS).status.phase != "Running":
        assert time.time() < deadline, "pod not running in 30 s"
        time.sleep(0.1)
    step("pod.create_running")

    listed = core.list_namespaced_pod(NS, label_selector="app=py")
    assert [item.metadata.name for item in listed.items] == ["py-pod"], listed.items
    assert core.list_namespaced_pod(NS, label_selector="app=other").items == []
    assert len(core.list_namespaced_persistent_volume_claim(NS, label_selector="berth.workspace.id=ws-py").items) == 1
    step("list.label_selector")

    out = stream(core.connect_get_namespaced_pod_exec, "py-pod", NS,
                 command=["sh", "-c", "echo hello > /data/f; cat /data/f; id -u"],
                 stderr=True, stdin=False, stdout=True, tty=False)
    assert out == "hello\n1000\n", repr(out)
    step("exec.output")

    ws = stream(core.connect_get_namespaced_pod_exec, "py-pod", NS, command=["sh", "-c", "cat; echo err >&2; exit 3"],
                stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    ws.write_stdin("from stdin\n")
    # v5 ends stdin with a [255, 0] frame (this client has no call for it).
    assert ws.subprotocol == "v5.channel.k8s.io", ws.subprotocol
    ws.sock.send(bytes([255, 0]), opcode=ABNF.OPCODE_BINARY)
    out, err = "", ""
    deadline = time.time() + 20
    while ws.is_open() and time.time() < deadline:
        ws.update(timeout=1)
        out += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
        err += ws.read_stderr(timeout=0) if ws.peek_stderr() else ""
    out += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
    err += ws.read_stderr(timeout=0) if ws.peek_stderr() else ""
    code = ws.returncode
    ws.close()
    assert out == "from stdin\n", repr(out)
    assert err == "err\n", repr(err)
    assert code == 3, code
    step("exec.stdin_stderr_exit")

    patched = core.patch_namespaced_persistent_volume_claim(
        "py-data", NS, {"metadata": {"annotations": {"berth.generation": "7"}}})
    assert patched.metadata.annotations["berth.generation"] == "7"
    stale = patched
    stale.metadata.resource_version = "1"
    try:
        core.replace_namespaced_persistent_volume_claim("py-data", NS, stale)
        raise AssertionError("a replace with a stale resourceVersion succeeded")
    except ApiException as error:
        assert error.status == 409, error
    step("pvc.patch_conflict")

    core.delete_namespaced_pod("py-pod", NS, grace_period_seconds=0)
    core.delete_namespaced_persistent_volume_claim("py-data", NS)
    try:
        core.read_namespaced_pod("py-pod", NS)
        raise AssertionError("the pod is still there")
    except ApiException as error:
        assert error.status == 404, error
    step("delete")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
