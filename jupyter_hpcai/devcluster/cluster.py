"""Start and stop munge, slurmctld and one slurmd per node, all on this machine.

Each node is its own network host (namespaces.py): its slurmd, and so every job step on it, runs in the
node's namespace with the node's address and hostname, and sees the login node's own folders (/usr/local, /opt)
empty but for what a site would share (the env roots, the wheelhouses); slurmctld (and the hub) stay on the host,
the login node. The nodes' processes share a cpu cgroup (cpu.py), so that they take no more of the login
node's CPU than one busy session of it, as if they ran on machines of their own. Every file (config,
spool, state, pid files, logs, fake GPU devices) lives under one state directory, shared by all; every
daemon is stopped by the PID in its pid file.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import socket
import stat
import sys
from dataclasses import asdict, dataclass, field, fields
from importlib.resources import files
from pathlib import Path
from string import Template

from .. import paths
from ..errors import HPCAIError
from ..network import LOOPBACK
from ..proc import run, start_daemon, wait_until
from ..scheduler import chosen
from ..envs.pip import pip_settings
from ..scheduler.interface import Node
from .accounting import Accounting
from .cpu import NodeCPU
from .daemon import Daemon
from .namespaces import Network
from .slurm_change import claim_slurm_cgroups, set_sudo_path, slurm_path

scheduler = chosen()

INSTALL_HINT = "apt-get install -y slurm-wlm munge slurmdbd mariadb-server openmpi-bin libopenmpi-dev"
_PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "srun", "scancel", "scontrol")
_ACCOUNTING = ("sacct", "sacctmgr", "slurmdbd", "mariadbd", "mariadb-install-db")
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
NODE_MEMORY_MB = 131072  # declared (SlurmdParameters=config_overrides); a job gets DefMemPerCPU unless it asks
GPU_DEVICE_MAJOR = 195  # the NVIDIA driver's character-device major number
# Only root reads these: slurmctld's state (every job's script and environment) and the daemons' logs.
PRIVATE_DIRS = ("ctld", "log", "accounting")
NO_ACCOUNTING = "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none"


def check_prerequisites(accounting: bool = True, prefix: str = "") -> None:
    """Raise HPCAIError naming what is missing to run the dev cluster here (with ``accounting``: its slurmdbd and
    database too; ``prefix``: the Slurm installed there), and how to get it."""
    if prefix and not Path(prefix, "sbin", "slurmctld").is_file():
        raise HPCAIError(f"no Slurm in {prefix}: {prefix}/sbin/slurmctld is not there",
                         f"build it there first: scripts/build-slurm.sh {prefix}")
    path = os.pathsep.join([*slurm_path(prefix), _SBIN_PATH])
    missing = [p for p in (*_PROGRAMS, *(_ACCOUNTING if accounting else ())) if shutil.which(p, path=path) is None]
    if missing:
        raise HPCAIError(f"Slurm is not installed here: {', '.join(missing)} not found", f"as root: {INSTALL_HINT}")
    if os.geteuid() != 0:
        raise HPCAIError(
            "the dev cluster needs root: it starts munged, slurmctld and slurmd and makes device files",
            "run it as root, e.g. `sudo .venv/bin/hpcai devcluster up`",
        )


@dataclass(frozen=True)
class ClusterStatus:
    """What `hpcai devcluster status` shows."""

    state_dir: Path
    conf: Path
    daemons: dict[str, int | None]  # name -> pid, None when not running
    nodes: list[Node]
    mode: str
    note: str
    login_address: str
    addresses: dict[str, str]  # node -> its address
    slurm: str  # the version of the Slurm it runs, e.g. "22.05"; "" before the first up (no config to read it with)
    accounting: bool  # slurmdbd on MariaDB keeps its jobs, users and limits


SEPARATE, SHARED = "separate hosts", "one shared address"  # the two network modes
# A site's login node has software of its own that its compute nodes lack: the nodes see these folders empty.
LOGIN_ONLY = ("/usr/local", "/opt")


@functools.cache
def shared_by_default() -> tuple[str, ...]:
    """What a site keeps on shared storage inside the login node's own folders: the site's env roots, and the
    local folders pip's configuration takes packages from (a wheelhouse, a file:// index)."""
    settings = pip_settings(Path(sys.executable), os.environ)
    wheelhouses = [p.removeprefix("file://") for option in ("find-links", "index-url", "extra-index-url")
                   for p in settings.get(option, "").split() if p.startswith(("/", "file:///"))]
    folders = [Path(w).parent if Path(w).name == "simple" else Path(w) for w in wheelhouses]  # an index's files too
    return tuple(sorted({*(str(r) for r in paths.site_env_roots()), *(str(f) for f in folders)}))


