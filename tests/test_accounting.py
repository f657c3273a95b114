"""A real site's accounting: slurmdbd on MariaDB (the dev cluster's own, `hpcai devcluster up --accounting`), the
form from the user's associations, limits refused before sbatch, and how a job ended, in words."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.hub import BOB, USER, Hub, as_user, demo_config_with, ensure_user, progress_events
from jupyter_hpcai.devcluster import DevCluster
from jupyter_hpcai.devcluster.accounting import BUDGET_GPU_MINUTES, BUDGET_PROJECT, PROJECTS
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import RAN, wait_until
from jupyter_hpcai.scheduler.jobscript import JobScript
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.ends import explain
from jupyter_hpcai.scheduler.interface import Account, Associations, JobEnd, Qos
from jupyter_hpcai.scheduler.slurm import versions
from jupyter_hpcai.spawner.associations import problems
from jupyter_hpcai.spawner.form import render
from jupyter_hpcai.spawner.options import OptionsError, Profile, merge_limits, validate
from jupyter_hpcai.spawner.queries import SiteFacts
from jupyter_hpcai.scheduler.interface import Partition

PROFILE = Profile(name="gpu", partition="gpu", nodes=1, gpus_per_node=1, walltime="01:00:00")
LIMITS = merge_limits([Partition("gpu", 2, 2, 4, 8, 86400, True), Partition("debug", 2, 2, 4, 8, 7200)], {})
FOUND = Associations("ana", (Account("climate", (), ("debug", "normal"), "normal"),
                             Account("genomics", ("gpu",), ("normal",), "normal", 1200, 300)),
                     {"normal": Qos("normal", 14400), "debug": Qos("debug", 1800, 2)})


# -- without a cluster: the checks and the words -----------------------------------------------------

@pytest.mark.parametrize(("raw", "field", "message"), [
    ({"account": "climat"}, "account", "no association with account 'climat' (yours: climate, genomics)"),
    ({"account": "genomics", "partition": "debug"}, "partition", "account genomics may run on gpu only"),
    ({"account": "genomics", "qos": "debug"}, "qos", "may use QOS normal, not 'debug'"),
    ({"qos": "debug", "walltime": "01:00:00"}, "walltime", "longer than 00:30:00, the limit of QOS debug"),
    ({"qos": "debug", "walltime": "00:20:00", "nodes": "2", "gpus_per_node": "2"}, "gpus_per_node",
     "4 GPUs in all is more than the 2 QOS debug allows"),
    ({"account": "genomics", "nodes": "2", "gpus_per_node": "4", "walltime": "03:00:00"}, "account",
     "this job may use 24.0 GPU hours; project genomics has 15.0 left"),
])
def test_options_outside_the_associations_are_refused_with_the_choices(raw: dict[str, str], field: str,
                                                                       message: str) -> None:
    with pytest.raises(OptionsError) as err:
        validate({"profile": "gpu", **raw}, [PROFILE], LIMITS, {}, FOUND)
    assert message in err.value.errors[field], err.value.errors


def test_a_user_without_associations_is_told_to_ask_for_one() -> None:
    with pytest.raises(OptionsError) as err:
        validate({"profile": "gpu"}, [PROFILE], LIMITS, {}, Associations("bo", (), {}))
    assert err.value.errors == {"account": "bo has no association in the site's accounting, so no job of theirs can "
                                           "run: ask the site's admins for one"}


def test_the_default_account_and_its_qos_are_written_in() -> None:
    options, _ = validate({"profile": "gpu"}, [PROFILE], LIMITS, {}, FOUND)
    assert (options.account, options.qos) == ("climate", "normal")
    options, _ = validate({"profile": "gpu", "account": "Genomics"}, [PROFILE], LIMITS, {}, FOUND)
    assert options.account == "genomics", "Slurm keeps account names in lower case"
    options, _ = validate({"profile": "gpu"}, [PROFILE], LIMITS, {}, FOUND, site_qos="normal")
    assert (options.account, options.qos) == ("climate", ""), "the site's QOS is the site's to write"
    assert problems("climate", "debug", "gpu", 1, 1, 600, FOUND, "normal") == {
        "qos": "the site runs every server under QOS normal"}
    assert problems("climate", "", "gpu", 1, 1, 600, FOUND, "interactive") == {
        "qos": "account climate may use QOS debug, normal, not 'interactive'"}


def test_without_accounting_the_form_is_as_before() -> None:
    options, _ = validate({"profile": "gpu", "account": "anything"}, [PROFILE], LIMITS, {}, None)
    assert options.account == "anything" and options.qos == ""
    with pytest.raises(OptionsError, match="keeps no accounting"):
        validate({"profile": "gpu", "qos": "debug"}, [PROFILE], LIMITS, {}, None)
    page = render([PROFILE], LIMITS, {}, found=None)
    assert 'id="hpcai-account" name="account" value=""' in page and 'name="qos"' not in page


def test_the_form_offers_the_users_accounts_and_qos_with_their_limits() -> None:
    page = render([PROFILE], LIMITS, {}, found=FOUND)
    accounts = re.search(r'<select class="form-select" id="hpcai-account".*?</select>', page, re.S).group(0)
    assert re.findall(r">([^<>]+)</option>", accounts) == ["climate (default)", "genomics"]
    assert "partitions: gpu; QOS: normal; GPU hours left: 15.0 of 20" in accounts
    assert "max time 00:30:00, at most 2 GPUs per user" in page and "max time 04:00:00" in page


@pytest.mark.parametrize(("end", "words"), [
    (JobEnd("7", "OUT_OF_MEMORY", "0:125", 720, "n[1-2]", "8G", "7.9G", "n2"),
     "Job 7 ran out of memory on n2 after 12 min (asked for 8G); its largest step used 7.9G. Ask for more memory"),
    (JobEnd("7", "TIMEOUT", "0:0", 3600, "n1"), "Job 7 reached its time limit after 1 h. Ask for a longer walltime"),
    (JobEnd("7", "NODE_FAIL", "0:0", 65, "n1"), "Job 7: a node of n1 failed after 1 min."),
    (JobEnd("7", "PREEMPTED", "0:0", 30, "n1"), "Job 7 was preempted after 30 s by a job of higher priority"),
    (JobEnd("7", "CANCELLED", "0:0", 7500, "n1", cancelled_by="ana", owner="ana"),
     "Job 7 was cancelled by you after 2 h 5 min."),
    (JobEnd("7", "CANCELLED", "0:0", 60, "n1", cancelled_by="root", owner="ana"),
     "Job 7 was cancelled by root (an admin) after 1 min."),
])
def test_how_a_job_ended_in_words(end: JobEnd, words: str) -> None:
    assert explain(end).startswith(words)


def test_an_extension_the_projects_gpu_budget_cannot_pay_for_is_refused() -> None:
    """Slurm checks a budget when a job starts, not when the hub (root) raises its limit: the hub checks it, or the
    project would overrun and lose every running job."""
    from jupyter_hpcai.spawner.extend import within_budget

    genomics = FOUND.account("genomics")  # 1200 GPU minutes, 300 used: 15 GPU hours left
    within_budget(genomics, gpus=2, remaining=3600, add=6 * 3600)  # 2 GPUs x 7 h = 14 h: fits
    with pytest.raises(HPCAIError, match=r"project genomics has 15.0 GPU hours left; this job's 4 GPU\(s\) would "
                                         r"need 16.0") as refused:
        within_budget(genomics, gpus=4, remaining=3600, add=3 * 3600)
    assert refused.value.hint == "ask for at most 02:45:00 more"
    within_budget(FOUND.account("climate"), gpus=8, remaining=3600, add=86400)  # no budget: nothing to check


def test_a_qos_changed_after_submission_is_noticed_where_the_site_set_it() -> None:
    """The site's QOS (or the account's default) is what the job was submitted with, even where the form left the
    QOS empty: a job its owner moved to another QOS is not extended."""
    from jupyter_hpcai.spawner.extend import as_submitted
    from jupyter_hpcai.spawner.options import SpawnOptions

    options = SpawnOptions(profile="debug", partition="debug", nodes=1, gpus_per_node=1, walltime="00:20:00",
                           account="climate")
    info = {"UserName": "ana", "Partition": "debug", "NumNodes": "1", "TresPerNode": "gres/gpu:1",
            "Account": "climate", "QOS": "normal"}
    assert as_submitted(info, options, "ana", "debug") == ["QOS normal, submitted debug"]
    assert as_submitted(info, options, "ana", "normal") == []


def test_no_job_asks_for_gpus_both_ways() -> None:
    """Slurm 26.05 refuses --gres=gpu beside --gpus-per-node: every job script is refused before it is written."""
    with pytest.raises(HPCAIError, match="asks for GPUs both ways"):
        JobScript(name="x", gpus_per_node=2, extra=("--gres=gpu:2",)).render()
    JobScript(name="x", extra=("--gres=gpu:2",)).render()  # GPUs asked for one way only


def test_what_differs_between_slurm_versions() -> None:
    assert versions.cpus_per_task({"SLURM_CPUS_PER_TASK": "4"}) == ["--cpus-per-task=4"]
    assert versions.cpus_per_task({}) == [] and versions.cpus_per_task({"SLURM_CPUS_PER_TASK": "1"}) == []
    assert versions.job_end_time({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    assert versions.job_end_time({}) is None
    assert versions.expand_output("/h/a/jupyterhub-%j.log", "7", "a") == "/h/a/jupyterhub-7.log"
    assert versions.expand_output("/h/a/jupyterhub-7.log", "7", "a") == "/h/a/jupyterhub-7.log"
    words = f"printf '%s;' {versions.cpus_per_task_in_shell()} next"  # a batch script's rank launch, in bash
    for cpus, said in (("4", "--cpus-per-task=4;next;"), ("", "next;")):
        done = subprocess.run(["bash", "-c", words], env={"SLURM_CPUS_PER_TASK": cpus} if cpus else {},
                              capture_output=True, text=True, timeout=10)
        assert done.stdout == said, done


# -- against slurmdbd on MariaDB ---------------------------------------------------------------------

@pytest.mark.oldest_slurm
@pytest.mark.slurm
def test_the_dev_cluster_keeps_a_sites_accounting(devcluster: DevCluster) -> None:
    """slurmdbd on the cluster's own MariaDB, enforcing associations, limits and QOS: alice in both projects
    (climate her default), bob in one, the QOS limits and the GPU budget as sacctmgr set them."""
    ensure_user(USER)
    ensure_user(BOB)
    daemons = devcluster.status().daemons
    assert daemons["mariadbd"] and daemons["slurmdbd"], daemons
    assert "AccountingStorageEnforce=associations,limits,qos,safe" in devcluster.conf.read_text()
    alice = slurm.associations(USER)
    assert alice is not None and [a.name for a in alice.accounts] == list(PROJECTS)
    assert alice.qos["debug"] == Qos("debug", 1800, 2) and alice.qos["normal"] == Qos("normal", 14400)
    budget = alice.account(BUDGET_PROJECT)
    assert budget is not None and budget.gpu_minutes == BUDGET_GPU_MINUTES
    bob = slurm.associations(BOB)
    assert bob is not None and [a.name for a in bob.accounts] == [PROJECTS[0]]
    # the QOS limits and budgets are the site's: a hub keeps them for every user (SharedQueries' SiteFacts)
    site, before = SiteFacts(ttl=600), dict(RAN)
    assert [slurm.associations(u, site=site) for u in (USER, BOB, USER)] == [alice, bob, alice]
    ran = {name: RAN[name] - before.get(name, 0) for name in ("sacctmgr", "sshare")}
    assert ran == {"sacctmgr": 3 + 1, "sshare": 2}, ran  # each user's own; one QOS read; alice's projects once


@pytest.mark.oldest_slurm
@pytest.mark.slurm
def test_slurm_enforces_the_limits_the_form_shows(devcluster: DevCluster) -> None:
    """What the form refuses, sbatch refuses too (its own reason): a form that allowed more would only move the
    refusal after the submission."""
    ensure_user(USER)
    said = {}
    for name, args in {"qos": ["--qos=debug", "--time=01:00:00"],
                       "account": ["--account=climat"],
                       "budget": [f"--account={BUDGET_PROJECT}", "-N2", "--gpus-per-node=4", "--time=04:00:00"]}.items():
        done = as_user(USER, "sbatch", "--parsable", "--partition=gpu", "--output=/dev/null", *args, "--wrap=true",
                       timeout=60)
        assert done.returncode != 0, (name, done.stdout)
        said[name] = done.stderr
    assert "QOSMaxWallDurationPerJobLimit" in said["qos"]
    assert "Invalid account" in said["account"]
    assert "AssocGrpGRESMinutes" in said["budget"]


@pytest.fixture(scope="module")
def acct_hub(devcluster, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A hub whose profile's job runs out of memory: its batch step allocates past --mem (300M)."""
    ensure_user(USER)
    folder = tmp_path_factory.mktemp("acct-hub")
    config = demo_config_with(folder, """
c.HPCSlurmSpawner.profiles = [
    {"name": "1 node, 1 GPU (debug)", "partition": "debug", "nodes": 1, "gpus_per_node": 1, "walltime": "00:20:00"},
    {"name": "too big", "partition": "debug", "nodes": 1, "gpus_per_node": 1, "walltime": "00:20:00",
     "extra_sbatch": ["--mem=300M"]},
]
c.HPCSlurmSpawner.environments = {}
c.HPCSlurmSpawner.start_estimates = False
c.HPCSlurmSpawner.extend_max_walltime = {"debug": "02:00:00"}
c.HPCSlurmSpawner.req_prologue = 'if [ "${SLURM_MEM_PER_NODE:-}" = 300 ]; then srun --overlap -n1 python3 -c "b = [bytearray(50 << 20) for _ in range(40)]" || exit 1; fi'
""")
    hub = Hub(folder, config=config)
    hub.start()
    hub.api("POST", f"/users/{USER}")
    yield hub
    hub.stop(proxy=True)


