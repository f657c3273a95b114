"""HPCSlurmSpawner: batchspawner's SlurmSpawner with profiles, a validated resource form, multi-node
jobs with one server on the first node, honest progress and failure reasons."""

from __future__ import annotations

import asyncio
import ipaddress
import pwd
import re
import socket
from pathlib import Path
from typing import Any, ClassVar

from batchspawner import JobStatus, SlurmSpawner
from tornado.web import HTTPError
from traitlets import Bool, Dict, Float, Integer, List, Set, Unicode, default

from ..contract import token_digest
from ..envs import EnvStore, open_env
from ..errors import HPCAIError
from ..scheduler import chosen
from ..scheduler.interface import TERMINAL_STATES
from . import compat, script
from .extend import JobExtension
from .fairness import StartShare
from .form import SpawnForm
from .liveness import ServerCheck
from .options import OptionsError, SpawnOptions
from .progress import StartProgress
from .queries import QuerySettings, SharedQueries
from .refusal import refused
from .submission import Submission

scheduler = chosen()
environment = chosen().environment

LAUNCHER = "hpcai-singleuser"  # the job's server start (server/singleuser.py)


def site_environments() -> dict[str, str]:
    """name -> display name of every env in the site's roots that opens (its kind, python and packages)."""
    store = EnvStore(site=None)
    found = {}
    for env_dir in store.list(scope="site"):
        if env_dir.name in found:
            continue  # an earlier site root's env of that name wins
        try:
            described = open_env(env_dir).describe()
        except HPCAIError:
            continue
        found[env_dir.name] = f"{env_dir.name} ({described['kind']}, python {described['python']})"
    return found


