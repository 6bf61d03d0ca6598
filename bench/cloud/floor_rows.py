"""What every `<backend>_floor.py` shares: the rows berth-bench's `cloud` scenario measures,
the 1 MiB payload, a timer per row, and the one JSON line the bench reads (the last line of
stdout: {row: [milliseconds, …]})."""

import json
import sys
import time

ROUNDS = int(sys.argv[1])
PAYLOAD = b"\x07" * (1024 * 1024)
rows = {"provision": [], "exec true": [], "write 1 MiB": [], "read 1 MiB": []}


def timed(row, call):
    """Runs `call()`, adds its duration to `row`, returns what it returned."""
    started = time.perf_counter()
    result = call()
    rows[row].append((time.perf_counter() - started) * 1000)
    return result


def emit():
    print(json.dumps(rows), flush=True)
