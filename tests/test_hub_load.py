"""The hub under load, its parts: one scheduler query per cycle for every spawner (real Slurm), and the bounded
submission queue."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from jupyter_hpcai import slurm
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.spawner.jobstate import JobStates, SubmitQueue


@pytest.mark.slurm
def test_one_scheduler_query_answers_every_spawner(devcluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    jobs = [str(slurm.sbatch(["--hold", "--time=00:05:00", f"--output={tmp_path}/j.out", "--wrap", "true"]))
            for _ in range(3)]
    try:
        states = JobStates()

        async def storm() -> list[dict[str, str] | None]:  # 30 polls at once, 10 per job
            return await asyncio.gather(*(states.info(job, interval=30) for job in jobs * 10))

        answers = asyncio.run(storm())
        assert [a["JobState"] if a else None for a in answers] == ["PENDING"] * 30, answers
        assert states.per_minute() == 1  # one squeue for all of them

        later = str(slurm.sbatch(["--hold", "--time=00:05:00", f"--output={tmp_path}/j.out", "--wrap", "true"]))
        jobs.append(later)
        found = asyncio.run(states.info(later, interval=30))  # not in this cycle's answer: asked on its own
        assert found and found["JobState"] == "PENDING" and states.per_minute() == 2
        assert asyncio.run(states.info("999999", interval=30)) is None  # unknown to Slurm: gone, after its own query

        subprocess.run(["scancel", jobs[0]], check=True, timeout=30)
        ended = asyncio.run(states.info(jobs[0], interval=0))  # a new cycle: the job is seen ending, not missing
        assert ended and ended["JobState"] in ("CANCELLED", "COMPLETING"), ended

        monkeypatch.setenv("PATH", str(tmp_path))  # the query cannot run: an error (the job kept), never "gone"
        with pytest.raises(HPCAIError, match="squeue: command not found"):
            asyncio.run(states.info(jobs[1], interval=0))
    finally:
        monkeypatch.undo()
        subprocess.run(["scancel", *jobs], timeout=30, check=False)


def test_submissions_wait_in_order_and_know_their_place() -> None:
    async def main() -> tuple[int, list[int], list[str], list[int]]:
        queue, running, most, order, places = SubmitQueue(), [0], [0], [], []
        release = asyncio.Event()
        tickets = [object() for _ in range(5)]

        async def submit(i: int) -> None:
            async with queue.slot(tickets[i], limit=2):
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(f"s{i}")
                await release.wait()
                running[0] -= 1

        tasks = [asyncio.create_task(submit(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        places.extend(queue.place(t) for t in tickets)
        tasks[3].cancel()  # a user who gave up leaves the queue; the others move up
        await asyncio.sleep(0.05)
        places.append(queue.place(tickets[4]))
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return most[0], places, order, [queue.place(t) for t in tickets]

    most, places, order, after = asyncio.run(main())
    assert most == 2  # never more than the limit at once
    assert places == [0, 0, 1, 2, 3, 2]  # two submitting, three waiting in order; then one fewer before the last
    assert order == ["s0", "s1", "s2", "s4"] and after == [0] * 5
