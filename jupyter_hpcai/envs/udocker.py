"""udocker as this project runs it (runs in the CLI, the server and a kernel): its executable, its directory, the
execution mode, and udocker's own ``UDOCKER_*`` variables, recorded in a container env's manifest so that the
kernel and the engines run the container exactly as the import did."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess

from ..errors import HPCAIError
from ..proc import run
from .manifest import UdockerRecord

MODES = ("P1", "P2", "R1", "R2", "R3", "F1", "F2", "F3", "F4", "S1")


@dataclass(frozen=True)
class Settings:
    """How udocker is run: sane defaults for a real cluster, each overridable by an environment variable.

    - ``HPCAI_UDOCKER``: the udocker executable (default: ``udocker`` on PATH, or beside this python);
    - ``UDOCKER_DIR``: where udocker keeps images and containers (udocker's default: ~/.udocker);
    - ``HPCAI_UDOCKER_MODE``: the execution mode (default P2: proot tracing every system call; P1: proot with
      seccomp, faster but it lost files in this project's tests (see the module doc); R1... see udocker's manual);
    - every ``UDOCKER_*`` variable (``UDOCKER_USE_PROOT_EXECUTABLE``, ``UDOCKER_TARBALL``...) is udocker's own
      configuration, passed on as is.
    """

    udocker: str
    mode: str = "P2"
    variables: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None, mode: str | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        beside = Path(sys.executable).parent / "udocker"  # pip install udocker next to jupyter-hpcai
        udocker = (env.get("HPCAI_UDOCKER") or shutil.which("udocker", path=env.get("PATH"))
                   or (str(beside) if beside.exists() else ""))
        if not udocker or not Path(udocker).exists():
            raise HPCAIError(f"udocker not found ({udocker or 'not on PATH'})",
                             "install it (pip install udocker) or set HPCAI_UDOCKER to its path")
        mode = (mode or env.get("HPCAI_UDOCKER_MODE") or "P2").upper()
        if mode not in MODES:
            raise HPCAIError(f"unknown udocker execution mode '{mode}'", f"use one of: {', '.join(MODES)}")
        variables = {k: v for k, v in env.items() if k.startswith("UDOCKER_")}
        return cls(str(Path(udocker).absolute()), mode, variables)

    @classmethod
    def of(cls, record: UdockerRecord) -> Settings:
        """The settings an import recorded in its manifest."""
        return cls(record.udocker, record.mode, dict(record.variables))

    @property
    def base(self) -> list[str]:
        """udocker and its global options."""
        return [self.udocker, "--quiet", *(["--allow-root"] if os.geteuid() == 0 else [])]

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.variables}

    def udocker_run(self, args: list[str], timeout: float = 600, check: bool = True) -> CompletedProcess[str]:
        return run([*self.base, *args], env=self.environ(), timeout=timeout, check=check)
