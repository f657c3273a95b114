"""The dev cluster's accounting, as a site runs it: slurmdbd on a MariaDB server, both the cluster's own.

The database server listens on loopback only, at ``port``; slurmdbd at ``port + 1``. Both keep every file (data,
socket, pid files, logs, slurmdbd.conf with the database password) under ``<state>/accounting``, which only root
reads. ``org()`` makes what a real site's accounting holds: an organisation with two projects, users with
associations, two QOS with limits, and a GPU-hour budget on one project.
"""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import HPCAIError
from ..network import LOOPBACK
from ..proc import run, start_daemon, wait_until
from .daemon import Daemon

INSTALL_HINT = "apt-get install -y slurmdbd mariadb-server"
ORGANISATION = "hpcai-lab"
PROJECTS = ("climate", "genomics")  # users join the first by default
BUDGET_PROJECT, BUDGET_GPU_MINUTES = "genomics", 1200  # 20 GPU hours: less than one 4-hour job on every GPU
# name -> sacctmgr settings; DenyOnLimit: sbatch refuses a job over a limit at once, instead of leaving it pending
QOS = {
    "normal": ["MaxWall=04:00:00", "Flags=DenyOnLimit"],
    "debug": ["MaxWall=00:30:00", "MaxTRESPerUser=gres/gpu=2", "Flags=DenyOnLimit"],
}


