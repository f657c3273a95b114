"""Where environments live: a search path of roots, each with versioned builds, a `current` pointer,
manifests, locks and logs.

The search path is the user's own root first (paths.env_root(), where builds go), then the site's roots
(paths.site_env_roots(), built by the admins, read-only to users). A name resolves to the first root
that has it: a user env shadows a site env of the same name.

Layout under a root::

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
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from .. import paths
from ..errors import HPCAIError
from .manifest import ContainerManifest, Lock, PrefixManifest, parse_manifest

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

    def _read(self, name: str) -> object | None:
        try:
            return json.loads((self.meta / name).read_text())
        except (OSError, ValueError):
            return None

    def manifest(self) -> PrefixManifest | ContainerManifest | None:
        """What the build holds (None for a build that never finished)."""
        data = self._read("manifest.json")
        return None if data is None else parse_manifest(data, f"{self.meta / 'manifest.json'}")

    def lock(self) -> Lock | None:
        """The exact package set, for ``hpcai env build --locked``."""
        data = self._read("lock.json")
        return None if data is None else Lock.model_validate(data)

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"


Scope = Literal["user", "site"]


@dataclass(frozen=True)
class Root:
    """One folder of environments on the search path."""

    path: Path
    scope: Scope

    def writable(self) -> bool:
        """Whether this user may make envs here (the root, or the nearest folder above it that exists)."""
        existing = next(p for p in (self.path, *self.path.parents) if p.exists())
        return os.access(existing, os.W_OK)


@dataclass(frozen=True)
class EnvDir:
    """An environment's folder: a name with its builds, one of them current."""

    name: str
    root: Root

    @property
    def path(self) -> Path:
        return self.root.path / self.name

    @property
    def scope(self) -> Scope:
        return self.root.scope

    def writable(self) -> bool:
        """Whether this user may build or remove here."""
        return os.access(self.path, os.W_OK) if self.path.exists() else self.root.writable()

    def require_writable(self, doing: str) -> None:
        """A clear error when this user cannot change the env (a site env, for a user)."""
        if self.writable():
            return
        if self.scope == "site":
            raise HPCAIError(f"cannot {doing} env '{self.name}': it is a site environment in {self.root.path}, "
                             "read-only to you", f"ask the site's admins; or build your own: hpcai env build RECIPE "
                             f"--name {self.name} (yours is found first and shadows the site one)")
        raise HPCAIError(f"cannot {doing} env '{self.name}': {self.path} is not writable by you",
                         "set HPCAI_ENV_ROOT to a folder of yours")

    @property
    def current_link(self) -> Path:
        return self.path / "current"

    def current(self) -> Build | None:
        """The build in use, or None when the env was never built."""
        if not self.current_link.is_symlink():
            return None
        return Build(self.current_link.resolve())

    def builds(self) -> list[Build]:
        builds_dir = self.path / "builds"
        return sorted((Build(p) for p in builds_dir.iterdir() if p.is_dir()), key=lambda b: b.id) if builds_dir.is_dir() else []

    def new_build(self) -> Build:
        """A fresh, empty prefix for the next build."""
        build_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        prefix = self.path / "builds" / build_id
        prefix.mkdir(parents=True)
        return Build(prefix)

    def log_path(self, build: Build) -> Path:
        logs = self.path / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logs.chmod(0o700)
        log = logs / f"{build.id}.log"
        log.touch(mode=0o600)
        return log

    def promote(self, build: Build) -> None:
        """Point `current` at ``build`` atomically: readers see the old build or the new one, never none."""
        tmp = self.path / f".current-{build.id}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path("builds") / build.id)
        os.replace(tmp, self.current_link)

    def prune(self, keep: int = 2) -> None:
        """Remove unfinished builds and all but the ``keep`` newest finished ones (never the current). Each is moved
        out of builds/ at once and deleted in the background (a prefix holds tens of thousands of files); what a
        killed deletion left is deleted by the next prune."""
        current = self.current()
        finished = [b for b in self.builds() if b.manifest()]
        keep_ids = {b.id for b in finished[-keep:]} | ({current.id} if current else set())
        trash = self.path / ".trash"
        for build in self.builds():
            if build.id not in keep_ids:
                trash.mkdir(exist_ok=True)
                os.replace(build.prefix, trash / f"{build.id}-{secrets.token_hex(2)}")
        if trash.is_dir() and any(trash.iterdir()):
            subprocess.Popen(["rm", "-rf", "--", *map(str, trash.iterdir())], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the env's build lock: one build (or removal) of an env at a time."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HPCAIError(f"another build of env '{self.name}' is running", "wait for it to finish") from None
            yield


@dataclass(frozen=True)
class Checked:
    """What ``Env.check`` found: the steps that passed, and how this node differs from what the env expects."""

    passed: list[str]
    warnings: list[str] = field(default_factory=list)


class Env(Protocol):
    """An environment's current build, of one kind (a built prefix, a container): what the CLI, kernelspecs,
    the provisioner and the engines use, never a kind's own fields."""

    kind: ClassVar[str]  # what `hpcai env list` shows
    interrupt_mode: ClassVar[str]  # how Jupyter interrupts its kernel: "signal" or "message"
    dir: EnvDir
    build: Build

    @property
    def name(self) -> str: ...

    @property
    def python(self) -> str:
        """The interpreter a kernelspec names (for a prefix, through `current`)."""
        ...

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a process inside the env starts with: ``base`` (default: this process's) activated."""
        ...

    def argv(self, cmd: Sequence[str], binds: Sequence[str] = ()) -> list[str]:
        """The argv that runs ``cmd`` (a python command line: a kernel, a rank) inside the env; ``binds`` are
        host folders it must see (a container's)."""
        ...

    def check(self) -> Checked:
        """Run it again: its verify steps, or the container; raises HPCAIError naming what fails."""
        ...

    def remove(self) -> None:
        """Remove every build (and what else the kind holds), after checking this user may."""
        ...

    def describe(self) -> dict[str, str]:
        """A line of `hpcai env list`: python and packages."""
        ...

    def encrypts(self) -> bool:
        """Whether its kernel can encrypt its connection (CurveZMQ)."""
        ...

    def has_package(self, name: str) -> bool:
        """Whether the env holds a Python distribution of that (normalised) name."""
        ...


@dataclass(frozen=True)
class BuiltEnv:
    """What every kind's class holds: the env's folder and the build it stands for (kinds add their manifest)."""

    env_dir: EnvDir
    build: Build

    @property
    def name(self) -> str:
        return self.env_dir.name


# manifest model -> the Env class of that kind; prefix.py and container.py register themselves
KINDS: dict[type, Callable[[EnvDir, Build, Any], Env]] = {}


def open_env(env_dir: EnvDir, build_id: str | None = None) -> Env:
    """The env's current build (or build ``build_id``) as an object of its kind; clear errors when it is gone or
    unfinished."""
    build = env_dir.current() if build_id is None else next((b for b in env_dir.builds() if b.id == build_id), None)
    if build_id is not None and build is None:
        raise HPCAIError(f"env '{env_dir.name}' has no build {build_id} any more (in {env_dir.root.path})",
                         f"export the notebook again for its current build, or rebuild: hpcai env build RECIPE "
                         f"--name {env_dir.name} --locked")
    if build is None or not build.prefix.is_dir():
        raise HPCAIError(f"env '{env_dir.name}' does not exist in {env_dir.root.path} (it was removed, or never "
                         "built)", f"build it: hpcai env build RECIPE --name {env_dir.name}, or pick another kernel")
    manifest = build.manifest()
    if manifest is None:
        raise HPCAIError(f"env '{env_dir.name}' has no finished build",
                         f"build it: hpcai env build RECIPE --name {env_dir.name}")
    return KINDS[type(manifest)](env_dir, build, manifest)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise HPCAIError(f"'{name}' is not a valid env name",
                         "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


class EnvStore:
    """Every environment on the search path: the user's root (builds go there) first, then the site roots.

    ``EnvStore(path)`` is the user root ``path`` with the site's roots after it; ``site=[]`` leaves them out.
    A folder that is both the user root and a site root (an admin building for the site) counts as site.
    """

    def __init__(self, root: Path | None = None, site: list[Path] | None = None) -> None:
        sites = [Path(p).absolute() for p in (paths.site_env_roots() if site is None else site)]
        user = Path(root or paths.env_root()).absolute()
        self.user_root = Root(user, "site" if user in sites else "user")
        self.site_roots = [Root(p, "site") for p in dict.fromkeys(sites)]
        self.roots = [self.user_root, *(r for r in self.site_roots if r.path != user)]

    @classmethod
    def at(cls, path: Path) -> EnvStore:
        """The store of one root only (a kernelspec names the root its env lives in)."""
        return cls(path, site=[])

    @property
    def root(self) -> Path:
        """Where builds go: the user's root."""
        return self.user_root.path

    def env(self, name: str, *, site: bool = False) -> EnvDir:
        """The folder env ``name`` is built in: the user's root, or (``site``) the first site root."""
        if site and not self.site_roots:
            raise HPCAIError("no site root is configured", "set HPCAI_ENV_PATH, or envs.site_roots in the site config")
        return EnvDir(check_name(name), self.site_roots[0] if site else self.user_root)

    def find(self, name: str) -> EnvDir:
        """The first env named ``name`` on the search path that has a current build; a clear error listing
        the ones that exist."""
        check_name(name)
        for root in self.roots:
            found = EnvDir(name, root)
            if found.current() is not None:
                return found
        known = ", ".join(sorted({e.name for e in self.list()})) or "none"
        raise HPCAIError(f"no environment named '{name}' in {', '.join(str(r.path) for r in self.roots)} "
                         f"(known: {known})", "build it with `hpcai env build RECIPE` (or set HPCAI_ENV_PATH to the "
                         "site's environments)")

    def get(self, name: str) -> Env:
        """The env ``name`` resolves to (user first, then site), as an object of its kind."""
        return open_env(self.find(name))

    def shadowed(self, env: EnvDir) -> list[EnvDir]:
        """Envs of the same name later on the search path, which ``env`` hides."""
        later = self.roots[self.roots.index(env.root) + 1:] if env.root in self.roots else []
        return [e for e in (EnvDir(env.name, r) for r in later) if e.current() is not None]

    def list(self, scope: Scope | None = None) -> list[EnvDir]:
        """Every env with a current build, root by root in search order (shadowed ones included)."""
        found = []
        for root in self.roots:
            if (scope is None or root.scope == scope) and root.path.is_dir():
                found += [EnvDir(p.name, root) for p in sorted(root.path.iterdir())
                          if re.fullmatch(NAME_PATTERN, p.name) and (p / "current").is_symlink()]
        return found
