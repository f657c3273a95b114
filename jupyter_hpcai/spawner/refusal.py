"""How the hub says no to a start or a request (runs in the hub): an HTTP status and the reason, on one line in the
hub's log, and on the spawn page or in the REST answer."""

from __future__ import annotations

from tornado.web import HTTPError

from ..errors import HPCAIError


def refused(status: int, err: HPCAIError) -> HTTPError:
    """A request the hub will not run: the REST API answers ``status`` with the reason, the spawn page shows it."""
    # logged on one line of printable characters: sbatch's words in it are the user's to write
    logged = " ".join("".join(c if c.isprintable() else " " for c in str(err)).split())
    refusal = HTTPError(status, log_message=logged.replace("%", "%%"))
    refusal.jupyterhub_message = err.jupyterhub_message  # type: ignore[attr-defined]
    if retry_after := getattr(err, "retry_after", None):  # fairness.TooMany: JupyterHub's handlers send an error's
        refusal.headers = {"Retry-After": str(retry_after)}  # type: ignore[attr-defined]  # headers (as for its 429s)
    return refusal
