"""Tiny conda packages and a local channel indexed by py-rattler: the tests' own conda-forge."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from pathlib import Path

PACKAGE_TIMESTAMP = 1_767_225_600_000  # 2026-01-01, in ms as conda's index.json has it


def make_package(channel: Path, name: str, version: str, files: dict[str, str], *, depends: tuple[str, ...] = (),
                 build: str = "0") -> Path:
    """A noarch .tar.bz2 holding ``files`` (path -> text); ``.sh`` files are executable.

    The same arguments make the same bytes (a fixed timestamp): both test lanes share the package cache, and a
    package whose hash changed would be extracted again, under the links of prefixes built from it."""
    subdir = channel / "noarch"
    subdir.mkdir(parents=True, exist_ok=True)
    index = {"name": name, "version": version, "build": build, "build_number": 0, "depends": list(depends),
             "subdir": "noarch", "noarch": "generic", "timestamp": PACKAGE_TIMESTAMP, "license": "BSD-3-Clause"}
    paths = [{"_path": p, "path_type": "hardlink", "sha256": hashlib.sha256(c.encode()).hexdigest(),
              "size_in_bytes": len(c.encode())} for p, c in files.items()]
    members = {"info/index.json": json.dumps(index), "info/files": "".join(f"{p}\n" for p in files),
               "info/paths.json": json.dumps({"paths": paths, "paths_version": 1}), **files}
    out = subdir / f"{name}-{version}-{build}.tar.bz2"
    with tarfile.open(out, "w:bz2") as tar:
        for path, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755 if path.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def index(channel: Path) -> None:
    """Write repodata.json for every subdir (linux-64 too, which solvers ask for)."""
    import rattler.index

    (channel / "linux-64").mkdir(parents=True, exist_ok=True)
    asyncio.run(rattler.index.index_fs(channel, force=True))


def add_binary(package: Path, path: str, data: bytes) -> None:
    """Put a binary file into a package made by make_package (which takes text), updating its metadata."""
    with tarfile.open(package) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    paths = json.loads(members["info/paths.json"])
    paths["paths"].append({"_path": path, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
                           "size_in_bytes": len(data)})
    members["info/paths.json"] = json.dumps(paths).encode()
    members["info/files"] += f"{path}\n".encode()
    members[path] = data
    with tarfile.open(package, "w:bz2") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(blob), 0o755
            tar.addfile(info, io.BytesIO(blob))