class HPCSlurmSpawner(SpawnForm, Submission, StartShare, ServerCheck, StartProgress, JobExtension,
                      SlurmSpawner):  # type: ignore[misc]
    """Notebook servers as scheduler jobs on GPU nodes, configured by profiles. Its parts, one job each: the form and
    the options validated once (form.py), the submission (submission.py), the user's share of starts
    (fairness.py), the check that the server on the job's port is the user's (liveness.py), what a start says
    (progress.py), and extend (extend.py); this class holds the settings, a start's and a job's life, and the
    state a restarted hub reads. ``REPLACES``: which of batchspawner's methods it replaces, and why."""

    REPLACES: ClassVar[dict[str, str]] = {  # batchspawner's methods (and JupyterHub's Spawner's) this replaces
        "__init__": "keeps the configured start_timeout: a follow-up's wait is added to it, never stacked",
        "options_from_form": "the form's values validated, once for the start that follows (form.py)",
        "options_from_query": "a link's choices fill the form and never start a server (form.py)",
        "_get_batch_script": "the one job script (script.py), not batchspawner's template, made off the event loop "
                             "(submission.py)",
        "run_command": "argument lists, never a shell; only COMMAND_ENV of the hub's environment; nothing of a "
                       "command outlives its call (submission.py, as_user.py)",
        "submit_batch_script": "no log line holding the environment (the server's token) or sbatch's output, which "
                               "is the user's to write (submission.py)",
        "parse_job_id": "exactly one line, a job id: anything else is refused, never read for a number "
                        "(submission.py)",
        "start": "the account policy, the user's share of starts, the options validated once, the log folder made "
                 "as the user, the scheduler's test first, the job's owner checked, a long hold cancelled, and the "
                 "server's identity proven before the hub routes to it",
        "poll": "a start a hub restart cut off is cancelled; a job whose server is gone from its port ends its route "
                "(liveness.py)",
        "query_job_status": "the hub's shared watcher (one query per cycle for every spawner), states read by name, "
                            "a failed query keeping the job",
        "state_gethost": "the node's address as the scheduler knows it, as one IP address",
        "progress": "the pending reason in words and the queue place, made once for every page (progress.py)",
        "get_state": "saves the digest of the server's token, and a start's 'starting' mark",
        "load_state": "reads them back: a restarted hub checks the server and cancels a start it cut off",
        "clear_state": "forgets the digest and the last proof with the job",
    }

    profiles = List(Dict(), config=True, help="""Profiles users pick from: dicts with name, partition, nodes,
        gpus_per_node, walltime, account, environment, cpus_per_gpu and mem_per_gpu (each rank's, one rank per GPU)
        and extra_sbatch (a list of admin-only sbatch options).""")
    limits = Dict(config=True, help="""Admin limits per partition, narrowing the scheduler's:
        {"gpu": {"max_nodes": 2, "max_gpus_per_node": 4, "max_walltime": "08:00:00"}}.""")
    partitions = List(Unicode(), config=True, help="Partitions offered (default: every partition Slurm reports).")
    environments = Dict(config=True, help="""Environments offered: hpcai env name -> display name. Empty (the
        default): every env in the site's roots (HPCAI_ENV_PATH, or the site config's envs.site_roots, else
        /opt/hpcai/envs), read when the form is shown. Never a user's own root: the hub reads only admins' folders.""")
    limits_ttl = Float(60, config=True, help="""Seconds the scheduler's partition limits are cached, and so are
        each user's associations, the site's QOS limits and projects' budgets, and the nodes' addresses.""")
    start_estimates = Bool(True, config=True, help="""Show on the form when Slurm expects each profile's job to
        start (sbatch --test-only as the user), and a shorter walltime that starts sooner.""")
    start_estimates_ttl = Float(30, config=True, help="Seconds a user's start estimates are cached.")
    job_state_interval = Float(1.0, config=True, help="""Seconds between the hub's queries of its jobs' states:
        one squeue per interval answers every spawner's poll, start loop and progress stream. 0: each spawner
        asks Slurm on its own (one scontrol per poll).""")
    max_concurrent_submits = Integer(8, config=True, help="""Submissions (sbatch --test-only, then sbatch) the hub
        runs at once; the others wait in order, and their spawn pages say their place.""")
    bind_ip = Unicode("", config=True, help="""Where the notebook server listens on its node. Empty (the default):
        the node's address as Slurm knows it (NodeAddr), found in the job; "0.0.0.0": every interface. The hub
        always connects to the node's NodeAddr.""")
    server_launcher = Unicode("", config=True, help="""The command that starts Spawner.cmd in the job:
        hpcai-singleuser, whose server reports its port to the hub once it listens there. Empty (the default): the
        hpcai-singleuser beside Spawner.cmd's first word (the same venv), or on the job's PATH when that is a bare
        name. Set it when Spawner.cmd is a wrapper outside the hub's venv.""")
    min_uid = Integer(1000, config=True, help="""The lowest unix uid a server may run as: system accounts (root,
        munge, slurm, daemons) are refused before anything is submitted.""")
    denied_users = Set(Unicode(), config=True, help="Unix accounts that never get a server, whatever their uid.")
    walltime_warning = Integer(600, config=True, help="""Seconds before a notebook job's walltime at which Slurm
        signals it (--signal=B:USR1@SECONDS): the notebook and the side panel warn, and the ranks' walltime hooks
        (hpc.on_walltime, e.g. a checkpoint) run. At most half the walltime; 0: off. A profile's walltime_warning
        overrides it.""")
    extend_max_walltime = Dict(config=True, help="""How far users may extend a running notebook job
        (%hpc extend, the side panel's Extend): partition (or "*" for any other) -> the longest walltime in all,
        e.g. {"gpu": "12:00:00"}; never past the partition's own limit, the job's QOS's MaxWall, nor what its
        project's GPU budget has left. Empty (the default): off.""")
    follows = Unicode("", help="""A job this server's next job starts after (set by the hub's /api/hpcai/continue
        for a follow-up, cleared once submitted): the script asks Slurm for --dependency=afterany:JOB.""")
    job_log_dir = Unicode(script.LOG_DIR, config=True, help="""The folder of each notebook job's log
        (jupyterhub-JOBID.log): relative to the user's home, or absolute with {username}. Made as the user (0700)
        before each submission; the job's umask keeps the logs the user's only. `hpcai logs` prints them.""")
    job_log_max_age = Integer(14, config=True, help="""Days a job log is kept: each notebook job deletes the
        user's older ones in job_log_dir as it starts. 0: never deleted.""")
    job_umask = Integer(0o077, config=True, help="""The umask jobs are submitted with (Slurm passes it to the job):
        the job's log, and what the server creates, are private to the user unless this allows more.""")
    max_pending_starts = Integer(2, config=True, help="""Servers one user may have starting at once, however they
        were asked for (the form, the REST API, named servers, a follow-up waiting for its job): one more is refused
        (429). Every start that waits counts against JupyterHub.concurrent_spawn_limit for everyone. 0: no limit.""")
    hub_api_per_minute = Integer(6, config=True, help="""Requests a minute each user may make of each endpoint
        jupyter-hpcai adds to the hub (a server's port report, extend, continue), and starts a minute, in bursts of as
        many: more are refused (429 with Retry-After). 0: no limit.""")
    held_start_timeout = Float(300, config=True, help="""Seconds a starting server's job may wait, in all, for its
        owner (held with scontrol hold: Slurm's reason JobHeldUser; or put off with a later BeginTime) before the hub
        cancels it, saying why on the spawn page: a held start counts against JupyterHub.concurrent_spawn_limit for
        everyone while it waits. 0: held as long as the start_timeout allows.""")

    _token_digest = ""  # the saved digest of the server's token (load_state), for a hub that restarted
    _queries: ClassVar[SharedQueries | None] = None  # the hub's one, made by the first spawner that asks
    _cancelling: asyncio.Future[bool] | None = None  # the cancel in flight

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._start_timeout = self.start_timeout  # as configured: a follow-up's wait is added to this, never stacked

    @property
    def queries(self) -> SharedQueries:
        """The hub's questions to the scheduler (queries.py), shared by every spawner, configured once: from the
        first spawner's settings, which are the hub config's (users cannot set them: apply_user_options is refused)."""
        if HPCSlurmSpawner._queries is None:
            settings = QuerySettings(self.limits_ttl, self.start_estimates_ttl, self.job_state_interval,
                                     self.max_concurrent_submits)
            HPCSlurmSpawner._queries = SharedQueries(settings, site_environments, self.log)
        return HPCSlurmSpawner._queries

    _options: SpawnOptions | None = None  # validated at the last start: what its job was submitted with (extend)
    _cut_off = False  # loaded from a state a start saved before it finished: that hub stopped mid-start

    @default("options_form")
    def _default_options_form(self) -> Any:
        return self._render_form

    # -- the batch script ------------------------------------------------------------------
    def job_script(self) -> str:
        """The script this spawner would submit for its user_options (also `hpcai spawner preview`)."""
        options, profile = self._valid()
        cmd = [self.launcher(), *self.cmd, *self.get_args()]
        if options.environment:
            cmd.append(f"--MappingKernelManager.default_kernel_name=hpcai-{options.environment.lower()}")
        keepvars = {*self.get_env(), *compat.extra_variables(self.req_keepvars_extra)}
        site = self._site_options()
        return script.render(options, profile, user=self.user.name, homedir=self._homedir(),
                             keepvars=",".join(sorted(keepvars)), cmd=[c for c in cmd if c],
                             logdir=self.job_log_folder(), log_days=self.job_log_max_age, site_options=site,
                             prologue=self.req_prologue, epilogue=self.req_epilogue, bind_node_address=not self.bind_ip,
                             walltime_warning=self.walltime_warning if profile.walltime_warning is None
                             else profile.walltime_warning, after=self.follows)

    def launcher(self) -> str:
        """server_launcher, else hpcai-singleuser beside the server command (the same venv), or from PATH when that is
        a bare name: it runs the server, which reports its port once it listens (server/port_report.py)."""
        if self.server_launcher:
            return self.server_launcher
        server = self.cmd[0] if self.cmd else "jupyterhub-singleuser"
        return str(Path(server).with_name(LAUNCHER)) if "/" in server else LAUNCHER

    def job_log_folder(self) -> str:
        """The user's job log folder: job_log_dir under their home, or as given with {username}."""
        folder = self.job_log_dir.format(username=self.user.name)
        return folder if folder.startswith("/") else f"{self._homedir()}/{folder}"

    def _homedir(self) -> str:
        try:
            return pwd.getpwnam(self.user.name).pw_dir
        except KeyError:
            raise HPCAIError(f"no unix user named {self.user.name} on the hub host",
                             "hub users must be unix users of the cluster") from None

    def check_account(self) -> None:
        """Refuse (HTTP 403) a server for an account the site does not allow: unknown to unix, a system account
        (uid below ``min_uid``) or one in ``denied_users``."""
        name = self.user.name
        if not re.fullmatch(r"[a-z_][a-z0-9_.-]*", name):  # it becomes a word of exec_prefix: a unix name only
            raise refused(403, HPCAIError(f"no notebook server for {name!r}: not a unix account name",
                                           "log in with your cluster account"))
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            raise refused(403, HPCAIError(f"no unix user named {name} on the hub host",
                                           "hub users must be unix users of the cluster")) from None
        if name in self.denied_users or uid < self.min_uid:
            why = "is in the site's denied users" if name in self.denied_users else \
                f"is a system account (uid {uid}, below {self.min_uid})"
            raise refused(403, HPCAIError(f"no notebook server for {name}: the account {why}",
                                           "log in with your own user account"))

    # -- the job's life --------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        self.ip, self.port, self._cut_off = self.bind_ip, 0, False
        try:  # a config that did not end with compat.check: a batchspawner setting never silently ignored
            compat.check(self.config)
        except HPCAIError as err:
            raise refused(500, err) from None
        try:
            self.check_account()
            self._check_share()
            try:
                self._options, _ = await asyncio.to_thread(self._valid)
            except OptionsError as err:
                raise refused(400, err) from None
            self._held_for, self._held_seen = 0.0, None
            await self._submit()
        finally:  # the next start checks its options again: the limits or the site's environments may have changed
            self._validated = None
        # only this job waits for that one: a later start of this server neither waits nor gets its longer timeout
        self.follows, self.start_timeout = "", self._start_timeout
        if not self.job_id:
            raise HPCAIError("sbatch returned no job id", "see the hub log")
        self._remember_job()
        await self._check_owner()
        while (status := await self.query_job_status()) != JobStatus.RUNNING:
            if status == JobStatus.NOTFOUND:
                raise HPCAIError(await self._failure_report("ended before it started running"))
            await self._cancel_a_long_hold()
            await asyncio.sleep(self.startup_poll_interval)
        self.ip = await asyncio.to_thread(self.state_gethost)  # sinfo: off the event loop
        while self.port == 0:  # set when the server reports in through the hub's batchspawner API
            if await self.query_job_status() == JobStatus.NOTFOUND:
                raise HPCAIError(await self._failure_report("ended before the Jupyter server started"))
            await asyncio.sleep(self.startup_poll_interval)
        await self._wait_until_listening()
        return self.ip, self.port

    def follow(self, job_id: str, seconds_left: int) -> None:
        """Make this server the follow-up of job ``job_id`` (hub_api's continue): its job starts once that one ends,
        and its start may take the rest of that job on top of the configured start_timeout (never on top of an
        earlier follow-up's)."""
        self.follows, self.start_timeout = job_id, self._start_timeout + seconds_left

    def token_digest(self) -> str:
        """SHA-256 of this server's hub token: from the token while this hub holds it, else as saved in the state
        (JupyterHub keeps no server token across its restarts); "" for none."""
        return token_digest(self.api_token) if self.api_token else self._token_digest

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if digest := self.token_digest():
            state["token_sha256"] = digest
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._cut_off = bool(state.get("starting"))
        self._token_digest = str(state.get("token_sha256", ""))

    def clear_state(self) -> None:
        super().clear_state()
        self._token_digest, self._last_proof, self._probing = "", 0.0, None

    async def poll(self) -> int | None:
        """batchspawner's poll, but a job whose start a hub restart cut off is cancelled at once: no hub waits for
        its server (this one would only give up on it after http_timeout), and its user may ask again now. A
        running job whose server is gone from its port is cancelled, and its route goes (``_server_gone``)."""
        if self._cut_off and not self._spawn_pending:
            self._cut_off = False
            self.log.warning("%s: the hub stopped while job %s was starting; cancelling it so that the user can "
                             "start again", self._log_name, self.job_id)
            await self.cancel_batch_job()
            self.clear_state()
            return 1
        status = await super().poll()
        if status is None and await self._server_gone():
            return 1
        return status

    async def _cancel_quietly(self) -> bool:
        """Cancel this spawner's job, if it has one; whether that worked (the caller says what went wrong). One
        cancel at a time: polls meanwhile wait for its answer (a user's stalled scancel never piles up)."""
        if not self.job_id:
            return True
        if self._cancelling is None or self._cancelling.done():
            self._cancelling = asyncio.ensure_future(self._cancel_once())
        return await asyncio.shield(self._cancelling)

    async def _cancel_once(self) -> bool:
        try:
            await self.cancel_batch_job()
        except Exception as err:  # scancel's failure, or no process to run it in
            self.log.error("%s: cancelling job %s failed: %s", self._log_name, self.job_id, err)
            return False
        return True

    async def _job_info(self) -> dict[str, str] | None:
        """Slurm's record of this spawner's job (the hub's shared queries: one of its jobs per cycle)."""
        return await self.queries.job_info(self.job_id, self.log)

    async def query_job_status(self) -> JobStatus:
        """Slurm's word on the job. A failed query is UNKNOWN (the job is kept), never 'gone'."""
        if not self.job_id:
            return JobStatus.NOTFOUND
        try:
            info = await self._job_info()
        except HPCAIError as err:
            self.log.warning("Slurm query for job %s failed, keeping the job: %s", self.job_id, err)
            return JobStatus.UNKNOWN
        if info is None:
            self.job_status = ""
            return JobStatus.NOTFOUND
        state = info.get("JobState", "")
        self.job_status, self._reason = f"{state} {info.get('BatchHost', '')}".strip(), info.get("Reason", "")
        if state in ("RUNNING", "COMPLETING"):
            return JobStatus.RUNNING
        if state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"):
            return JobStatus.PENDING
        if state in TERMINAL_STATES:
            return JobStatus.NOTFOUND
        # STOPPED, SIGNALING, STAGE_OUT, a state this code does not know: the job still holds its nodes, so it is
        # kept (a user who stops their own job must not make the hub forget it, and leave it running unseen)
        self.log.warning("%s: job %s is %r; keeping it", self._log_name, self.job_id, state)
        return JobStatus.UNKNOWN

    def state_gethost(self) -> str:
        """The address the hub reaches the first node at: Slurm's NodeAddr (node names may not resolve), as one IP
        address, so that the hub's check of the server and the proxy's route reach the same (one_address)."""
        host = self.job_status.split()[-1]
        return one_address(self.queries.node_address(host))


