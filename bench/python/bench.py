"""Python bench: AgentScope's own workspace managers against ``BerthWorkspaceManager``.

One run, one machine, the same four scenarios for every manager (``bench/python/README.md``):

- ``first-session-storm``: N concurrent ``get_workspace`` for ONE (user, agent) — every
  manager must end with exactly one workspace (counted on disk);
- ``distinct-first-sessions``: M concurrent first sessions of M users — exactly M;
- ``exec-true``: sequential ``exec_shell(["true"])`` through the workspace's backend;
- ``write-read-1mib``: sequential 1 MiB ``write_file`` then ``read_file``.

Exit status 1 on any error or a wrong workspace count. Results go to
``<out>/python-workspaces.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import managers


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), int(round(q / 100 * len(ordered) + 0.5))))
    return ordered[rank - 1]


def summary(samples: list[float], wall: float, count: int, unit: str) -> dict:
    return {
        "n": len(samples),
        "p50_ms": percentile(samples, 50) * 1000,
        "p99_ms": percentile(samples, 99) * 1000,
        "max_ms": max(samples) * 1000,
        "mean_ms": statistics.fmean(samples) * 1000,
        "wall_s": wall,
        "throughput": count / wall if wall > 0 else 0.0,
        "unit": unit,
    }


async def timed(call):
    started = time.perf_counter()
    result = await call
    return time.perf_counter() - started, result


async def first_session_storm(subject: managers.Subject, n: int, run: str) -> dict:
    user, agent = f"storm-{run}", "coder"
    subject.before_first_use(user, agent)
    before = subject.count_on_disk()
    started = time.perf_counter()
    results = await asyncio.gather(
        *(timed(subject.manager.get_workspace(user, agent, f"s{i}")) for i in range(n))
    )
    wall = time.perf_counter() - started
    ids = {workspace.workspace_id for _, workspace in results}
    made = subject.count_on_disk() - before
    row = summary([latency for latency, _ in results], wall, n, "sessions/s")
    row.update(params=f"N={n}", distinct_ids=len(ids), workspaces_on_disk=made)
    if len(ids) != 1 or made != 1:
        row["error"] = f"expected exactly 1 workspace, got {len(ids)} ids and {made} on disk"
    return row


async def distinct_first_sessions(subject: managers.Subject, m: int, run: str) -> dict:
    # Distinct users and agents: a first session each (AgentScope's local workspaces are per agent).
    users = [(f"distinct-{run}-{i}", f"coder-{i}") for i in range(m)]
    for user, agent in users:
        subject.before_first_use(user, agent)
    before = subject.count_on_disk()
    started = time.perf_counter()
    results = await asyncio.gather(*(timed(subject.manager.get_workspace(user, agent, "s")) for user, agent in users))
    wall = time.perf_counter() - started
    ids = {workspace.workspace_id for _, workspace in results}
    made = subject.count_on_disk() - before
    row = summary([latency for latency, _ in results], wall, m, "sessions/s")
    row.update(params=f"M={m}", distinct_ids=len(ids), workspaces_on_disk=made)
    if len(ids) != m or made != m:
        row["error"] = f"expected {m} workspaces, got {len(ids)} ids and {made} on disk"
    return row


async def exec_true(subject: managers.Subject, k: int, run: str) -> dict:
    user, agent = f"exec-{run}", "coder"
    subject.before_first_use(user, agent)
    workspace = await subject.manager.get_workspace(user, agent, "s")
    backend = workspace.get_backend()
    await backend.exec_shell(["true"])  # warm
    samples = []
    started = time.perf_counter()
    for _ in range(k):
        latency, result = await timed(backend.exec_shell(["true"]))
        if result.exit_code != 0:
            return {"params": f"K={k}", "error": f"true exited {result.exit_code}: {result.stderr!r}"}
        samples.append(latency)
    row = summary(samples, time.perf_counter() - started, k, "exec/s")
    row["params"] = f"K={k}"
    return row


async def write_read(subject: managers.Subject, k: int, run: str) -> dict:
    user, agent = f"io-{run}", "coder"
    subject.before_first_use(user, agent)
    workspace = await subject.manager.get_workspace(user, agent, "s")
    backend = workspace.get_backend()
    path = backend.join_path(workspace.workdir, "bench", "blob.bin")
    payload = os.urandom(1024 * 1024)
    samples = []
    started = time.perf_counter()
    for _ in range(k):
        begin = time.perf_counter()
        await backend.write_file(path, payload)
        back = await backend.read_file(path)
        samples.append(time.perf_counter() - begin)
        if back != payload:
            return {"params": f"K={k}", "error": "read back other bytes than written"}
    row = summary(samples, time.perf_counter() - started, 2 * k, "MiB/s")
    row["params"] = f"K={k} (write+read of 1 MiB)"
    return row


SCENARIOS = {
    "first-session-storm": ("storm", first_session_storm),
    "distinct-first-sessions": ("distinct", distinct_first_sessions),
    "exec-true": ("execs", exec_true),
    "write-read-1mib": ("io", write_read),
}


def machine() -> dict:
    def read(command: list[str]) -> str:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import agentscope

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        # Other work on the machine skews every row: record it.
        "load_average_1m_5m_15m": list(os.getloadavg()),
        "agentscope": agentscope.__version__,
        "bwrap": read(["bwrap", "--version"]),
        "commit": read(["git", "-C", str(managers.REPO), "rev-parse", "--short=12", "HEAD"]),
        "dirty": bool(read(["git", "-C", str(managers.REPO), "status", "--porcelain"])),
    }


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        f"Run {info['time']} on: {info['machine']['cpu']} ({info['machine']['cores']} cores), "
        f"kernel {info['machine']['kernel']}, load average {info['machine']['load_average_1m_5m_15m'][0]:.1f}, "
        f"Python {info['machine']['python']}, "
        f"AgentScope {info['machine']['agentscope']}, commit {info['machine']['commit']}"
        + (" (dirty)" if info["machine"]["dirty"] else "")
        + f", berth binary {Path(info['berth_bin']).parent.name}",
        "",
        "| scenario | manager | params | p50 | p99 | max | throughput | workspaces |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row and "p50_ms" not in row:
            lines.append(f"| {row['scenario']} | {row['manager']} | {row.get('params', '')} | — | — | — | — | FAILED |")
            continue
        throughput = row["throughput"] if row["unit"] != "MiB/s" else row["n"] * 2 / row["wall_s"]
        workspaces = row.get("workspaces_on_disk", "")
        lines.append(
            f"| {row['scenario']} | {row['manager']} | {row['params']} | {row['p50_ms']:.2f} ms | "
            f"{row['p99_ms']:.2f} ms | {row['max_ms']:.2f} ms | {throughput:.1f} {row['unit']} | {workspaces} |"
        )
    failures = [row for row in rows if "error" in row]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {r['scenario']} / {r['manager']}: {r['error']}" for r in failures]
    return "\n".join(lines) + "\n"


async def run_subject(subject: managers.Subject, sizes: dict, only: list[str], run: str) -> list[dict]:
    rows = []
    async with subject.manager:
        for scenario in only:
            key, function = SCENARIOS[scenario]
            print(f"{subject.name}: {scenario} {key}={sizes[key]}", file=sys.stderr)
            try:
                row = await function(subject, sizes[key], run)
            except Exception as error:  # noqa: BLE001 - reported as a failed row
                traceback.print_exc()
                row = {"params": f"{key}={sizes[key]}", "error": f"{type(error).__name__}: {error}"}
            row.update(scenario=scenario, manager=subject.name)
            rows.append(row)
    return rows


def build_name(berth_bin: str) -> str:
    """`release/berth` or `debug/berth`: the build profile and binary, without the checkout's path."""
    path = Path(berth_bin)
    return f"{path.parent.name}/{path.name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI): storm 50, distinct 3, execs 20, io 5")
    parser.add_argument("--storm", type=int, help="first-session storm size (default 1000)")
    parser.add_argument("--distinct", type=int, help="distinct first sessions (default 20)")
    parser.add_argument("--execs", type=int, help="sequential execs (default 200)")
    parser.add_argument("--io", type=int, help="1 MiB write+read rounds (default 50)")
    parser.add_argument("--managers", default="agentscope-local,agentscope-bubblewrap,berth-local,berth-bubblewrap")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--berth-bin", help="the berth binary (default: target/release/berth, else target/debug)")
    parser.add_argument("--out", default=str(managers.REPO / "bench" / "results"))
    args = parser.parse_args()

    defaults = {"storm": 50, "distinct": 3, "execs": 20, "io": 5} if args.quick else {
        "storm": 1000, "distinct": 20, "execs": 200, "io": 50}  # fmt: skip
    sizes = {key: getattr(args, key) or value for key, value in defaults.items()}
    berth_bin = args.berth_bin
    if berth_bin is None:
        release = managers.REPO / "target" / "release" / "berth"
        berth_bin = str(release) if release.exists() else None
    makers = {
        "agentscope-local": managers.agentscope_local,
        "agentscope-bubblewrap": managers.agentscope_bubblewrap,
        "berth-local": lambda: managers.berth("local", berth_bin),
        "berth-bubblewrap": lambda: managers.berth("bubblewrap", berth_bin),
    }
    only = [name for name in args.scenarios.split(",") if name]
    run = dt.datetime.now(dt.timezone.utc).strftime("%H%M%S")
    rows: list[dict] = []
    for name in [item for item in args.managers.split(",") if item]:
        try:
            subject = makers[name]()
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"scenario": "setup", "manager": name, "error": f"{type(error).__name__}: {error}"})
            continue
        try:
            rows.extend(asyncio.run(run_subject(subject, sizes, only, run)))
        finally:
            subject.close()
    info = {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "sizes": sizes,
        # Which build ran (target/release or target/debug), never the machine's absolute path.
        "berth_bin": build_name(berth_bin or os.environ.get("BERTH_BIN") or str(managers.REPO / "target" / "debug" / "berth")),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "python-workspaces-quick" if args.quick else "python-workspaces"
    (out / f"{stem}.json").write_text(json.dumps({"run": info, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, info)
    (out / f"{stem}.md").write_text(table)
    print(table)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