@pytest.mark.oldest_slurm
@pytest.mark.slurm
def test_a_mistyped_account_is_refused_before_sbatch(acct_hub: Hub) -> None:
    status, body = acct_hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)",
                                                                     "account": "climat"})
    assert status == 400, body
    assert "no association with account 'climat' (yours: climate, genomics)" in body["message"], body
    assert "submitted" not in acct_hub.log.read_text().split("climat")[-1]
    jobs = subprocess.run(["squeue", "--noheader", f"--user={USER}"], capture_output=True, text=True, timeout=30)
    assert not jobs.stdout.strip(), jobs.stdout


@pytest.mark.oldest_slurm
@pytest.mark.slurm
def test_a_job_out_of_memory_is_said_on_the_hubs_page(acct_hub: Hub) -> None:
    """A step allocating past the job's --mem is killed by the memory cgroup; the spawn page reads sacct and says
    so, with the node, the time and what the job asked for."""
    status, body = acct_hub.api("POST", f"/users/{USER}/server", {"profile": "too big"})
    if status in (201, 202):  # still starting: the spawn page says how it failed
        body = wait_until(lambda: next((e for e in _events(acct_hub) if e.get("failed")), None), timeout=180,
                          what="the start to fail")
    assert re.search(r"ran out of memory on n\d (within a second|after \d+ s) \(asked for 300M\)", body["message"]), \
        str(body.get("message", body))  # a str, shown whole (a dict is shortened)
    wait_until(lambda: acct_hub.server(USER) is None or None, timeout=60, what="the failed server to clear")


