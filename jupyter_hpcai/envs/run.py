"""``python -m jupyter_hpcai.envs.run --root ROOT --build ID NAME -- SCRIPT [ARGS...]``: run a Python script
inside one build of an env, activated as the hpcai-env provisioner starts a kernel (the env's ``argv`` and
``environ``): what an exported notebook job's ranks run (export.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import HPCAIError
from .store import EnvDir, EnvStore, check_name, open_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jupyter_hpcai.envs.run")
    parser.add_argument("--root", type=Path, required=True, help="the env's root")
    parser.add_argument("--build", help="the build (default: the current one)")
    parser.add_argument("name")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        env = open_env(EnvDir(check_name(args.name), EnvStore.at(args.root).roots[0]), args.build)
        full = env.argv([env.python, *cmd], binds=[str(Path(cmd[0]).absolute().parent)] if cmd else [])
        # a virtualenv active where the job was submitted is not this env (IPython would put its packages first)
        base = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        os.execvpe(full[0], full, env.environ(base))
    except HPCAIError as err:
        sys.exit(f"hpcai: {err.message}\n  hint: {err.hint}")


if __name__ == "__main__":
    main()
