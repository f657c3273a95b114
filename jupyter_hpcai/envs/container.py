"""Container environments: an image run with udocker (no root, no daemon), next to the conda-built ones.

``hpcai env import-container SOURCE --name NAME`` pulls (registry reference) or imports (rootfs
tarball) or loads (``docker save`` tarball) the image, creates a udocker container, sets its
execution mode (P2 unless told), runs ``udocker setup --nvidia`` on a node with NVIDIA devices, then
looks inside (python, ipykernel, ipyparallel, mpi4py, OpenMPI) and records it all in a build of the
env, like a conda build. ``current`` moves only when the container runs; a failed import keeps the
previous build.

Everything udocker needs is configuration (:class:`Settings`): the udocker executable, its directory,
the execution mode, and udocker's own ``UDOCKER_*`` variables (proot/runc/patchelf executables,
``UDOCKER_TARBALL``). They are recorded in the manifest, so the kernel and the engines run the
container exactly as the import did, whatever environment they start from.

Inside the container, kernels and engines see: the host environment less its secrets (``--hostenv``
after :func:`without_secrets`: no hub token, nothing named like a token, secret, password or key) and
the user's identity (``--hostauth --user``), the home directory, /tmp, the env's extra binds,
jupyter_hpcai's own (pure Python) code at /.hpcai/lib, and the host's Slurm client at /.hpcai/bin
(srun, scontrol..., run with the host's loader and libraries, bound one by one under /.hpcai/host, so
the image's C library does not matter), its config files and munge socket. Nothing else of the host:
the image is untrusted. It runs as the user, so with the Slurm client and the home directory it can do what the
user can (srun, sbatch, the user's files), as any program the user runs; udocker binds are writable, so a package
the user can write (an own venv) is the image's to change too: ``check`` warns about that.

Why P2 (proot without seccomp) is the default and not P1 (proot with seccomp acceleration): measured on
2026-12-04 (Debian 12, kernel 6.18, Debian's proot 5.1.0, udocker 1.3.17), P1 lost files at random. With 4
containers at once, each importing TensorFlow, 4 of 40 imports failed in P1 (3 of 20 with a second thread making
system calls): "cannot open shared object file: Bad address", FileNotFoundError, ModuleNotFoundError of a module
that is there; a Horovod test's rank failed the same way in CI. In P2 (udocker sets PROOT_NO_SECCOMP=1), 32 of 32
passed. P2 costs more per system call, as proot then traces every one: a site whose proot works in P1 may choose
it (``--mode P1`` or ``HPCAI_UDOCKER_MODE=P1``); ``hpcai env check`` warns about an env in P1.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from .. import mpi
from ..container_launch import ContainerLaunch
from ..contract import without_secrets
from ..errors import HPCAIError
from ..proc import run
from ..scheduler import chosen
from .manifest import ContainerManifest, Inside, UdockerRecord, write_atomic
from .store import KINDS, Build, BuiltEnv, Checked, EnvStore
from .udocker import Settings

client = chosen().client

LIB = "/.hpcai/lib"  # jupyter_hpcai's own code, so kernel and ranks run the same version as the host
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the image's PATH
_LOOK_INSIDE = r"""
import json, shutil, subprocess, sys
from importlib import metadata
found = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}, "mpi": None}
for name in ("ipykernel", "ipyparallel", "mpi4py", "horovod", "tensorflow", "tensorflow-cpu", "torch"):
    try:
        found["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
if shutil.which("mpirun"):
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    found["mpi"] = out.splitlines()[0].strip() if out.strip() else None
print("HPCAI-INSIDE " + json.dumps(found))
"""


def package_warnings() -> list[str]:
    """A warning when this user can write jupyter_hpcai's own code, which every container gets (writable: udocker
    binds cannot be read-only), so that an image could change what later runs on the host."""
    import jupyter_hpcai

    package = Path(jupyter_hpcai.__file__).parent
    if not os.access(package, os.W_OK):
        return []
    return [f"you can write {package}, which containers get at {LIB}/jupyter_hpcai and could change: run container "
            "envs from an install you cannot write (the site's, or a venv of another account)"]


@dataclass(frozen=True)
class ContainerEnv(BuiltEnv):
    """A container env's current build (or a build being imported), as its manifest records it."""

    kind: ClassVar[str] = "container"
    interrupt_mode: ClassVar[str] = "message"  # a signal would reach udocker, not the kernel inside
    manifest: ContainerManifest

    @property
    def python(self) -> str:
        return self.manifest.python

    @property
    def container(self) -> str:
        return self.manifest.container

    @property
    def settings(self) -> Settings:
        return Settings.of(self.manifest.udocker)

    @property
    def inside(self) -> Inside:
        return self.manifest.inside

    def require_container(self) -> ContainerEnv:
        """This env, checked to still have its container in udocker's directory."""
        udocker_dir = Path(self.settings.variables.get("UDOCKER_DIR") or Path.home() / ".udocker")
        if not (udocker_dir / "containers" / self.container).exists():
            raise HPCAIError(f"udocker's container {self.container} of env '{self.name}' is gone from {udocker_dir}",
                             f"import the image again: hpcai env import-container {self.manifest.source} "
                             f"--name {self.name}")
        return self

    def run_argv(self, extra_binds: Sequence[str] = ()) -> list[str]:
        """``udocker run`` up to the command: host env and identity, home, /tmp, Slurm client, our code."""
        import jupyter_hpcai

        binds = [str(Path.home()), "/tmp", str(Path.cwd()), *self.manifest.binds, *extra_binds, *client.client_paths(),
                 *client.host_client_binds(), f"{Path(jupyter_hpcai.__file__).parent}:{LIB}/jupyter_hpcai"]
        path = [client.HOST_BIN, *([str(Path(self.python).parent)] if self.python.startswith("/") else []), SYSTEM_PATH]
        return [*self.settings.base, "run", "--nobanner", "--hostenv", "--hostauth", f"--user={os.getuid()}:{os.getgid()}",
                *(f"--volume={b}" for b in dict.fromkeys(binds)), f"--workdir={Path.cwd()}",
                f"--env=PATH={':'.join(path)}", f"--env=PYTHONPATH={LIB}",
                *(f"--env={k}={v}" for k, v in client.host_client_environ().items()), self.container]

    def argv(self, cmd: Sequence[str], binds: Sequence[str] = ()) -> list[str]:
        """``cmd`` (a python command line) run by the image's python in the container."""
        self.require_container()
        return [*self.run_argv(binds), self.python, *list(cmd)[1:]]

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment udocker runs with, which the container gets (``--hostenv``) less its secrets; inside,
        PATH and PYTHONPATH are run_argv's. Ranks started from it run in the same container."""
        env = self.settings.environ(without_secrets(dict(os.environ if base is None else base)))
        launch = ContainerLaunch(self.name, self.run_argv(), self.python, self.inside.mpi, mpi.host_version())
        return {**env, **launch.to_env()}

    def check(self) -> Checked:
        """Run the container again; its warnings; raise when it does not run."""
        self.require_container()
        inside = look_inside(self)
        return Checked([f"container {self.container} runs (mode {self.settings.mode}, {self.python})"],
                       [*mode_warnings(self.settings.mode, self.name, self.manifest.source), *warnings(inside),
                        *package_warnings()])

    def remove(self) -> None:
        """Remove the env and everything udocker holds for it."""
        self.env_dir.require_writable("remove")
        with self.env_dir.exclusive():
            for build in self.env_dir.builds():
                discard(build)
            self.env_dir.current_link.unlink(missing_ok=True)
        shutil.rmtree(self.env_dir.path, ignore_errors=True)

    def describe(self) -> dict[str, str]:
        packages = ", ".join(f"{k} {v}" for k, v in self.inside.packages.items()) or "none"
        return {"kind": "container", "python": self.inside.python or "-", "packages": packages}

    def encrypts(self) -> bool:
        return False

    def has_package(self, name: str) -> bool:
        return name in self.inside.packages