@dataclass
class DevCluster:
    """A dev cluster: ``nodes`` nodes named n1..nN, each with ``gpus_per_node`` fake GPUs.

    slurmctld listens on ``port`` and node i's slurmd on ``port + i``, so clusters with
    different state directories and ports can run side by side; ``first_job_id`` keeps their job ids apart. With
    ``separate_hosts`` each
    node gets its own network namespace and an address of ``network`` on the bridge ``bridge``;
    ``mode`` says what ``up`` could make (``note`` why, when it fell back to one shared address);
    ``cpu_note`` says why the nodes share the host's CPU as its own processes do, when they do. With
    ``accounting``, slurmdbd on a MariaDB server of the cluster's own (accounting.py) keeps its jobs, users and limits.
    """

    state_dir: Path = field(default_factory=paths.devcluster_dir)
    nodes: int = 2
    gpus_per_node: int = 4
    cpus_per_node: int = 8
    port: int = 6817
    separate_hosts: bool = True
    network: str = "10.213.0.0/24"
    bridge: str = "hpcai0"
    netns_prefix: str = "hpcai-"
    first_job_id: int = 1
    accounting: bool = True
    slurm: str = field(default_factory=paths.slurm_prefix)  # the Slurm it runs: an install prefix, "" the system's
    login_only: tuple[str, ...] = LOGIN_ONLY  # the login node's own folders, empty on the nodes (separate hosts)
    shared: tuple[str, ...] = ()  # folders inside those that the nodes see [default: env roots, pip's wheelhouses]
    mode: str = field(default="", compare=False)
    note: str = field(default="", compare=False)
    cpu_note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self.login_only, self.shared = tuple(self.login_only), tuple(self.shared)  # as cluster.json gives them: lists
        if not 1 <= self.nodes <= 16:
            raise HPCAIError(f"--nodes must be between 1 and 16, not {self.nodes}")
        if not 0 <= self.gpus_per_node <= 16:
            raise HPCAIError(f"--gpus-per-node must be between 0 and 16, not {self.gpus_per_node}")
        self.net  # validates the network settings

    @classmethod
    def load(cls, state_dir: Path | None = None) -> DevCluster:
        """The cluster last set up in ``state_dir`` (defaults when none was)."""
        state_dir = Path(state_dir or paths.devcluster_dir())
        try:
            saved = json.loads((state_dir / "cluster.json").read_text())
        except FileNotFoundError:
            return cls(state_dir=state_dir)
        return cls(state_dir=state_dir, **{k: v for k, v in saved.items() if k != "state_dir"})

    # -- layout ---------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def net(self) -> Network:
        return Network(self.state_dir, tuple(self.node_names), self.network, self.bridge, self.netns_prefix,
                       tuple(self.login_only), tuple(self.shared) or shared_by_default())

    @property
    def cpu(self) -> NodeCPU:
        return NodeCPU(f"hpcai-devcluster-{self.port}")

    @property
    def login_address(self) -> str:
        """Where the nodes reach this host (slurmctld, the hub): the bridge's address, or loopback."""
        return self.net.login_address if self.mode == SEPARATE else LOOPBACK

    def node_address(self, node: str) -> str:
        return self.net.address(node) if self.mode == SEPARATE else LOOPBACK

    @property
    def nodelist(self) -> str:
        return f"n[1-{self.nodes}]" if self.nodes > 1 else "n1"

    def variables(self) -> dict[str, str]:
        """What a shell or a process needs to use this cluster (``hpcai`` itself finds it by its state dir): with a
        Slurm of its own, its client commands first on PATH (the hub, kernels and ranks then run them)."""
        found = {"SLURM_CONF": str(self.conf), "HPCAI_DEVCLUSTER_DIR": str(self.state_dir)}
        if self.slurm:
            rest = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d not in slurm_path(self.slurm)]
            found["PATH"] = os.pathsep.join([*slurm_path(self.slurm), *rest])
        return found

    def environ(self) -> dict[str, str]:
        """This process's environment with the cluster's variables set."""
        return {**os.environ, **self.variables()}

    @property
    def acct(self) -> Accounting:
        """The cluster's slurmdbd and database (used only with ``accounting``); ports ``port + 100`` and ``+ 101``."""
        return Accounting(self.state_dir, self.port + 100, self.login_address)

    def enrol(self, user: str, projects: tuple[str, ...] | None = None) -> None:
        """Give ``user`` associations with ``projects`` (default: the first project); nothing without accounting."""
        if self.accounting:
            self.acct.enrol(self.environ(), user, *([projects] if projects else []))

    def daemons(self) -> list[Daemon]:
        """Every daemon in start order."""
        run_dir = self.state_dir / "run"
        return [
            Daemon("munged", run_dir / "munged.pid", "munged"),
            Daemon("slurmctld", run_dir / "slurmctld.pid", "slurmctld"),
            *(Daemon(f"slurmd {n}", run_dir / f"slurmd-{n}.pid", "slurmd") for n in self.node_names),
        ]

    def running(self) -> bool:
        """True when any daemon of this cluster runs."""
        return any(d.pid() for d in self.daemons())

    # -- lifecycle ------------------------------------------------------------------------
    def up(self, timeout: float = 90) -> None:
        """Start whatever is not running and return when every node accepts jobs. Idempotent."""
        check_prerequisites(self.accounting, self.slurm)
        fresh = not self.running()
        if not fresh:
            saved = DevCluster.load(self.state_dir)
            if saved != self:
                differ = [f"{k} {getattr(saved, k)!r}, not {getattr(self, k)!r}" for k in self._settings()
                          if getattr(saved, k) != getattr(self, k)]
                raise HPCAIError(
                    f"a different dev cluster is running in {self.state_dir}: {'; '.join(differ)}",
                    f"stop it first (hpcai devcluster down --state-dir {self.state_dir}), or ask for it as it runs "
                    "(the same --slurm or HPCAI_SLURM, and --accounting, every time)",
                )
            self.mode, self.note, self.cpu_note = saved.mode, saved.note, saved.cpu_note
        else:
            self._forget_another_slurm()
            set_sudo_path(self.slurm)
            claim_slurm_cgroups(self.slurm, self.node_names)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.note = self.net.up() if self.separate_hosts else "asked for one shared address (--single-host)"
            self.mode = SHARED if self.note else SEPARATE
            self.cpu_note = self.cpu.up()
            self._write_files()
        env = self.environ()
        munged, ctld, *slurmds = self.daemons()
        log = self.state_dir / "log"
        if not munged.pid():
            munge = self.state_dir / "munge"
            start_daemon(
                ["munged", "--force", f"--socket={munge / 'munge.socket'}", f"--key-file={munge / 'munge.key'}",
                 f"--pid-file={munged.pid_file}", f"--log-file={log / 'munged.log'}",
                 f"--seed-file={munge / 'munged.seed'}"],
                log=log / "munged.start.log", env=env,
            )
            wait_until(munged.pid, timeout=10, what="munged to start", hint=f"see {log / 'munged.log'}")
        if self.accounting:
            self.acct.up(env)
        if not ctld.pid():
            start_daemon(["slurmctld", "-i"], log=log / "slurmctld.start.log", env=env)
        for node, daemon in zip(self.node_names, slurmds):
            if not daemon.pid():
                host = self.net.exec_prefix(node) if self.mode == SEPARATE else []
                cpu = [] if self.cpu_note else self.cpu.exec_prefix()
                start_daemon([*cpu, *host, "slurmd", "-N", node], log=log / f"slurmd-{node}.start.log", env=env)
        wait_until(
            self._all_nodes_usable, timeout=timeout, what="every dev-cluster node to be idle",
            hint=f"see the logs in {log}",
        )
        if fresh:  # jobs the controller saved while they waited or ran: nothing of theirs runs now, and they hold nodes
            self._cancel_all_jobs(timeout)
        if self.accounting:
            self.acct.org(env, users=["root"])

    def down(self, timeout: float = 30) -> None:
        """Cancel every job, then stop every daemon by its PID. Harmless when nothing runs."""
        munged, ctld, *slurmds = self.daemons()
        if ctld.pid() and munged.pid():
            self._cancel_all_jobs(timeout)
        for daemon in [*slurmds, ctld, *reversed(self.acct.daemons()), munged]:  # slurmdbd before its database
            daemon.stop(timeout)
        self.net.down()  # also what a crashed `up` or a killed run left
        self.cpu.down()

    def status(self) -> ClusterStatus:
        """Daemons with their PIDs, and the nodes as Slurm reports them (when slurmctld runs)."""
        daemons = {d.name: d.pid() for d in self.daemons()}
        if self.accounting:
            daemons.update({d.name: d.pid() for d in self.acct.daemons()})
        nodes = scheduler.nodes(self.environ()) if daemons["slurmctld"] and daemons["munged"] else []
        return ClusterStatus(self.state_dir, self.conf, daemons, nodes, self.mode, self.note, self.login_address,
                             {n: self.node_address(n) for n in self.node_names},
                             "%d.%02d" % scheduler.version(self.environ()) if self.conf.exists() else "",
                             self.accounting)

    # -- internals ------------------------------------------------------------------------
    def _settings(self) -> list[str]:
        """The fields that make a cluster what it is (those ``up`` compares with the one running)."""
        return [f.name for f in fields(self) if f.compare and f.name != "state_dir"]

    def _forget_another_slurm(self) -> None:
        """Remove what a cluster of another Slurm left in the state folder (its controller's state, its nodes', its
        accounting database): no Slurm reads a newer one's, and the cluster starts afresh."""
        saved = DevCluster.load(self.state_dir)
        if (self.state_dir / "cluster.json").exists() and saved.slurm != self.slurm:
            for sub in ("ctld", "spool", "accounting"):
                shutil.rmtree(self.state_dir / sub, ignore_errors=True)

    def _all_nodes_usable(self) -> bool:
        try:
            found = scheduler.nodes(self.environ())
        except HPCAIError:  # slurmctld not answering yet
            return False
        return len(found) == self.nodes and all(n.usable for n in found)

    def _cancel_all_jobs(self, timeout: float) -> None:
        env = self.environ()
        jobs = run(["squeue", "--noheader", "--format=%A"], env=env, check=False, timeout=15).stdout.split()
        if not jobs:
            return
        run(["scancel", *jobs], env=env, check=False, timeout=15)
        wait_until(
            lambda: not run(["squeue", "--noheader", "--format=%A"], env=env, check=False, timeout=15).stdout.strip(),
            timeout=timeout, what="cancelled jobs to end",
        )

    def _write_files(self) -> None:
        state = self.state_dir
        for sub in ["ctld", "run", "log", "dev", "munge", *(f"spool/{n}" for n in self.node_names),
                    *(f"tmp/{n}" for n in self.node_names)]:
            (state / sub).mkdir(mode=0o700 if sub in PRIVATE_DIRS else 0o777, parents=True, exist_ok=True)
        for d in [state, *state.iterdir()]:  # readable by every user (jobs run as them), writable by root only
            if d.is_dir():
                d.chmod(0o700 if d.name in PRIVATE_DIRS else 0o755)
        for n in self.node_names:  # like /tmp: each job user may create its own files here
            (state / "tmp" / n).chmod(0o1777)
        key = state / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for i in range(self.gpus_per_node):
            dev = state / "dev" / f"nvidia{i}"
            if not (dev.exists() and stat.S_ISCHR(dev.stat().st_mode)):
                dev.unlink(missing_ok=True)
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(GPU_DEVICE_MAJOR, i))
        host = socket.gethostname().split(".")[0]
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={n if self.mode == SEPARATE else host} NodeAddr={self.node_address(n)}"
            f" Port={self.port + i} CPUs={self.cpus_per_node} RealMemory={NODE_MEMORY_MB}"
            + (f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else "")
            + " State=UNKNOWN"
            for i, n in enumerate(self.node_names, start=1)
        )
        # One shared address: Open MPI excludes loopback by default, so name it; separate hosts need nothing.
        loopback_only = ("echo \"export OMPI_MCA_btl_tcp_if_include=lo\"\n"
                         "echo \"export OMPI_MCA_oob_tcp_if_include=lo\"\n") if self.mode == SHARED else ""
        values = {
            "state": str(state), "host": host, "ctld_port": str(self.port), "nodes": str(self.nodes),
            "nodelist": self.nodelist, "node_lines": node_lines, "last_gpu": str(self.gpus_per_node - 1),
            "login_address": self.login_address, "mode": self.mode, "loopback_only": loopback_only,
            "first_job_id": str(self.first_job_id),
            "accounting": self.acct.conf_lines() if self.accounting else NO_ACCOUNTING,
        }
        templates = files(__package__) / "templates"
        self.conf.write_text(Template((templates / "slurm.conf").read_text()).substitute(values))
        (state / "cgroup.conf").write_text((templates / "cgroup.conf").read_text())
        gres = Template((templates / "gres.conf").read_text()).substitute(values) if self.gpus_per_node else ""
        (state / "gres.conf").write_text(gres)
        prolog = state / "task-prolog.sh"
        prolog.write_text(Template((templates / "task-prolog.sh").read_text()).substitute(values))
        prolog.chmod(0o755)
        saved = {k: v for k, v in asdict(self).items() if k != "state_dir"}
        (state / "cluster.json").write_text(json.dumps(saved, indent=2) + "\n")
