"""The dev cluster is a real Slurm: nodes, GPU gres, multi-node jobs, PMIx MPI, start and stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.devcluster import SEPARATE, SHARED, DevCluster, check_prerequisites, own_hosts, slurm_change
from jupyter_hpcai.devcluster.cpu import NodeCPU
from jupyter_hpcai.devcluster.namespaces import NODE_IFACE, Network
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

pytestmark = pytest.mark.slurm

# A second cluster beside the session's: its own block, bridge and namespaces.
OTHER_NETWORK = {"network": "10.213.1.0/24", "bridge": "hpcait", "netns_prefix": "hpcait-"}

# Holds its GPUs until the file named by $1 exists, after each node has reported its GPUs.
HOLD_GPUS = """#!/bin/bash
srun --ntasks-per-node=1 bash -c 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
while [ ! -e "$1" ]; do sleep 0.1; done
"""


def test_nodes_idle_with_four_gpus(devcluster: DevCluster) -> None:
    def rows() -> set[tuple[str, ...]]:
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %T %G %P"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        return {tuple(line.split()) for line in out.splitlines()}

    idle = {(n, "idle", "gpu:4") for n in ("n1", "n2")}
    # an earlier test's job may still be completing on a node
    wait_until(lambda: {r[:3] for r in rows()} == idle, timeout=60, what=f"sinfo to show {sorted(idle)}")
    assert {r[3].rstrip("*") for r in rows()} == {"gpu", "debug", "cpu"}
    assert {(n.name, n.gpus) for n in slurm.nodes()} == {("n1", 4), ("n2", 4)}


def _gpu_lines(output: Path) -> dict[str, str] | None:
    """node -> CUDA_VISIBLE_DEVICES, once both nodes have written their line."""
    lines = output.read_text().split("\n")[:-1] if output.exists() else []
    found = dict(line.split(" ", 1) for line in lines)
    return found if len(found) == 2 else None


def test_two_node_gpu_jobs_get_distinct_gpus(devcluster: DevCluster, tmp_path: Path) -> None:
    script = tmp_path / "hold.sh"
    script.write_text(HOLD_GPUS)
    release = tmp_path / "release"
    jobs, seen = [], []
    try:
        for name in ("a", "b"):
            out = tmp_path / f"{name}.out"
            jobs.append(slurm.submit(["-N2", "--gpus-per-node=2", f"--output={out}", str(script), str(release)]))
            seen.append(wait_until(lambda: _gpu_lines(out), timeout=60, what=f"job {name} to report its GPUs"))
    finally:
        release.touch()
    first, second = seen
    assert set(first) == set(second) == {"n1", "n2"}
    assert first == {"n1": "0,1", "n2": "0,1"}
    for node in ("n1", "n2"):  # both jobs run at once on each node, on other GPUs
        assert not set(first[node].split(",")) & set(second[node].split(","))
        assert len(second[node].split(",")) == 2
    for job in jobs:
        wait_until(lambda: slurm.job_info(job)["JobState"] == "COMPLETED", timeout=60, what=f"job {job} to complete")


def test_srun_pmix_mpi_allreduce_across_nodes(devcluster: DevCluster) -> None:
    code = "from mpi4py import MPI; import os; c = MPI.COMM_WORLD; print(c.rank, os.environ['SLURMD_NODENAME'], c.allreduce(c.rank + 1))"
    done = subprocess.run(["srun", "--mpi=pmix", "-N2", "-n4", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split() for line in done.stdout.splitlines())
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert {r[1] for r in rows} == {"n1", "n2"}
    assert {r[2] for r in rows} == {"10"}


def test_up_twice_is_harmless(devcluster: DevCluster) -> None:
    before = devcluster.status().daemons
    devcluster.up()
    assert devcluster.status().daemons == before


def test_up_with_other_shape_while_running_is_refused(devcluster: DevCluster) -> None:
    with pytest.raises(HPCAIError, match="different dev cluster") as err:
        DevCluster(state_dir=devcluster.state_dir, nodes=1).up()
    assert "hpcai devcluster down" in err.value.hint


def _daemon_pids(state_dir: Path) -> list[int]:
    """Processes started with this cluster's SLURM_CONF in their environment."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"SLURM_CONF={state_dir}/slurm.conf".encode() in environ:
                pids.append(int(proc.name))
    return pids


