"""Where environments live: versioned build prefixes, a `current` pointer, manifests, locks and logs.

Layout under the env root (``hpcai env`` and paths.env_root())::

    NAME/builds/BUILD_ID/           a prefix (conda-meta/, bin/python, ...) and .hpcai/{manifest,lock}.json
    NAME/current -> builds/BUILD_ID  moved only after a build verified
    NAME/logs/BUILD_ID.log           private to the user
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import HPCAIError

META_DIR = ".hpcai"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # an env's name is a folder name, a kernel name, a container name


@dataclass(frozen=True)
class Build:
    """One build of an environment: an installed prefix."""

    prefix: Path

    @property
    def id(self) -> str:
        return self.prefix.name

    @property
    def meta(self) -> Path:
        return self.prefix / META_DIR

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.meta / name).read_text())
        except (OSError, ValueError):
            return None

    def manifest(self) -> dict[str, Any] | None:
        """What the build holds (None for a build that never finished)."""
        return self._read("manifest.json")

    def lock(self) -> dict[str, Any] | None:
        """The exact package set, for ``hpcai env build --locked``."""
        return self._read("lock.json")

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"


@dataclass(frozen=True)
class Env:
    """An environment: a name with its builds, one of them current."""

    name: str
    root: Path

    @property
    def dir(self) -> Path:
        return self.root / self.name

    @property
    def current_link(self) -> Path:
        return self.dir / "current"

    def current(self) -> Build | None:
        """The build in use, or None when the env was never built."""
        if not self.current_link.is_symlink():
            return None
        return Build(self.current_link.resolve())

    def builds(self) -> list[Build]:
        builds_dir = self.dir / "builds"
        return sorted((Build(p) for p in builds_dir.iterdir() if p.is_dir()), key=lambda b: b.id) if builds_dir.is_dir() else []

    def new_build(self) -> Build:
        """A fresh, empty prefix for the next build."""
        build_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        prefix = self.dir / "builds" / build_id
        prefix.mkdir(parents=True)
        return Build(prefix)

    def log_path(self, build: Build) -> Path:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logs.chmod(0o700)
        log = logs / f"{build.id}.log"
        log.touch(mode=0o600)
        return log

    def promote(self, build: Build) -> None:
        """Point `current` at ``build`` atomically: readers see the old build or the new one, never none."""
        tmp = self.dir / f".current-{build.id}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path("builds") / build.id)
        os.replace(tmp, self.current_link)

    def prune(self, keep: int = 2) -> None:
        """Remove unfinished builds and all but the ``keep`` newest finished ones (never the current)."""
        current = self.current()
        finished = [b for b in self.builds() if b.manifest()]
        keep_ids = {b.id for b in finished[-keep:]} | ({current.id} if current else set())
        for build in self.builds():
            if build.id not in keep_ids:
                shutil.rmtree(build.prefix, ignore_errors=True)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the env's build lock: one build (or removal) of an env at a time."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HPCAIError(f"another build of env '{self.name}' is running", "wait for it to finish") from None
            yield


class EnvStore:
    """All environments under one root."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or paths.env_root()).absolute()

    def env(self, name: str) -> Env:
        if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
            raise HPCAIError(f"'{name}' is not a valid env name",
                             "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return Env(name, self.root)

    def get(self, name: str) -> Env:
        """An env that has a current build, or a clear error listing the ones that exist."""
        env = self.env(name)
        if env.current() is None:
            known = ", ".join(e.name for e in self.list()) or "none"
            raise HPCAIError(f"no environment named '{name}' in {self.root} (known: {known})",
                             "build it with `hpcai env build RECIPE`, or set HPCAI_ENV_ROOT")
        return env

    def list(self) -> list[Env]:
        if not self.root.is_dir():
            return []
        return [self.env(p.name) for p in sorted(self.root.iterdir()) if (p / "current").is_symlink()]

    def remove(self, name: str) -> None:
        env = self.get(name)
        with env.exclusive():
            shutil.rmtree(env.dir / "builds", ignore_errors=True)
            env.current_link.unlink(missing_ok=True)
        shutil.rmtree(env.dir, ignore_errors=True)
