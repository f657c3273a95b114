"""The side panel (JupyterLab extension + server extension) and the ClusterPanel widget, in Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers.kernels import JobLab, lab_in_job
from helpers.jupyter import Server, jupyter_server

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


ESCAPE = "import(process.argv[1]).then(m => process.stdout.write(m.escape(process.argv[2])))"


def test_the_panel_escapes_text_for_attributes_too() -> None:
    """The side panel writes text from outside into element text and into quoted attributes (an engine set's id in
    data-cluster="..."): its escape covers both, quotes included. Run as built (labextension/lib, made by the
    install)."""
    built = Path(__file__).resolve().parents[1] / "labextension" / "lib" / "escape.js"
    hostile = """x" onmouseover="alert(1)" data-x='<img src=y onerror=alert(2)>&"""
    done = subprocess.run(["node", "-e", ESCAPE, str(built), hostile], capture_output=True, text=True, timeout=60)
    assert done.stdout == ("x&quot; onmouseover=&quot;alert(1)&quot; data-x=&#39;&lt;img src=y onerror=alert(2)&gt;"
                           "&amp;"), done


def test_rest_handlers_outside_a_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    with jupyter_server(tmp_path, env={**env, "IPYTHONDIR": str(tmp_path / "ipython")}) as server:
        assert server.request("GET", "/hpcai/api/allocation") == (200, {"in_job": False})
        assert server.request("GET", "/hpcai/api/engines") == (200, {"engine_sets": []})
        # the side panel's stacks button: bad requests and unknown sets get a clear answer (never a path lookup)
        assert server.request("POST", "/hpcai/api/stacks", {"native": "yes"})[0] == 400
        for cluster_id in ("hpcai-1-2-3", "../../etc", "hpcai-../../x"):
            status, body = server.request("POST", "/hpcai/api/stacks", {"cluster_id": cluster_id})
            assert status == 409 and body["error"] == f"no running engine set '{cluster_id}'", body
            assert "%hpc start" in body["hint"]
        # the side panel's Stop: the same (an id is never a path)
        assert server.request("POST", "/hpcai/api/engines/stop", {"cluster_id": "../../etc"})[0] == 400
        status, body = server.request("POST", "/hpcai/api/engines/stop", {"cluster_id": "hpcai-1-2-3"})
        assert status == 404 and body["error"] == "no engine set 'hpcai-1-2-3' in this job", body
        anonymous = Server(server.url, "wrong-token", server.log)
        assert anonymous.request("GET", "/hpcai/api/allocation")[0] == 403
        # no prompt to fetch Jupyter's news (JupyterLab asks while fetchNews is "none"), no update check
        status, body = server.request("GET", "/lab/api/settings/@jupyterlab/apputils-extension:notification")
        assert status == 200 and body["settings"] == {}, body  # a default of the install, not a user's setting
        defaults = {k: body["schema"]["properties"][k]["default"] for k in ("fetchNews", "checkForUpdates")}
        assert defaults == {"fetchNews": "false", "checkForUpdates": False}, defaults


@pytest.mark.slurm
def test_rest_allocation_inside_a_job(job_lab: JobLab) -> None:
    status, body = Server(job_lab.url, job_lab.token, Path("/dev/null")).request("GET", "/hpcai/api/allocation")
    assert status == 200 and body["in_job"] and body["job_id"] == str(job_lab.job_id)
    assert body["nodes"] == ["n1"] and body["gpus_per_node"] == 2 and 0 < body["seconds_left"] <= 1800


