"""The floor of berth-bench's `cloud` rows for E2B: the same calls made with the official SDK
(`e2b`, from .ci/requirements/e2b.txt) against the same provider.

    E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… python e2b_floor.py ROUNDS

Prints one JSON object: {row: [milliseconds, …]} for the rows berth-bench measures.
"""

import json
import sys
import time

from e2b import Sandbox

rounds = int(sys.argv[1])
rows = {"provision": [], "exec true": [], "write 1 MiB": [], "read 1 MiB": []}
data = b"\x07" * (1024 * 1024)


def timed(row, call):
    started = time.perf_counter()
    result = call()
    rows[row].append((time.perf_counter() - started) * 1000)
    return result


for _ in range(rounds):
    sandbox = timed("provision", lambda: Sandbox.create(template="base"))
    try:
        timed("exec true", lambda: sandbox.commands.run("true"))
        timed("write 1 MiB", lambda: sandbox.files.write("/home/user/bench.bin", data))
        back = timed("read 1 MiB", lambda: sandbox.files.read("/home/user/bench.bin", format="bytes"))
        assert bytes(back) == data, len(back)
    finally:
        sandbox.kill()
print(json.dumps(rows))
