"""The host's Slurm client inside a container (runs where a container env's kernel or ranks start): its programs,
run with the host's loader and libraries through wrappers (whatever C library the image has), its config files and
munge socket; nothing else of the host."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from . import environment

HOST = "/.hpcai/host"  # the host's Slurm client inside: ld.so, bin/srun..., its library folders at their host paths
HOST_BIN = "/.hpcai/bin"  # the wrappers that run the host's srun, scontrol... inside the container
WRAPPERS = Path(__file__).parent / "hostbin"  # they: the same for every env and host, bound at HOST_BIN
LIBRARY_PATH_VAR = "HPCAI_HOST_LIBRARY_PATH"  # the library folders under HOST, for the wrappers' loader
SLURM_CLIENT = ("srun", "scontrol", "squeue", "sinfo", "scancel", "sbatch")
# Where Slurm clients find their libraries and plugins, config and munge socket on common installations.
SLURM_LIBS = ("/usr/lib64/slurm", "/usr/lib/slurm", "/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/x86_64-linux-gnu/slurm")
SLURM_CONF_DIRS = ("/etc/slurm", "/etc/slurm-llnl")
MUNGE_SOCKET = "/run/munge/munge.socket.2"
SYSTEM_LIBS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
               "/lib64", "/usr/lib64")


def _slurm_libs() -> list[str]:
    """The folders of Slurm's libraries and plugins: the common installations', and the one beside the srun on PATH
    (a Slurm in a prefix of its own, e.g. /opt/slurm: its lib/slurm/, libslurmfull and the plugins), that one first:
    its srun must load its own libslurmfull, never another installed version's."""
    srun = shutil.which("srun")
    own = Path(srun).resolve().parent.parent / "lib" / "slurm" if srun else None
    return [*([str(own)] if own and str(own) not in SLURM_LIBS else []), *SLURM_LIBS]


def client_paths(environ: dict[str, str] | None = None) -> list[str]:
    """Host paths the Slurm client needs inside the container, found on the node it runs on.

    ``HPCAI_CONTAINER_SLURM_PATHS`` (colon-separated) when set; else the world-readable files beside
    SLURM_CONF (slurm.conf and what it includes: never the folder, which may hold keys or state), the munge
    socket slurm.conf names, the plugin folders, and the PMIx library that ``srun --mpi=pmix`` loads.
    """
    env = os.environ if environ is None else environ
    if "HPCAI_CONTAINER_SLURM_PATHS" in env:
        return [p for p in env["HPCAI_CONTAINER_SLURM_PATHS"].split(":") if p]
    conf = Path(env.get(environment.CONFIG) or next((f"{d}/slurm.conf" for d in SLURM_CONF_DIRS
                                                 if Path(d, "slurm.conf").exists()), "/etc/slurm/slurm.conf"))
    configs = [str(f) for f in conf.parent.glob("*") if f.is_file() and f.stat().st_mode & 0o004] \
        if conf.is_file() else []
    named = re.search(r"^\s*AuthInfo=.*\bsocket=([^,\s]+)", conf.read_text(errors="replace"), re.M) \
        if conf.is_file() else None
    socket = named.group(1) if named else MUNGE_SOCKET
    pmix = [str(p) for p in Path("/usr/lib").glob("*/pmix*/lib/libpmix.so")]
    return sorted({p for p in (*configs, socket, *_slurm_libs(), *pmix) if Path(p).exists()})


def _host_client() -> tuple[str | None, list[str], dict[str, str]]:
    """The host's loader, library folders and Slurm programs, as resolved host paths (what the wrappers run)."""
    loader = next((str(Path(p).resolve()) for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
                   if Path(p).exists()), None)
    libs = list(dict.fromkeys(str(Path(d).resolve()) for d in (*_slurm_libs(), *SYSTEM_LIBS) if Path(d).is_dir()))
    programs = {name: str(Path(exe).resolve()) for name in SLURM_CLIENT if (exe := shutil.which(name))}
    return loader, libs, programs


def host_client_binds() -> list[str]:
    """udocker binds for the host's Slurm client, found on this node now (a site that moves or upgrades Slurm
    changes nothing in an env): the wrappers at HOST_BIN, the loader and the programs at the fixed names the
    wrappers run, the library folders under HOST at their host paths; nothing else."""
    loader, libs, programs = _host_client()
    if loader is None:
        return []
    nested = [d for d in libs if any(d.startswith(f"{other}/") for other in libs)]
    return [f"{WRAPPERS}:{HOST_BIN}", f"{loader}:{HOST}/ld.so",
            *(f"{exe}:{HOST}/bin/{name}" for name, exe in programs.items()),
            *(f"{d}:{HOST}{d}" for d in libs if d not in nested)]


def host_client_environ() -> dict[str, str]:
    """The variables the wrappers read inside the container: where the host's libraries are bound."""
    _, libs, _ = _host_client()
    return {LIBRARY_PATH_VAR: ":".join(f"{HOST}{d}" for d in libs)}
