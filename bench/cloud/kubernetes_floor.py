"""The floor of berth-bench's `cloud` rows for Kubernetes: the same calls made with the
official Python client (`kubernetes`, from .ci/requirements/kubernetes.txt) against the same
API server — create a PVC + Pod and wait for Running, `pods/exec` of `true`, `cat >` and
`cat` of 1 MiB over exec (the floor any client of the API pays).

    KUBECONFIG=… BERTH_KUBE_NAMESPACE=… python kubernetes_floor.py ROUNDS

Prints the rows as floor_rows.emit() does.
"""

import os
import time

from kubernetes import client, config
from kubernetes.stream import stream
from websocket import ABNF

from floor_rows import PAYLOAD, ROUNDS, emit, timed

config.load_kube_config()
core = client.CoreV1Api()
namespace = os.environ["BERTH_KUBE_NAMESPACE"]
text = "x" * len(PAYLOAD)  # the client writes text to stdin; same size as the others


def run(name, command, stdin=None):
    ws = stream(core.connect_get_namespaced_pod_exec, name, namespace, command=command, stderr=True,
                stdin=stdin is not None, stdout=True, tty=False, _preload_content=False)
    if stdin is not None:
        ws.write_stdin(stdin)
        ws.sock.send(bytes([255, 0]), opcode=ABNF.OPCODE_BINARY)  # close stdin (v5 channel protocol)
    out = ""
    while ws.is_open():
        ws.update(timeout=1)
        if ws.peek_stdout():
            out += ws.read_stdout(timeout=0)
    out += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
    ws.close()
    return out


def provision(name):
    core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": {
        "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                        "volumeMounts": [{"name": "data", "mountPath": "/workspace"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]}})
    while core.read_namespaced_pod(name, namespace).status.phase != "Running":
        time.sleep(0.02)


for index in range(ROUNDS):
    name = f"sdk-bench-{index}"
    timed("provision", lambda: provision(name))
    try:
        timed("exec true", lambda: run(name, ["true"]))
        timed("write 1 MiB", lambda: run(name, ["sh", "-c", "cat > /workspace/bench.bin"], text))
        back = timed("read 1 MiB", lambda: run(name, ["cat", "/workspace/bench.bin"]))
        assert back == text, len(back)
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        core.delete_namespaced_persistent_volume_claim(name, namespace)
emit()
