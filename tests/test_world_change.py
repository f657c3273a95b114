"""The pure parts of a changing world: Horovod slots as horovodrun counts them, a grown rank's place before the
kernel re-forms the world, what %hpc shrink picks, and the grown job's script. The runs on the dev cluster are
test_elastic.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_hpcai.engines import membership
from jupyter_hpcai.engines.launch import Layout
from jupyter_hpcai.engines.running_set import Rank
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.ranks import world
from jupyter_hpcai.ranks.frameworks import horovod_slots, launch_hosts
from jupyter_hpcai.ranks.identity import RANK_VARS, first_int


def test_horovod_slots_count_local_and_cross_ranks_as_horovodrun_does() -> None:
    """What horovodrun's get_host_assignments gives for hosts a:2,b:1 (horovod/runner/common/util/hosts.py,
    Horovod 0.28.1, run by hand: this venv has no Horovod)."""
    slots = horovod_slots(["a", "a", "b"])
    assert [(s["rank"], s["local_rank"], s["local_size"], s["cross_rank"], s["cross_size"]) for s in slots] == [
        (0, 0, 2, 0, 2), (1, 1, 2, 0, 1), (2, 0, 1, 1, 2)]
    assert {s["size"] for s in slots} == {3}
    assert launch_hosts([2, 1]) == ["node0", "node0", "node1"]


def test_a_grown_rank_starts_past_the_world_and_takes_the_place_the_kernel_gives() -> None:
    env = {"SLURM_PROCID": "1", world.OFFSET: "4"}
    world.shift(env)
    assert first_int(env, RANK_VARS, -1) == 5  # never rank 1 of the world it joins
    env = {"SLURM_PROCID": "1"}
    world.shift(env)
    assert first_int(env, RANK_VARS, -1) == 1  # a rank of the first launch keeps its own


def _world(hosts: list[str], jobs: list[str]) -> SimpleNamespace:
    ranks = [Rank(i, h, "", 100 + i, i, job=j) for i, (h, j) in enumerate(zip(hosts, jobs))]
    return SimpleNamespace(ranks=ranks, layout=Layout(len(ranks), 2, 2, "srun"), grown={}, framework=None, warm=None)


def test_shrink_picks_the_last_nodes_and_never_the_notebooks_node() -> None:
    w = _world(["n1", "n1", "n2", "n2", "n3", "n3"], ["7", "7", "7", "7", "9", "9"])
    picked = membership.removable(w, nodes=1, ranks=None, node=None, keep="n1")  # type: ignore[arg-type]
    assert [r.rank for r in picked] == [4, 5]  # n3: the grown job's node, last in
    picked = membership.removable(w, nodes=2, ranks=None, node=None, keep="n1")  # type: ignore[arg-type]
    assert {r.host for r in picked} == {"n2", "n3"}
    with pytest.raises(HPCAIError, match="the notebook's own node stays"):
        membership.removable(w, nodes=3, ranks=None, node=None, keep="n1")  # type: ignore[arg-type]
    assert [r.rank for r in membership.removable(w, nodes=None, ranks=[2, 3], node=None, keep="n1")] == [2, 3]  # type: ignore[arg-type]
    with pytest.raises(HPCAIError, match="no rank 9"):
        membership.removable(w, nodes=None, ranks=[9], node=None, keep="n1")  # type: ignore[arg-type]
    with pytest.raises(HPCAIError, match="no rank runs on n7"):
        membership.removable(w, nodes=None, ranks=None, node="n7", keep="n1")  # type: ignore[arg-type]
    with pytest.raises(HPCAIError, match="every rank"):
        membership.removable(w, nodes=None, ranks=list(range(6)), node=None, keep="n1")  # type: ignore[arg-type]


def test_the_grown_job_asks_for_other_nodes_ends_with_the_notebook_job_and_joins_its_controller(tmp_path: Path) -> None:
    growth = membership.Growth(nodes=2, gpus_per_node=4, seconds=3600, partition="gpu", account="proj",
                               exclude=("n1", "n2"))
    w = SimpleNamespace(connection_file=tmp_path / "ipcontroller-x-engine.json", folder=tmp_path / "set",
                        telemetry_interval=2.0, cluster=SimpleNamespace(profile_dir=str(tmp_path), cluster_id="x"))
    script = growth.job_script(w, offset=8, log=str(tmp_path / "grow-%j.log")).render()  # type: ignore[arg-type]
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --time=01:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
                 "#SBATCH --no-kill", "#SBATCH --exclude=n1,n2", "export HPCAI_RANK_OFFSET=8",
                 f"export HPCAI_CONNECTION_FILE={tmp_path}/ipcontroller-x-engine.json", "--kill-on-bad-exit=0",
                 "-m jupyter_hpcai.ranks.boot --profile-dir", "--cluster-id x"):
        assert line in script, (line, script)


def test_the_grown_job_ends_with_the_notebook_job() -> None:
    """Its walltime is what the notebook job has left, less 30 s; a job too close to its end grows nothing."""
    import datetime as dt

    from jupyter_hpcai.scheduler.allocation import Allocation

    def allocation(left: float | None) -> Allocation:
        end = None if left is None else dt.datetime.now() + dt.timedelta(seconds=left)
        return Allocation(job_id="7", partition="gpu", nodes=["n1"], gpus_per_node=2, cpus_per_node=4, tasks=2,
                          gpus_here=["0", "1"], end_time=end)

    w = _world(["n1", "n1"], ["7", "7"])
    growth = membership.growth_for(allocation(3600), w, 1)  # type: ignore[arg-type]
    assert 3600 - 30 - 5 <= growth.seconds <= 3600 - 30 and growth.partition == "gpu" and growth.gpus_per_node == 2
    assert growth.exclude == ("n1",) and "#SBATCH --time=00:59:" in growth.job_script(
        SimpleNamespace(connection_file=Path("/c.json"), folder=Path("/set"), telemetry_interval=0.0,
                        cluster=SimpleNamespace(profile_dir="/p", cluster_id="x")), offset=2, log="/l").render()  # type: ignore[arg-type]
    assert membership.growth_for(allocation(None), w, 1).seconds == 24 * 3600 - 30  # type: ignore[arg-type]
    with pytest.raises(HPCAIError, match=r"the notebook job ends in (100|99) s"):
        membership.growth_for(allocation(100.5), w, 1)  # type: ignore[arg-type]


def test_a_profile_with_no_kill_asks_slurm_to_keep_the_job_when_a_node_fails() -> None:
    from jupyter_hpcai.spawner import script
    from jupyter_hpcai.spawner.options import Profile, SpawnOptions

    options = SpawnOptions(profile="p", partition="gpu", nodes=2, gpus_per_node=2, walltime="01:00:00")

    def rendered(no_kill: bool) -> str:
        return script.render(options, Profile(name="p", partition="gpu", no_kill=no_kill), user="alice",
                             homedir="/home/alice", keepvars="PATH", cmd=["server"], bind_node_address=False)

    assert "#SBATCH --no-kill\n" in rendered(True) and "--no-kill" not in rendered(False)


def test_the_grown_job_gets_no_secret_and_not_the_notebook_jobs_slurm_view(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, dict[str, str]] = {}

    class Script:
        def submit(self, env: dict[str, str], on_command_line: bool) -> str:
            seen["env"] = env
            return "1"

    for var, value in {"JUPYTERHUB_API_TOKEN": "secret", "SLURM_JOB_ID": "7", "SLURM_NTASKS_PER_NODE": "2",
                       "SLURM_CONF": "/etc/slurm/slurm.conf", "HPCAI_WORLD_RANK": "3", "PATH": "/env/bin"}.items():
        monkeypatch.setenv(var, value)
    membership.submit(Script())  # type: ignore[arg-type]
    env = seen["env"]
    assert "JUPYTERHUB_API_TOKEN" not in env and "SLURM_JOB_ID" not in env and "SLURM_NTASKS_PER_NODE" not in env
    assert "HPCAI_WORLD_RANK" not in env and env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and env["PATH"] == "/env/bin"


def test_every_framework_travels_to_the_ranks_by_pickle() -> None:
    """cells.py sends a Framework with the init call: a lambda in it fails every first cell of that framework."""
    import pickle

    from jupyter_hpcai.ranks.frameworks import FRAMEWORKS

    for framework in FRAMEWORKS.values():
        assert pickle.loads(pickle.dumps(framework)) == framework


class _World:
    """A stand-in RunningSet: its ranks, grown jobs, and the engines registered beyond them."""

    def __init__(self, ranks: list[Rank], grown: dict[str, tuple[int, int]], extra: dict[int, str]) -> None:
        from jupyter_hpcai.engines.running_set import Grown

        self.ranks, self.client, self.framework, self.warm = ranks, object(), None, None
        self.grown = {job: Grown(*g) for job, g in grown.items()}
        self.extra, self.adopted, self.removed_ranks = extra, {}, []  # type: ignore[var-annotated]

    def ranks_of(self, job: str) -> list[Rank]:
        return [r for r in self.ranks if r.job == job]

    def joined(self) -> list[int]:
        return sorted(self.extra)

    def identify(self, ids: list[int]) -> dict[int, dict[str, str]]:
        return {eid: {"job": self.extra[eid]} for eid in ids}

    def adopt(self, infos: dict[int, dict[str, str]]) -> None:
        self.adopted = infos

    def remove(self, ranks: list[Rank]) -> None:
        self.removed_ranks = ranks
        self.ranks = [r for r in self.ranks if r not in ranks]

    def write_rank_table(self) -> None:
        pass


def test_only_a_whole_grown_job_of_this_kernels_joins() -> None:
    ranks = [Rank(i, "n1", "", 1, i, job="7") for i in range(2)]
    w = _World(ranks, {"9": (1, 2)}, {5: "9", 6: "8"})  # 6: another job's engine
    assert not membership.take_joined(w)  # type: ignore[arg-type]  (one of job 9's two)
    w.extra[7] = "9"
    assert membership.take_joined(w) and sorted(w.adopted) == [5, 7]  # type: ignore[arg-type]


def test_shrinking_ranks_leaves_a_waiting_grown_job_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled: list[str] = []
    monkeypatch.setattr(membership, "cancel", cancelled.append)
    ranks = [Rank(i, "n1" if i < 2 else "n2", "", 1, i, job="7") for i in range(4)]
    w = _World(ranks, {"9": (1, 2)}, {})
    said, _ = membership.shrink(w, None, nodes=None, ranks=[3], node=None)  # type: ignore[arg-type]
    assert cancelled == [] and "9" in w.grown and "3 ranks now" in said
    said, _ = membership.shrink(w, None, nodes=1, ranks=None, node=None)  # type: ignore[arg-type]
    assert cancelled == ["9"] and said == "cancelled Slurm job 9 (still waiting); 3 ranks now"


@pytest.mark.parametrize(("n", "nodes", "layout"), [
    (None, None, (6, 3, 2)), (4, None, (4, 2, 2)), (5, None, (5, 3, 2)), (3, None, (3, 3, 1)), (2, None, (2, 2, 1)),
    (4, 2, (4, 2, 2)), (1, None, (1, 1, 1))])
def test_a_layout_names_the_nodes_block_placement_fills(n: int | None, nodes: int | None,
                                                         layout: tuple[int, int, int]) -> None:
    """-n 4 in a 3-node job of 2 GPUs each: 2 nodes of 2 ranks, as srun places them, so that each rank's Horovod
    slot (from Layout.counts) names the node it runs on; not 3 nodes that srun would fill 2, 1, 1."""
    from jupyter_hpcai.scheduler.allocation import Allocation
    from jupyter_hpcai.engines.launch import plan

    job = Allocation(job_id="7", partition="gpu", nodes=["n1", "n2", "n3"], gpus_per_node=2, cpus_per_node=4, tasks=6,
                     gpus_here=["0", "1"], end_time=None)
    found = plan(job, n=n, nodes=nodes, launcher="srun")
    assert (found.n, found.nodes, found.per_node) == layout
    assert sum(found.counts) == found.n and all(count > 0 for count in found.counts)
    with pytest.raises(HPCAIError, match=r"-n 4 at 2 per node fills 2 node\(s\), not 3") as err:
        plan(job, n=4, nodes=3, launcher="srun")
    assert "use --nodes 2, or -n 6" in err.value.hint
