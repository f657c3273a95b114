"""Build an environment from a recipe, in order: conda layer, python, pip layer, verify, record, promote.

Each build goes to a new prefix; `current` moves to it only after verify passed and the manifest
and lock were written. Whatever goes wrong (a failed step, Ctrl-C), the previous build stays
current and usable, and the error says where the full log is. An unchanged recipe is up to date at
once, in any checkout: only its editable sources are followed to where this recipe points.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import paths
from ..errors import HPCAIError
from ..proc import run
from ..scheduler import chosen
from . import activate, conda, pip
from .manifest import ContainerManifest, Lock, Package, PrefixManifest, StepRecord, read_json_model, write_atomic
from .preflight import preflight
from .recipe import PRODUCT, Recipe, load_recipe, requirement_name, unsafe_requirement
from .store import Build, EnvDir, EnvStore
from .verify import StepResult, verify

environment = chosen().environment

_COMPILED_AGAINST = re.compile(r"^(tensorflow|tf-keras|keras|torch|mxnet|jax|jaxlib|numpy|mpi4py)\b", re.I)
TOOLCHAIN_FACTS = ("compiler", "mpi", "mpicc", "cuda")  # preflight's facts a compiled wheel depends on
State = Literal["started", "update", "done", "warning", "log"]


@dataclass(frozen=True)
class Event:
    """What a build reports as it goes: a phase starting, advancing (``done`` of ``total`` where known), done."""

    phase: str
    message: str = ""
    state: State = "update"
    done: int | None = None
    total: int | None = None


Progress = Callable[[Event], None]


@dataclass
class BuildResult:
    env_dir: EnvDir
    build: Build
    log: Path | None
    up_to_date: bool = False
    phase_seconds: dict[str, float] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    followed: dict[str, str] = field(default_factory=dict)  # editable project -> the source it now follows

    def summary(self) -> str:
        """One line: the time of each phase, and the whole."""
        phases = " · ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phase_seconds.items())
        return f"{phases} (total {sum(self.phase_seconds.values()):.1f} s)"


def default_installer() -> str:
    """``HPCAI_PIP_INSTALLER``, else ``[envs] installer`` in the site config, else uv."""
    return os.environ.get("HPCAI_PIP_INSTALLER") or paths.site_config().get("envs", {}).get("installer") or "uv"


@dataclass(frozen=True)
class BuildRequest:
    """What ``hpcai env build`` asks for: the recipe, the target, the lock, the flags, and where it runs."""

    recipe_path: Path
    name: str | None = None
    site: bool = False  # into the first site root (an admin's shared env)
    locked: bool = False  # reproduce the current build's lock
    lock_file: Path | None = None
    rebuild: bool = False
    partition: str | None = None  # build in a job there [default: the recipe's build.partition]
    here: bool = False  # build on this machine whatever the recipe says
    gpus: int | None = None
    time_limit: str | None = None
    account: str | None = None
    installer: str | None = None

    def recipe(self) -> Recipe:
        return load_recipe(self.recipe_path)

    def partition_for(self, recipe: Recipe) -> str | None:
        """The partition of the build job; None to build here (--here, inside a job, or none named)."""
        if self.here or environment.job_id(os.environ):
            return None
        return self.partition or recipe.build.partition

    def job_args(self) -> tuple[str, ...]:
        """The flags that make the build inside the job the same build."""
        flags = tuple(flag for flag, on in (("--locked", self.locked), ("--rebuild", self.rebuild), ("--site", self.site))
                      if on)
        flags += ("--lock-file", str(self.lock_file.absolute())) if self.lock_file else ()
        return flags + (("--installer", self.installer) if self.installer else ())

    def builder(self, store: EnvStore, progress: Progress | None = None) -> Builder:
        recipe = self.recipe()
        name = self.name or recipe.name
        lock = None
        if self.lock_file:
            lock = read_json_model(self.lock_file, Lock)
        elif self.locked:
            current = store.env(name, site=self.site).current()
            lock = current.lock() if current else None
            if lock is None:
                raise HPCAIError(f"env '{name}' has no lock", "build it once without --locked")
        return Builder(recipe, store=store, name=name, site=self.site, locked=lock, rebuild=self.rebuild,
                       installer=self.installer, progress=progress)


@dataclass(frozen=True)
class _Plan:
    channels: list[str]
    specs: list[str]
    plain: list[str]  # pip requirement lines, with build isolation
    isolated_off: list[str]  # then these, built against what is installed


class Builder:
    """One build of one env. ``locked`` is a lock (from a manifest) to reproduce exactly."""

    def __init__(self, recipe: Recipe, *, store: EnvStore | None = None, name: str | None = None, site: bool = False,
                 locked: Lock | None = None, rebuild: bool = False, installer: str | None = None,
                 progress: Progress | None = None) -> None:
        self.recipe = recipe
        self.store = store or EnvStore()
        self.name = name or recipe.name
        self.env_dir = self.store.env(self.name, site=site)
        self.locked = locked
        self.rebuild = rebuild
        self.installer = pip.known_installer(installer or default_installer())
        self.progress: Progress = progress or (lambda event: None)
        self.phase_seconds: dict[str, float] = {}

    def run(self) -> BuildResult:
        self.env_dir.require_writable("build")
        with self.env_dir.exclusive():
            self.env_dir.prune()  # leftovers of builds that were killed
            previous = self.env_dir.current()
            manifest = previous.manifest() if previous else None
            if isinstance(manifest, ContainerManifest):
                raise HPCAIError(f"env '{self.name}' is a container env", "pick another --name, or `hpcai env "
                                 "remove` it first")
            if previous and manifest and not (self.rebuild or self.locked) and manifest.recipe_hash == self.recipe.digest():
                return BuildResult(self.env_dir, previous, None, up_to_date=True,
                                   followed=self._follow_editables(previous, manifest))
            plan = self._plan(manifest)
            build = self.env_dir.new_build()
            log = self.env_dir.log_path(build)
            self.progress(Event("log", str(log), "log"))
            keep = f"env '{self.name}' is unchanged" + (f" (build {previous.id} is still current)" if previous else "")
            try:
                conflicts = self._build(build, log, plan, previous)
            except HPCAIError as err:
                self._discard(build, log, f"FAILED: {err}")
                where = "" if str(log) in err.hint else f"; full log: {log}"
                raise HPCAIError(err.message, f"{err.hint + '; ' if err.hint else ''}{keep}{where}") from None
            except KeyboardInterrupt:
                self._discard(build, log, "INTERRUPTED")
                raise HPCAIError(f"the build of env '{self.name}' was interrupted", f"{keep}; log: {log}") from None
            except Exception:
                self._discard(build, log, traceback.format_exc())
                raise HPCAIError(f"the build of env '{self.name}' failed unexpectedly", f"{keep}; full log: {log}") from None
            self.env_dir.promote(build)
            self.env_dir.prune()
            return BuildResult(self.env_dir, build, log, phase_seconds=self.phase_seconds, conflicts=conflicts)

    # -- planning --------------------------------------------------------------------------
    def _plan(self, manifest: PrefixManifest | None) -> _Plan:
        recipe = self.recipe
        editables = [f"-e {p}" for p in recipe.editables()]  # this checkout's, whatever the lock's were
        if self.locked:
            lock = self.locked
            later = set(lock.no_build_isolation)
            lines = [line for line in lock.pip if not line.startswith("-e ")] + editables
            for line in lines:
                reason = ("is an option" if line.startswith("-") and not line.startswith("-e ") else
                          unsafe_requirement(line))
                if reason:
                    raise HPCAIError(f"the lock's line `{line}` {reason}", f"a lock lists packages only (jupyter-hpcai "
                                     f"as `{PRODUCT} @ URL`, the wheel the hub was installed from): fix that line, or "
                                     "build from the recipe")
            return _Plan(lock.conda.channels, lock.conda.specs, [ln for ln in lines if requirement_name(ln) not in later],
                         [ln for ln in lines if requirement_name(ln) in later])
        channels = list(recipe.conda.channels) if recipe.conda else []
        specs = list(recipe.conda.specs) if recipe.conda else []
        if manifest and not self.rebuild:
            if manifest.recipe.get("conda") != recipe.model_dump(mode="json")["conda"]:
                if manifest.pip:
                    raise HPCAIError(
                        f"env '{self.name}' already has a pip layer ({len(manifest.pip)} packages) and the recipe "
                        f"changes its conda layer: conda packages never go on top of pip ones (pip's files would be "
                        f"overwritten, or conda's solve would ignore what pip installed)",
                        "rebuild both layers in order: hpcai env build RECIPE --rebuild",
                    )
            else:  # only the pip layer changed: keep the conda layer exactly as it is
                specs = conda.pinned_specs([p.model_dump() for p in manifest.conda])
        return _Plan(channels, specs, *recipe.pip_installs())

    def _follow_editables(self, build: Build, manifest: PrefixManifest) -> dict[str, str]:
        """Point the current build's editable installs at this recipe's sources where they point elsewhere
        (the same recipe in another checkout); what moved."""
        wanted = [p for p in self.recipe.editables() if str(p) not in manifest.editables.values()]
        if not wanted:
            return {}
        env = activate.activation_env(build.prefix, self.recipe, self.name)
        dists = {_normal(d["name"]): d for d in pip.inspect(build.python, env) if d["editable"] and d["url"]}
        followed = {}
        for source in wanted:
            dist = dists.get(_normal(_project_name(source)))
            if dist is None or not pip.repoint_editable(dist, source):
                log = self.env_dir.log_path(build)
                pip.installer(self.installer, build.python, env).install([f"-e {source}"], log=log, no_deps=True)
            followed[_project_name(source)] = str(source)
        dists_now = pip.inspect(build.python, env)
        write_atomic(build.meta / "manifest.json", manifest.model_copy(update={"editables": pip.editables(dists_now)}))
        lock = build.lock()
        if lock:
            write_atomic(build.meta / "lock.json", lock.model_copy(update={"pip": pip.lock_lines(dists_now)}))
        return followed

    # -- the phases ------------------------------------------------------------------------
    @contextmanager
    def _phase(self, name: str, log: Path, total: int | None = None) -> Iterator[None]:
        self.progress(Event(name, "started", "started", 0 if total else None, total))
        with open(log, "a") as out:
            out.write(f"\n==== phase {name} ====\n")
        start = time.monotonic()
        yield
        self.phase_seconds[name] = round(time.monotonic() - start, 2)
        self.progress(Event(name, f"done in {self.phase_seconds[name]:.1f} s", "done"))

    def _build(self, build: Build, log: Path, plan: _Plan, previous: Build | None) -> list[str]:
        recipe, prefix = self.recipe, build.prefix
        with self._phase("preflight", log):
            checked = preflight(recipe)
            with open(log, "a") as out:
                out.write(f"preflight: {json.dumps(checked.facts)}\n")
            for warning in checked.warnings:
                self.progress(Event("preflight", f"warning: {warning}", "warning"))
            checked.raise_for_problems()
        if plan.specs:
            with self._phase("conda", log):
                conda.install(prefix, plan.channels, plan.specs, cache=paths.cache_dir() / "conda-pkgs", log=log,
                              on_output=_CondaCounter(self.progress))
        installer = pip.installer(self.installer, build.python, {})
        if recipe.python:
            with self._phase("python", log):
                if not os.access(recipe.python, os.X_OK):
                    raise HPCAIError(f"python: {recipe.python} is not an executable interpreter",
                                     "set `python:` to an existing interpreter, e.g. /usr/bin/python3")
                installer.make_venv(recipe.python, prefix, log)
        env = activate.activation_env(prefix, recipe, self.name)
        build_env = {k: activate.expand(v, env) for k, v in recipe.build_env.items()}
        conflicts: list[str] = []
        dists: list[dict[str, Any]] = []
        pip_check = ""
        no_deps = bool(self.locked)
        if plan.plain or plan.isolated_off:
            with self._phase("pip", log, total=len(plan.plain) + len(plan.isolated_off)):
                before = pip.snapshot(prefix)
                installer = pip.installer(self.installer, build.python, {**env, **build_env})
                counter = _PipCounter(self.progress, len(plan.plain) + len(plan.isolated_off))
                if plan.plain:
                    installer.install(plan.plain, log=log, no_deps=no_deps, on_output=counter)
                if plan.isolated_off:
                    against = [d for d in pip.lock_lines(pip.inspect(build.python, env)) if _COMPILED_AGAINST.match(d)]
                    toolchain = [list(recipe.modules), *(checked.facts.get(k) for k in TOOLCHAIN_FACTS)]
                    cache = paths.cache_dir() / "compiled-wheels" / _compiled_key(build_env, prefix, against, toolchain)
                    with pip.compiled_wheels(build.python, plan.isolated_off, folder=cache, env={**env, **build_env},
                                             log=log, prefix=prefix) as wheels:
                        installer.install(plan.isolated_off, log=log, no_build_isolation=True, no_deps=no_deps,
                                          find_links=wheels, on_output=counter)
                reused = pip.compile_bytecode(build.python, prefix, previous.prefix if previous else None, log)
                self.progress(Event("pip", f"bytecode: {reused} .pyc files from the build before, the rest compiled"))
                dists = pip.inspect(build.python, env)
                conflicts = pip.overwritten(prefix, before, dists)
                pip_check = installer.check()
        elif build.python.exists():
            dists = pip.inspect(build.python, env)
        steps: list[StepResult] = []
        total_steps = len(recipe.verify.imports) + len(recipe.verify.commands)
        seen: list[StepResult] = []

        def on_step(step: StepResult) -> None:
            seen.append(step)
            shown = step.step if len(step.step) <= 60 else f"{step.step[:57]}..."
            message = f"{shown}: skipped, {step.skipped}" if step.skipped else shown
            self.progress(Event("verify", message, "warning" if step.skipped else "update", len(seen), total_steps))

        with self._phase("verify", log, total=total_steps or None):
            if build.python.exists():
                steps = verify(build.python, recipe.verify, env, on_step=on_step)
            with open(log, "a") as out:
                out.writelines(f"verify: {s.step}: {s.skipped or s.output}\n" for s in steps)
        with self._phase("record", log):
            self._record(build, plan, dists, steps, build_env, conflicts, pip_check, checked.facts, env)
        for line in conflicts:
            self.progress(Event("pip", f"warning: {line}", "warning"))
        return conflicts

    def _record(self, build: Build, plan: _Plan, dists: list[dict[str, Any]], steps: list[StepResult],
                build_env: dict[str, str], conflicts: list[str], pip_check: str, site: dict[str, Any],
                env: dict[str, str]) -> None:
        recipe = self.recipe
        records = conda.installed(build.prefix)
        version = run([str(build.python), "-c", "import sys; print(sys.version.split()[0])"], env=env,
                      timeout=60).stdout.strip() if build.python.exists() else None
        manifest = PrefixManifest(
            name=self.name, build_id=build.id, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), host=platform.node(),
            prefix=str(build.prefix), recipe_hash=recipe.digest(), recipe=recipe.model_dump(mode="json"),
            locked=bool(self.locked), python=version,
            conda=[Package(**{k: r.get(k) for k in ("name", "version", "build", "channel")}) for r in records],
            pip=[Package(name=d["name"], version=d["version"]) for d in pip.pip_installed(dists)],
            build_env=build_env, verify=[StepRecord(step=s.step, output=s.output, skipped=s.skipped) for s in steps],
            conflicts=conflicts, pip_check=pip_check, phase_seconds=self.phase_seconds,
            builder_python=sys.version.split()[0], build_site=site, installer=self.installer,
            editables=pip.editables(dists))
        lock = Lock(recipe_hash=recipe.digest(),
                    conda={"channels": [conda.channel_url(c) for c in plan.channels], "specs": conda.pinned_specs(records)},
                    pip=pip.lock_lines(dists), no_build_isolation=[requirement_name(n) for n in recipe.no_build_isolation])
        try:
            build.meta.mkdir(exist_ok=True)
            write_atomic(build.meta / "lock.json", lock)
            write_atomic(build.meta / "manifest.json", manifest)
        except OSError as err:
            raise HPCAIError(f"cannot write the manifest of build {build.id}: {err}",
                             "make the env folder writable (a full disk? a read-only mount?) and build again") from None

    def _discard(self, build: Build, log: Path, why: str) -> None:
        with open(log, "a") as out:
            out.write(f"\n==== build {build.id} discarded: {why}\n")
        shutil.rmtree(build.prefix, ignore_errors=True)


class _PipCounter:
    """Packages done of the pip layer, read from uv's or pip's output lines."""

    def __init__(self, progress: Progress, requested: int) -> None:
        self.progress, self.done, self.total = progress, 0, requested

    def __call__(self, line: str) -> None:
        if m := re.match(r"Resolved (\d+) packages?", line):  # uv
            self.total = max(int(m.group(1)), self.done)
        elif m := re.match(r"(?:Installed|Audited) (\d+) packages?", line):  # uv
            self.done = self.total
        elif line.startswith("Collecting "):  # pip
            self.done += 1
            self.total = max(self.total, self.done)
        elif line.startswith("Successfully installed "):  # pip
            self.done = self.total
        self.progress(Event("pip", line, "update", self.done, self.total))


class _CondaCounter:
    """The conda layer's packages, from its child's "solved N" and "installed" lines."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.total = progress, None

    def __call__(self, line: str) -> None:
        if m := re.match(r"conda layer: solved (\d+) packages", line):
            self.total = int(m.group(1))
        done = self.total if line.startswith("conda layer: installed") else 0 if self.total else None
        self.progress(Event("conda", line, "update", done, self.total))


def _project_name(source: Path) -> str:
    """The project name in a source folder's pyproject.toml (else the folder's name)."""
    try:
        return str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["name"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return source.name


def _compiled_key(build_env: dict[str, str], prefix: Path, against: list[str], toolchain: list[Any]) -> str:
    """The compiled-wheel cache's folder for a build: installers key their wheel caches by source only, and these
    builds also depend on the build variables, the frameworks they compile against (Horovod against TensorFlow),
    the toolchain outside the prefix (the recipe's modules; the compiler, MPI and CUDA preflight found) and the
    conda layer (MPI, NCCL, CUDA there). Each build has a prefix of its own, so the variables name the new build's
    prefix as ``$PREFIX`` (pip.compiled_wheels still compiles again a wheel that holds its prefix's path)."""
    variables = {name: value.replace(str(prefix), "$PREFIX") for name, value in build_env.items()}
    layer = conda.pinned_specs(conda.installed(prefix))
    return hashlib.sha256(json.dumps([variables, against, toolchain, layer], sort_keys=True).encode()).hexdigest()[:16]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
