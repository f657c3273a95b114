"""A daemon of the dev cluster, known by the pid file it writes: found running, and stopped (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ..errors import HPCAIError
from ..proc import wait_until


@dataclass(frozen=True)
class Daemon:
    """One daemon of the cluster and the pid file it writes."""

    name: str
    pid_file: Path
    program: str

    def pid(self) -> int | None:
        """The PID of the running daemon, or None (no pid file, stale pid, or another program)."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            return None
        argv0 = cmdline.split(b"\0")[0].decode(errors="replace")
        return pid if Path(argv0).name == self.program else None

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, and SIGKILL when it has not stopped within ``timeout`` seconds; harmless when it does not run."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: self.pid() is None, timeout=timeout, what=f"{self.name} (pid {pid}) to stop")
        except HPCAIError:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=5, what=f"{self.name} to die")
