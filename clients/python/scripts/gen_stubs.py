"""Generates the committed gRPC stubs (berth/v1) from the repository's proto/, or checks them.

    python clients/python/scripts/gen_stubs.py          # regenerate
    python clients/python/scripts/gen_stubs.py --check  # exit 1 if the committed stubs differ

Needs grpcio-tools (the pinned version of .ci/requirements/python-client.txt: the stubs
name the grpcio and protobuf versions they need, see pyproject.toml).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PACKAGE = Path(__file__).resolve().parents[1]
PROTO = PACKAGE.parents[1] / "proto"
TARGET = PACKAGE / "berth" / "v1"
#: Hand-written, not generated.
KEEP = {"__init__.py"}


def generate(into: Path) -> list[Path]:
    protos = sorted(str(path.relative_to(PROTO)) for path in (PROTO / "berth" / "v1").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO}",
        f"-I{include}",
        f"--python_out={into}",
        f"--pyi_out={into}",
        f"--grpc_python_out={into}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((into / "berth" / "v1").iterdir())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    check = parser.parse_args().check
    with tempfile.TemporaryDirectory() as temp:
        fresh = {path.name: path for path in generate(Path(temp))}
        committed = {path.name: path for path in TARGET.iterdir() if path.is_file() and path.name not in KEEP}
        if check:
            stale = sorted(set(fresh) ^ set(committed))
            stale += sorted(name for name in set(fresh) & set(committed) if not filecmp.cmp(fresh[name], committed[name], shallow=False))
            if stale:
                print(f"berth/v1 stubs do not match proto/ ({', '.join(stale)}): run {Path(__file__).name}", file=sys.stderr)
                return 1
            print(f"berth/v1 stubs match proto/ ({len(fresh)} files)")
            return 0
        for name in committed:
            if name not in fresh:
                (TARGET / name).unlink()
        for name, path in fresh.items():
            shutil.copyfile(path, TARGET / name)
        print(f"wrote {len(fresh)} files to {TARGET}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
