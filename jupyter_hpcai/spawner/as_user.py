"""What the hub runs as a user (runs in the hub, as root): through exec_prefix (sudo), with nothing of the hub's own
environment, in a session of its own that never outlives the call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from ..proc import RAN
from ..scheduler import chosen

scheduler = chosen()

# All a command the hub runs as a user gets of the hub's own environment (which holds the hub's secrets, and
# which sudo -E would pass on for the user to read in /proc): nothing but where the programs and the scheduler are.
COMMAND_ENV = ("PATH", "LANG", "LC_ALL", scheduler.environment.CONFIG)


async def run_as_user(argv: list[str], env: dict[str, str], input: str | None, timeout: float,
                      umask: int) -> tuple[int | None, bytes, bytes]:
    """Run a command (through exec_prefix: as the user) in a session of its own; its exit status (None when it did
    not end within ``timeout``), stdout and stderr. Whatever happens, nothing of it outlives the call: the user may
    stop their own process (kill -STOP) or hold its pipes, and killing sudo alone left both pipes open in the hub."""
    RAN.update(name for name in (Path(word).name for word in argv) if name in scheduler.SUBMITTERS)
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                umask=umask, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(input.encode() if input else None), timeout=timeout)
        return proc.returncode, out, err
    except asyncio.TimeoutError:
        return None, b"", b""
    finally:  # on a timeout, and on a cancelled start too (start_timeout)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc._transport.close()  # type: ignore[attr-defined]  # our pipe ends, whoever holds theirs (no public close)


def command_env() -> dict[str, str]:
    """All a command the hub runs as a user gets of the hub's environment (COMMAND_ENV)."""
    return {k: os.environ[k] for k in COMMAND_ENV if k in os.environ}
