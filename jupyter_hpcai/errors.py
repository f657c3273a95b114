"""The one exception type every user-facing failure is raised as."""

from __future__ import annotations


class HPCAIError(Exception):
    """A failure the user can act on: what went wrong, and what to do about it.

    The CLI prints it without a traceback; the magics render it.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message

    @property
    def jupyterhub_message(self) -> str:
        """What JupyterHub shows for a failed spawn: on the spawn page, and in a REST reply instead of a bare 500."""
        return str(self)

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it in a notebook: the message and the hint, no traceback."""
        lines = [f"\x1b[1;31m{type(self).__name__}:\x1b[0m {self.message}"]
        return lines + [f"\x1b[33mhint:\x1b[0m {self.hint}"] if self.hint else lines
