"""Functions that run on the engines (the ranks). Light to import: frameworks load only when asked.

A rank may have started initialising its framework while it booted (boot.py); ``init_framework`` then takes
that work's result (or its error) instead of starting again. ``timeline`` holds when each boot phase ended
(wall clock, for the kernel's breakdown).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin before Python 3.11
from typing import Any

from ..network import LOOPBACK
from ..scheduler import chosen
from .framework import Framework, Handles
from .identity import LOCAL_RANK_VARS, RANK_VARS, SIZE_VARS, first_int, host_name

environment = chosen().environment

SLOW_INIT = 60.0  # seconds a cell waits for a framework's initialisation before it says where that is

timeline: dict[str, float] = {}
_booting: dict[str, Future[Handles | None]] = {}
_boot_threads: dict[str, threading.Thread] = {}
_initialised: Framework | None = None
_resting: str | None = None  # the framework initialised in its resting form (frameworks.Framework.rest)


def initialised() -> Framework | None:
    """The framework this rank initialised (its collectives are the world's), or None."""
    return _initialised


def mark(phase: str) -> None:
    timeline[phase] = time.time()


def start_booting(framework: Framework) -> None:
    """Import (and, if it needs no params, initialise) ``framework`` in a thread while the engine registers."""
    future: Future[Handles | None] = Future()

    def work() -> None:
        try:
            handles = framework.boot()
        except BaseException as err:  # handed to the first cell that needs the framework
            mark("framework")
            future.set_exception(err)
            return
        mark("framework")
        future.set_result(handles)

    _booting[framework.name] = future
    _boot_threads[framework.name] = thread = threading.Thread(target=work, name=f"hpcai-boot-{framework.name}",
                                                              daemon=True)
    thread.start()


def _booted(name: str, booting: Future[Handles | None]) -> Handles | None:
    """What the boot's thread made of framework ``name``. Past SLOW_INIT, the rank says once (on stderr, into the
    cell's output) where that thread is: inside a container no stack can be read from outside."""
    try:
        return booting.result(timeout=SLOW_INIT)
    except FutureTimeout:
        thread = _boot_threads.get(name)
        frame = sys._current_frames().get(thread.ident or 0) if thread is not None else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)\n"
        print(f"hpcai: rank {first_int(os.environ, RANK_VARS, -1)}: initialising {name} has taken over "
              f"{SLOW_INIT:g} s since the cell asked; it is at:\n{where}", file=sys.stderr, flush=True)
        return booting.result()


def rank_info(distributions: list[str] | None = None) -> dict[str, Any]:
    """Who this engine is: rank, local rank, host, its address (boot.py set it), GPU, pid; the versions the
    preflight compares and when its boot phases ended."""
    return {"rank": first_int(os.environ, RANK_VARS, -1), "local_rank": first_int(os.environ, LOCAL_RANK_VARS, 0),
            "host": host_name(os.environ),
            "addr": os.environ.get("HPCAI_NODE_ADDR", LOOPBACK), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "pid": os.getpid(), "job": environment.job_id(os.environ) or "local",
            "versions": versions(distributions or []), "timeline": dict(timeline),
            "framework": _initialised.name if _initialised else None, "resting": _resting}


def join(distributions: list[str] | None = None) -> dict[str, Any]:
    """On a rank as it joins a set (and after its world re-forms): its identity into the namespace, so that every
    cell has ``rank``, ``size``, ``local_rank`` and ``node`` whatever the framework (``%%px`` too; a framework's
    init sets its own after); what ``rank_info`` says."""
    info = rank_info(distributions)
    _user_ns().update(rank=info["rank"], size=first_int(os.environ, SIZE_VARS, 1), local_rank=info["local_rank"],
                      node=info["host"])
    return info


def versions(distributions: list[str]) -> dict[str, Any]:
    """The interpreter and package versions this rank sees (without importing the packages)."""
    from importlib import metadata

    found: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    for name in distributions:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _user_ns() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else sys.modules["__main__"].__dict__