KINDS[ContainerManifest] = ContainerEnv


def _tarball_kind(path: Path) -> str:
    """'load' for a ``docker save`` archive, 'import' for a root filesystem tarball."""
    try:
        with tarfile.open(path) as tar:
            for i, member in enumerate(tar):
                name = member.name.removeprefix("./")
                if name in ("manifest.json", "repositories", "oci-layout") or re.match(r"^[0-9a-f]{64}(/|\.json$)", name):
                    return "load"
                if name.startswith(("etc/", "usr/", "bin")) or i > 200:
                    return "import"
    except (OSError, tarfile.TarError) as err:
        raise HPCAIError(f"{path} is not a readable tar archive: {err}",
                         "give an image tarball (docker save, or a root filesystem made with tar)") from None
    return "import"


def import_container(source: str, name: str, *, store: EnvStore | None = None, mode: str | None = None,
                     python: str = "python3", binds: Sequence[str] = (), settings: Settings | None = None) -> ContainerEnv:
    """Import ``source`` (a tarball path or a registry reference) as a new build of env ``name``."""
    settings = settings or Settings.from_environ(mode=mode)
    env_dir = (store or EnvStore()).env(name)
    env_dir.require_writable("import into")
    for bind in binds:
        if not Path(bind.split(":", 1)[0]).exists():
            raise HPCAIError(f"--bind {bind}: {bind.split(':', 1)[0]} does not exist on this host", "bind an existing path")
    with env_dir.exclusive():
        previous = env_dir.current()
        if previous and not isinstance(previous.manifest(), ContainerManifest | None):
            raise HPCAIError(f"env '{name}' is a built env, not a container", "pick another --name, or `hpcai env "
                             "remove` it first")
        build = env_dir.new_build()
        tag = f"hpcai-{name.lower()}:{build.id}"
        manifest = ContainerManifest(
            kind="container", name=name, build_id=build.id, source=source, image=tag,
            container=f"hpcai-{name.lower()}-{build.id}", python=python, binds=list(binds),
            udocker=UdockerRecord(**asdict(settings)), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        try:
            build.meta.mkdir()
            write_atomic(build.meta / "manifest.json", manifest)  # first, so that a failed import can be cleaned up
            manifest.image = _get_image(settings, source, tag)
            write_atomic(build.meta / "manifest.json", manifest)
            settings.udocker_run(["create", f"--name={manifest.container}", manifest.image], timeout=1800)
            setup = settings.udocker_run(["setup", f"--execmode={settings.mode}", manifest.container], check=False)
            if setup.returncode != 0:
                raise HPCAIError(f"udocker cannot use execution mode {settings.mode}: {setup.stderr.strip()[-300:]}",
                                 "pick another with --mode (P1, P2 need proot; R1 needs runc) or set the udocker "
                                 "executables (UDOCKER_USE_PROOT_EXECUTABLE, UDOCKER_USE_RUNC_EXECUTABLE)")
            if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
                settings.udocker_run(["setup", "--nvidia", manifest.container], timeout=600)
            manifest.inside = look_inside(ContainerEnv(env_dir, build, manifest))
            write_atomic(build.meta / "manifest.json", manifest)
        except BaseException:
            discard(build)
            raise
        env_dir.promote(build)
        for old in env_dir.builds():
            if old.id not in (build.id, previous.id if previous else ""):
                discard(old)
    return ContainerEnv(env_dir, build, manifest)


def _get_image(settings: Settings, source: str, tag: str) -> str:
    path = Path(source)
    if path.exists():
        if _tarball_kind(path) == "load":
            done = settings.udocker_run(["load", "-i", str(path.absolute())], timeout=1800)
            loaded = re.findall(r"[\w./-]+:[\w.-]+", done.stdout)
            if not loaded:
                raise HPCAIError(f"udocker load of {path} named no image", "check the tarball with `tar tf`")
            return loaded[-1]
        settings.udocker_run(["import", str(path.absolute()), tag], timeout=1800)
        return tag
    if source.startswith((".", "/", "~")) or source.endswith((".tar", ".tar.gz", ".tgz")):
        raise HPCAIError(f"no image tarball at {source}", "give an existing file, or a registry reference such as "
                         "docker.io/library/debian:bookworm")
    done = settings.udocker_run(["pull", source], timeout=3600, check=False)
    if done.returncode != 0:
        raise HPCAIError(f"udocker pull {source} failed: {(done.stderr or done.stdout).strip()[-300:]}",
                         "check the reference and that this node reaches the registry; offline, import a tarball "
                         "(docker save IMAGE > image.tar on a machine with internet, then copy it here)")
    return source


def look_inside(c: ContainerEnv) -> Inside:
    """Run the env's python in the container and record what it has; clear errors when it cannot run."""
    done = run([*c.run_argv(), c.python, "-c", _LOOK_INSIDE], env=c.environ(), check=False, timeout=300)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("HPCAI-INSIDE ")), None)
    if line is None:
        text = f"{done.stderr}\n{done.stdout}"
        errors = [ln.strip() for ln in text.splitlines() if "rror" in ln]
        detail = (errors[0] if errors else text.strip()[-300:])[:300]
        if "command not found" in detail:
            raise HPCAIError(f"the container of env '{c.name}' has no {c.python}",
                             "install python3 in the image, or pass --python with the interpreter's path inside")
        raise HPCAIError(f"the container of env '{c.name}' does not run in mode {c.settings.mode}: {detail}",
                         "try another --mode (P1, P2, R1), or check udocker's executables (UDOCKER_USE_*_EXECUTABLE)")
    return Inside.model_validate_json(line.removeprefix("HPCAI-INSIDE "))