@dataclass(frozen=True)
class Accounting:
    """MariaDB and slurmdbd for the cluster in ``state_dir``; ``port`` is the database's (on loopback), ``port + 1``
    slurmdbd's, which the nodes' jobs (sacct, sacctmgr, sshare) reach at ``host``, the login node's address."""

    state_dir: Path
    port: int
    host: str = LOOPBACK
    cluster: str = "hpcai-dev"

    @property
    def dir(self) -> Path:
        return self.state_dir / "accounting"

    @property
    def dbd_port(self) -> int:
        return self.port + 1

    @property
    def socket(self) -> Path:
        return self.dir / "mysqld.sock"

    def conf_lines(self) -> str:
        """slurm.conf's accounting settings."""
        return "\n".join([
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={self.host}",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={self.state_dir / 'munge' / 'munge.socket'}",  # the munge socket for slurmdbd
            "AccountingStorageEnforce=associations,limits,qos,safe",
            "AccountingStorageTRES=gres/gpu",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=5",
            # GrpTRESMins is enforced only with the multifactor plugin; usage here never decays or resets
            "PriorityType=priority/multifactor",
            "PriorityDecayHalfLife=0",
            "PriorityUsageResetPeriod=NONE",
        ])

    # -- lifecycle ------------------------------------------------------------------------
    def up(self, env: dict[str, str]) -> None:
        """Start the database server and slurmdbd (each when not running); make the database on the first start."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        log = self.dir / "log"
        log.mkdir(exist_ok=True)
        if not (self.dir / "data" / "mysql").is_dir():
            run(["mariadb-install-db", "--no-defaults", f"--datadir={self.dir / 'data'}", "--user=root",
                 "--skip-test-db", "--auth-root-authentication-method=socket"], timeout=120)
        mariadbd, slurmdbd = self.daemons()
        if not mariadbd.pid():
            with open(log / "mariadbd.log", "ab") as out:
                subprocess.Popen(
                    ["mariadbd", "--no-defaults", f"--datadir={self.dir / 'data'}", f"--socket={self.socket}",
                     f"--port={self.port}", f"--bind-address={LOOPBACK}", f"--pid-file={mariadbd.pid_file}",
                     "--user=root", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                     "--innodb-lock-wait-timeout=900", "--performance-schema=OFF"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            wait_until(self._database_answers, timeout=60, what="the accounting database to start",
                       hint=f"see {log / 'mariadbd.log'}")
        self._write_dbd_conf()
        if not slurmdbd.pid():
            start_daemon(["slurmdbd"], log=log / "slurmdbd.start.log", env={**env, "SLURM_CONF": str(self.dir / "slurm.conf")})
            wait_until(lambda: self._sacctmgr(["show", "cluster"], env, check=False).returncode == 0, timeout=60,
                       what="slurmdbd to answer", hint=f"see {log / 'slurmdbd.log'}")
        self._add(env, "cluster", self.cluster)  # before slurmctld starts, which then registers with it

    def daemons(self) -> list[Daemon]:
        """The database server and slurmdbd, in start order."""
        return [Daemon(name, self.dir / f"{name}.pid", name) for name in ("mariadbd", "slurmdbd")]

    # -- what a site's accounting holds ---------------------------------------------------
    def org(self, env: dict[str, str], users: list[str]) -> None:
        """The organisation and its projects, the QOS and ``users``: each harmless when it exists. Once slurmctld
        runs: it registers the GPU resource (``AccountingStorageTRES``) that the limits name."""
        wait_until(lambda: "gres|gpu" in self._sacctmgr(["-nP", "show", "tres", "format=type,name"], env).stdout,
                   timeout=60, what="slurmctld to register the GPU resource with slurmdbd",
                   hint=f"see {self.dir / 'log' / 'slurmdbd.log'}")
        for name, settings in QOS.items():
            self._add(env, "qos", name, *settings)
            self._sacctmgr(["modify", "qos", "where", f"name={name}", "set", *settings], env, check=False)
        self._add(env, "account", ORGANISATION, "Description=the organisation", "Organization=hpcai-lab")
        for project in PROJECTS:
            self._add(env, "account", project, f"parent={ORGANISATION}", f"Description=project {project}",
                      "Organization=hpcai-lab", "QOS=normal,debug", "DefaultQOS=normal")
        self._sacctmgr(["modify", "account", "where", f"name={BUDGET_PROJECT}", f"cluster={self.cluster}", "set",
                        f"GrpTRESMins=gres/gpu={BUDGET_GPU_MINUTES}"], env, check=False)
        for user in users:
            self.enrol(env, user)

    def enrol(self, env: dict[str, str], user: str, projects: tuple[str, ...] = PROJECTS[:1]) -> None:
        """Give ``user`` an association with each of ``projects`` (the first its default account)."""
        self._add(env, "user", user, f"Account={','.join(projects)}", f"DefaultAccount={projects[0]}")

    # -- internals ------------------------------------------------------------------------
    def _add(self, env: dict[str, str], kind: str, name: str, *settings: str) -> None:
        done = self._sacctmgr(["add", kind, name, *settings], env, check=False)
        # what exists already is no error: 22.05 says "Nothing new added", 24.11 "Already existing ..." or "Nothing added"
        said = done.stdout + done.stderr
        if done.returncode != 0 and not re.search(r"already exist|nothing (new )?added|didn't affect anything", said,
                                                  re.I):
            raise HPCAIError(f"sacctmgr add {kind} {name} failed: {(done.stderr or done.stdout).strip()}",
                             f"see {self.dir / 'log' / 'slurmdbd.log'}")

    def _sacctmgr(self, args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["sacctmgr", "--immediate", *args], env=env, check=check, timeout=30)

    def _database_answers(self) -> bool:
        return run(["mariadb", "--no-defaults", f"--socket={self.socket}", "-u", "root", "-e", "SELECT 1"],
                   check=False, timeout=10).returncode == 0

    def _write_dbd_conf(self) -> None:
        """slurmdbd.conf (root's, mode 600) and the database user it logs in as, with a password made once."""
        conf = self.dir / "slurmdbd.conf"
        password_file = self.dir / "db.password"
        if not password_file.exists():
            password_file.write_text(secrets.token_hex(16))
            password_file.chmod(0o600)
        password = password_file.read_text()
        sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'{LOOPBACK}' IDENTIFIED BY '{password}';"
               f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{LOOPBACK}';")
        # on stdin: a command line is every local user's to read (/proc), and an error would print it
        run(["mariadb", "--no-defaults", f"--socket={self.socket}", "-u", "root"], input=sql, timeout=30)
        log = self.dir / "log"
        conf.write_text("\n".join([
            "# Generated by `hpcai devcluster up --accounting`.",
            f"DbdHost={socket.gethostname().split('.')[0]}", f"DbdAddr={self.host}",
            f"DbdPort={self.dbd_port}", "SlurmUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={self.state_dir / 'munge' / 'munge.socket'}",
            f"PidFile={self.dir / 'slurmdbd.pid'}", f"LogFile={log / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql", f"StorageHost={LOOPBACK}", f"StoragePort={self.port}",
            "StorageUser=slurm", f"StoragePass={password}", "StorageLoc=slurm_acct_db", "",
        ]))
        conf.chmod(0o600)
