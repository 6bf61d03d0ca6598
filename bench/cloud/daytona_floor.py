"""The floor of berth-bench's `cloud` rows for Daytona: the same calls made with the official
SDK (`daytona`, from .ci/requirements/daytona.txt) against the same provider.

    DAYTONA_API_URL=… DAYTONA_API_KEY=… python daytona_floor.py ROUNDS

Prints one JSON object: {row: [milliseconds, …]} for the rows berth-bench measures.
"""

import json
import os
import sys
import time

from daytona import Daytona, DaytonaConfig

rounds = int(sys.argv[1])
daytona = Daytona(DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"]))
rows = {"provision": [], "exec true": [], "write 1 MiB": [], "read 1 MiB": []}
data = b"\x07" * (1024 * 1024)


def timed(row, call):
    started = time.perf_counter()
    result = call()
    rows[row].append((time.perf_counter() - started) * 1000)
    return result


for _ in range(rounds):
    sandbox = timed("provision", daytona.create)
    try:
        timed("exec true", lambda: sandbox.process.exec("true"))
        path = sandbox.get_user_home_dir() + "/bench.bin"
        timed("write 1 MiB", lambda: sandbox.fs.upload_file(data, path))
        back = timed("read 1 MiB", lambda: sandbox.fs.download_file(path))
        assert back == data, len(back)
    finally:
        daytona.delete(sandbox)
print(json.dumps(rows))
