"""A rank's own Python stack, for where py-spy cannot attach (ptrace forbidden on the node, the ranks in a container).

A thread of the rank looks in the engine set's folder every WATCH seconds for requests (one file each, named by its
token: two askers at once, a timeout's report and the side panel, each get their answers) and answers each once with
its main thread's stack, innermost frame first. It answers while the main thread is blocked in C where that C code
lets go of Python's lock, as the collectives of Gloo, MPI and NCCL in torch and Horovod do; a rank held in C with the
lock, or gone, does not answer, and the asker says so.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from ..contract import STACKS_ANSWER, STACKS_REQUEST
from ..errors import HPCAIError
from .identity import host_name

WATCH = 2.0  # seconds between a rank's looks for a request: as often as telemetry samples (a shared filesystem pays)
Answer = list[tuple[str, str, int]] | str  # (name, file, line) innermost first, or why there is none


class Watcher(threading.Thread):
    """Answers the stack requests in ``folder`` for as long as the rank lives (a daemon)."""

    def __init__(self, folder: Path, host: str) -> None:
        super().__init__(name="hpcai-stacks", daemon=True)
        self.folder, self.host = folder, host
        self.answered: set[str] = set()

    def run(self) -> None:
        prefix = STACKS_REQUEST.format(token="")
        while True:
            time.sleep(WATCH)
            tokens = {p.name.removeprefix(prefix) for p in self.folder.glob(f"{prefix}*")}  # none once it is gone
            for token in tokens - self.answered:
                self.answer(token)
            self.answered = tokens  # the requests still there: their askers have not read every answer yet

    def answer(self, token: str) -> None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        frames = [[f.name, f.filename, f.lineno] for f in reversed(traceback.extract_stack(frame))] if frame else []
        path = self.folder / STACKS_ANSWER.format(token=token, host=self.host, pid=os.getpid())
        partial = path.with_name(f".{path.name}")
        try:
            partial.write_text(json.dumps(frames))
            os.replace(partial, path)
        except OSError:  # the set's folder went away (the engines are stopping)
            pass


def start_watching(environ: Mapping[str, str], folder_var: str) -> None:
    """At boot: the rank's watcher, when the kernel gave the set a folder."""
    folder = environ.get(folder_var)
    if folder and Path(folder).is_dir():
        Watcher(Path(folder), host_name(environ)).start()


def ask(folder: Path, ranks: list[tuple[int, str, int]], timeout: float = 2 * WATCH + 6) -> dict[int, Answer]:
    """Every rank's own stack (ranks: rank, host, pid), once each has answered or ``timeout`` passed; the request
    and its answers are removed after."""
    token = secrets.token_hex(8)
    request = folder / STACKS_REQUEST.format(token=token)
    try:
        os.close(os.open(request, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        raise HPCAIError("the engines stopped while their stacks were asked for",
                         "start them again: %hpc start") from None
    answers: dict[int, Answer] = {}
    paths = {rank: folder / STACKS_ANSWER.format(token=token, host=host, pid=pid) for rank, host, pid in ranks}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < len(ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
            for rank, path in paths.items():
                if rank not in answers:
                    try:
                        frames = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue
                    answers[rank] = [(str(name), str(file), int(line)) for name, file, line in frames]
    finally:
        for path in [request, *paths.values()]:
            path.unlink(missing_ok=True)
    silent = (f"no answer within {timeout:g} s: the rank holds Python's lock in C (no thread of its own can run), "
              "it has no stack watcher (no engine set folder where it runs), or it is gone")
    return {rank: answers.get(rank, silent) for rank, _, _ in ranks}