def test_own_hosts_gives_a_command_an_etc_hosts_of_its_own(devcluster: DevCluster) -> None:
    """A second cluster's processes resolve n1, n2 in an /etc/hosts of their own: a copy without any dev cluster's
    block, written inside and gone with them, never the host's (this process's) file."""
    before = Path("/etc/hosts").read_text()
    assert f"# hpcai-devcluster {devcluster.state_dir} begin" in before  # this process's cluster names its nodes here
    inside = ('grep -c "hpcai-devcluster" /etc/hosts; echo "10.214.99.2 hpcai-probe" >> /etc/hosts; '
              'getent hosts hpcai-probe; "$0" -c "from jupyter_hpcai.devcluster import own_hosts as o; '
              'print(o.hosts_are_own())"')
    done = subprocess.run(own_hosts.command(["sh", "-c", inside, sys.executable]), capture_output=True, text=True,
                          timeout=60)
    blocks, probe, own = done.stdout.splitlines()
    assert (blocks, probe.split(), own) == ("0", ["10.214.99.2", "hpcai-probe"], "True"), done.stdout + done.stderr
    assert Path("/etc/hosts").read_text() == before
    assert subprocess.run(["getent", "hosts", "hpcai-probe"], capture_output=True, timeout=30).returncode != 0


def test_down_stops_everything_and_up_works_again(devcluster: DevCluster, tmp_path: Path) -> None:
    """A second, separate cluster (own state dir and ports) beside the session's one."""
    other = DevCluster(state_dir=tmp_path / "cluster", nodes=2, gpus_per_node=1, port=7817, first_job_id=500_001,
                       accounting=False, **OTHER_NETWORK)
    try:
        for _ in range(2):
            other.up()
            assert {(n.name, n.gpus, n.state) for n in slurm.nodes(other.environ())} == {("n1", 1, "idle"), ("n2", 1, "idle")}
            job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"], env=other.environ(),
                                 capture_output=True, text=True, timeout=30)
            assert int(job.stdout.strip()) >= 500_001, job.stdout + job.stderr  # its job ids are its own
            daemons = {d.pid() for d in other.daemons()}
            assert None not in daemons and len(daemons) == 4  # munged, slurmctld, two slurmd
            assert daemons <= set(_daemon_pids(other.state_dir))
            other.down()
            assert _daemon_pids(other.state_dir) == []
            assert not other.running()
        other.down()  # nothing running: harmless
    finally:
        other.down()
    assert all(devcluster.status().daemons.values()), "the session's cluster must be untouched"


def test_a_killed_cluster_comes_back_without_its_old_jobs_and_names_the_daemon_that_died() -> None:
    """A controller stopped with a job running saves the job: a cluster started again from nothing cancels it (it held
    the nodes, and the next session's jobs waited behind it), and keeps the jobs that ended (Slurm still tells them). A daemon that died during a session is
    named, with its log's end, in the session's summary (stopped_daemons)."""
    import shutil
    import signal
    import tempfile

    from jupyter_hpcai.devcluster.pytest_plugin import stopped_daemons

    # a short state folder: under pytest-xdist's tmp_path, slurmstepd's socket for the batch step passes Unix's 108
    # characters, and the job never starts
    short = Path(tempfile.mkdtemp(prefix="hpcai-killed-"))
    other = DevCluster(state_dir=short, nodes=1, gpus_per_node=1, port=7917, first_job_id=600_001,
                       accounting=False, **OTHER_NETWORK)
    try:
        other.up()
        env = other.environ()
        job = slurm.submit(["--output=/dev/null", "--wrap=sleep 600"], env=env)
        wait_until(lambda: (slurm.job_info(job, env) or {}).get("JobState") == "RUNNING", timeout=60, what="the job")
        assert stopped_daemons(other) == []
        ctld = next(d for d in other.daemons() if d.name == "slurmctld")
        os.kill(ctld.pid(), signal.SIGTERM)  # type: ignore[arg-type]  # it saves its state, the job in it
        wait_until(lambda: ctld.pid() is None, timeout=30, what="slurmctld to stop")
        said = "\n".join(stopped_daemons(other))
        assert "slurmctld had stopped before the session's end" in said and "Saving all slurm state" in said, said
        other.down()  # it cannot cancel the job without slurmctld
        other.up()
        assert (slurm.job_info(job, other.environ()) or {}).get("JobState") in (None, "CANCELLED")  # not RUNNING
        assert [n.state for n in slurm.nodes(other.environ())] == ["idle"]
    finally:
        other.down()
        shutil.rmtree(short, ignore_errors=True)


