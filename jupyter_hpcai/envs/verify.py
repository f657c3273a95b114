"""Verification: the recipe's imports (in one interpreter) and commands, run inside the activated env."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import HPCAIError
from ..proc import run
from .recipe import Verify, VerifyCommand

# Imports each module in turn; the first that fails ends it with its traceback on stderr.
_IMPORTS = """
import importlib, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        traceback.print_exc()
        sys.exit(3)
    print("HPCAI-IMPORTED " + name, flush=True)
"""


@dataclass(frozen=True)
class StepResult:
    step: str
    output: str
    skipped: str = ""  # why a step did not run here


def gpus_visible() -> str:
    """Why no GPU can be used here ('' when one can): nvidia-smi must list at least one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no GPU here (no nvidia-smi)"
    done = run([smi, "-L"], check=False, timeout=60)
    return "" if done.returncode == 0 and "GPU " in done.stdout else "no GPU here (nvidia-smi lists none)"


def verify(python: Path, spec: Verify, env: dict[str, str],
           on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    """Run every step, side by side (they are independent checks; a framework's import is most of each); report
    them in the recipe's order; raise HPCAIError naming the first one that fails. GPU-only steps are skipped,
    with the reason, where no GPU is visible."""
    report = on_step or (lambda result: None)
    no_gpu = gpus_visible() if any(c.needs_gpu for c in spec.commands) else ""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        imports = pool.submit(_imports, python, spec.imports, env) if spec.imports else None
        commands = [None if c.needs_gpu and no_gpu else pool.submit(_command, c, env) for c in spec.commands]
        results = []
        if imports:
            for result in imports.result():
                results.append(result)
                report(result)
        for command, running in zip(spec.commands, commands):
            results.append(running.result() if running else StepResult(command.run, "", f"needs a GPU: {no_gpu}"))
            report(results[-1])
    return results


def _imports(python: Path, modules: list[str], env: dict[str, str]) -> list[StepResult]:
    done = run([str(python), "-c", _IMPORTS, *modules], env=env, check=False, timeout=600)
    imported = [ln.split(" ", 1)[1] for ln in done.stdout.splitlines() if ln.startswith("HPCAI-IMPORTED ")]
    if done.returncode != 0:
        failed = modules[len(imported)] if len(imported) < len(modules) else "?"
        raise HPCAIError(f"verify step `import {failed}` failed:\n{_tail(done.stderr)}",
                         "the env is missing the package or a library it loads; see the recipe's pip/conda lists")
    return [StepResult(f"import {m}", "ok") for m in imported]


def _command(command: VerifyCommand, env: dict[str, str]) -> StepResult:
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
    return StepResult(command.run, output.strip())


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
