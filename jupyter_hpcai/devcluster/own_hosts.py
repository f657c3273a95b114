"""Run a command with an /etc/hosts of its own: ``python -m jupyter_hpcai.devcluster.own_hosts COMMAND...`` (root).

Every dev cluster names its nodes n1, n2...; the names resolve through a block of /etc/hosts. A second cluster on
the same machine (a test run's second process has one: pytest_plugin.py) needs those names to mean its own nodes
for everything it starts: its slurmds, their jobs, the hub and the browser. Run inside a fresh mount namespace,
this puts a copy of /etc/hosts without any dev cluster's block on a tmpfs only that namespace sees, binds it over
/etc/hosts, and execs COMMAND. The host's /etc/hosts is never written; the copy goes with the namespace.
The module runs twice: first it execs `unshare` to make the namespace, then, inside (``--inside``), it mounts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HOSTS = Path("/etc/hosts")
PRIVATE = Path("/run/hpcai-own-hosts")  # an empty folder on the host; a tmpfs inside the namespace
_BLOCK = re.compile(r"^# hpcai-devcluster .* begin$.*?^# hpcai-devcluster .* end$\n?", re.M | re.S)
INSIDE = "--inside"
MODULE = "jupyter_hpcai.devcluster.own_hosts"


def command(argv: list[str]) -> list[str]:
    """``argv`` run with an /etc/hosts of its own."""
    return [sys.executable, "-m", MODULE, *argv]


def hosts_are_own() -> bool:
    """True when this process's /etc/hosts is the copy this module mounted."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        if fields[0].split()[4] == str(HOSTS) and len(fields) > 1 and fields[1].split()[1] == "hpcai-own-hosts":
            return True
    return False


def main(argv: list[str]) -> None:
    if not argv or argv == [INSIDE]:
        sys.exit("usage (as root): python -m jupyter_hpcai.devcluster.own_hosts COMMAND...")
    if argv[0] != INSIDE:
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", *command([INSIDE, *argv])])
    argv = argv[1:]
    PRIVATE.mkdir(mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "hpcai-own-hosts", str(PRIVATE)],
                   check=True, timeout=20)
    copy = PRIVATE / "hosts"
    copy.write_text(_BLOCK.sub("", HOSTS.read_text()))
    copy.chmod(0o644)
    subprocess.run(["mount", "--bind", str(copy), str(HOSTS)], check=True, timeout=20)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
