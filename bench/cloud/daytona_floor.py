"""The floor of berth-bench's `cloud` rows for Daytona: the same calls made with the official
SDK (`daytona`, from .ci/requirements/daytona.txt) against the same provider.

    DAYTONA_API_URL=… DAYTONA_API_KEY=… python daytona_floor.py ROUNDS

Prints the rows as floor_rows.emit() does.
"""

import os

from daytona import Daytona, DaytonaConfig

from floor_rows import PAYLOAD, ROUNDS, emit, timed

daytona = Daytona(DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"]))


for _ in range(ROUNDS):
    sandbox = timed("provision", daytona.create)
    try:
        timed("exec true", lambda: sandbox.process.exec("true"))
        path = sandbox.get_user_home_dir() + "/bench.bin"
        timed("write 1 MiB", lambda: sandbox.fs.upload_file(PAYLOAD, path))
        back = timed("read 1 MiB", lambda: sandbox.fs.download_file(path))
        assert back == PAYLOAD, len(back)
    finally:
        daytona.delete(sandbox)
emit()
