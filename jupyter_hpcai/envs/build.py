"""Build an environment from a recipe, in order: conda layer, python, pip layer, verify, record, promote.

Each build goes to a new prefix; `current` moves to it only after verify passed and the manifest
and lock were written. Whatever goes wrong (a failed step, Ctrl-C), the previous build stays
current and usable, and the error says where the full log is.
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
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import HPCAIError
from ..proc import run, run_logged
from . import activate, conda, pip
from .preflight import preflight
from .recipe import Recipe, requirement_name
from .store import Build, Env, EnvStore
from .verify import verify

Progress = Callable[[str, str], None]  # (phase, latest message)
_COMPILED_AGAINST = re.compile(r"^(tensorflow|tf-keras|keras|torch|mxnet|jax|jaxlib|numpy|mpi4py)\b", re.I)
_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")


@dataclass
class BuildResult:
    env: Env
    build: Build
    log: Path | None
    up_to_date: bool = False
    phase_seconds: dict[str, float] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)


def activation_env(build: Build, recipe: Recipe, name: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a process inside ``build`` runs with (activation applied to ``base``)."""
    base = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROP}
    act = activate.for_prefix(build.prefix, name, list(recipe.modules), dict(recipe.activate))
    return act.apply(base)


def recipe_of(env: Env) -> tuple[Build, Recipe]:
    """The env's current build and the recipe it was made from (recorded in its manifest)."""
    build = env.current()
    if build is None or not build.prefix.is_dir():
        raise HPCAIError(f"env '{env.name}' does not exist in {env.root} (it was removed, or never built)",
                         f"build it: hpcai env build RECIPE --name {env.name}, or pick another kernel")
    manifest = build.manifest()
    if manifest is None:
        raise HPCAIError(f"env '{env.name}' has no finished build", f"build it: hpcai env build RECIPE --name {env.name}")
    return build, Recipe(**manifest["recipe"])


def activated(env: Env, base: Mapping[str, str] | None = None) -> tuple[Build, dict[str, str]]:
    """The env's current build and the environment its processes run with; clear errors when broken."""
    build, recipe = recipe_of(env)
    if not build.python.exists():
        raise HPCAIError(f"env '{env.name}' is broken: its python ({build.python}) is missing",
                         f"rebuild it: hpcai env build RECIPE --name {env.name} --rebuild")
    return build, activation_env(build, recipe, env.name, base)


