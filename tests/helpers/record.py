"""What a test run records besides pass and fail: the attacks tried (each blocked or not) and the benchmark
lines (ratios against a baseline measured in the same run); printed at the end and written to test-artifacts/.

In a run of several processes (pytest-xdist's ``-n``), each worker hands what it recorded to the main process as it
ends (``handed``), which adds it to its own (``received``) before the summary."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from . import cpu

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BENCH: list[str] = []  # benchmark lines (the bench fixture hands it out)
ATTACKS: list[tuple[str, str, str]] = []  # (attack, "blocked" or "LEAKED", what was observed)
FILE_SECONDS: dict[str, float] = {}  # each test file's setup, call and teardown time (a session fixture: where first used)
PHASES: list[tuple[str, str, str, float, float]] = []  # (process, test, phase, start, stop): the run's timeline
BENCHMARKS: set[str] = set()  # the tests that ask for the bench fixture themselves (marked ``benchmark`` as collected)
STARTED = (time.monotonic(), cpu.machine())  # the run's start, and the machine's CPU seconds then
BUSY: list[tuple[float, float]] = []  # (time, the machine's busy cores over the 5 s before it), in the main process
KEY = "hpcai-record"  # what a worker hands over, in its workeroutput


def timed(report: pytest.TestReport) -> None:
    """Add one phase of one test to its file's time."""
    path = report.nodeid.split("::")[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)  # pytest-xdist's, in the main process
    PHASES.append((worker.id if worker else "main", report.nodeid, report.when, report.start, report.stop))
    if "benchmark" in report.keywords:
        BENCHMARKS.add(report.nodeid)


def handed(config: pytest.Config) -> None:
    """In a worker, as it ends: its benchmark lines and attacks, for the main process."""
    if hasattr(config, "workeroutput"):
        config.workeroutput[KEY] = {"bench": BENCH, "attacks": ATTACKS}


def received(workeroutput: dict[str, Any]) -> None:
    """In the main process: a worker's benchmark lines and attacks, added to the run's."""
    got = workeroutput.get(KEY, {})
    BENCH.extend(got.get("bench", []))
    ATTACKS.extend(tuple(row) for row in got.get("attacks", []))  # type: ignore[misc]


def sample_the_machine() -> None:
    """In the main process: how many of the machine's cores are busy, every 5 s, for the timeline (a daemon thread)."""
    def sample() -> None:
        then = cpu.machine()
        while True:
            time.sleep(5)
            now = cpu.machine()
            BUSY.append((time.time(), cpu.CORES * (now[0] - then[0]) / max(now[1] - then[1], 1e-9)))
            then = now

    threading.Thread(target=sample, name="hpcai-busy", daemon=True).start()


def timeline(wall: float) -> list[str]:
    """Write every test phase's process, start and end (seconds from the run's start) to test-artifacts/timeline.tsv;
    return a line per process: its time in tests, and between them (waiting for an alone test, or its last file
    done before the run's end); and the time of the tests that ask for the bench fixture themselves."""
    if not PHASES:
        return []
    zero = time.time() - wall
    rows = sorted(PHASES, key=lambda row: row[3])
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "timeline.tsv").write_text("process\tstart s\tend s\tphase\ttest\n" + "".join(
        f"{who}\t{start - zero:.1f}\t{stop - zero:.1f}\t{when}\t{test}\n" for who, test, when, start, stop in rows))
    (ARTIFACTS / "busy.tsv").write_text("time s\tbusy cores\n" + "".join(f"{at - zero:.0f}\t{cores:.2f}\n"
                                                                          for at, cores in BUSY))
    lines = []
    for who in sorted({row[0] for row in rows}):
        mine = [row for row in rows if row[0] == who]
        busy = sum(stop - start for *_, start, stop in mine)
        first, last = mine[0][3] - zero, max(row[4] for row in mine) - zero
        lines.append(f"  {who}: {busy / 60:.1f} min in tests from {first / 60:.1f} to {last / 60:.1f} min, "
                     f"{(last - first - busy) / 60:.1f} min between them")
    if BENCHMARKS:
        benchmarks = sum(stop - start for _, test, _, start, stop in rows if test in BENCHMARKS)
        total = sum(stop - start for *_, start, stop in rows)
        lines.append(f"  tests that ask for the bench fixture themselves ({len(BENCHMARKS)}): "
                     f"{benchmarks / 60:.1f} min of the {total / 60:.1f} min in tests")
    lines.append("  (every test phase in test-artifacts/timeline.tsv, the busy cores every 5 s in busy.tsv)")
    return lines


def attack(name: str, blocked: bool, observed: str) -> None:
    """Record one attack's outcome for the run's table (printed, and written to test-artifacts/), then fail the
    test if it was not blocked: the table shows every attack tried, the leaks included."""
    ATTACKS.append((name, "blocked" if blocked else "LEAKED", observed))
    assert blocked, f"{name}: {observed}"


def report(terminalreporter: pytest.TerminalReporter) -> None:
    """The attack table and the benchmark lines, at the end of the run (in the main process: a worker hands its
    records over instead)."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    from jupyter_hpcai.bench.stamp import stamp

    made = stamp()
    if ATTACKS:
        blocked = f"{sum(o == 'blocked' for _, o, _ in ATTACKS)} of {len(ATTACKS)} blocked"
        rows = ["| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |"
                for row in ATTACKS]
        table = [f"# Attacks tried by the test run of {made}", "",
                 f"{blocked}.", "",
                 "| attack | outcome | observed |", "|---|---|---|", *rows]
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "security-attacks.md").write_text("\n".join(table) + "\n")
        terminalreporter.section(f"attacks tried: {blocked} (test-artifacts/security-attacks.md)")
        for name, outcome, seen in ATTACKS:
            terminalreporter.write_line(f"{outcome:8} {name}: {seen}")
    if FILE_SECONDS:
        total = sum(FILE_SECONDS.values())
        wall = time.monotonic() - STARTED[0]
        busy, every = (now - then for now, then in zip(cpu.machine(), STARTED[1]))
        terminalreporter.section(f"where the time went: {total / 60:.1f} min in test files, {wall / 60:.1f} min from "
                                 f"start to end, the machine's {cpu.CORES} cores busy {100 * busy / every:.0f} % of it "
                                 f"(that CPU work alone needs {busy / cpu.CORES / 60:.1f} min on them); the slowest 20 "
                                 "files")
        for path, seconds in sorted(FILE_SECONDS.items(), key=lambda item: -item[1])[:20]:
            terminalreporter.write_line(f"{seconds:7.1f} s  {100 * seconds / total:4.1f} %  {path}")
        for line in timeline(wall):
            terminalreporter.write_line(line)
    if BENCH:
        terminalreporter.section(f"benchmarks (ratios against a baseline measured in the same run): {made}")
        for line in BENCH:
            terminalreporter.write_line(line)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "measured.md").write_text(f"# Measured by the test run of {made}\n\nRatios against a baseline "
                                               "measured in the same run (printed, never asserted).\n\n"
                                               + "".join(f"- {line}\n" for line in BENCH))
