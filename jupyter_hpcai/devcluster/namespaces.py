"""The dev cluster's network: every node its own host (a Linux network namespace), the login node the host.

A bridge on the host carries the first address of the block (the login node: slurmctld, the hub and its
proxy); node i's namespace holds the block's (i+1)th address on a veth joined to that bridge, and nothing
else: no default route, so traffic leaves a node only for loopback or the block. Node names, and the login
address's (``<prefix>login``), resolve through a marked block of /etc/hosts: no lookup of theirs reaches DNS.
Every object is written to ``network.json`` in the state dir *before* it is made, so ``down`` finds whatever a
crashed ``up`` or a killed test run left.

Where namespaces cannot be made (no privilege, no ``ip``), every node shares the host's loopback, as the
dev cluster did before; :func:`Network.up` then returns the reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import HPCAIError
from ..proc import kill_all, run, wait_until

HOSTS_FILE = Path("/etc/hosts")
NODE_IFACE = "hpc0"  # the interface name inside every node namespace (one name on all nodes, as on a site)
_IP_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def node_disk(login_only: tuple[str, ...], shared: tuple[str, ...]) -> list[str]:
    """Shell commands, run in a node's own mount namespace (private: nothing reaches the host's), that cover each
    of ``login_only`` with an empty tmpfs and mount the ``shared`` folders inside it back where they were. A shared
    folder is held at /mnt meanwhile (a tmpfs of the namespace's own)."""
    steps = ["mount -t tmpfs -o size=1m hpcai-held /mnt"] if login_only else []
    held = 0
    for folder in login_only:
        keep = [s for s in shared if s.startswith(folder.rstrip("/") + "/") and os.path.isdir(s)]
        for offset, path in enumerate(keep):
            steps += [f"mkdir /mnt/{held + offset}", f"mount --rbind {shlex.quote(path)} /mnt/{held + offset}"]
        steps.append(f"mount -t tmpfs -o mode=755,size=1m hpcai-login-only {shlex.quote(folder)}")
        for path in keep:
            steps += [f"mkdir -p {shlex.quote(path)}", f"mount --move /mnt/{held} {shlex.quote(path)}"]
            held += 1
    return [*steps, "umount /mnt"] if login_only else []


@dataclass
class Made:
    """What ``up`` created, recorded before each step (so teardown needs nothing else)."""

    bridge: str = ""
    namespaces: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    hosts_marker: str = ""


@dataclass(frozen=True)
class Network:
    """Address block, bridge name and namespace prefix of one dev cluster; ``nodes`` names its nodes."""

    state_dir: Path
    nodes: tuple[str, ...]
    block: str = "10.213.0.0/24"
    bridge: str = "hpcai0"
    prefix: str = "hpcai-"
    login_only: tuple[str, ...] = ()  # folders local to the login node: empty on the nodes
    shared: tuple[str, ...] = ()  # folders inside those that the nodes see all the same (shared storage)

    def __post_init__(self) -> None:
        try:
            net = ipaddress.IPv4Network(self.block)
        except ValueError as err:
            raise HPCAIError(f"--network {self.block!r} is not an IPv4 block: {err}", "e.g. 10.213.0.0/24") from None
        if not net.is_private or net.num_addresses - 2 < len(self.nodes) + 1:
            raise HPCAIError(f"--network {self.block} must be a private block with room for the login node and "
                             f"{len(self.nodes)} nodes", "e.g. 10.213.0.0/24")
        for name, value in (("--bridge", self.bridge), ("--netns-prefix", self.prefix)):
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,7}", value):
                raise HPCAIError(f"{name} {value!r}: 1-8 lowercase letters, digits or '-'", "e.g. hpcai0, hpcai-")

    # -- names and addresses --------------------------------------------------------------
    @property
    def login_address(self) -> str:
        """The host's address on the bridge, where the nodes reach slurmctld and the hub."""
        return str(ipaddress.IPv4Network(self.block)[1])

    @property
    def login_name(self) -> str:
        """The login address's name in /etc/hosts. Slurm 24.11's slurmctld looks up the name of every peer that
        connects; without an entry each lookup goes to the site's DNS, and 24.11.5 accepts no other connection until
        it times out (5 s a lookup with no DNS reachable)."""
        return f"{self.prefix}login"

    @property
    def prefixlen(self) -> int:
        return ipaddress.IPv4Network(self.block).prefixlen

    def address(self, node: str) -> str:
        return str(ipaddress.IPv4Network(self.block)[2 + self.nodes.index(node)])

    def namespace(self, node: str) -> str:
        return f"{self.prefix}{node}"

    def _veth(self, node: str) -> str:  # the host end; interface names are at most 15 characters
        return f"{self.bridge}-{node}"[:15]

    @property
    def _record(self) -> Path:
        return self.state_dir / "network.json"

    @property
    def _marker(self) -> str:
        return f"hpcai-devcluster {self.state_dir}"

    def exec_prefix(self, node: str) -> list[str]:
        """The argv prefix that runs a program as host ``node``: in its network namespace, with its hostname, and
        in a mount namespace of its own where the login node's own folders (``login_only``) are empty but for the
        ``shared`` ones inside them. /sys stays as it is (nsenter and unshare, not `ip netns exec`, which remounts
        it: slurmd then finds no cgroup filesystem)."""
        return ["nsenter", f"--net=/run/netns/{self.namespace(node)}", "unshare", "--uts", "--mount", "sh", "-c",
                " && ".join(['hostname "$0"', *node_disk(self.login_only, self.shared), 'exec "$@"']), node]

    # -- lifecycle ------------------------------------------------------------------------
    def up(self) -> str:
        """Make the bridge, one namespace per node and the hosts entries; '' when done, else why not (nothing
        is left behind then). Idempotent: what exists is kept."""
        if shutil.which("ip", path=_IP_PATH) is None:
            return "`ip` was not found (as root: apt-get install -y iproute2)"
        if os.geteuid() != 0:
            return "making network namespaces needs root"
        self._refuse_others()
        try:
            self._make()
        except HPCAIError as err:
            self.down()
            return f"could not make the node namespaces: {err.message}"
        return ""

    def _refuse_others(self) -> None:
        """A bridge or namespace of these names that this cluster did not make belongs to another one."""
        made = self._load()
        taken = [self.bridge] if _link_exists(self.bridge) and made.bridge != self.bridge else []
        taken += [ns for ns in _namespaces()
                  if ns in map(self.namespace, self.nodes) and ns not in made.namespaces and _live(ns)]
        if taken:
            raise HPCAIError(f"{', '.join(taken)} already exist and are not this dev cluster's ({self.state_dir})",
                             "give this cluster its own --bridge, --netns-prefix and --network")

    def _make(self) -> None:
        made = self._load()
        if not _link_exists(self.bridge):
            made.bridge = self.bridge
            self._save(made)
            _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "replace", f"{self.login_address}/{self.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        existing = set(_namespaces())  # made by an earlier `up` (_refuse_others checked)
        for node in self.nodes:
            ns, veth = self.namespace(node), self._veth(node)
            if ns in existing and _live(ns):
                continue
            if ns in existing:  # its file only: the mount went with the mount namespace of a killed test worker
                _ip("netns", "del", ns, check=False)
            made.namespaces = sorted({*made.namespaces, ns})
            made.veths = sorted({*made.veths, veth})
            self._save(made)
            _ip("netns", "add", ns)
            if _link_exists(veth):  # a leftover whose namespace is gone
                _ip("link", "del", veth)
            _ip("link", "add", veth, "type", "veth", "peer", "name", NODE_IFACE, "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(node)}/{self.prefixlen}", "dev", NODE_IFACE)
            _ip("-n", ns, "link", "set", NODE_IFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")  # no route but the block's own: no default route
        made.hosts_marker = self._marker
        self._save(made)
        _write_hosts_block(self._marker, [(self.login_address, self.login_name),
                                          *((self.address(n), n) for n in self.nodes)])

    def down(self) -> None:
        """Remove what ``network.json`` says was made: processes left in the namespaces, the namespaces, veths,
        bridge and hosts entries. Harmless when nothing is there."""
        made = self._load()
        for ns in made.namespaces:
            _kill_processes_in(ns)
            _ip("netns", "del", ns, check=False)
        for veth in made.veths:  # deleting a namespace removes its veth pair, though not always at once
            if _link_exists(veth):
                _ip("link", "del", veth, check=False)
            wait_until(lambda v=veth: not _link_exists(v), timeout=10, what=f"the veth {veth} to go")
        if made.bridge:
            _ip("link", "del", made.bridge, check=False)
        if made.hosts_marker:
            _write_hosts_block(made.hosts_marker, [])
        self._record.unlink(missing_ok=True)

    def _load(self) -> Made:
        try:
            return Made(**json.loads(self._record.read_text()))
        except FileNotFoundError:
            return Made()

    def _save(self, made: Made) -> None:
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(made), indent=2) + "\n")
        tmp.replace(self._record)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS`; a failure raises HPCAIError unless ``check`` is False."""
    done = run(["ip", *args], check=False, timeout=20, env={"PATH": _IP_PATH})
    if check and done.returncode != 0:
        raise HPCAIError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def _live(ns: str) -> bool:
    """Whether /run/netns/``ns`` holds a namespace here, not only the empty file a bind mount left behind."""
    return _ip("-n", ns, "link", "show", "lo", check=False).returncode == 0


def _kill_processes_in(ns: str) -> None:
    """SIGKILL whatever still runs in namespace ``ns`` (daemons are stopped before; this is what a killed run
    left: job steps, servers), and wait until it is gone."""
    kill_all(lambda: [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()],
             timeout=15, what=f"namespace {ns}")


def _write_hosts_block(marker: str, entries: list[tuple[str, str]]) -> None:
    """Replace the lines between ``# <marker> begin`` and ``# <marker> end`` of the hosts file with ``entries``
    (none: remove the block). Written in place: /etc/hosts is often a bind mount that a rename would break."""
    begin, end = f"# {marker} begin", f"# {marker} end"
    lines = HOSTS_FILE.read_text().splitlines()
    if begin in lines and end in lines[lines.index(begin):]:
        start = lines.index(begin)
        del lines[start:lines.index(end, start) + 1]
    if entries:
        lines += [begin, *(f"{addr} {name}" for addr, name in entries), end]
    HOSTS_FILE.write_text("\n".join(lines) + "\n")