def preview(config_file: Path, options: dict[str, str], user: str) -> str:
    """The batch script the hub would submit for ``user`` with ``options``, from a hub config file."""
    spawner = offline_spawner(config_file, user)
    try:
        spawner.user_options = spawner._checked(options)
    except HTTPError as refusal:  # the site's account policy (check_account): as the hub would answer
        raise HPCAIError(f"the hub would refuse {user}: {refusal.log_message}",
                         "preview as a user the hub starts servers for") from None
    return spawner.job_script()


def one_address(host: str) -> str:
    """``host`` as one IP address: itself if it is one, else the first address it resolves to (the one a client
    tries first). A name resolved twice may give an IPv6 address once and an IPv4 one the next time, and another
    user may hold the same port on the other."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as err:
        raise HPCAIError(f"the node address {host} does not resolve on the hub ({err})",
                         "give the nodes a NodeAddr the hub resolves, or an IP address") from None


def offline_spawner(config_file: Path, user: str) -> HPCSlurmSpawner:
    """The spawner a hub with this config file would make for ``user``, without a hub (for previews)."""
    from types import SimpleNamespace

    from jupyterhub.objects import Hub
    from traitlets.config import PyFileConfigLoader

    config = PyFileConfigLoader(config_file.name, str(config_file.parent)).load_config()
    fake_user = SimpleNamespace(name=user, escaped_name=user, url=f"/user/{user}/", id=0, settings={},
                                server=None, orm_user=None, spawners={}, db=None)
    return HPCSlurmSpawner(config=config, user=fake_user, hub=Hub(), orm_spawner=None, api_token="(set at spawn)",
                           oauth_client_id="jupyterhub-user-preview")