def _events(hub: Hub) -> list[dict]:  # type: ignore[type-arg]
    try:
        return list(progress_events(hub, USER, timeout=120))
    except OSError:
        return []


@pytest.mark.slurm
def test_without_accounting_nothing_is_asked_of_it() -> None:
    """A cluster that keeps no accounting (accounting_storage/none): no associations, no job end, and the form
    as before."""
    # a short state folder: under pytest-xdist's tmp_path, slurmstepd's socket for the batch step passes Unix's 108
    # characters, and the job never starts (its slurmd says so)
    short = Path(tempfile.mkdtemp(prefix="hpcai-plain-"))
    cluster = DevCluster(state_dir=short, nodes=1, port=7417, separate_hosts=False, accounting=False,
                         first_job_id=700_001)
    cluster.up()
    try:
        env = cluster.environ()
        assert slurm.associations("root", env) is None
        job = slurm.submit(["--wrap=true", "--output=/dev/null"], env=env)
        wait_until(lambda: slurm.job_info(job, env) is None or slurm.job_info(job, env)["JobState"] == "COMPLETED"
                   or None, timeout=60, what="the job to end")
        assert slurm.job_end(job, env) is None
    finally:
        cluster.down()
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.slurm
def test_a_job_name_with_separators_moves_nothing_in_its_end(devcluster: DevCluster) -> None:
    """A job's owner writes its name and comment; the hub reads how the job ended from sacct's fixed fields only,
    so a name shaped like a record says nothing about the end."""
    from helpers.record import attack

    ensure_user(USER)
    forged = "x|OUT_OF_MEMORY|0:125|99|n9|1G|9G|root"
    done = as_user(USER, "sbatch", "--parsable", f"--job-name={forged}", f"--comment={forged}", "--output=/dev/null",
                   "--wrap=true", timeout=60)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    end = wait_until(lambda: slurm.job_end(job), timeout=90, what=f"job {job}'s end in the accounting")
    attack("a job's name and comment shaped like an accounting record steer what the hub says of its end",
           (end.state, end.owner, end.nodes) == ("COMPLETED", USER, end.nodes) and "n9" not in end.nodes
           and end.requested_memory != "1G", f"read back: {end}")


