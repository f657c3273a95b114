"""The side panel (JupyterLab extension + server extension) and the ClusterPanel widget, in Chromium."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import JobLab
from jupyter_helpers import Server, jupyter_server

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def test_rest_handlers_outside_a_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    with jupyter_server(tmp_path, env={**env, "IPYTHONDIR": str(tmp_path / "ipython")}) as server:
        assert server.request("GET", "/hpcai/api/allocation") == (200, {"in_job": False})
        assert server.request("GET", "/hpcai/api/engines") == (200, {"engine_sets": []})
        anonymous = Server(server.url, "wrong-token", server.log)
        assert anonymous.request("GET", "/hpcai/api/allocation")[0] == 403


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
        page.screenshot(path=str(ARTIFACTS / "side-panel.png"))
        browser.close()


@pytest.mark.slurm
@pytest.mark.slow
def test_widget_start_button_starts_two_engines(job_lab: JobLab, tf_env) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    from jupyter_hpcai import kernelspec

    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": "from jupyter_hpcai.widgets import ClusterPanel\nClusterPanel()"}],
                "metadata": {"kernelspec": {"name": kernelspec.kernel_name(tf_env), "display_name": "tf",
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (job_lab.root / "panel.ipynb").write_text(json.dumps(notebook))
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _lab_page(p, job_lab, "lab/tree/panel.ipynb")
        # the kernel must be idle first: an earlier Shift+Enter is silently dropped
        page.wait_for_function("document.querySelector('#jp-main-statusbar')?.innerText.includes('| Idle')",
                               timeout=120_000)
        page.click(".jp-Cell .jp-InputArea-editor")
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
        assert re.search(r"0\s+n1\s+\d\s+running", table) and re.search(r"1\s+n1\s+\d\s+running", table)
        page.screenshot(path=str(ARTIFACTS / "widget-panel.png"))
        page.click('li[data-id="hpcai-panel"]')
        page.wait_for_selector("#hpcai-panel table.hpcai-engines", timeout=60_000)
        assert "2/2" in page.inner_text("#hpcai-panel table.hpcai-engines")
        page.screenshot(path=str(ARTIFACTS / "side-panel-with-engines.png"))
        browser.close()
