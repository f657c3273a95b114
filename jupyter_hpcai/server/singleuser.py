"""``hpcai-singleuser jupyterhub-singleuser [options]``: the notebook job's server (runs in the job's batch step,
as the user; the spawner's script starts it). It runs the server command in this process on a port the OS
picks, and the server reports that port to the hub once it listens there (port_report.py).

It replaces batchspawner-singleuser, which told the hub a port before the server held it.
"""

from __future__ import annotations

import shutil
import sys
from runpy import run_path

from . import port_report
from .deferred import defer_rfc3987_syntax


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    found = shutil.which(args[0]) if args else None
    if found is None:
        sys.exit(f"hpcai-singleuser: no server command {args[0] if args else '(none given)'!r} found; give it "
                 "first, e.g. hpcai-singleuser jupyterhub-singleuser")
    port_report.wanted = True
    # on the command line, above JupyterHub's extension config (which takes the port from JUPYTERHUB_SERVICE_URL
    # and sets port_retries to 0): port 0, the OS picks a free one
    sys.argv = [found, *args[1:], "--ServerApp.port=0"]
    defer_rfc3987_syntax()  # the server listens sooner
    run_path(found, run_name="__main__")


if __name__ == "__main__":
    main()
