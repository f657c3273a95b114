"""Parsing of Slurm's text formats (no cluster needed)."""

from pathlib import Path

import pytest

from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.scheduler.slurm.commands import expand_hostlist, gres_gpus, parse_job_line


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[01-02,07],login1", ["gpu01", "gpu02", "gpu07", "login1"]),
        ("a[9-10]-ib", ["a9-ib", "a10-ib"]),
    ],
)
def test_expand_hostlist(hostlist: str, names: list[str]) -> None:
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize(
    ("gres", "gpus"), [("gpu:4", 4), ("gpu:a100:2(S:0-1)", 2), ("(null)", 0), ("gpu:a100:2,gpu:v100:1", 3),
                       ("gres:gpu:2", 2), ("gres/gpu:a100:4", 4)]
)
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert gres_gpus(gres) == gpus


def test_a_job_record_keeps_its_fields_whatever_its_path_holds() -> None:
    line = "7|PENDING|ana|debug|1:00:00|N/A|N/A||n/a|0|2026-12-02T21:33:18|1|gres:gpu:1|afterany:6(unfulfilled)|Resources|normal|(null)|/home/ana/a|Partition=gpu|x%j.log|"
    info = parse_job_line(line)
    assert (info["JobState"], info["Partition"], info["TimeLimit"], info["Reason"]) == ("PENDING", "debug", "01:00:00",
                                                                                        "Resources")
    assert info["StartTime"] == "" and info["BatchHost"] == "" and info["ExitCode"] == "0:0" and info["UserName"] == "ana"
    assert info["Dependency"] == "afterany:6(unfulfilled)"
    assert info["StdOut"] == "/home/ana/a|Partition=gpu|x7.log"


def test_an_account_with_separators_moves_only_the_log_path() -> None:
    """Where the site keeps no accounting, a job's owner may set any Account text (scontrol update Account=)."""
    line = "7|RUNNING|ana|debug|1:00:00|N/A|N/A|n1|n1|0|2026-12-02T21:33:18|1|gres:gpu:1|(null)|None|debug|a|gpu|4-00:00:00|/home/ana/x%j.log|"
    info = parse_job_line(line)
    assert (info["Partition"], info["TimeLimit"], info["NumNodes"], info["TresPerNode"]) == ("debug", "01:00:00", "1",
                                                                                            "gres:gpu:1")
    assert info["Account"] == "a" and info["StdOut"] == "gpu|4-00:00:00|/home/ana/x7.log" and info["QOS"] == "debug"


def test_a_short_job_record_is_refused() -> None:
    with pytest.raises(HPCAIError, match="not a job record"):
        parse_job_line("7|PENDING|debug")


def test_a_job_missing_from_one_answer_is_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded slurmctld once answered a running job's squeue with no job: one such answer is not the job's end."""
    from jupyter_hpcai.scheduler.slurm import commands as slurm

    answers = iter([None, {"JobState": "RUNNING"}, None, {"JobState": "COMPLETED", "ExitCode": "0:0"}])
    monkeypatch.setattr(slurm, "job_info", lambda job_id: next(answers))
    log = tmp_path / "job.out"
    log.write_text("one\ntwo\n")
    seen: list[str] = []
    assert slurm.follow_output(7, log, seen.append, poll=0.01) == 0
    assert seen == ["one", "two"]