@pytest.mark.slurm
def test_the_panel_shows_the_projects_gpu_hours_left(acct_hub: Hub) -> None:
    """A server in the budgeted project: the side panel's allocation endpoint says the GPU hours its project has
    left, as the user's associations say them, read by the server (as the user) once for the panel's polls; its
    recent jobs say how the start that ran out of memory ended (test_a_job_out_of_memory_is_said_on_the_hubs_page,
    earlier in this file)."""
    from helpers.jupyter import Server

    status, body = acct_hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)",
                                                                     "account": BUDGET_PROJECT})
    assert status in (201, 202), body
    try:
        acct_hub.wait_ready()
        server = Server(acct_hub.user_url(USER), acct_hub.user_token(USER), Path("/dev/null"))
        status, alloc = server.request("GET", "/hpcai/api/allocation")
        assert status == 200 and alloc["in_job"], alloc
        budget = slurm.associations(USER).account(BUDGET_PROJECT)  # type: ignore[union-attr]
        assert alloc["budget"] == {"account": BUDGET_PROJECT, "gpu_hours": BUDGET_GPU_MINUTES / 60,
                                   "gpu_hours_left": budget.gpu_hours_left}, alloc  # type: ignore[union-attr]
        status, recent = server.request("GET", "/hpcai/api/recent-jobs")  # the panel's list: the failed start's end
        assert status == 200 and any("ran out of memory" in j["said"] and j["state"] == "OUT_OF_MEMORY"
                                     for j in recent["jobs"]), recent
    finally:
        acct_hub.stop_server()


