"""The floor of berth-bench's `cloud` rows for OpenSandbox: the same calls made with the
official SDK (`opensandbox`, from .ci/requirements/opensandbox.txt) against the same server.

    OPENSANDBOX_DOMAIN=127.0.0.1:PORT OPENSANDBOX_API_KEY=… BERTH_OPENSANDBOX_IMAGE=… \
        python opensandbox_floor.py ROUNDS

Prints the rows as floor_rows.emit() does.
"""

import os
from datetime import timedelta

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.filesystem import WriteEntry
from opensandbox.sync.sandbox import SandboxSync

from floor_rows import PAYLOAD, ROUNDS, emit, timed

config = ConnectionConfigSync(api_key=os.environ["OPENSANDBOX_API_KEY"], domain=os.environ["OPENSANDBOX_DOMAIN"],
                              protocol="http", request_timeout=timedelta(seconds=60))
image = os.environ["BERTH_OPENSANDBOX_IMAGE"]


for _ in range(ROUNDS):
    sandbox = timed("provision", lambda: SandboxSync.create(
        image, entrypoint=["tail", "-f", "/dev/null"], timeout=None, metadata={"berth.bench": "sdk"},
        connection_config=config))
    try:
        execution = timed("exec true", lambda: sandbox.commands.run("true"))
        assert execution.error is None, execution.error
        timed("write 1 MiB", lambda: sandbox.files.write_files([WriteEntry(path="/tmp/bench.bin", data=PAYLOAD, mode=644)]))
        back = timed("read 1 MiB", lambda: sandbox.files.read_bytes("/tmp/bench.bin"))
        assert back == PAYLOAD, len(back)
    finally:
        sandbox.kill()
emit()
