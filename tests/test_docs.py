"""The documentation site: it builds offline with warnings as errors, its setting reference covers every configurable
trait of HPCSlurmSpawner (each with help), its tutorial shows the demo notebook's cells, the README's links into it
lead somewhere, a broken link fails, and no page states a measured figure without its stamp."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_hpcai.spawner.spawner import HPCSlurmSpawner

REPO = Path(__file__).resolve().parents[1]


def build(out: Path, source: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``scripts/docs.sh OUT [SOURCE]``: its exit status and everything it printed."""
    command = ["bash", str(REPO / "scripts" / "docs.sh"), str(out), *([str(source)] if source else [])]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def text(page: Path) -> str:
    """A built page's text: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    done = build(out)
    assert done.returncode == 0, f"the docs build failed (warnings are errors):\n{done.stdout}{done.stderr}"
    return out


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for page in ("index.html", "tutorials/first-notebook.html", "howto/site-install.html", "reference/cli.html",
                 "reference/magics.html", "reference/rest.html", "explanation/security.html"):
        assert page in pages
    assert not (REPO / "docs" / "_build").exists()


def test_every_setting_of_the_spawner_is_in_the_reference_with_help(request: pytest.FixtureRequest) -> None:
    traits = HPCSlurmSpawner.class_own_traits(config=True)
    assert "job_state_interval" in traits  # the walk finds the class's own settings: a control
    undocumented = sorted(name for name, trait in traits.items() if not trait.help.strip())
    assert undocumented == [], f"configurable traits of HPCSlurmSpawner without help text: {undocumented}"
    page = (request.getfixturevalue("site") / "reference" / "spawner.html").read_text()
    anchor = 'id="jupyter_hpcai.spawner.spawner.HPCSlurmSpawner.{}"'
    missing = sorted(name for name in traits if anchor.format(name) not in page)
    assert missing == [], f"settings missing from reference/spawner.html: {missing}"


def test_the_tutorial_shows_every_code_cell_of_the_demo_notebook(site: Path) -> None:
    """The cells come from examples/demo.ipynb (which the demo check runs, cell by cell: test_demo), not a copy."""
    shown = text(site / "tutorials" / "first-notebook.html")
    cells = [c for c in json.loads((REPO / "examples" / "demo.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    assert cells
    for cell in cells:
        assert " ".join("".join(cell["source"]).split()) in shown


def test_the_readmes_links_into_the_site_lead_somewhere(site: Path) -> None:
    """The README keeps the first screen and links into the site: every page (and heading) it links to exists."""
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([\w-]+))?\)", (REPO / "README.md").read_text())
    assert len(links) > 20 and any(anchor for _, anchor in links)
    for path, anchor in links:
        assert (REPO / path).is_file(), path
        if anchor:
            page = site / Path(path).relative_to("docs").with_suffix(".html")
            assert f'id="{anchor}"' in page.read_text(), f"README links to {path}#{anchor}: no such heading"


@pytest.mark.parametrize("broken", ["[a page](no-such-page.md)", "[a heading](reference/cli.md#no-such-heading)",
                                    "{ref}`a label <no-such-label>`"])
def test_a_broken_internal_link_fails_the_build(tmp_path: Path, broken: str) -> None:
    source = tmp_path / "docs"
    shutil.copytree(REPO / "docs", source, ignore=shutil.ignore_patterns("_build", "__pycache__"))
    shutil.copy(REPO / "README.md", tmp_path / "README.md")  # the explanation pages include its sections
    index = source / "index.md"
    index.write_text(index.read_text() + f"\nSee {broken}.\n")
    done = build(tmp_path / "html", source)
    assert done.returncode != 0, f"a build with {broken} passed"
    assert re.search(r"index\.md:\d+: WARNING: .*no-such-", done.stderr + done.stdout), done.stderr + done.stdout


# A sentence that speaks of a measurement and gives a time, a rate, a percentage or a ratio states a figure: its
# paragraph must carry the run's stamp (a date; the generated pages of measured figures carry theirs whole).
MEASURING = re.compile(r"\b(measured|median|took|faster|slower|throughput|speed-?up|overhead|swung|swings)\b", re.I)
FIGURE = re.compile(r"\b(twice|three times|half as|\d+(\.\d+)?\s?(ms|s|%|x|×|/s|min))\b")
STAMP = re.compile(r"\b20\d\d-\d\d-\d\d\b")
GENERATED = ("measured.md", "bench-results.md", "security-attacks.md")  # written whole by a test run, stamped


def unstamped_figures(markdown: str) -> list[str]:
    """The sentences of ``markdown`` (code left out) that state a measured figure in a paragraph without a stamp."""
    found = []
    for paragraph in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", markdown, flags=re.S)):
        for sentence in re.split(r"(?<=[.;:])\s+|\n\s*[-|]", re.sub(r"`[^`]*`", "", paragraph)):
            if MEASURING.search(sentence) and FIGURE.search(sentence) and not STAMP.search(paragraph):
                found.append(" ".join(sentence.split()))
    return found


def test_every_figure_in_the_docs_carries_its_stamp() -> None:
    pages = [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if p.name not in GENERATED)]
    found = {str(p.relative_to(REPO)): unstamped_figures(p.read_text()) for p in pages}
    assert not {page: figures for page, figures in found.items() if figures}, found
    # control: the sentence engines.md had, whose figure matched no run (the file it cited said 3.2x)
    assert unstamped_figures("try MPI: on the dev cluster's CPUs (4 ranks on 2 cores) a small convnet trained about "
                             "twice as fast over MPI as over Gloo (the throughput lines of the measured figures).")
    assert not unstamped_figures("Twenty `squeue` at once took a median of 5 s.\nMeasured 2026-12-07 on the vm.")
