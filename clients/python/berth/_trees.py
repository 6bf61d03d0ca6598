"""Directory trees as tar streams: pack a local directory, unpack a downloaded one safely."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from ._convert import CHUNK_SIZE


def pack_dir(local_dir: str | os.PathLike[str], arcname: str = "") -> Iterator[bytes]:
    """A tar of ``local_dir``'s content (files, directories, symlinks), in chunks.

    The archive is spooled to a temporary file (in memory up to 8 MiB), so a large tree
    is never held whole in memory.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
        with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for entry in sorted(root.iterdir()):
                name = f"{arcname}/{entry.name}" if arcname else entry.name
                archive.add(str(entry), arcname=name, recursive=True)
        spool.seek(0)
        while chunk := spool.read(CHUNK_SIZE):
            yield chunk


def pack_bytes(local_dir: str | os.PathLike[str], arcname: str = "") -> bytes:
    return b"".join(pack_dir(local_dir, arcname))


def _inside(root: Path, candidate: Path) -> bool:
    try:
        candidate.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def unpack(chunks: Iterable[bytes], dest: str | os.PathLike[str]) -> int:
    """Extracts a tar stream into ``dest`` (created); returns the number of entries.

    Only regular files and directories are extracted (the server sends nothing else);
    absolute names, ``..`` components and anything resolving outside ``dest`` are refused.
    """
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
        for chunk in chunks:
            spool.write(chunk)
        spool.seek(0)
        count = 0
        with tarfile.open(fileobj=spool, mode="r:*") as archive:
            for member in archive:
                name = member.name
                parts = Path(name).parts
                if name.startswith("/") or ".." in parts:
                    raise ValueError(f"refusing tar entry {name!r}: it leaves the destination")
                target = root / name
                if not _inside(root, target.parent if target.parent != root else root):
                    raise ValueError(f"refusing tar entry {name!r}: it leaves the destination")
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = archive.extractfile(member)
                    if source is None:
                        continue
                    with open(target, "wb") as out:
                        while block := source.read(CHUNK_SIZE):
                            out.write(block)
                    os.chmod(target, member.mode & 0o777)
                else:
                    continue
                count += 1
        return count


def zip_to_tar(data: bytes, max_bytes: int) -> bytes:
    """Converts a zip archive to tar (Berth's skill and tree RPCs take tar or tar.gz)."""
    import zipfile

    out = io.BytesIO()
    total = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive, tarfile.open(fileobj=out, mode="w") as tar:
        for info in archive.infolist():
            total += info.file_size
            if total > max_bytes:
                raise ValueError(f"archive expands to more than {max_bytes} bytes")
            member = tarfile.TarInfo(info.filename.rstrip("/"))
            if info.is_dir():
                member.type = tarfile.DIRTYPE
                member.mode = 0o755
                tar.addfile(member)
                continue
            content = archive.read(info)
            member.size = len(content)
            member.mode = 0o644
            tar.addfile(member, io.BytesIO(content))
    return out.getvalue()