def test_missing_slurm_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("jupyter_hpcai.devcluster.cluster._SBIN_PATH", str(tmp_path))  # an empty PATH
    with pytest.raises(HPCAIError, match="Slurm is not installed") as err:
        check_prerequisites()
    assert "apt-get install -y slurm-wlm munge" in err.value.hint


def test_cli_without_root_says_so() -> None:
    """Run the real CLI as an unprivileged user (nobody); scripts/setup.sh lets every user run .venv."""
    if os.geteuid() != 0:
        pytest.fail("the dev-cluster tests run as root (they start Slurm daemons)")
    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(Path(sys.executable).parent / "hpcai"),
         "devcluster", "up", "--state-dir", "/tmp/hpcai-nobody-cluster"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], "HOME": "/tmp"},
    )
    assert done.returncode == 1, done.stderr
    assert "needs root" in done.stdout and "sudo" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


# On n1: listen on loopback and on the node's address, say so, answer each connection with the node's name.
LISTEN = """
import os, socket, sys, time
port, addr, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
socks = [socket.create_server((host, port)) for host in ("127.0.0.1", addr)]
open(ready, "w").write("listening")
deadline = time.monotonic() + 60
for s in socks:
    s.settimeout(0.2)
while time.monotonic() < deadline and not os.path.exists(ready + ".done"):
    for s in socks:
        try:
            conn, _ = s.accept()
        except TimeoutError:
            continue
        conn.sendall(os.environ["SLURMD_NODENAME"].encode())
        conn.close()
"""
# On n2 (and on the login node): what connecting to each address gives.
DIAL = """
import json, socket, sys
seen = {}
for host in sys.argv[2:]:
    try:
        with socket.create_connection((host, int(sys.argv[1])), timeout=5) as c:
            seen[host] = "answered by " + c.recv(16).decode()
    except OSError as err:
        seen[host] = type(err).__name__
print(json.dumps(seen))
"""


