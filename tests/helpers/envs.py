"""The envs the tests build: the small recipe over the local conda channel, a real Lmod module, the shipped
recipes' envs (kept between runs)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jupyter_hpcai.envs import Builder, EnvDir, EnvStore, load_recipe

REPO = Path(__file__).resolve().parents[2]

LIB_SOURCE = "int hpcai_answer(void) { return 42; }\n"


SMALL_RECIPE = """
name: small
conda:
  channels: [{channel}]
  specs: [hpcai-test-lib=1.0, hpcai-test-six]
python: /usr/bin/python3
pip: [six==1.16.0]
activate:
  LD_LIBRARY_PATH: ${{CONDA_PREFIX}}/lib:${{LD_LIBRARY_PATH}}
verify:
  imports: [six]
  commands:
    - run: hpcai-test-tool.sh
      expect: [tool-ok]
"""


MODULEFILE = """-- a real Lmod modulefile, loaded by the kernel env's activation
setenv("HPCAI_TEST_MODULE", "loaded")
prepend_path("PATH", "/opt/hpcai-test-module/bin")
"""


@contextmanager
def shipped_env_held(recipe: str) -> Iterator[Path]:
    """The shipped envs' store, with ``recipe``'s env held against the test run's other process (which waits): while
    one builds it, or a test changes it."""
    root = Path(os.environ.get("HPCAI_TEST_ENV_ROOT", "/opt/hpcai/envs"))
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{recipe}.test-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root


def shipped_env(recipe: str) -> EnvDir:
    """A shipped recipe's env, in a store outside the checkout that persists between runs: rebuilt only
    when the recipe changed (jupyter_hpcai is installed editable, so code changes need no rebuild)."""
    with shipped_env_held(recipe) as root:
        return Builder(load_recipe(REPO / "recipes" / f"{recipe}.yaml"), store=EnvStore(root)).run().env_dir
