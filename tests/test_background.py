"""A start of the engines in a thread (engines/background.py), without a cluster: what the thread tells at its end."""

from __future__ import annotations

import threading

from jupyter_hpcai.engines import Engines
from jupyter_hpcai.engines.background import Background
from jupyter_hpcai.errors import HPCAIError


def test_done_runs_last_in_the_thread_after_a_start_or_its_failure() -> None:
    for outcome in (None, HPCAIError("no nodes"), ValueError("bad")):
        background, seen = Background(), []

        def start(outcome: Exception | None = outcome) -> None:
            seen.append("start")
            if outcome is not None:
                raise outcome

        background.start(start, done=lambda: seen.append(("done", threading.current_thread().name, background.busy)))
        background.wait()
        assert seen == ["start", ("done", "hpcai-background-start", False)]  # not busy as seen from itself
        assert (background.error is None) is (outcome is None)


def test_a_panel_drawn_while_a_start_in_the_background_ended_is_told_again() -> None:
    """A listener (the widget panel) reads the engines when told; told once more as the thread ends, it reads what
    the thread left, whatever it read from another thread meanwhile."""
    engines, told = Engines(), []
    engines.subscribe(lambda e: told.append((e.state, threading.current_thread().name)))
    engines.background.start(lambda: engines._set_state("running"), done=engines.announce)
    engines.await_background()
    assert told == [("running", "hpcai-background-start")] * 2