class Builder:
    """One build of one env. ``locked`` is a lock (from a manifest) to reproduce exactly."""

    def __init__(self, recipe: Recipe, *, store: EnvStore | None = None, name: str | None = None,
                 locked: dict[str, Any] | None = None, rebuild: bool = False, progress: Progress | None = None) -> None:
        self.recipe = recipe
        self.store = store or EnvStore()
        self.name = name or recipe.name
        self.env = self.store.env(self.name)
        self.locked = locked
        self.rebuild = rebuild
        self.progress = progress or (lambda phase, message: None)
        self.phase_seconds: dict[str, float] = {}

    def run(self) -> BuildResult:
        with self.env.exclusive():
            self.env.prune()  # leftovers of builds that were killed
            previous = self.env.current()
            plan = self._plan(previous)
            if plan is None:
                assert previous is not None
                return BuildResult(self.env, previous, None, up_to_date=True)
            build = self.env.new_build()
            log = self.env.log_path(build)
            self.progress("log", str(log))
            keep = f"env '{self.name}' is unchanged" + (f" (build {previous.id} is still current)" if previous else "")
            try:
                conflicts = self._build(build, log, *plan)
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
            self.env.promote(build)
            self.env.prune()
            return BuildResult(self.env, build, log, phase_seconds=self.phase_seconds, conflicts=conflicts)

    # -- planning --------------------------------------------------------------------------
    def _plan(self, previous: Build | None) -> tuple[list[str], list[str], list[str], list[str]] | None:
        """(conda channels, conda specs, pip args, pip args without build isolation); None when up to date."""
        recipe = self.recipe
        if self.locked:
            lock = self.locked
            later = set(lock.get("no_build_isolation", []))
            isolated = [line for line in lock["pip"] if requirement_name(line) not in later]
            return lock["conda"]["channels"], lock["conda"]["specs"], isolated, [
                line for line in lock["pip"] if requirement_name(line) in later]
        channels = list(recipe.conda.channels) if recipe.conda else []
        specs = list(recipe.conda.specs) if recipe.conda else []
        manifest = previous.manifest() if previous else None
        if manifest and not self.rebuild:
            if manifest["recipe_hash"] == recipe.digest():
                return None
            old_conda = manifest["recipe"].get("conda")
            new_conda = recipe.model_dump(mode="json")["conda"]
            if old_conda != new_conda:
                if manifest["pip"]:
                    raise HPCAIError(
                        f"env '{self.name}' already has a pip layer ({len(manifest['pip'])} packages) and the recipe "
                        f"changes its conda layer: conda packages never go on top of pip ones (pip's files would be "
                        f"overwritten, or conda's solve would ignore what pip installed)",
                        "rebuild both layers in order: hpcai env build RECIPE --rebuild",
                    )
            else:  # only the pip layer changed: keep the conda layer exactly as it is
                specs = conda.pinned_specs(manifest["conda"])
        return channels, specs, *recipe.pip_installs()

    # -- the phases ------------------------------------------------------------------------
    @contextmanager
    def _phase(self, name: str, log: Path) -> Iterator[None]:
        self.progress(name, "started")
        with open(log, "a") as out:
            out.write(f"\n==== phase {name} ====\n")
        start = time.monotonic()
        yield
        self.phase_seconds[name] = round(time.monotonic() - start, 2)
        self.progress(name, f"done in {self.phase_seconds[name]:.1f} s")

    def _build(self, build: Build, log: Path, channels: list[str], specs: list[str], plain: list[str],
               isolated_off: list[str]) -> list[str]:
        recipe, prefix = self.recipe, build.prefix
        on_output = lambda line: None  # noqa: E731
        with self._phase("preflight", log):
            checked = preflight(recipe)
            with open(log, "a") as out:
                out.write(f"preflight: {json.dumps(checked.facts)}\n")
            for warning in checked.warnings:
                self.progress("preflight", f"warning: {warning}")
            checked.raise_for_problems()
        if specs:
            with self._phase("conda", log):
                conda.install(prefix, channels, specs, cache=paths.cache_dir() / "conda-pkgs", log=log)
        if recipe.python:
            with self._phase("python", log):
                if not os.access(recipe.python, os.X_OK):
                    raise HPCAIError(f"python: {recipe.python} is not an executable interpreter",
                                     "set `python:` to an existing interpreter, e.g. /usr/bin/python3")
                run_logged([recipe.python, "-m", "venv", prefix], log=log, timeout=300)
        env = activation_env(build, recipe, self.name)
        build_env = {k: activate.expand(v, env) for k, v in recipe.build_env.items()}
        conflicts: list[str] = []
        dists: list[dict[str, Any]] = []
        if plain or isolated_off:
            with self._phase("pip", log):
                before = pip.snapshot(prefix)
                pip_env = {**env, **build_env}
                on_output = lambda line: self.progress("pip", line)  # noqa: E731
                if plain:
                    pip.install(build.python, plain, env=pip_env, log=log, no_deps=bool(self.locked), on_output=on_output)
                if isolated_off:
                    # pip keys its wheel cache by source only; these builds also depend on the build variables
                    # and on the frameworks they compile against (Horovod against TensorFlow), so cache them apart.
                    against = [d for d in pip.lock_lines(pip.inspect(build.python, env)) if _COMPILED_AGAINST.match(d)]
                    key = hashlib.sha256(json.dumps([build_env, against], sort_keys=True).encode()).hexdigest()[:16]
                    cache = paths.cache_dir() / "pip-builds" / key
                    pip.install(build.python, isolated_off, env={**pip_env, "PIP_CACHE_DIR": str(cache)}, log=log,
                                no_build_isolation=True, no_deps=bool(self.locked), on_output=on_output)
                dists = pip.inspect(build.python, env)
                conflicts = pip.overwritten(prefix, before, dists)
                pip_check = run([str(build.python), "-m", "pip", "check"], env=env, check=False, timeout=300).stdout
        elif build.python.exists():
            dists = pip.inspect(build.python, env)
        with self._phase("verify", log):
            steps = verify(build.python, recipe.verify, env) if build.python.exists() else []
            with open(log, "a") as out:
                out.writelines(f"verify: {s.step}: {s.output}\n" for s in steps)
        with self._phase("record", log):
            records = conda.installed(prefix)
            manifest = {
                "name": self.name, "build_id": build.id, "kind": "conda", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "host": platform.node(), "prefix": str(prefix), "recipe_hash": recipe.digest(),
                "recipe": recipe.model_dump(mode="json"), "locked": bool(self.locked),
                "python": run([str(build.python), "-c", "import sys; print(sys.version.split()[0])"], env=env,
                              timeout=60).stdout.strip() if build.python.exists() else None,
                "conda": [{k: r.get(k) for k in ("name", "version", "build", "channel")} for r in records],
                "pip": [{"name": d["name"], "version": d["version"]} for d in pip.pip_installed(dists)],
                "build_env": build_env, "verify": [{"step": s.step, "output": s.output} for s in steps],
                "conflicts": conflicts, "pip_check": pip_check.strip() if plain or isolated_off else "",
                "phase_seconds": self.phase_seconds, "builder_python": sys.version.split()[0],
                "build_site": checked.facts,
            }
            lock = {
                "recipe_hash": recipe.digest(),
                "conda": {"channels": [conda.channel_url(c) for c in channels], "specs": conda.pinned_specs(records)},
                "pip": pip.lock_lines(dists),
                "no_build_isolation": [requirement_name(n) for n in recipe.no_build_isolation],
            }
            try:
                build.meta.mkdir(exist_ok=True)
                (build.meta / "lock.json").write_text(json.dumps(lock, indent=2) + "\n")
                (build.meta / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            except OSError as err:
                raise HPCAIError(f"cannot write the manifest of build {build.id}: {err}",
                                 "make the env folder writable (a full disk? a read-only mount?) and build again") from None
        for line in conflicts:
            self.progress("pip", f"warning: {line}")
        return conflicts

    def _discard(self, build: Build, log: Path, why: str) -> None:
        with open(log, "a") as out:
            out.write(f"\n==== build {build.id} discarded: {why}\n")
        shutil.rmtree(build.prefix, ignore_errors=True)
