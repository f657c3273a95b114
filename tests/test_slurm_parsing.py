"""Parsing of Slurm's text formats (no cluster needed)."""

import pytest

from jupyter_hpcai.slurm import expand_hostlist, gres_gpus, parse_key_values


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
    ("gres", "gpus"), [("gpu:4", 4), ("gpu:a100:2(S:0-1)", 2), ("(null)", 0), ("gpu:a100:2,gpu:v100:1", 3)]
)
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert gres_gpus(gres) == gpus


def test_parse_key_values() -> None:
    line = "JobId=7 JobName=x UserId=ana(1001) JobState=PENDING Reason=Resources TresPerNode=gres:gpu:2"
    info = parse_key_values(line)
    assert info["JobState"] == "PENDING" and info["Reason"] == "Resources" and info["TresPerNode"] == "gres:gpu:2"
