"""The floor of berth-bench's `cloud` rows for OpenSandbox: the same calls made with the
official SDK (`opensandbox`, from .ci/requirements/opensandbox.txt) against the same server.

    OPENSANDBOX_DOMAIN=127.0.0.1:PORT OPENSANDBOX_API_KEY=… BERTH_OPENSANDBOX_IMAGE=… \
        python opensandbox_floor.py ROUNDS

Prints one JSON object: {row: [milliseconds, …]} for the rows berth-bench measures.
"""

import json
import os
import sys
import time
from datetime import timedelta

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.filesystem import WriteEntry
from opensandbox.sync.sandbox import SandboxSync

rounds = int(sys.argv[1])
config = ConnectionConfigSync(api_key=os.environ["OPENSANDBOX_API_KEY"], domain=os.environ["OPENSANDBOX_DOMAIN"],
                              protocol="http", request_timeout=timedelta(seconds=60))
image = os.environ["BERTH_OPENSANDBOX_IMAGE"]
rows = {"provision": [], "exec true": [], "write 1 MiB": [], "read 1 MiB": []}
data = b"\x07" * (1024 * 1024)


def timed(row, call):
    started = time.perf_counter()
    result = call()
    rows[row].append((time.perf_counter() - started) * 1000)
    return result


for _ in range(rounds):
    sandbox = timed("provision", lambda: SandboxSync.create(
        image, entrypoint=["tail", "-f", "/dev/null"], timeout=None, metadata={"berth.bench": "sdk"},
        connection_config=config))
    try:
        execution = timed("exec true", lambda: sandbox.commands.run("true"))
        assert execution.error is None, execution.error
        timed("write 1 MiB", lambda: sandbox.files.write_files([WriteEntry(path="/tmp/bench.bin", data=data, mode=644)]))
        back = timed("read 1 MiB", lambda: sandbox.files.read_bytes("/tmp/bench.bin"))
        assert back == data, len(back)
    finally:
        sandbox.kill()
print(json.dumps(rows))
