"""Verification: the recipe's imports and commands, run inside the activated env."""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import HPCAIError
from ..proc import run
from .recipe import Verify


@dataclass(frozen=True)
class StepResult:
    step: str
    output: str


def verify(python: Path, spec: Verify, env: dict[str, str]) -> list[StepResult]:
    """Run every step; raise HPCAIError naming the first one that fails."""
    results = []
    for module in spec.imports:
        step = f"import {module}"
        done = run([str(python), "-c", f"import {module}"], env=env, check=False, timeout=300)
        if done.returncode != 0:
            raise HPCAIError(f"verify step `{step}` failed:\n{_tail(done.stderr)}",
                             "the env is missing the package or a library it loads; see the recipe's pip/conda lists")
        results.append(StepResult(step, "ok"))
    for command in spec.commands:
        argv = shlex.split(command.run)
        exe = shutil.which(argv[0], path=env.get("PATH"))
        if exe is None:
            raise HPCAIError(f"verify step `{command.run}` failed: {argv[0]} not found in the env",
                             "install the package that provides it in the recipe")
        done = run([exe, *argv[1:]], env=env, check=False, timeout=command.timeout)
        output = done.stdout + done.stderr
        missing = [e for e in command.expect if e not in output]
        if done.returncode != 0 or missing:
            why = f"exit status {done.returncode}" if done.returncode else f"output lacks {missing}"
            raise HPCAIError(f"verify step `{command.run}` failed ({why}):\n{_tail(output)}",
                             "the build is incomplete; check the build variables (e.g. HOROVOD_WITH_*) in the recipe")
        results.append(StepResult(command.run, output.strip()))
    return results


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
