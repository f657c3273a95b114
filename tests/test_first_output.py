"""From the spawn form's Start to the first line a rank prints, as a new user meets it in the browser: the demo's
2 x 2 profile, a notebook JupyterLab opens at the spawn, its cells run as soon as the kernel is idle. The engines
start with the job (the profile's start_engines) against a hub whose profile leaves them to the first cell,
alternating; each phase is timed from the click (Slurm's times for the queue, the hub's log for the server's port
report and its route, the rank table's for the engines)."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import cpu
from helpers.hub import USER, Hub, as_user, logged_in_page
from jupyter_hpcai import kernelspec
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.envs import open_env

NOTEBOOK = "first-output.ipynb"
CELLS = ["%load_ext jupyter_hpcai", "%%horovod_run\nprint('first output from rank', rank, 'of', size)"]
PHASES = ("Slurm job submitted", "job running", "server listening", "hub routed it", "JupyterLab page", "kernel idle",
          "engines registered or attached", "first rank output")


def _notebook() -> str:
    return json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                  "source": code} for code in CELLS],
                       "metadata": {"kernelspec": {"name": "hpcai-tf-horovod-cpu", "display_name": "tf-horovod-cpu",
                                                   "language": "python"}}, "nbformat": 4, "nbformat_minor": 5})


def _slurm_time(value: str) -> float:
    return dt.datetime.fromisoformat(value).timestamp()


def _hub_logged(hub: Hub, pattern: str, after: float) -> float:
    """When the hub's log first says ``pattern`` (a regular expression) at or after ``after``; NaN if it never does.
    JupyterHub stamps its lines in this machine's local time, to the millisecond."""
    for line in hub.log.read_text(errors="replace").splitlines():
        stamped = re.match(r"\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) JupyterHub ", line)
        if stamped and re.search(pattern, line):
            at = dt.datetime.strptime(stamped[1], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            if at >= after:
                return at
    return float("nan")


def _engines_registered(job: str) -> float:
    """When the job's engine set last wrote its rank table (every rank registered, or a kernel attached)."""
    found = sorted(Path(f"~{USER}").expanduser().glob(f".ipython/profile_default/hpcai-ranks/hpcai-{job}-*/ranks.json"))
    tables = [p for p in found if json.loads(p.read_text()).get("ranks")]
    return tables[0].stat().st_mtime if tables else float("nan")


def _newest_job() -> dict[str, str]:
    """scontrol's record of the user's newest job (the server's, as the user has no other)."""
    jobs = subprocess.run(["squeue", "--noheader", "--user", USER, "--format=%i"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()
    return slurm.job_info(max(jobs, key=int)) or {}


def _one_start(playwright, hub: Hub) -> tuple[dict[str, float], dict[str, float]]:  # type: ignore[no-untyped-def]
    """Start -> first rank output once: each phase's seconds from the click; the CPU seconds each group of processes
    spent meanwhile, and the machine's ("busy")."""
    browser, page = logged_in_page(playwright, hub)
    try:
        page.goto(f"{hub.url}/hub/spawn")
        page.select_option("#hpcai-profile", "2 nodes x 2 GPUs")
        processes, (busy, _) = cpu.processes(), cpu.machine()
        clicked = time.time()
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_selector("#jp-main-dock-panel", timeout=300_000)
        lab = time.time()
        page.wait_for_function("document.querySelector('#jp-main-statusbar')?.innerText.includes('| Idle')",
                               timeout=300_000)
        idle = time.time()
        page.click(".jp-Cell .jp-InputArea-editor")
        for _ in CELLS:  # Run All, as fast as a person can
            page.keyboard.press("Shift+Enter")
        page.wait_for_function("[...document.querySelectorAll('.jp-Notebook .jp-Cell')][1]"
                               "?.querySelector('.jp-OutputArea')?.innerText.includes('first output from rank')",
                               timeout=600_000)
        first = time.time()
        spent = {**cpu.spent(processes, cpu.processes()), "busy": cpu.machine()[0] - busy}
        output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea").inner_text()
        assert "first output from rank 0 of 4" in output and "first output from rank 3 of 4" in output, output
        job = _newest_job()
        engines = _engines_registered(job["JobId"])
    finally:
        browser.close()
    hub.stop_server()
    listening = _hub_logged(hub, f"Server of {USER} reported port", clicked)  # the server's own report, once it listens
    routed = _hub_logged(hub, f"User {USER} took [\\d.]+ seconds to start", clicked)  # proven, then routed
    at = dict(zip(PHASES, (_slurm_time(job["SubmitTime"]), _slurm_time(job["StartTime"]), listening, routed, lab, idle,
                           engines, first)))
    return {phase: when - clicked for phase, when in at.items()}, spent


def _cpu_line(mode: str, runs: list[dict[str, float]], wall: float) -> str:
    """Where the CPU went from the click to the first output (medians), and the wall time that work alone needs on
    this machine's cores: a first output sooner than that needs less work, not less waiting."""
    used = {group: statistics.median(run.get(group, 0.0) for run in runs) for group in {g for r in runs for g in r}}
    busy = used.pop("busy")
    groups = ", ".join(f"{group} {seconds:.1f}" for group, seconds in sorted(used.items(), key=lambda i: -i[1]))
    return (f"Start -> first rank output, engines {mode}: CPU seconds from the click (medians of 2, by process): "
            f"{groups}; the machine {busy:.1f} s on {cpu.CORES} cores, busy {100 * busy / (cpu.CORES * wall):.0f} % of "
            f"the {wall:.1f} s; that work alone needs {busy / cpu.CORES:.1f} s here")


@pytest.mark.slow
@pytest.mark.alone  # the seconds from the click, not what the run's other process takes of the cores
def test_start_to_the_first_rank_output_in_the_browser(devcluster, tf_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       bench: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    kernelspec.install(open_env(tf_env), prefix=sys.prefix)  # what `hpcai demo` installs for the hub's servers
    as_user(USER, sys.executable, "-c", f"import os; open(os.path.expanduser('~/{NOTEBOOK}'), 'w').write({_notebook()!r})")
    hubs = {mode: Hub(tmp_path / mode, environ={"HPCAI_DEMO_NOTEBOOK": NOTEBOOK, "HPCAI_DEMO_START_ENGINES": flag})
            for mode, flag in (("with the job", "1"), ("at the first cell", "0"))}
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in hubs}
    spent: dict[str, list[dict[str, float]]] = {mode: [] for mode in hubs}
    try:
        for hub in hubs.values():
            hub.start()
            hub.api("POST", f"/users/{USER}")
        with sync_playwright() as p:
            for mode in ("with the job", "at the first cell", "at the first cell", "with the job"):
                phases, used = _one_start(p, hubs[mode])
                runs[mode].append(phases)
                spent[mode].append(used)
    finally:
        for hub in hubs.values():
            if hub.proc and hub.proc.poll() is None and hub.server(USER) is not None:
                hub.stop_server(USER)
            hub.stop(proxy=True)
    total = {mode: statistics.median(r["first rank output"] for r in rs) for mode, rs in runs.items()}
    for mode, rs in runs.items():
        median = {phase: statistics.median(r[phase] for r in rs) for phase in PHASES}
        # each phase after the one before it (the engines, started with the job, may register before the kernel is idle)
        assert (median["job running"] <= median["server listening"] <= median["hub routed it"] <= median["JupyterLab page"]
                <= median["kernel idle"] < median["first rank output"]), median
        bench.append(f"Start -> first rank output in the browser, engines {mode} (2 x 2, tf-horovod-cpu; medians of 2, "
                     "seconds from the click): " + ", ".join(f"{phase} {at:.1f}" for phase, at in median.items()))
        bench.append(_cpu_line(mode, spent[mode], median["first rank output"]))
    bench.append(f"Start -> first rank output: engines with the job / at the first cell = "
                 f"{total['with the job'] / total['at the first cell']:.2f} "
                 f"({total['with the job']:.1f} s / {total['at the first cell']:.1f} s, alternating)")
