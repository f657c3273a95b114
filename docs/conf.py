"""Sphinx configuration: MyST pages, references generated from the code, built offline with warnings as errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# the repository the references and the tutorial's notebook come from (scripts/docs.sh sets it for a copy of docs/)
hpcai_repo = os.environ.get("DOCS_REPO") or str(DOCS.parent)
sys.path.insert(0, str(DOCS / "_ext"))

project = "jupyter-hpcai"
author = "the jupyter-hpcai developers"
copyright = "the jupyter-hpcai developers"
extensions = ["myst_parser", "sphinx_copybutton", "sphinx_click", "autodoc_traits", "hpcai_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# the stamped files the test run generates are included by explanation/measured.md, not pages of their own
exclude_patterns = ["_build", "measured.md", "bench-results.md", "security-attacks.md", "requirements.txt"]

nitpicky = True  # every unresolved reference is a warning, and so (-W) an error
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked against the page's headings
myst_enable_extensions = ["colon_fence"]
autodoc_typehints = "none"

html_theme = "pydata_sphinx_theme"
html_title = project
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
smartquotes = False  # --options stay as typed