@pytest.mark.slurm
def test_extend_stays_within_the_jobs_qos(acct_hub: Hub) -> None:
    """The hub (root) extends a job as Slurm would not let its owner: the site's policy allows 2 hours on debug, but
    the job runs under QOS debug (at most 30 minutes), so the hub refuses past it, and sets nothing in Slurm."""
    from helpers.hub import server_token
    from helpers.record import attack
    from jupyter_hpcai.scheduler.durations import parse_duration

    status, body = acct_hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)", "qos": "debug",
                                                                     "walltime": "00:20:00"})
    assert status in (201, 202), body
    try:
        acct_hub.wait_ready()
        job = str(acct_hub.server(USER)["state"]["job_id"])  # type: ignore[index]
        status, said = acct_hub.api("POST", "/hpcai/extend", {"seconds": 1800}, token=server_token(USER, job))
        after = parse_duration((slurm.job_info(job) or {}).get("TimeLimit", ""))
        attack("extend a debug-QOS job past its QOS's 30 minutes, through the hub's root", status == 409
               and "over 00:30:00, the most this site allows under QOS debug" in said.get("error", "") and after == 1200,
               f"HTTP {status}: {said}; time limit {after} s")
        status, said = acct_hub.api("POST", "/hpcai/extend", {"seconds": 600}, token=server_token(USER, job))
        assert status == 200 and said["time_limit"] == "00:30:00", said  # within the QOS: granted
    finally:
        acct_hub.stop_server()
