"""The floor of the OpenSandbox bench rows: the same calls as Berth's backend, made with the
official SDK (`opensandbox==1.1.1`) against the same server.

    python sdk_bench.py SERVER_PORT API_KEY IMAGE ITERATIONS

Prints one JSON object per row: {"row", "via": "sdk", "samples_ms": [...]}.
"""

import json
import sys
import time
from datetime import timedelta

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.filesystem import WriteEntry
from opensandbox.sync.sandbox import SandboxSync

port, api_key, image, iterations = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
config = ConnectionConfigSync(api_key=api_key, domain=f"127.0.0.1:{port}", protocol="http",
                              request_timeout=timedelta(seconds=60))
rows = {"provision": [], "exec true": [], "write 1 MiB": [], "read 1 MiB": []}
payload = bytes(range(256)) * 4096
sandboxes = []
try:
    for _ in range(iterations):
        started = time.perf_counter()
        sandbox = SandboxSync.create(image, entrypoint=["tail", "-f", "/dev/null"], timeout=None,
                                     metadata={"berth.bench": "sdk"}, connection_config=config)
        rows["provision"].append((time.perf_counter() - started) * 1000)
        sandboxes.append(sandbox)
    sandbox = sandboxes[0]
    for _ in range(iterations):
        started = time.perf_counter()
        execution = sandbox.commands.run("true")
        rows["exec true"].append((time.perf_counter() - started) * 1000)
        assert execution.error is None, execution.error
        started = time.perf_counter()
        sandbox.files.write_files([WriteEntry(path="/tmp/bench.bin", data=payload, mode=644)])
        rows["write 1 MiB"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        back = sandbox.files.read_bytes("/tmp/bench.bin")
        rows["read 1 MiB"].append((time.perf_counter() - started) * 1000)
        assert back == payload
finally:
    for sandbox in sandboxes:
        sandbox.kill()
for row, samples in rows.items():
    print(json.dumps({"row": row, "via": "sdk", "samples_ms": samples}), flush=True)
