"""The machine to one test: the test run's two processes (scripts/test.sh) each run a test at a time, side by side; a
test marked ``alone`` (a storm of the whole machine, or a figure a user waits for, measured in seconds) runs while
the other process runs none.

Two flock(2) locks in /run, which both processes see (the second one's private /etc/hosts changes nothing there):
every test holds ``MAIN`` shared, an ``alone`` test holds it exclusively. ``TURN`` is a turnstile: an ``alone``
test waiting for ``MAIN`` holds it, so that the other process starts no new test meanwhile (flock favours no one)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


MAIN = Path("/run/hpcai-tests.lock")
TURN = Path("/run/hpcai-tests.turn")


@contextmanager
def share(alone: bool) -> Iterator[None]:
    """Held while one test runs (its setup and teardown too): with the other process's tests, or ``alone``."""
    with open(TURN, "a") as turn, open(MAIN, "a") as main:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
