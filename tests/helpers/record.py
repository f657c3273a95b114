"""What a test run records besides pass and fail: the attacks tried (each blocked or not) and the benchmark
lines (ratios against a baseline measured in the same run); printed at the end and written to test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BENCH: list[str] = []  # benchmark lines (the bench fixture hands it out)
ATTACKS: list[tuple[str, str, str]] = []  # (attack, "blocked" or "LEAKED", what was observed)


def attack(name: str, blocked: bool, observed: str) -> None:
    """Record one attack's outcome for the run's table (printed, and written to test-artifacts/), then fail the
    test if it was not blocked: the table shows every attack tried, the leaks included."""
    ATTACKS.append((name, "blocked" if blocked else "LEAKED", observed))
    assert blocked, f"{name}: {observed}"


def report(terminalreporter: pytest.TerminalReporter) -> None:
    """The attack table and the benchmark lines, at the end of the run."""
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
    if BENCH:
        terminalreporter.section(f"benchmarks (ratios against a baseline measured in the same run): {made}")
        for line in BENCH:
            terminalreporter.write_line(line)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "measured.md").write_text(f"# Measured by the test run of {made}\n\nRatios against a baseline "
                                               "measured in the same run (printed, never asserted).\n\n"
                                               + "".join(f"- {line}\n" for line in BENCH))