def test_nodes_are_separate_hosts(devcluster: DevCluster, tmp_path: Path) -> None:
    """A listener bound to loopback inside n1 is not reachable from n2 (nor from the login node); one on n1's
    address is, from both."""
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: {devcluster.note}")
    n1, n2 = devcluster.node_address("n1"), devcluster.node_address("n2")
    assert len({n1, n2, devcluster.login_address}) == 3 and not any(a.startswith("127.") for a in (n1, n2))
    ready, port = tmp_path / "ready", 47913
    listener = subprocess.Popen(["srun", "-N1", "-w", "n1", sys.executable, "-c", LISTEN, str(port), n1, str(ready)])
    try:
        wait_until(ready.exists, timeout=60, what="the listener on n1")
        dial = ["-c", DIAL, str(port), "127.0.0.1", n1]
        from_n2 = subprocess.run(["srun", "-N1", "-w", "n2", sys.executable, *dial], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        from_login = subprocess.run([sys.executable, *dial], capture_output=True, text=True, timeout=60,
                                    check=True).stdout
    finally:
        Path(f"{ready}.done").touch()
        listener.wait(timeout=60)
    print(f"from n2: {from_n2.strip()}\nfrom the login node: {from_login.strip()}")
    for seen in (json.loads(from_n2), json.loads(from_login)):
        assert seen == {"127.0.0.1": "ConnectionRefusedError", n1: "answered by n1"}
    routes = subprocess.run(["srun", "-N1", "-w", "n1", "ip", "route"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    assert routes.split() == [devcluster.network, "dev", NODE_IFACE, "proto", "kernel", "scope", "link", "src", n1], routes


def test_the_nodes_see_the_login_nodes_own_folders_empty_but_what_is_shared(devcluster: DevCluster) -> None:
    """/usr/local and /opt are the login node's own: empty on a node, but for the site's env roots and pip's
    wheelhouses inside them; the host's own view is untouched. The cluster as saved is the cluster asked for."""
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: {devcluster.note}")
    assert DevCluster.load(devcluster.state_dir) == devcluster  # `up` again, as a test that revives a node does
    shared = [f for f in devcluster.net.shared if f.startswith("/opt/")]
    seen = subprocess.run(["srun", "-N1", "-w", "n1", "bash", "-c", "ls -A /usr/local; echo --; ls -A /opt"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    local, opt = seen.split("--\n")
    assert local == "" and sorted(opt.split()) == sorted({f.split("/")[2] for f in shared}), seen
    assert any(Path("/usr/local").iterdir())  # the login node's own, still there for it
    for folder in shared:
        listed = subprocess.run(["srun", "-N1", "-w", "n2", "ls", "-A", folder], capture_output=True, text=True,
                                timeout=60, check=True).stdout.split()
        assert sorted(listed) == sorted(p.name for p in Path(folder).iterdir()), (folder, listed)


def test_every_address_of_the_cluster_is_named_in_hosts(devcluster: DevCluster) -> None:
    """slurmctld 24.11 looks up the name of every peer that connects: the login address and the nodes' resolve
    from /etc/hosts, never through DNS (which this machine cannot reach: each lookup held every other connection
    for its 5 s timeout, 20 squeue at once then took 5-10 s each)."""
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: {devcluster.note}")
    addresses = [devcluster.login_address, *map(devcluster.node_address, devcluster.node_names)]
    found = subprocess.run(["getent", "-s", "files", "hosts", *addresses], capture_output=True, text=True,
                           timeout=10).stdout
    names = dict(line.split()[:2] for line in found.splitlines())
    assert names == {devcluster.login_address: devcluster.net.login_name,
                     **{devcluster.node_address(n): n for n in devcluster.node_names}}, found


# Spins from the wall-clock time $1 to $2 and prints the CPU seconds it got meanwhile.
SPIN = """
import sys, time
start, end = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
used = time.process_time()
while time.time() < end:
    pass
print(time.process_time() - used)
"""


def _cpu_groups(cluster: DevCluster, text: str) -> list[str]:
    """The cpu cgroups named in /proc/PID/cgroup lines: the v1 cpu controller's, else the unified hierarchy's."""
    v1 = cluster.cpu.path.parent.name == "cpu"
    return [path for _, controllers, path in (line.split(":", 2) for line in text.splitlines())
            if ("cpu" in controllers.split(",") if v1 else controllers == "")]


def test_the_nodes_take_the_hosts_cpu_as_one_session(devcluster: DevCluster) -> None:
    """Every job step runs in the nodes' cpu cgroup, this host's processes do not; eight spinning jobs on the nodes
    together get about what one spinning process of the host gets (outside the cgroup each would get as much)."""
    if devcluster.cpu_note:
        pytest.skip(f"the nodes share this host's CPU as its own processes do: {devcluster.cpu_note}")
    groups = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "cat", "/proc/self/cgroup"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    assert _cpu_groups(devcluster, groups) == [f"/{devcluster.cpu.name}"] * 2, groups
    assert _cpu_groups(devcluster, Path("/proc/self/cgroup").read_text()) == ["/"]

    start = time.time() + 8  # time for srun to start the eight jobs
    window = [str(start), str(start + 3)]
    jobs = [subprocess.Popen(["srun", "-N1", "-w", f"n{1 + i % 2}", sys.executable, "-c", SPIN, *window],
                             stdout=subprocess.PIPE, text=True) for i in range(8)]  # each job a session of its own
    # the host's spinner in a session of its own too: the other test lane's processes share pytest's session
    host = subprocess.run([sys.executable, "-c", SPIN, *window], capture_output=True, text=True, timeout=60, check=True,
                          start_new_session=True)
    job_cpu = [float(job.communicate(timeout=60)[0]) for job in jobs]
    ratio = float(host.stdout) / (sum(job_cpu) / len(job_cpu))
    print(f"CPU seconds in a 3 s window: the host's spinner {float(host.stdout):.2f}, each of 8 jobs "
          f"{sum(job_cpu) / len(job_cpu):.2f} on average: {ratio:.1f} times as much")
    assert ratio > 3, job_cpu  # outside the cgroup: about 1


def test_without_a_cgroup_the_cpu_says_why(tmp_path: Path) -> None:
    """Where no cgroup can be made, up says why (and makes nothing), and down is harmless."""
    plain = tmp_path / "not-a-cgroupfs"  # a plain folder, as /sys/fs/cgroup is (a tmpfs) without a cpu hierarchy
    plain.mkdir()
    cpu = NodeCPU("hpcai-devcluster-test", root=plain)
    assert cpu.up() == f"no cgroup cpu controller under {plain}" and not cpu.path.exists()
    (plain / "cgroup.controllers").write_text("cpu io memory\n")  # a controller, but the cgroup cannot be made
    (plain / "cgroup.subtree_control").write_text("cpu\n")
    cpu.path.write_text("")
    assert cpu.up() == f"could not make the cgroup {cpu.path}: File exists"
    cpu.path.unlink()
    cpu.down()


def _leftovers(cluster: DevCluster) -> list[str]:
    """Namespaces, links, hosts lines of ``cluster``'s network and its cpu cgroup that exist now."""
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    found = [line for line in spaces.splitlines() if line.startswith(cluster.netns_prefix)]
    found += [line for line in links.splitlines() if f" {cluster.bridge}" in line or f"{cluster.bridge}-" in line]
    addresses = {cluster.node_address(n) for n in cluster.node_names} | {cluster.login_address}
    found += [line for line in Path("/etc/hosts").read_text().splitlines()
              if str(cluster.state_dir) in line or line.split()[:1] in ([a] for a in addresses)]
    return found + ([str(cluster.cpu.path)] if cluster.cpu.path.exists() else [])


# A test run that brings a cluster up, starts a job, and is then killed with SIGKILL.
KILLED_RUN = """
import sys, time
from pathlib import Path
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.devcluster import DevCluster
cluster = DevCluster(state_dir=Path(sys.argv[1]), nodes=2, gpus_per_node=1, port=7917, accounting=False,
                     **eval(sys.argv[2]))
cluster.up()
slurm.submit(["-N2", f"--output={sys.argv[1]}/job.out", "--wrap", "srun sleep 600"], env=cluster.environ())
print(cluster.mode, flush=True)
time.sleep(600)
"""


def test_down_after_a_killed_run_leaves_no_network_behind(devcluster: DevCluster, tmp_path: Path) -> None:
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: {devcluster.note}")
    state = tmp_path / "killed"
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(state), repr(OTHER_NETWORK)], stdout=subprocess.PIPE,
                           text=True)
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == SEPARATE
        cluster = DevCluster.load(state)
        wait_until(lambda: "RUNNING" in subprocess.run(["squeue", "-h", "-o", "%T"], env=cluster.environ(),
                                                       capture_output=True, text=True, timeout=30).stdout,
                   timeout=60, what="the killed run's job to run")
        assert len(_leftovers(cluster)) >= 2 + 3 + 4 + 1  # namespaces; bridge, veths; hosts block (2 lines, 2 marks); cgroup
    finally:
        run.kill()
        run.wait(timeout=30)
    done = subprocess.run([str(Path(sys.executable).parent / "hpcai"), "devcluster", "down", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _leftovers(cluster) == []
    assert _daemon_pids(state) == []
    assert all(devcluster.status().daemons.values()), "the session's cluster must be untouched"
    again = subprocess.run(done.args, capture_output=True, text=True, timeout=60)  # nothing left: harmless
    assert again.returncode == 0 and _leftovers(cluster) == [], again.stdout + again.stderr


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "unrecorded"])
def test_a_namespace_file_without_its_namespace_is_made_again(devcluster: DevCluster, tmp_path: Path,
                                                               recorded: bool) -> None:
    """A test worker makes its namespaces in a mount namespace of its own; killed, it leaves the files in
    /run/netns without the namespaces (CI hit this: nsenter answered EINVAL). `up` makes them again."""
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: {devcluster.note}")
    net = Network(tmp_path, ("n1", "n2"), OTHER_NETWORK["network"], OTHER_NETWORK["bridge"],
                  OTHER_NETWORK["netns_prefix"])
    stale = Path("/run/netns") / net.namespace("n1")
    stale.parent.mkdir(exist_ok=True)
    stale.touch()
    if recorded:
        (tmp_path / "network.json").write_text(json.dumps({"namespaces": [net.namespace("n1")]}))
    try:
        assert net.up() == ""
        for node in net.nodes:
            inside = subprocess.run([*net.exec_prefix(node), "ip", "-o", "-4", "addr", "show", NODE_IFACE],
                                    capture_output=True, text=True, timeout=30)
            assert inside.returncode == 0 and f"{net.address(node)}/" in inside.stdout, inside.stderr
    finally:
        net.down()
    assert not stale.exists()


def test_without_namespaces_up_says_so_and_the_nodes_share_loopback(devcluster: DevCluster, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without `ip` (or without the privilege): up falls back to one shared address and says why."""
    monkeypatch.setattr("jupyter_hpcai.devcluster.namespaces._IP_PATH", str(tmp_path))  # no `ip` found there
    other = DevCluster(state_dir=tmp_path / "cluster", nodes=2, gpus_per_node=1, port=8017, accounting=False, **OTHER_NETWORK)
    try:
        other.up()
        assert other.mode == SHARED and "`ip` was not found" in other.note and "iproute2" in other.note
        assert DevCluster.load(other.state_dir).mode == SHARED  # recorded for status and the tests
        assert slurm.node_addresses(["n1", "n2"], other.environ()) == {"n1": "127.0.0.1", "n2": "127.0.0.1"}
        assert {n.state for n in slurm.nodes(other.environ())} == {"idle"}
        assert not (other.state_dir / "network.json").exists()
    finally:
        other.down()


def test_clusters_started_at_once_each_set_sudos_path_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pytest-xdist worker's `up` writes sudo's secure_path at the same moment: none may lose its file to another
    (CI once failed 108 tests on `visudo: unable to open /etc/sudoers.d/.hpcai-devcluster.new`)."""
    (tmp_path / "sudoers.d").mkdir()
    monkeypatch.setattr(slurm_change, "SUDOERS", tmp_path / "sudoers.d" / "hpcai-devcluster")
    for n in (0, 1):
        for sub in ("bin", "sbin"):
            (tmp_path / f"slurm-{n}" / sub).mkdir(parents=True)
    prefixes = [str(tmp_path / f"slurm-{n % 2}") for n in range(8)]  # two Slurms, four clusters each, all at once
    with ThreadPoolExecutor(len(prefixes)) as pool:
        list(pool.map(slurm_change.set_sudo_path, prefixes))  # re-raises the first HPCAIError
    text = slurm_change.SUDOERS.read_text()
    assert any(f'secure_path="{tmp_path}/slurm-{n}/bin:{tmp_path}/slurm-{n}/sbin:/usr/local/sbin' in text
               for n in (0, 1)), text
    assert [p.name for p in (tmp_path / "sudoers.d").iterdir()] == ["hpcai-devcluster"], "a staged file was left"
    slurm_change.set_sudo_path("")  # the system's Slurm: Debian's own secure_path again
    assert not slurm_change.SUDOERS.exists()


@pytest.mark.parametrize("prefix, refused", [('/opt/x"\nALL ALL=(ALL) NOPASSWD: ALL\n#', "letters, digits"),
                                             ("/tmp", "may be written by others than root")])
def test_a_prefix_sudo_would_run_unsafely_is_refused(prefix: str, refused: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix goes into every user's sudo secure_path: no sudoers syntax in it, and no folder others can write."""
    (tmp_path / "sudoers.d").mkdir()
    monkeypatch.setattr(slurm_change, "SUDOERS", tmp_path / "sudoers.d" / "hpcai-devcluster")
    with pytest.raises(HPCAIError, match=refused):
        slurm_change.set_sudo_path(prefix)
    assert not slurm_change.SUDOERS.exists()


def _cgroups_to_make() -> Path:
    """Where a test makes Slurm-like cgroups: the v1 memory controller, else the unified hierarchy."""
    controller = next((c for c in (slurm_change.CGROUP_ROOT / "memory", slurm_change.CGROUP_ROOT)
                       if (c / "cgroup.procs").exists()), None)
    if os.geteuid() != 0 or controller is None:
        pytest.skip("making cgroups needs root and a mounted cgroup filesystem")
    return controller


def test_a_change_of_slurm_removes_the_empty_cgroups_the_other_left() -> None:
    """Real cgroups (of a node name no cluster uses): the empty ones go, deepest first; one with a process stays."""
    controller = _cgroups_to_make()
    top = controller / "slurm_hpcaitest"
    (top / "uid_1001" / "job_7" / "step_batch").mkdir(parents=True)
    (top / "uid_1002" / "job_8").mkdir(parents=True)
    busy = subprocess.Popen(["sleep", "60"])
    try:
        (top / "uid_1002" / "job_8" / "cgroup.procs").write_text(str(busy.pid))
        stayed = slurm_change.clear_slurm_cgroups(["hpcaitest"])
        assert not (top / "uid_1001").exists()
        assert set(stayed) == {top / "uid_1002" / "job_8", top / "uid_1002", top}
    finally:
        busy.kill()
        busy.wait()
        wait_until(lambda: not slurm_change.clear_slurm_cgroups(["hpcaitest"]), timeout=10,
                   what="the test's cgroups to go once their process has")
    assert not top.exists()


def test_the_cgroups_are_claimed_by_one_slurm_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node cgroups are the machine's, whatever the state folder: a cluster of the Slurm that made them keeps them, one
    of another Slurm removes them first, and is refused while a job of the other one still runs in them."""
    controller = _cgroups_to_make()
    monkeypatch.setattr(slurm_change, "CGROUP_LOCK", tmp_path / "claimed")
    job = controller / "slurm_hpcaitest" / "uid_1001" / "job_7"
    job.mkdir(parents=True)
    slurm_change.claim_slurm_cgroups("/opt/slurm-a", ["hpcaitest"])  # unknown maker: cleared
    assert not job.parent.parent.exists() and (tmp_path / "claimed").read_text() == "/opt/slurm-a\n"
    job.mkdir(parents=True)
    slurm_change.claim_slurm_cgroups("/opt/slurm-a", ["hpcaitest"])  # its own: kept
    assert job.exists()
    busy = subprocess.Popen(["sleep", "60"])
    try:
        (job / "cgroup.procs").write_text(str(busy.pid))
        with pytest.raises(HPCAIError, match="another Slurm's jobs still run in"):
            slurm_change.claim_slurm_cgroups("", ["hpcaitest"])  # the system's Slurm while a's job runs
        assert (tmp_path / "claimed").read_text() == "/opt/slurm-a\n"
    finally:
        busy.kill()
        busy.wait()
        wait_until(lambda: not slurm_change.clear_slurm_cgroups(["hpcaitest"]), timeout=10,
                   what="the test's cgroups to go once their process has")
    slurm_change.claim_slurm_cgroups("", ["hpcaitest"])
    assert (tmp_path / "claimed").read_text() == "\n"
