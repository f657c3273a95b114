"""Functions that run on the engines (the ranks). Light to import: frameworks load only when asked."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from typing import Any

from ..network import LOOPBACK
from .engine import LOCAL_RANK_VARS, RANK_VARS, first_int


def rank_info() -> dict[str, Any]:
    """Who this engine is: rank, local rank, host, its address (engine.py set it), GPU, pid."""
    return {"rank": first_int(os.environ, RANK_VARS, -1), "local_rank": first_int(os.environ, LOCAL_RANK_VARS, 0),
            "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "addr": os.environ.get("HPCAI_NODE_ADDR", LOOPBACK), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "pid": os.getpid()}


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


def free_port() -> int:
    """A TCP port free on this rank's node (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_framework(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Initialise a framework once per engine and put its handles in the user namespace."""
    ns = _user_ns()
    if ns.get("_hpcai_framework") == name:
        return {"initialised": False, **ns["_hpcai_framework_info"]}
    from .frameworks import FRAMEWORKS

    info = FRAMEWORKS[name].init(ns, params)
    ns["_hpcai_framework"], ns["_hpcai_framework_info"] = name, info
    return {"initialised": True, **info}


def run_cell(code: str) -> dict[str, Any]:
    """Run a cell in the engine's namespace as IPython would; return its value or its error, never raise."""
    from IPython import get_ipython

    shell = get_ipython()
    result = shell.run_cell(code, store_history=False, silent=False)
    sys.stdout.flush()
    sys.stderr.flush()
    error = result.error_in_exec or result.error_before_exec
    if isinstance(error, SystemExit) and error.code in (0, None):  # a script's sys.exit(0)
        error = None
    if error is None:
        return {"ok": True, "value": _picklable(result.result)}
    tb = error.__traceback__
    while tb is not None and "IPython" in tb.tb_frame.f_code.co_filename:  # start at the cell's own frames
        tb = tb.tb_next
    return {"ok": False, "ename": type(error).__name__, "evalue": str(error),
            "traceback": "".join(traceback.format_exception(type(error), error, tb))}


def _picklable(value: Any) -> Any:
    import pickle

    try:
        pickle.dumps(value)
        return value
    except Exception:
        return repr(value)
