"""What choosing a Slurm for the dev cluster changes outside its state folder, and what another Slurm left.

- sudo's ``secure_path`` (``/etc/sudoers.d/hpcai-devcluster``): the commands the hub runs as its users through sudo,
  and the jobs they submit, find the cluster's Slurm first, as a site puts its Slurm's ``bin/`` in secure_path.
- Slurm's own cgroups (``/sys/fs/cgroup/<controller>/slurm_<node>``, one per node name for the whole machine):
  slurmd keeps them after it stops, and an older slurmd fails every job in a tree a newer one made
  ("task_p_pre_setuid functions returned error"), so the empty ones are removed when the machine's clusters change
  their Slurm (``/run/hpcai-devcluster-cgroups`` says which one made them last).
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from pathlib import Path

from ..errors import HPCAIError
from ..proc import run

SUDOERS = Path("/etc/sudoers.d/hpcai-devcluster")
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_LOCK = Path("/run/hpcai-devcluster-cgroups")  # which Slurm's slurmd made the nodes' cgroups last


def slurm_path(prefix: str) -> list[str]:
    """The folders of the Slurm installed in ``prefix`` that go first on PATH ([] for the system's Slurm)."""
    return [f"{prefix}/bin", f"{prefix}/sbin"] if prefix else []


def set_sudo_path(prefix: str) -> None:
    """sudo's secure_path with ``prefix``'s Slurm first; Debian's own (the drop-in removed) for the system's Slurm.

    Written to a file of a name of its own, checked by visudo, then renamed into place: clusters started at once (one
    per pytest-xdist worker) never read or replace each other's half-written file.
    """
    if not SUDOERS.parent.is_dir():
        return  # no sudo here: nothing runs through it
    if not prefix:
        SUDOERS.unlink(missing_ok=True)
        return
    _refuse_unsafe(prefix)
    text = ("# Written by `hpcai devcluster up --slurm PREFIX`; removed by `up` with the system's Slurm.\n"
            f'Defaults secure_path="{os.pathsep.join([*slurm_path(prefix), SECURE_PATH])}"\n')
    if SUDOERS.is_file() and SUDOERS.read_text() == text:
        return
    # sudo reads no file of sudoers.d with a '.' in its name, so the staged one is never in force
    fd, staged = tempfile.mkstemp(prefix=".hpcai-devcluster.", suffix=".new", dir=SUDOERS.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(staged, 0o440)
        run(["visudo", "-cf", staged], timeout=30)
        os.replace(staged, SUDOERS)
    finally:
        Path(staged).unlink(missing_ok=True)


def _refuse_unsafe(prefix: str) -> None:
    """sudo runs what it finds first in secure_path as root, for every user of the machine: a prefix only root can
    write, named in plain characters (nothing a sudoers line could read as its own syntax)."""
    if not re.fullmatch(r"/[A-Za-z0-9/._+-]+", prefix):
        raise HPCAIError(f"--slurm {prefix!r}: an absolute path of letters, digits and / . _ + - only",
                         "install Slurm under a plain path, e.g. /opt/slurm-24.11")
    for folder in (Path(prefix), *(Path(p) for p in slurm_path(prefix))):
        found = folder.stat()
        if found.st_uid != 0 or found.st_mode & 0o022:
            raise HPCAIError(f"{folder} may be written by others than root: sudo would run what they put there",
                             f"chown root {folder}; chmod go-w {folder}")


def claim_slurm_cgroups(prefix: str, nodes: list[str]) -> None:
    """Before ``nodes``' slurmd start with the Slurm in ``prefix`` ("" for the system's): where another Slurm made
    their cgroups last (any state folder's cluster: the cgroups are named by node only), remove
    the empty ones first. Raise where one still holds a process: that Slurm's slurmd would fail this one's jobs."""
    with open(CGROUP_LOCK, "a+") as lock:  # clusters started at once: one claims, the others find it claimed
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        if lock.read() == f"{prefix}\n":
            return
        stayed = clear_slurm_cgroups(nodes)
        if stayed:
            raise HPCAIError(f"another Slurm's jobs still run in {', '.join(map(str, stayed[:3]))}",
                             "stop the dev cluster that runs them (hpcai devcluster down --state-dir DIR), or reboot")
        lock.truncate(0)
        lock.write(f"{prefix}\n")


def clear_slurm_cgroups(nodes: list[str]) -> list[Path]:
    """Remove the empty cgroups Slurm left for ``nodes`` (deepest first); those with a process in them stay.

    Returns what stays.
    """
    stayed: list[Path] = []
    for top in sorted(CGROUP_ROOT.glob("*/slurm_*")) + sorted(CGROUP_ROOT.glob("slurm_*")):
        if top.name.removeprefix("slurm_") not in nodes:
            continue
        for folder, _subdirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count(os.sep)):
            try:
                os.rmdir(folder)  # a cgroup goes only when no process and no child cgroup is in it
            except OSError:
                stayed.append(Path(folder))
    return stayed