_held: dict[int, socket.socket] = {}  # listening sockets this rank holds for a rendezvous it will serve, by port


def held_port(addr: str) -> int:
    """A TCP port this rank listens on from now on, at its node's address ``addr``, for a rendezvous it will serve
    (take_held): never a port chosen, let go, and maybe taken by another user's process before the server binds."""
    sock = socket.create_server((addr, 0))
    port = int(sock.getsockname()[1])
    _held[port] = sock
    return port


def take_held(port: int) -> socket.socket | None:
    """The socket ``held_port`` keeps for ``port``, for its server to take over (``detach()``: the server closes it
    then), or None; the others it held are closed (asked for by a world that never came)."""
    taken = _held.pop(port, None)
    for stale in _held.values():
        stale.close()
    _held.clear()
    return taken


def init_framework(framework: Framework, params: dict[str, Any], again: bool = False) -> dict[str, Any]:
    """Initialise a framework once per engine (taking over what boot started), or ``again`` (a world going to rest
    or waking: ``params["resting"]`` says which), and put its handles in the user namespace."""
    global _initialised, _resting
    ns = _user_ns()
    if ns.get("_hpcai_framework") == framework.name and not again:
        return {"initialised": False, **ns["_hpcai_framework_info"]}
    booting = _booting.pop(framework.name, None)
    handles = _booted(framework.name, booting) if booting is not None else None
    _boot_threads.pop(framework.name, None)
    try:
        names, info = handles if handles is not None and not again else framework.init(params)
    except BaseException:
        forget_framework()  # not initialised now (shut down for a rest or wake that failed): said so to who asks
        raise
    ns.update(names)
    ns["_hpcai_framework"], ns["_hpcai_framework_info"] = framework.name, info
    _initialised = framework
    if params.get("resting"):
        _resting = framework.name
    elif _resting == framework.name:
        _resting = None
    return {"initialised": True, **info}


def forget_framework() -> None:
    """The world changed (world.py): the next cell initialises the framework again, on the new world."""
    global _initialised, _resting
    _initialised, _resting = None, None
    _booting.clear()
    _boot_threads.clear()
    _user_ns().pop("_hpcai_framework", None)


def run_cell(code: str, first_line: int = 1, push: dict[str, Any] | None = None,
             setup: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Run a cell in the engine's namespace as IPython would; return its value or its error, never raise.

    ``first_line``: the line number the cell's first line has as the user sees it (a cell magic's body starts
    on line 2), so that tracebacks point where the user looks. ``push``: names to set first. ``setup``: run
    first (a framework's init on the first cell), its error reported like the cell's.
    """
    from IPython import get_ipython

    shell = get_ipython()
    try:
        if setup is not None:
            setup()
        if push:
            shell.user_ns.update(push)
    except BaseException as error:
        return {**_failure(error, error.__traceback__), "setup": True}
    # comment lines, not blank ones, move the cell down: IPython drops a cell's leading blank lines
    result = shell.run_cell("#\n" * (first_line - 1) + code, store_history=False, silent=False)  # the engine flushes
    error = result.error_in_exec or result.error_before_exec
    if isinstance(error, SystemExit) and error.code in (0, None):  # a script's sys.exit(0)
        error = None
    if error is None:
        return {"ok": True, "value": _picklable(result.result)}
    tb = error.__traceback__
    while tb is not None and "IPython" in tb.tb_frame.f_code.co_filename:  # start at the cell's own frames
        tb = tb.tb_next
    return _failure(error, tb)


def _failure(error: BaseException, tb: Any) -> dict[str, Any]:
    return {"ok": False, "ename": type(error).__name__, "evalue": str(error),
            "traceback": "".join(traceback.format_exception(type(error), error, tb))}


def _picklable(value: Any) -> Any:
    import pickle

    try:
        pickle.dumps(value)
        return value
    except Exception:
        return repr(value)