def warnings(inside: Inside) -> list[str]:
    """What will not work with what the image has: an MPI unlike this node's, no ipykernel or ipyparallel."""
    warnings = []
    if mismatch := mpi.mismatch(inside.mpi, mpi.host_version()):
        warnings.append(f"MPI: {mismatch}; MPI programs in the container may fail to start across nodes")
    for package in ("ipykernel", "ipyparallel"):
        if package not in inside.packages:
            warnings.append(f"the image has no {package}: add it to the image (pip install {package})")
    return warnings


def mode_warnings(mode: str, name: str, source: str) -> list[str]:
    """A warning for mode P1, whose proot lost files at random in this project's tests (see the module doc)."""
    if mode != "P1":
        return []
    warning = (f"mode P1 (proot with seccomp) lost files at random in this project's tests (imports failed with "
               f"'Bad address' or 'No such file'); re-import in mode P2: hpcai env import-container {source} "
               f"--name {name} --mode P2")
    return [warning]


def discard(build: Build) -> None:
    """Remove a container build: its udocker container and imported image, then its folder."""
    try:
        manifest = build.manifest()
    except HPCAIError:
        manifest = None
    if isinstance(manifest, ContainerManifest):
        settings = Settings.of(manifest.udocker)
        settings.udocker_run(["rm", "-f", manifest.container], check=False)
        if manifest.image == f"hpcai-{manifest.name.lower()}:{build.id}":  # imported here; pulls stay cached
            settings.udocker_run(["rmi", manifest.image], check=False)
    shutil.rmtree(build.prefix, ignore_errors=True)
