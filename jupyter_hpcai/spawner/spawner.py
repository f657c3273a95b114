"""HPCSlurmSpawner: batchspawner's SlurmSpawner with profiles, a validated resource form, multi-node
jobs with one server on the first node, honest progress and failure reasons."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import os
import pwd
import re
import secrets
import shlex
import signal
import socket
import time
from pathlib import Path
from typing import Any, ClassVar

from batchspawner import JobStatus, SlurmSpawner
from jupyterhub.utils import url_path_join
from tornado.httpclient import HTTPClientError
from tornado.iostream import StreamClosedError
from tornado.simple_httpclient import SimpleAsyncHTTPClient
from tornado.web import HTTPError
from traitlets import Bool, Dict, Float, Integer, List, Set, Unicode, default

from ..contract import IDENTITY_PATH, identity_proof, token_digest
from ..envs import EnvStore, open_env
from ..errors import HPCAIError
from ..scheduler import chosen
from ..scheduler.durations import format_duration, later, parse_duration
from ..scheduler.interface import TERMINAL_STATES
from . import compat, extend, form, script
from .fairness import SHARES, TooMany
from .options import FIELDS, Limit, OptionsError, Profile, SpawnOptions, merge_limits, validate
from .progress import Feed, pending_message
from .queries import QuerySettings, SharedQueries

scheduler = chosen()
environment = chosen().environment

LOG_TAIL_BYTES = 8192  # of a failed job's log, shown on the spawn page
LAUNCHER = "hpcai-singleuser"  # the job's server start (server/singleuser.py)
IDENTITY_BYTES = 4096  # of the answer to the hub's identity check
SILENT_FOR = 300.0  # seconds without a proof from a running server's port before its job is ended
HOLDS_ITS_PORT = ("SUSPENDED", "STOPPED", "RESIZING", "SIGNALING")  # a started job's processes live on: not probed
PROBE_EVERY = 10.0  # seconds: a running server's port is asked at most this often, however many polls want it
OWNER_WAITS = ("JobHeldUser", "BeginTime")  # a waiting job's reasons that are its owner's doing (held_start_timeout)
# All a command the hub runs as a user gets of the hub's own environment (which holds the hub's secrets, and
# which sudo -E would pass on for the user to read in /proc): nothing but where the programs and Slurm are.
COMMAND_ENV = ("PATH", "LANG", "LC_ALL", environment.CONFIG)


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


class HPCSlurmSpawner(SlurmSpawner):  # type: ignore[misc]
    """Notebook servers as Slurm jobs on GPU nodes, configured by profiles."""

    profiles = List(Dict(), config=True, help="""Profiles users pick from: dicts with name, partition, nodes,
        gpus_per_node, walltime, account, environment and extra_sbatch (a list of admin-only sbatch options).""")
    limits = Dict(config=True, help="""Admin limits per partition, narrowing the scheduler's:
        {"gpu": {"max_nodes": 2, "max_gpus_per_node": 4, "max_walltime": "08:00:00"}}.""")
    partitions = List(Unicode(), config=True, help="Partitions offered (default: every partition Slurm reports).")
    environments = Dict(config=True, help="""Environments offered: hpcai env name -> display name. Empty (the
        default): every env in the site's roots (HPCAI_ENV_PATH, or the site config's envs.site_roots, else
        /opt/hpcai/envs), read when the form is shown. Never a user's own root: the hub reads only admins' folders.""")
    limits_ttl = Float(60, config=True, help="Seconds the scheduler's partition limits are cached.")
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
        e.g. {"gpu": "12:00:00"}; never past the partition's own limit. Empty (the default): off.""")
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
    _last_proof = 0.0  # time.monotonic() of the running server's last proof (or of this hub's first look)
    _queries: ClassVar[SharedQueries | None] = None  # the hub's one, made by the first spawner that asks
    _reason = ""  # Slurm's reason for the job's state, at the last query
    _held_for = 0.0  # seconds this start's job has waited for its owner (_held), up to the last look
    _held_seen: float | None = None  # time.monotonic() of the last look, where it was waiting for its owner then
    _feed: Feed | None = None  # this start's spawn-page events, made once for every stream that reads them
    _report: tuple[str, asyncio.Future[str]] | None = None  # (job id, its failure report), made once per job
    _admitted = False  # this start passed the user's share (_check_share): it counts against their next ones
    _probing: tuple[float, tuple[str, int], asyncio.Future[str]] | None = None  # the last probe: when, where, answer
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
            HPCSlurmSpawner._queries = SharedQueries(settings, site_environments)
        return HPCSlurmSpawner._queries

    # the form's last rejected submission (or a link's choices), shown again with a message per field
    _rejected: tuple[dict[str, str], dict[str, str]] | None = None
    _from_link = False  # those choices came with a link (options_from_query): the form says nothing started
    _options: SpawnOptions | None = None  # validated at the last start: what its job was submitted with (extend)
    _validated: tuple[dict[str, Any], SpawnOptions, Profile] | None = None  # the last check (_validate), until its start
    _cut_off = False  # loaded from a state a start saved before it finished: that hub stopped mid-start

    @default("options_form")
    def _default_options_form(self) -> Any:
        return self._render_form

    # -- options ---------------------------------------------------------------------------
    def _profiles(self) -> list[Profile]:
        return [Profile(**p) for p in self.profiles]

    def _limits(self) -> dict[str, Limit]:
        """The scheduler's partition limits (cached), narrowed by the admin's."""
        return merge_limits(self.queries.partitions(), self.limits, list(self.partitions) or None)

    def _environments(self) -> dict[str, str]:
        return dict(self.environments) or self.queries.site_environments()

    def _validate(self, raw: dict[str, Any]) -> tuple[SpawnOptions, Profile]:
        """``raw`` checked against the profiles, the limits and the environments, and remembered: the start that
        follows (its check, its two scripts) uses these, and validates again only options that differ."""
        options, profile = validate(raw, self._profiles(), self._limits(), self._environments())
        self._validated = (options.model_dump(), options, profile)
        self.log.info("%s: options checked: %s", self._log_name, self._validated[0])
        return options, profile

    def _valid(self) -> tuple[SpawnOptions, Profile]:
        """user_options, validated once per start (_validate): the form's check, if they are what it returned."""
        raw = self.user_options or {}
        if self._validated is not None and self._validated[0] == raw:
            return self._validated[1], self._validated[2]
        return self._validate(raw)

    async def current_limits(self) -> dict[str, Limit]:
        return await asyncio.to_thread(self._limits)

    async def _render_form(self, spawner: Any = None) -> str:
        self.check_account()  # the estimates run sbatch as this user: never for an account the site refuses
        values, errors = self._rejected or ({}, {})
        note = form.FROM_LINK if self._from_link else ""
        self._rejected, self._from_link = None, False
        environments = await asyncio.to_thread(self._environments)
        profiles = self._profiles()
        said: dict[str, str] = {}
        if self.start_estimates:  # at most estimates.WAIT seconds more for the form; else the last ones
            prefix = shlex.split(self.exec_prefix.format(username=self.user.name))
            found = await self.queries.start_estimates(self.user.name, prefix, profiles, command_env())
            now = time.time()
            said = {name: e.words(now) for name, e in found.items()}
        return form.render(profiles, await self.current_limits(), environments, values, errors, said, note)

    async def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """The form's values, validated (sinfo and the site envs' scan run off the event loop)."""
        return await asyncio.to_thread(self._checked, {k: v[0] for k, v in formdata.items() if v}, True)

    async def options_from_query(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """A link's choices fill the form, and never start a server: whoever follows a link (another site's, or a
        message's) presses Start themselves, after reading what it asks for and whom it charges."""
        self._rejected = ({k: v[0] for k, v in query.items() if k in FIELDS and v}, {})
        self._from_link = True
        refusal = HTTPError(400, log_message="a spawn link's choices were put in the form, not started")
        refusal.jupyterhub_message = None  # type: ignore[attr-defined]  # the form says why, not "Error: ..."
        raise refusal

    def _checked(self, raw: dict[str, Any], remember: bool = False) -> dict[str, Any]:
        try:
            options, _ = self._validate(raw)
        except OptionsError as err:
            if remember:
                self._rejected = ({k: str(v) for k, v in raw.items()}, err.errors)
            raise
        return options.model_dump()

    # -- the batch script ------------------------------------------------------------------
    def job_script(self) -> str:
        """The script this spawner would submit for its user_options (also `hpcai spawner preview`)."""
        options, profile = self._valid()
        cmd = [self.launcher(), *self.cmd, *self.get_args()]
        if options.environment:
            cmd.append(f"--MappingKernelManager.default_kernel_name=hpcai-{options.environment.lower()}")
        keepvars = {*self.get_env(), *compat.extra_variables(self.req_keepvars_extra)}
        site = compat.sbatch_options({name: getattr(self, name) for name in (*compat.SBATCH, "req_options")})
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
            raise _refused(403, HPCAIError(f"no notebook server for {name!r}: not a unix account name",
                                           "log in with your cluster account"))
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            raise _refused(403, HPCAIError(f"no unix user named {name} on the hub host",
                                           "hub users must be unix users of the cluster")) from None
        if name in self.denied_users or uid < self.min_uid:
            why = "is in the site's denied users" if name in self.denied_users else \
                f"is a system account (uid {uid}, below {self.min_uid})"
            raise _refused(403, HPCAIError(f"no notebook server for {name}: the account {why}",
                                           "log in with your own user account"))

    async def _get_batch_script(self, **subvars: Any) -> str:
        return await asyncio.to_thread(self.job_script)  # sinfo and the site envs' scan: off the event loop

    async def run_command(self, cmd: str, input: str | None = None, env: dict[str, str] | None = None,
                          timeout: float = 60) -> str:
        """batchspawner's commands, run as argument lists: no shell ever sees them. ``env`` is the user's (sbatch
        gets get_env()); without one, a command gets COMMAND_ENV only, never the hub's environment."""
        code, out, err = await _run_as_user(shlex.split(cmd), env if env is not None else command_env(), input,
                                            timeout, self.job_umask)
        if code is None:
            raise RuntimeError(f"{cmd.split()[0]} did not answer within {timeout:g} s")
        if code != 0:
            raise RuntimeError(err.decode().strip() or f"exit status {code}")
        return out.decode().strip()

    # -- the job's life --------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        self.ip, self.port, self._cut_off = self.bind_ip, 0, False
        try:  # a config that did not end with compat.check: a batchspawner setting never silently ignored
            compat.check(self.config)
        except HPCAIError as err:
            raise _refused(500, err) from None
        self.check_account()
        self._check_share()
        try:
            self._options, _ = await asyncio.to_thread(self._valid)
        except OptionsError as err:
            raise _refused(400, err) from None
        self._held_for, self._held_seen = 0.0, None
        try:
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

    async def _submit(self) -> None:
        """Make the user's job log folder, ask the scheduler whether it would run the script, then submit it: in the
        hub's submission queue (a place per start, shown on its spawn page)."""
        async with self.queries.submission(self.user.name, self):
            as_user = self.exec_prefix.format(username=self.user.name)
            try:  # Slurm writes the log only into a folder that exists: the user makes it (root never does, there)
                await self.run_command(f"{as_user} install -d -m 0700 -- {shlex.quote(self.job_log_folder())}",
                                       timeout=10)
            except RuntimeError as err:
                raise _refused(500, HPCAIError(f"could not make the job log folder {self.job_log_folder()} as "
                                               f"{self.user.name}: {err}", "tell the site's admins")) from None
            try:
                await self.run_command(f"{as_user} {shlex.join(scheduler.test_script())}", input=await asyncio.to_thread(self.job_script),
                                       env=self.get_env())
            except RuntimeError as err:
                said = re.sub(r"^[\w-]+: error: ", "", str(err))  # the command's own prefix ("sbatch: error: ")
                raise _refused(400, HPCAIError(
                    f"the scheduler would not run this request: {said}",
                    "pick another partition, fewer nodes or GPUs, or a shorter walltime")) from None
            await self.submit_batch_script()

    def _check_share(self) -> None:
        """Refuse (429) a start over its user's share: more than hub_api_per_minute starts a minute (every start asked
        for counts: JupyterHub has written the server's records before it calls start), or max_pending_starts of
        theirs admitted by this check already (starts asked for at once are not refused for each other). No await
        between the count and the mark: starts at once are counted one after another."""
        self._admitted = False
        try:
            SHARES.take(self.user.name, "start", self.hub_api_per_minute)
        except TooMany as err:
            raise _refused(429, err) from None
        starting = sorted(s.name or "the default" for s in self.user.spawners.values()
                          if s is not self and s.pending == "spawn" and getattr(s, "_admitted", False))
        if self.max_pending_starts and len(starting) >= self.max_pending_starts:
            raise _refused(429, HPCAIError(
                f"{len(starting)} servers of {self.user.name}'s are starting already ({', '.join(starting)}), the "
                f"most this hub starts at once for one user", "wait until one has started, or stop one on the "
                "hub's home page"))
        self._admitted = True

    def follow(self, job_id: str, seconds_left: int) -> None:
        """Make this server the follow-up of job ``job_id`` (hub_api's continue): its job starts once that one ends,
        and its start may take the rest of that job on top of the configured start_timeout (never on top of an
        earlier follow-up's)."""
        self.follows, self.start_timeout = job_id, self._start_timeout + seconds_left

    def _held(self) -> float:
        """Seconds this start's job has waited, in all, for its owner: held (scontrol hold: JobHeldUser) or put off
        (a BeginTime the hub never sets), however often released and held again."""
        now = time.monotonic()
        if self._held_seen is not None:
            self._held_for += now - self._held_seen
        self._held_seen = now if self._reason in OWNER_WAITS else None
        return self._held_for

    async def _cancel_a_long_hold(self) -> None:
        """Cancel this start's job, and fail the start saying why, once its owner has held it (scontrol hold, or a
        later BeginTime) for held_start_timeout seconds in all: while it waits it counts against the hub's limit of
        starts at once."""
        held = self._held()
        if not self.held_start_timeout or held < self.held_start_timeout:
            return
        await self._cancel_quietly()
        raise _refused(409, HPCAIError(
            f"job {self.job_id} was held by {self.user.name} (scontrol hold) for {held:.0f} s, so the hub cancelled "
            "it: a start that waits counts against the hub's limit of starts at once, for everyone",
            "start again when the job may run; release a held start sooner (scontrol release JOBID)"))

    def parse_job_id(self, output: str) -> str:
        """sbatch --parsable's answer: exactly one line, a job id (";cluster" may follow). sbatch runs as the user,
        so its output is theirs to write: anything else is refused, never read for a number."""
        lines = output.strip().splitlines()
        if len(lines) != 1 or not re.fullmatch(r"\d+(;[\w.-]+)?", lines[0].strip()):
            self.log.error("%s: sbatch answered %d lines that are not one job id; refusing", self._log_name, len(lines))
            return ""
        return lines[0].strip().split(";")[0]

    async def submit_batch_script(self) -> str:
        """batchspawner's submission without its log lines: they held the environment (the server's token, at debug)
        and sbatch's output (the user's to write). Logged here: the user and the job id only."""
        script = await self._get_batch_script()
        cmd = " ".join([self.exec_prefix.format(username=self.user.name), self.batch_submit_cmd])
        self.job_id = self.parse_job_id(await self.run_command(cmd, input=script, env=self.get_env()))
        self.log.info("%s: submitted Slurm job %s", self._log_name, self.job_id or "(none)")
        return self.job_id

    async def _check_owner(self) -> None:
        """The job the hub will track, cancel and extend is this user's, as Slurm records it: an id sbatch's answer
        names that is another user's job, or no job Slurm knows, is refused."""
        info = await self._job_info()
        if info is None or info.get("UserName") != self.user.name:
            self.job_id = ""
            self._remember_job()  # no restarted hub may cancel (or track) that id
            raise HPCAIError(f"the job id sbatch answered is not a job of {self.user.name}",
                             "tell the site's admins: the hub's submissions are being tampered with")

    def _remember_job(self) -> None:
        """Save the job id now, marked as starting, not once the server is up: a hub restarted while this start
        waits finds the job, and cancels it (poll), instead of leaving it to run unseen. JupyterHub saves the
        state again once the start has finished, without the mark."""
        if self.orm_spawner is not None and self.db is not None:
            self.orm_spawner.state = {**self.get_state(), "starting": True}
            self.db.commit()

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

    async def _server_gone(self) -> bool:
        """Whether this started job's server is gone from its port, its route to go now (the job cancelled where it
        would run on): the job is no longer running (COMPLETING as its server ended, or requeued), so that its port is
        free for anyone on the node to take; or something else answers there (another user's process on the port the
        server gave up); or no proof came for SILENT_FOR seconds (nothing listens, or a squatter hangs on the probe
        alone; time, not probes: users' page loads poll too, and a server may stall a while on a slow file system).
        A job whose processes live on stopped (SUSPENDED, STOPPED), RESIZING or SIGNALING holds its port: kept unprobed.
        A job the cancel failed for is kept, to be tried again at the next poll."""
        server, job = self.server, self.job_id
        if self._spawn_pending or self._stop_pending or server is None or not (server.ip and server.port and job) \
                or not self.token_digest():
            return False
        state = (self.job_status.split() or [""])[0]
        if state in HOLDS_ITS_PORT:
            self._last_proof = time.monotonic()  # its grace counts from when it runs again
            return False
        if state != "RUNNING":
            self.log.warning("%s: job %s is %s; its server's port is no longer its own, so its route goes now",
                             self._log_name, job, state or "gone")
            if state != "COMPLETING" and not await self._cancel_quietly():  # a requeued job would run on unseen
                return False
            self.clear_state()
            return True
        found, asked = await self._probe(server.ip, server.port)
        if job != self.job_id or self._spawn_pending or self._stop_pending:  # it stopped or restarted meanwhile
            return False
        now = time.monotonic()
        if found == "proven":
            self._last_proof = asked
        elif not self._last_proof:
            self._last_proof = now  # a restarted hub counts from its first look
        if found == "proven" or (found in ("refused", "silent") and now - self._last_proof < SILENT_FOR):
            return False
        self.log.warning("%s: its server no longer answers on %s:%s (%s); cancelling job %s", self._log_name,
                         server.ip, server.port, found, job)
        if not await self._cancel_quietly():
            return False
        self.clear_state()
        return True

    async def _wait_until_listening(self) -> None:
        """Wait until this user's server answers on the port it reported and proves it holds the server's token
        (``_identity``). Whatever else answers there, such as another user's process on a port the server gave
        up, fails the start: the hub never routes a user to it. A server that dies at start (a broken config in
        the user's home, say) ends its job: the spawn then fails with the job's state and log, where JupyterHub,
        left to find it dead, would answer a bare 500."""
        while (found := await self._identity(self.ip, self.port)) in ("refused", "silent"):
            if await self.query_job_status() == JobStatus.NOTFOUND:
                raise HPCAIError(await self._failure_report("ended before the Jupyter server answered"))
            await asyncio.sleep(self.startup_poll_interval)
        if found == "proven":
            return
        await self._cancel_quietly()
        where = f"what answers on {self.ip}:{self.port}, the port {self.user.name}'s server reported,"
        raise HPCAIError(f"{where} has no jupyter_hpcai identity endpoint: the server extension is off in that "
                         "server's config, or it is not that server; the job was cancelled" if found == "no endpoint"
                         else f"{where} is not that server (it cannot prove it holds the server's token); the job "
                         "was cancelled", "start the server again; tell the site's admins if it happens again")

    async def _identity(self, ip: str, port: int) -> str:
        """What answers on ``ip:port``: "proven" (an HMAC of a fresh nonce under this server's token,
        contract.identity_proof), "refused" (nothing listens), "silent" (no HTTP answer: cut, timed out), "no
        endpoint" (404) or "not proven". The answer may be anyone's: at most IDENTITY_BYTES of body and 8 KiB of
        headers within 5 s, read by tornado's own client (JupyterHub may have made curl the default one), and only an
        exact body is taken."""
        nonce = secrets.token_hex(16)
        base = self.server.base_url if self.server is not None else self.user.url
        host = f"[{ip}]" if ":" in ip else ip
        client = SimpleAsyncHTTPClient(force_instance=True, max_body_size=IDENTITY_BYTES, max_header_size=8192)
        try:
            answer = await client.fetch(f"http://{host}:{port}{url_path_join(base, IDENTITY_PATH)}?nonce={nonce}",
                                        request_timeout=5, follow_redirects=False, raise_error=False)
        except ConnectionRefusedError:
            return "refused"
        except (OSError, StreamClosedError, HTTPClientError):
            return "silent"
        except Exception:  # an answer that is not HTTP tornado takes
            return "not proven"
        finally:
            client.close()
        if answer.code == 599:  # tornado's code for no HTTP answer
            return "silent"
        if answer.code == 404:
            return "no endpoint"
        proof = re.fullmatch(rb'\s*\{\s*"proof"\s*:\s*"([0-9a-f]{64})"\s*\}\s*', answer.body or b"")
        expected = identity_proof(self.token_digest(), nonce, port).encode()
        return "proven" if answer.code == 200 and proof and hmac.compare_digest(proof.group(1), expected) \
            else "not proven"

    async def _probe(self, ip: str, port: int) -> tuple[str, float]:
        """What answers on the running server's port (``_identity``) and when it was asked: asked at most once every
        PROBE_EVERY seconds, one probe at a time, however many polls want it (every load of a user's hub home page
        polls their servers)."""
        now = time.monotonic()
        if self._probing is None or self._probing[1] != (ip, port) \
                or (self._probing[2].done() and now - self._probing[0] >= PROBE_EVERY):
            self._probing = (now, (ip, port), asyncio.ensure_future(self._identity(ip, port)))
        asked, _, answer = self._probing
        return await asyncio.shield(answer), asked

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

    async def extend(self, seconds: int) -> dict[str, Any]:
        """Add ``seconds`` to the running job's time limit within ``extend_max_walltime`` (the hub runs scontrol:
        users cannot raise their own limit); the job's new limit and end. The policy refuses first, before any
        question to Slurm; then the job's record as it is now (the cycle's query may predate the last extend)."""
        options = self._options or (await asyncio.to_thread(self._valid))[0]  # a hub restarted since its start
        extend.allowed(self.extend_max_walltime, options.partition)
        info = await self.queries.fresh_job_info(self.job_id) or {}
        if info.get("JobState") != "RUNNING":
            raise HPCAIError(f"job {self.job_id} is not running ({info.get('JobState', 'gone')})",
                             "only a running notebook job can be extended")
        if changed := as_submitted(info, options, self.user.name):
            # its owner changed it (scontrol update Partition=, NumNodes=, Account= while pending, or a script
            # swapped in sbatch's stdin), or it is not this user's job: the policy was decided for the job submitted
            raise HPCAIError(f"job {self.job_id} is not the job the hub submitted for {self.user.name}: "
                             + "; ".join(changed), "only a notebook job as the hub submitted it can be extended")
        partition, old = options.partition, parse_duration(info.get("TimeLimit", "")) or 0
        limits = (await self.current_limits()).get(partition)
        wanted = extend.new_limit(self.extend_max_walltime, partition, old, seconds,
                                  limits.max_walltime if limits else None)
        limit = format_duration(wanted)
        await self.run_command(scheduler.set_time_limit(self.job_id, limit))
        self.log.info("Extended job %s of %s by %s s to %s", self.job_id, self.user.name, seconds, limit)
        # the end moves by what the limit grew (Slurm's EndTime: the start, the limit and any time suspended)
        return {"job_id": self.job_id, "time_limit": limit,
                "end_time": later(info.get("EndTime", ""), wanted - old)}

    def state_gethost(self) -> str:
        """The address the hub reaches the first node at: Slurm's NodeAddr (node names may not resolve), as one IP
        address, so that the hub's check of the server and the proxy's route reach the same (one_address)."""
        host = self.job_status.split()[-1]
        return one_address(scheduler.node_address(host))

    async def _failure_report(self, what: str) -> str:
        """What became of this start's job, with the last lines of its log: made once per job, however many ask
        (the start, and every spawn page watching it)."""
        if self._report is None or self._report[0] != self.job_id:
            self._report = (self.job_id, asyncio.ensure_future(self._report_on(what)))
        return await asyncio.shield(self._report[1])

    async def _report_on(self, what: str) -> str:
        info = await self._job_info() or {}
        state, reason, code = info.get("JobState", "gone"), info.get("Reason", ""), info.get("ExitCode", "")
        lines = [f"Job {self.job_id} {what}: state {state}" + (f", reason {reason}" if reason not in ("", "None") else "")
                 + (f", exit code {code}" if code else "")]
        if info.get("StdOut"):
            tail = await self._log_tail(info["StdOut"])
            # indented: in the hub's log, where this report lands too, no line the user wrote looks like the hub's own
            lines += [f"Last lines of {info['StdOut']}:", *(f"  | {line}" for line in tail)] if tail else []
        return "\n".join(lines)

    async def _log_tail(self, path: str, lines: int = 15) -> list[str]:
        """The last lines of the job's log, read as the job's user: the path is in their home, so they decide what
        it is (a link to a root-only file, a FIFO, a huge file), and the hub never opens it with its own rights.
        At most LOG_TAIL_BYTES, within a few seconds, off the event loop; nothing when the user cannot read it."""
        argv = [*shlex.split(self.exec_prefix.format(username=self.user.name)),
                "timeout", "5", "tail", "-c", str(LOG_TAIL_BYTES), "--", path]
        code, out, _ = await _run_as_user(argv, command_env(), None, 10, self.job_umask)
        if code != 0:
            return []
        text = out.decode(errors="replace")
        return ["".join(c for c in line if c.isprintable() or c == "\t") for line in text.splitlines()[-lines:]]

    async def progress(self) -> Any:
        """Spawn-page events: job id, state, the scheduler's pending reason and expected start. One watcher per start
        makes them (progress.Feed), however many pages read them: N streams cost the hub and Slurm what one does."""
        if self._feed is None or self._feed.owner is not self._spawn_future:
            self._feed = Feed(self._progress_events(), self._spawn_future)
        async for event in self._feed.read():
            yield event

    async def _progress_events(self) -> Any:
        """This start's events, each once, while it is pending (JupyterHub stops reading once the server is up)."""
        last = ""
        while self._spawn_pending:
            place = self.queries.place(self)
            if not self.job_id and place:
                message, pct = (f"Waiting to submit: number {place} in the hub's queue (it submits "
                                f"{self.max_concurrent_submits} requests at a time)"), 2
            elif not self.job_id:
                message, pct = "Checking the request with the scheduler and submitting the job...", 5
            else:
                try:
                    info = await self._job_info() or {}
                except HPCAIError:  # Slurm did not answer this time: say nothing new
                    await asyncio.sleep(1)
                    continue
                state = info.get("JobState", "")
                if state == "PENDING":
                    message, pct = pending_message(self.job_id, info.get("Reason", ""), info.get("StartTime", "")), 30
                    if self._held_seen is not None and self.held_start_timeout:  # said every 10 s, not every second
                        left = self.held_start_timeout - self._held_for
                        message += (f"; the hub cancels it in about {max(0, round(left, -1)):.0f} s unless it is "
                                    "released")
                elif state in ("RUNNING", "CONFIGURING"):
                    message, pct = (f"Job {self.job_id} is running on {info.get('NodeList', '?')}; "
                                    "waiting for the Jupyter server to start"), 70
                elif state and state not in TERMINAL_STATES:  # SUSPENDED, REQUEUED, STOPPED...: it may go on
                    message, pct = f"Job {self.job_id} is {state.lower()}", 50
                else:
                    yield {"progress": 100, "failed": True, "message": await self._failure_report("is not running")}
                    return
            if message != last:
                yield {"progress": pct, "message": message}
                last = message
            await asyncio.sleep(1)


def as_submitted(info: dict[str, str], options: SpawnOptions, user: str) -> list[str]:
    """How Slurm's record of a job differs from the job the hub submitted for ``user`` with ``options`` (its
    owner, partition, nodes, GPUs per node and account); nothing when it is that job."""
    wanted = {"owner": user, "partition": options.partition, "nodes": str(options.nodes),
              "GPUs per node": str(options.gpus_per_node), "account": options.account or info.get("Account", "")}
    found = {"owner": info.get("UserName", ""), "partition": info.get("Partition", ""),
             "nodes": info.get("NumNodes", ""), "GPUs per node": str(scheduler.gres_gpus(info.get("TresPerNode", ""))),
             "account": info.get("Account", "")}
    # Slurm keeps account names in lower case
    return [f"{what} {found[what] or '(none)'}, submitted {wanted[what]}" for what in wanted
            if found[what].lower() != wanted[what].lower()]


async def _run_as_user(argv: list[str], env: dict[str, str], input: str | None, timeout: float,
                       umask: int) -> tuple[int | None, bytes, bytes]:
    """Run a command (through exec_prefix: as the user) in a session of its own; its exit status (None when it did
    not end within ``timeout``), stdout and stderr. Whatever happens, nothing of it outlives the call: the user may
    stop their own process (kill -STOP) or hold its pipes, and killing sudo alone left both pipes open in the hub."""
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                umask=umask, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(input.encode() if input else None), timeout=timeout)
        return proc.returncode, out, err
    except asyncio.TimeoutError:
        return None, b"", b""
    finally:  # on a timeout, and on a cancelled start too (start_timeout)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc._transport.close()  # type: ignore[attr-defined]  # our pipe ends, whoever holds theirs (no public close)


def command_env() -> dict[str, str]:
    """All a command the hub runs as a user gets of the hub's environment (COMMAND_ENV)."""
    return {k: os.environ[k] for k in COMMAND_ENV if k in os.environ}


def _refused(status: int, err: HPCAIError) -> HTTPError:
    """A request the hub will not run: the REST API answers ``status`` with the reason, the spawn page shows it."""
    # logged on one line of printable characters: sbatch's words in it are the user's to write
    logged = " ".join("".join(c if c.isprintable() else " " for c in str(err)).split())
    refusal = HTTPError(status, log_message=logged.replace("%", "%%"))
    refusal.jupyterhub_message = err.jupyterhub_message  # type: ignore[attr-defined]
    if isinstance(err, TooMany):  # JupyterHub's handlers send an error's headers (as for its own 429s)
        refusal.headers = {"Retry-After": str(err.retry_after)}  # type: ignore[attr-defined]
    return refusal


def preview(config_file: Path, options: dict[str, str], user: str) -> str:
    """The batch script the hub would submit for ``user`` with ``options``, from a hub config file."""
    spawner = offline_spawner(config_file, user)
    spawner.user_options = spawner._checked(options)
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
