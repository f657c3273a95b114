"""What a notebook server and its kernels ask of the hub that started them, with the server's own token from
its environment (sent in a header: never on a command line, never in a log)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from .errors import HPCAIError

TIMEOUT = 30


def extend(seconds: int, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ask the hub for ``seconds`` more walltime for this notebook job (``HPCSlurmSpawner.extend``); the job's
    new time limit and end, or the site's reason to refuse."""
    return _post("hpcai/extend", {"seconds": seconds}, os.environ if environ is None else environ)


def follow_up(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ask the hub to queue this notebook job's follow-up (the same options, starting when this job ends): its
    server's name and URL path, its Slurm job and the job it waits for."""
    return _post("hpcai/continue", {}, os.environ if environ is None else environ)


def _post(path: str, body: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    url, token = environ.get("JUPYTERHUB_API_URL", ""), environ.get("JUPYTERHUB_API_TOKEN", "")
    if not url:
        raise HPCAIError("this notebook server was not started by a JupyterHub, so there is no hub to ask",
                         "start the notebook from the hub's page")
    if not token:
        raise HPCAIError("this kernel holds no hub token (a container env's kernel never gets one)",
                         "use the side panel's Extend button, or a notebook with a kernel of a built env (not a "
                         "container's) for %hpc continue")
    request = urllib.request.Request(f"{url.rstrip('/')}/{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the hub is reached directly
    try:
        with opener.open(request, timeout=TIMEOUT) as reply:
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as err:
        try:
            said = json.loads(err.read())
        except ValueError:
            said = {}
        raise HPCAIError(str(said.get("error") or said.get("message") or f"the hub answered {err.code} {err.reason}"),
                         str(said.get("hint") or "see the hub's log")) from None
    except (urllib.error.URLError, OSError) as err:
        raise HPCAIError(f"the hub at {url} did not answer: {getattr(err, 'reason', err)}",
                         "try again in a minute; if it persists, tell the site's admins") from None
