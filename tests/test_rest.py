"""When idle worlds rest (engines/rest.py), without a cluster: the thread's timing and its respect for cells, and
what a rank says after a rest that failed. The world here is a stand-in that counts rests; tests/test_engines.py and
tests/test_warm_start.py rest and wake a real Horovod world."""

from __future__ import annotations

import threading
import time

import pytest

from jupyter_hpcai.engines.rest import DEFAULT_AFTER, Rest, rest_after
from jupyter_hpcai.errors import HPCAIError


class CountingWorld:
    def __init__(self) -> None:
        self.rests: list[float] = []

    def rest(self) -> bool:
        self.rests.append(time.monotonic())
        return True


def wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_the_setting() -> None:
    assert rest_after({}) == DEFAULT_AFTER == 30
    assert rest_after({"HPCAI_REST_AFTER": "0"}) == 0
    assert rest_after({"HPCAI_REST_AFTER": "2.5"}) == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(HPCAIError) as err:
            rest_after({"HPCAI_REST_AFTER": bad})
        assert "HPCAI_REST_AFTER" in err.value.message and "0: never" in err.value.hint


def test_a_world_rests_once_after_the_last_cell_and_a_cell_postpones_it() -> None:
    world, lock = CountingWorld(), threading.RLock()
    rest = Rest(lock, lambda: world, after=1.0)
    rest.used()
    time.sleep(0.3)
    again = time.monotonic()
    rest.used()  # a cell: the clock starts again
    assert wait_for(lambda: world.rests)
    assert world.rests[0] - again >= 1.0
    time.sleep(1.5)
    assert len(world.rests) == 1  # once, until the next cell


def test_no_rest_while_a_cell_holds_the_lock_nor_without_a_world_nor_when_off() -> None:
    world, lock = CountingWorld(), threading.RLock()
    rest = Rest(lock, lambda: world, after=0.2)
    with lock:  # a cell that runs long
        rest.used()
        time.sleep(0.6)
        assert world.rests == []
    rest.used()  # its end
    assert wait_for(lambda: world.rests)

    idle = Rest(threading.RLock(), lambda: None, after=0.1)
    idle.used()
    time.sleep(0.3)  # nothing to rest: no error, nothing done

    off, never = CountingWorld(), Rest(threading.RLock(), lambda: off, after=0)
    never.used()
    time.sleep(0.3)
    assert off.rests == [] and never._thread is None


def test_horovod_switches_read_as_horovod_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOROVOD_AUTOTUNE (no rest under it) and HOROVOD_ENABLE_XLA_OPS (the awake cycle's default): on for an integer
    above 0, as Horovod's env_parser.cc reads them; "true" is off to Horovod, so it is here."""
    from jupyter_hpcai.ranks.frameworks import _horovod_flag

    for value, on in (("1", True), ("2", True), (" 3", True), ("0", False), ("-1", False), ("true", False), ("", False)):
        monkeypatch.setenv("HOROVOD_AUTOTUNE", value)
        assert _horovod_flag("HOROVOD_AUTOTUNE") is on, value
    monkeypatch.delenv("HOROVOD_AUTOTUNE")
    assert not _horovod_flag("HOROVOD_AUTOTUNE")


def test_a_rank_whose_rest_failed_says_nothing_is_initialised() -> None:
    """A rest or wake shuts the framework down, then initialises it again: when that fails, the rank reports no
    framework (a kernel that attaches later then initialises it in full instead of running on a shut-down one)."""
    from jupyter_hpcai.ranks import calls
    from jupyter_hpcai.ranks.framework import Framework

    def init(params: dict) -> tuple[dict, dict]:  # type: ignore[type-arg]
        if params.get("fail"):
            raise RuntimeError("HTTP request failed.")
        return {}, {"rank": 0}

    fake = Framework("fake", "fake_run", "a fake", (), (), (), init, max, lambda value: value)
    calls.init_framework(fake, {})
    assert calls.rank_info()["framework"] == "fake"
    with pytest.raises(RuntimeError):
        calls.init_framework(fake, {"resting": True, "fail": True}, again=True)
    info = calls.rank_info()
    assert info["framework"] is None and info["resting"] is None, info
    assert calls.init_framework(fake, {})["initialised"] is True  # the next cell initialises it again
    calls.forget_framework()
