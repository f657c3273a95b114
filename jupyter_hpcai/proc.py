"""Run commands as argument lists (never through a shell), always with a timeout."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from .errors import HPCAIError

T = TypeVar("T")
RAN: Counter[str] = Counter()  # every program this process ran through ``run`` (or counted), by name


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` and capture its output; raise HPCAIError naming the command on failure."""
    argv = [str(a) for a in cmd]
    shown = shlex.join(argv)
    RAN[Path(argv[0]).name] += 1
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",  # output is often another's text: a stray byte never ends the caller
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise HPCAIError(f"{argv[0]}: command not found", f"install it or put it on PATH (ran: {shown})") from None
    except subprocess.TimeoutExpired:
        raise HPCAIError(f"`{shown}` did not finish within {timeout:g} s") from None
    if check and done.returncode != 0:
        detail = _tail(done.stderr or done.stdout)
        raise HPCAIError(f"`{shown}` failed with exit status {done.returncode}" + (f":\n{detail}" if detail else ""))
    return done


def start_daemon(
    cmd: Sequence[str | os.PathLike[str]], *, log: Path, env: Mapping[str, str] | None = None, timeout: float = 30
) -> None:
    """Start a program that forks into the background; its early output goes to ``log``.

    The daemon's stdio never points at a pipe of ours, so a daemon that keeps its
    descriptors open cannot make this call hang.
    """
    argv = [str(a) for a in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            rc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=timeout, env=dict(env) if env else None
            ).returncode
        except FileNotFoundError:
            raise HPCAIError(f"{argv[0]}: command not found") from None
        except subprocess.TimeoutExpired:
            raise HPCAIError(f"`{shlex.join(argv)}` did not detach within {timeout:g} s; see {log}") from None
    if rc != 0:
        raise HPCAIError(f"`{shlex.join(argv)}` failed with exit status {rc}:\n{_tail(log.read_text(errors='replace'))}")


def wait_until(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2, hint: str = ""
) -> T:
    """Call ``probe`` until it returns something other than None/False, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise HPCAIError(f"timed out after {timeout:g} s waiting for {what}", hint)
        time.sleep(interval)


def kill_all(pids: Callable[[], list[int]], *, timeout: float, what: str) -> None:
    """SIGKILL every process ``pids()`` names and wait until it names none (``what``: where they run)."""
    for pid in pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not pids(), timeout=timeout, what=f"the processes in {what} to end")


def run_logged(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    log: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    on_output: Callable[[str], None] | None = None,
) -> None:
    """Run ``cmd`` with its output appended to ``log``; ``on_output`` gets each line it writes, as it comes.

    On failure the error names the command, shows the log's last lines and says where the log is.
    """
    argv = [str(a) for a in cmd]
    shown = shlex.join(argv)
    with open(log, "a") as out, open(log, "rb") as follow:
        out.write(f"\n$ {shown}\n")
        out.flush()
        follow.seek(0, os.SEEK_END)
        pending = b""

        def forward() -> None:
            nonlocal pending
            pending += follow.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if on_output and line.strip():
                    on_output(line.decode(errors="replace").strip())

        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=dict(env) if env is not None else None, cwd=cwd)
        except FileNotFoundError:
            raise HPCAIError(f"{argv[0]}: command not found", f"install it or put it on PATH (ran: {shown})") from None
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    rc = child.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    forward()
                    if time.monotonic() > deadline:
                        raise HPCAIError(f"`{shown}` did not finish within {timeout:g} s", f"full log: {log}") from None
            forward()
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    if rc != 0:
        raise HPCAIError(f"`{shown}` failed with exit status {rc}:\n{_tail(log.read_text(errors='replace'))}",
                         f"full log: {log}")
