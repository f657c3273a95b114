"""A world of 128 ranks on this 2-core machine: every engine registers, and the start is timed against a bare start
of the same processes (a benchmark line, never asserted).

The local launcher outside Slurm starts them (the registration storm does not depend on how many nodes there are:
128 processes build their kernels on 2 cores). Before registration_args, the controller gave up on a registration
after 30 s, while these engines took 30-45 s from their registration to their first heartbeat: 109 of 128 joined in
a control run with the old setting, and on a 16-node dev cluster 0 of 128 (the issue's "only 28 of 128").

Then worlds of 64, 32 and 8 ranks, and at each size an empty cell's wall and kernel CPU time through ours, %%px and
ipyparallel's coalescing BroadcastView (bench/overhead.py's cell_costs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.alone]
RANKS = 128
SIZES = (RANKS, 64, 32, 8)
START = """
import json, time
import jupyter_hpcai.engines as E
from jupyter_hpcai.bench.overhead import cell_costs
engines = E.current()
found = {}
for n in %r:
    t = time.monotonic()
    engines.start(n=n, launcher="local", framework=None, timeout=400)
    ready = time.monotonic() - t
    values = engines.run("rank", framework=None, write=lambda _: None)
    costs = cell_costs(engines)
    t = time.monotonic()
    engines.stop()
    found[n] = {"ready": ready, "numbered": sorted(values.values()) == list(range(n)), "stop": time.monotonic() - t,
                "cells": costs}
print(json.dumps(found))
""" % (SIZES,)


@pytest.fixture
def outside_slurm() -> Iterator[dict[str, str]]:
    yield {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def test_128_ranks_start_register_and_stop(outside_slurm: dict[str, str], bench: list[str]) -> None:
    t = time.monotonic()
    bare = subprocess.run([sys.executable, "-m", "jupyter_hpcai.ranks.local", "-n", str(RANKS), sys.executable, "-c",
                           "from ipyparallel.engine.app import main"], capture_output=True, text=True, timeout=600,
                          env=outside_slurm)
    bare_s = time.monotonic() - t
    assert bare.returncode == 0, bare.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=1500, env=outside_slurm)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {int(n): v for n, v in json.loads(done.stdout.splitlines()[-1]).items()}
    assert all(found[n]["numbered"] for n in SIZES), found  # every rank answered a cell, numbered 0..n-1
    ready, stopped = found[RANKS]["ready"], found[RANKS]["stop"]
    bench.append(f"scale: {RANKS} engines ready in {ready:.1f} s, {ready / bare_s:.2f}x a bare start of "
                 f"{RANKS} processes importing the engine ({bare_s:.1f} s, local launcher, 2 cores); stop "
                 f"{stopped:.1f} s")
    cells = {n: found[n]["cells"] for n in sorted(SIZES)}

    def each(way: str, what: str) -> str:
        return "/".join(f"{cells[n][way][what] * 1e3:.0f}" for n in cells)

    bench.append(f"empty cell at {'/'.join(map(str, cells))} ranks (local launcher, 2 cores; ms, medians of 7 "
                 f"alternating): kernel CPU ours {each('ours', 'cpu')}, %%px {each('px', 'cpu')}, BroadcastView "
                 f"{each('broadcast', 'cpu')}; wall ours {each('ours', 'wall')}, %%px {each('px', 'wall')}, "
                 f"BroadcastView {each('broadcast', 'wall')}; ours at {RANKS} / at 8: kernel CPU "
                 f"{cells[RANKS]['ours']['cpu'] / cells[8]['ours']['cpu']:.1f}x; ours / BroadcastView wall at {RANKS}: "
                 f"{cells[RANKS]['ours']['wall'] / cells[RANKS]['broadcast']['wall']:.2f}")
    bench.append(_model(found))


def _model(found: dict[int, dict]) -> str:  # type: ignore[type-arg]
    """512 and 1,024 ranks on paper: a least-squares line through the 4 sizes measured here, per quantity."""
    from statistics import linear_regression

    quantities = {"start": lambda f: f["ready"], "stop": lambda f: f["stop"],
                  "empty cell wall": lambda f: f["cells"]["ours"]["wall"],
                  "its kernel CPU": lambda f: f["cells"]["ours"]["cpu"]}
    said = []
    for name, read in quantities.items():
        slope, intercept = linear_regression(list(found), [read(found[n]) for n in found])
        said.append(f"{name} " + " / ".join(f"{intercept + slope * n:.1f}" for n in (512, 1024))
                    + f" s ({slope * 1e3:.1f} ms a rank)")
    return ("model at 512 / 1,024 ranks (a line through the sizes measured here; the engines share 2 cores, so start "
            "and wall are upper bounds for ranks with cores of their own): " + "; ".join(said))