def _lab_page(playwright, job_lab: JobLab, path: str = "lab"):  # type: ignore[no-untyped-def]
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{job_lab.url}/{path}?token={job_lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    return browser, page


def _notebook_page(playwright, job_lab: JobLab, env, name: str, cells: list[str]):  # type: ignore[no-untyped-def]
    """A notebook of ``cells`` in ``env``'s kernel, open in JupyterLab, its kernel idle, the first cell focused."""
    from jupyter_hpcai import kernelspec

    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": code}
                          for code in cells],
                "metadata": {"kernelspec": {"name": kernelspec.kernel_name(env), "display_name": env.name,
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (job_lab.root / name).write_text(json.dumps(notebook))
    # a workspace of its own: JupyterLab would reopen other tests' notebooks beside it, and keys and selectors
    # could reach one of those
    browser, page = _lab_page(playwright, job_lab, f"lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}")
    # the kernel must be idle first: an earlier Shift+Enter is silently dropped
    page.wait_for_function("document.querySelector('#jp-main-statusbar')?.innerText.includes('| Idle')",
                           timeout=120_000)
    page.click(".jp-Cell .jp-InputArea-editor")
    return browser, page


@pytest.mark.slurm
def test_side_panel_shows_the_real_allocation(job_lab: JobLab) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _lab_page(p, job_lab)
        page.click('li[data-id="hpcai-panel"]')
        page.wait_for_selector("#hpcai-panel table.hpcai-job", timeout=60_000)
        text = page.inner_text("#hpcai-panel")
        assert f"Job\t{job_lab.job_id}" in text and "Partition\tgpu" in text and "1 (n1)" in text
        assert "GPUs per node\t2" in text
        assert re.search(r"Walltime left: 00:[0-2]\d:\d\d", text)
        # one HPC panel: ipyparallel's own lab extension (its "IP" cluster tab) is off in the servers we start
        config = json.loads(page.eval_on_selector("#jupyter-config-data", "e => e.textContent"))
        assert "ipyparallel-labextension" in config.get("disabledExtensions", []), config.get("disabledExtensions")
        assert page.locator(".ipp-ClusterListing").count() == 0
        page.screenshot(path=str(ARTIFACTS / "side-panel.png"))
        browser.close()


@pytest.mark.slurm
def test_side_panel_warns_in_the_last_15_minutes(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A job with 10 minutes of walltime: the countdown turns to a warning and JupyterLab says so once."""
    from playwright.sync_api import sync_playwright

    with lab_in_job(tf_env, tmp_path, walltime="00:10:00") as lab, sync_playwright() as p:
        browser, page = _lab_page(p, lab)
        page.click('li[data-id="hpcai-panel"]')
        page.wait_for_selector("#hpcai-panel .hpcai-walltime.hpcai-warning", timeout=60_000)
        assert re.fullmatch(r"00:0\d:\d\d", page.inner_text("#hpcai-panel .hpcai-walltime"))
        toast = page.wait_for_selector(f"text=Slurm job {lab.job_id}:", timeout=30_000)
        assert "of walltime left" in toast.inner_text() and "Save your work" in toast.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "side-panel-walltime-warning.png"))
        # the job ends (scancel, as the walltime would): the panel says so in words, not with an HTTP status
        subprocess.run(["scancel", str(lab.job_id)], timeout=30, check=True)
        page.wait_for_selector("#hpcai-panel .hpcai-stopped", timeout=60_000)
        stopped = page.inner_text("#hpcai-panel")
        assert "The notebook server has stopped" in stopped and "start a new server from the hub" in stopped, stopped
        assert not re.search(r"\b(424|502|503)\b|Failed Dependency|Error:", stopped), stopped
        page.screenshot(path=str(ARTIFACTS / "side-panel-server-stopped.png"))
        browser.close()


@pytest.mark.slurm
@pytest.mark.slow
def test_widget_start_button_starts_two_engines(job_lab: JobLab, tf_env) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _notebook_page(p, job_lab, tf_env, "panel.ipynb",
                                       ["from jupyter_hpcai.widgets import ClusterPanel\nClusterPanel()"])
        page.keyboard.press("Shift+Enter")
        start = page.locator(".jp-OutputArea button[title=Start]")
        try:
            start.wait_for(timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "widget-panel-failed.png"))
            raise
        start.click()
        page.wait_for_selector("table.hpcai-ranks tr:nth-child(3)", timeout=180_000)  # header + 2 ranks
        table = page.inner_text("table.hpcai-ranks")
        assert re.search(r"0\s+n1\s+\d\s+\d+\s+running", table) and re.search(r"1\s+n1\s+\d\s+\d+\s+running", table)
        page.screenshot(path=str(ARTIFACTS / "widget-panel.png"))
        page.click('li[data-id="hpcai-panel"]')
        # a row per rank, with its telemetry (the first samples come within 2 s; the panel refreshes every 2 s)
        page.wait_for_function("[...document.querySelectorAll('#hpcai-panel tr.hpcai-rank')].filter("
                               "r => /^\\d\\s+n1\\s+\\d\\s+\\d+\\s+running$/.test(r.innerText.trim())"
                               " && /^CPU \\d+% · \\d+\\.\\d MiB · GPU -/.test(r.nextSibling.innerText.trim())"
                               ").length === 2"  # and each rank's CPU as a sparkline
                               " && document.querySelectorAll('#hpcai-panel svg.hpcai-spark').length === 2",
                               timeout=60_000)
        assert "2/2 running" in page.inner_text("#hpcai-panel .hpcai-set")
        page.click("#hpcai-panel .hpcai-stacks-button")  # every rank's stack, grouped: both idle
        page.wait_for_selector("#hpcai-panel pre.hpcai-stacks:has-text('(2 of 2)')", timeout=60_000)
        assert page.inner_text("#hpcai-panel pre.hpcai-stacks").startswith("ranks 0,1 (2 of 2): idle")
        page.screenshot(path=str(ARTIFACTS / "side-panel-with-engines.png"))
        browser.close()


LARGE_WORLD = ["%load_ext jupyter_hpcai\n%hpc start --framework none",
               "import os, signal, jupyter_hpcai.engines as E\nos.kill(E.current().running_set().ranks[5].pid, "
               "signal.SIGKILL)"]


@pytest.mark.slurm
@pytest.mark.slow
def test_the_side_panel_sums_a_large_world_up_per_node(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """12 ranks on 2 nodes (a job of 6 tasks a node, no GPUs), more than the 8 the panel lists one by one: a row per
    node instead (its ranks, how many run, its readings as min/median/max), and a rank that dies shows on its node's
    row and, in full, under Flagged ranks."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with lab_in_job(tf_env, tmp_path, shape=("-N2", "--ntasks-per-node=6")) as lab, sync_playwright() as p:
        browser, page = _notebook_page(p, lab, tf_env, "large.ipynb", LARGE_WORLD)
        page.keyboard.press("Shift+Enter")
        page.click('li[data-id="hpcai-panel"]')
        node = "#hpcai-panel table.hpcai-nodes tr.hpcai-node"
        try:
            page.wait_for_function(f"[...document.querySelectorAll('{node}')].filter(r => "
                                   "/^n[12]\\s+ranks (0-5|6-11)\\s+6\\/6 running$/.test(r.innerText.trim())).length === 2",
                                   timeout=240_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "side-panel-large-world-failed.png"))
            raise
        assert page.locator("#hpcai-panel tr.hpcai-rank").count() == 0  # no row per rank
        assert "12 ranks on 2 nodes: a row per node" in page.inner_text("#hpcai-panel")
        page.keyboard.press("Shift+Enter")  # rank 5 killed
        page.wait_for_function(f"[...document.querySelectorAll('{node}')].some(r => r.innerText.includes("
                               "'5/6 running') && r.nextSibling.innerText.includes('dead: ranks 5'))", timeout=60_000)
        flagged = page.locator("#hpcai-panel tr.hpcai-rank")
        assert flagged.count() == 1 and re.match(r"5\s+\S+\s+.*dead$", flagged.inner_text().strip()), flagged.inner_text()
        page.screenshot(path=str(ARTIFACTS / "side-panel-large-world.png"))
        browser.close()


TOUR = ["%load_ext jupyter_hpcai\n%hpc start",
        "%%horovod_run\nimport tensorflow as tf\ntotal = hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum)\n"
        "print(f'rank {rank} of {size}: allreduce = {float(total)}')",
        "%%horovod_run\nif rank == 1:\n    raise ValueError('rank 1 got a bad batch')\nprint(f'rank {rank} is fine')"]


@pytest.mark.slurm
@pytest.mark.slow
def test_horovod_cells_and_a_failing_rank_as_jupyterlab_shows_them(job_lab: JobLab, tf_env) -> None:  # type: ignore[no-untyped-def]
    """What the README's tour shows, from a real run: a %%horovod_run cell's rank-prefixed output, and the error
    display when one rank raises (every failing rank's traceback, the others' output, the kernel alive)."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _notebook_page(p, job_lab, tf_env, "tour.ipynb", TOUR)
        for _ in TOUR:  # queued one after the other, as a person runs them
            page.keyboard.press("Shift+Enter")
        cells = page.locator(".jp-Notebook .jp-Cell")
        try:  # the last cell's output (its source names the error too, so wait for the output area's words)
            page.wait_for_function("[...document.querySelectorAll('.jp-Notebook .jp-Cell')][2]"
                                   "?.querySelector('.jp-OutputArea')?.innerText.includes('ranks failed')",
                                   timeout=300_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "tour-failed.png"))
            raise
        ran = cells.nth(1).locator(".jp-OutputArea").inner_text()
        assert "[rank 0 n1] rank 0 of 2: allreduce = 3.0" in ran and "[rank 1 n1] rank 1 of 2: allreduce = 3.0" in ran
        failed = cells.nth(2).locator(".jp-OutputArea").inner_text()
        assert "[rank 0 n1] rank 0 is fine" in failed and "ValueError" in failed and "1 of 2 ranks failed" in failed
        cells.nth(1).screenshot(path=str(ARTIFACTS / "horovod-run-cell.png"))
        cells.nth(2).screenshot(path=str(ARTIFACTS / "rank-error.png"))
        browser.close()
    server = Server(job_lab.url, job_lab.token, Path("/dev/null"))
    for kernel in server.request("GET", "/api/kernels")[1]:  # its engines go with it
        server.request("DELETE", f"/api/kernels/{kernel['id']}")
