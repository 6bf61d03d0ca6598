"""The floor of berth-bench's `cloud` rows for E2B: the same calls made with the official SDK
(`e2b`, from .ci/requirements/e2b.txt) against the same provider.

    E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… python e2b_floor.py ROUNDS

Prints the rows as floor_rows.emit() does.
"""


from e2b import Sandbox

from floor_rows import PAYLOAD, ROUNDS, emit, timed


for _ in range(ROUNDS):
    sandbox = timed("provision", lambda: Sandbox.create(template="base"))
    try:
        timed("exec true", lambda: sandbox.commands.run("true"))
        timed("write 1 MiB", lambda: sandbox.files.write("/home/user/bench.bin", PAYLOAD))
        back = timed("read 1 MiB", lambda: sandbox.files.read("/home/user/bench.bin", format="bytes"))
        assert bytes(back) == PAYLOAD, len(back)
    finally:
        sandbox.kill()
emit()
