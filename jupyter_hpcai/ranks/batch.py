"""What an exported notebook job (``hpcai job from-notebook``, ``%hpc export``) runs on every rank: the engine's
start (boot.py: GPU pinning, the node's network, the framework initialised as ``%%horovod_run`` / ``%%torchrun``
do it), then the notebook's cells in their order, with the same per-rank output prefixes as the notebook.

A setup cell ran in the notebook's kernel, once: here rank 0 runs it, and the values its rank cells
``--push``ed reach every rank through the framework's broadcast. A rank cell runs on every rank in one
namespace per rank, kept from cell to cell as an engine keeps it. A failing cell prints each failing rank's
traceback and ends the job (srun's ``--kill-on-bad-exit``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from .. import network
from ..scheduler import chosen
from . import calls
from .frameworks import FRAMEWORKS, torch_rendezvous
from .identity import host_name, pin

environment = chosen().environment

MASTER_ADDR_VAR, MASTER_PORT_VAR = "HPCAI_MASTER_ADDR", "HPCAI_MASTER_PORT"  # torch's rendezvous (the job script's)


class Prefixed:
    """A text stream that starts every line with the rank's prefix (as the notebook's cell output does)."""

    def __init__(self, stream: TextIO, prefix: str, shown: bool = True) -> None:
        self.stream, self.prefix, self.shown, self._at_start = stream, prefix, shown, True

    def write(self, text: str) -> int:
        if self.shown and text:
            lines = text.split("\n")
            out = "\n".join((self.prefix + line) if (i or self._at_start) and line else line
                            for i, line in enumerate(lines))
            self._at_start = text.endswith("\n")
            self.stream.write(out)
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


class Job:
    """This rank of an exported job: the framework initialised, the cells run in order."""

    def __init__(self, framework: str) -> None:
        pin(os.environ, len(os.sched_getaffinity(0)))
        network.join_node_network(os.environ)  # the job script set every node's address
        from IPython.core.displayhook import DisplayHook
        from IPython.core.interactiveshell import InteractiveShell

        class Quiet(DisplayHook):  # type: ignore[misc]
            """Keeps a cell's value (``Job.cell`` prints rank 0's as the notebook shows it), prints nothing."""

            def write_output_prompt(self) -> None:
                pass

            def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
                pass

        # cells run as IPython runs them on an engine
        self.shell = InteractiveShell.instance(displayhook_class=Quiet)
        self.framework = FRAMEWORKS[framework]
        calls.init_framework(self.framework, self._params())
        self.rank = int(self.shell.user_ns["rank"])
        self.prefix = f"[rank {self.rank} {host_name(os.environ)}] "
        self.kernel_ns: dict[str, Any] = {}  # what the notebook's kernel held: the setup cells' names (rank 0)

    def _params(self) -> dict[str, Any]:
        """The framework's params (torch.distributed's rendezvous), from what the job script exported."""
        if self.framework.params is None:
            return {}
        nodes = list(network.decode_addresses(os.environ[network.NODE_ADDRS]))
        per_node = int(os.environ[environment.TASKS]) // max(1, len(nodes))  # block order, as the ranks started
        return torch_rendezvous(os.environ[MASTER_ADDR_VAR], int(os.environ[MASTER_PORT_VAR]),
                                [node for node in nodes for _ in range(per_node)])

    def setup(self, code: str, cell: int) -> None:
        """A cell the notebook's kernel ran: rank 0 runs it (its output unprefixed, as the notebook showed it)."""
        if self.rank == 0:
            try:
                exec(compile(code, f"<cell {cell}>", "exec"), self.kernel_ns)  # noqa: S102 (the user's own cell)
            except BaseException as error:
                sys.stderr.write(f"setup cell {cell} failed on rank 0: {type(error).__name__}: {error}\n")
                raise SystemExit(1) from None

    def cell(self, code: str, cell: int, push: tuple[str, ...] = (), output: str = "all", first_line: int = 2) -> None:
        """A ``%%horovod_run`` / ``%%torchrun`` cell, on every rank."""
        values = self.framework.broadcast_object({name: self.kernel_ns.get(name) for name in push} if push else None)
        out, err = sys.stdout, sys.stderr
        shown = output != "rank0" or self.rank == 0
        sys.stdout, sys.stderr = Prefixed(out, self.prefix, shown), Prefixed(err, self.prefix, shown)
        try:
            outcome = calls.run_cell(code, first_line, values)
        finally:
            sys.stdout, sys.stderr = out, err
        if not outcome["ok"]:
            err.write(f"---- rank {self.rank} on {host_name(os.environ)}: {outcome['ename']} (cell {cell}) ----\n"
                      f"{outcome['traceback']}")
            err.flush()
            raise SystemExit(1)
        if self.rank == 0 and outcome["value"] is not None:  # what the notebook showed as the cell's Out
            out.write(f"{self.prefix}Out[{cell}]: {outcome['value']!r}\n")
            out.flush()
