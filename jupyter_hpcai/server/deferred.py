"""An import the notebook server need not pay for at its start (runs in the server, before Jupyter's imports).

Every Jupyter server imports jupyter_events, whose jsonschema imports rfc3987_syntax for two formats ("iri",
"iri-reference"); that module builds an Earley parser of RFC 3987's grammar as it is imported: 0.7 s of one core
on the dev machine, nearly half of the server's imports, before it can listen. ``defer_rfc3987_syntax`` puts a
stand-in in its place: the first use of anything in it (a schema that checks one of those formats) imports the
real module, which then replaces the stand-in, and answers.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

NAME = "rfc3987_syntax"
_loading = threading.Lock()


class _StandIn(types.ModuleType):
    """What ``import rfc3987_syntax`` finds until the real module is needed."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # what the import system and introspection ask of any module
            raise AttributeError(attr)
        return getattr(_real(), attr)


def _real() -> types.ModuleType:
    with _loading:
        if isinstance(sys.modules.get(NAME), _StandIn):
            del sys.modules[NAME]
            importlib.import_module(NAME)
    return sys.modules[NAME]


def _is_valid_syntax(term: str, value: str) -> bool:
    """rfc3987_syntax.is_valid_syntax, which jsonschema imports by name; the real one from its first call."""
    return bool(_real().is_valid_syntax(term, value))


def defer_rfc3987_syntax() -> None:
    """Until first used, a stand-in for rfc3987_syntax (when it is installed and not imported yet)."""
    if NAME in sys.modules or importlib.util.find_spec(NAME) is None:
        return
    stand_in = _StandIn(NAME, "a stand-in: the real rfc3987_syntax is imported at its first use")
    stand_in.is_valid_syntax = _is_valid_syntax  # type: ignore[attr-defined]
    sys.modules[NAME] = stand_in
