"""A start's submission (runs in the hub): the user's log folder, the scheduler's test of the script, the script
submitted as the user, and the job id checked to be theirs. A mixin of HPCSlurmSpawner, replacing batchspawner's
run_command, submit_batch_script, parse_job_id and _get_batch_script."""

from __future__ import annotations

import asyncio
import re
import shlex
from typing import Any

from ..errors import HPCAIError
from ..scheduler import chosen
from .as_user import command_env, run_as_user
from .refusal import refused

scheduler = chosen()


class Submission:
    """Submits the spawner's job_script as its user (``_submit``), in the hub's submission queue."""

    async def _get_batch_script(self, **subvars: Any) -> str:
        return await asyncio.to_thread(self.job_script)  # sinfo and the site envs' scan: off the event loop

    async def run_command(self, cmd: str, input: str | None = None, env: dict[str, str] | None = None,
                          timeout: float = 60) -> str:
        """batchspawner's commands, run as argument lists: no shell ever sees them. ``env`` is the user's (sbatch
        gets get_env()); without one, a command gets COMMAND_ENV only, never the hub's environment."""
        code, out, err = await run_as_user(shlex.split(cmd), env if env is not None else command_env(), input,
                                            timeout, self.job_umask)
        if code is None:
            raise RuntimeError(f"{cmd.split()[0]} did not answer within {timeout:g} s")
        if code != 0:
            raise RuntimeError(err.decode().strip() or f"exit status {code}")
        return out.decode().strip()

    async def _submit(self) -> None:
        """Make the user's job log folder, ask the scheduler whether it would run the script, then submit it: in the
        hub's submission queue (a place per start, shown on its spawn page)."""
        async with self.queries.submission(self.user.name, self):
            as_user = self.exec_prefix.format(username=self.user.name)
            try:  # Slurm writes the log only into a folder that exists: the user makes it (root never does, there)
                await self.run_command(f"{as_user} install -d -m 0700 -- {shlex.quote(self.job_log_folder())}",
                                       timeout=10)
            except RuntimeError as err:
                raise refused(500, HPCAIError(f"could not make the job log folder {self.job_log_folder()} as "
                                               f"{self.user.name}: {err}", "tell the site's admins")) from None
            try:
                script = await asyncio.to_thread(self.job_script)
                await self.run_command(f"{as_user} {shlex.join(scheduler.test_script())}", input=script,
                                       env=self.get_env())
            except RuntimeError as err:
                said = re.sub(r"^[\w-]+: error: ", "", str(err))  # the command's own prefix ("sbatch: error: ")
                raise refused(400, HPCAIError(
                    f"the scheduler would not run this request: {said}",
                    "pick another partition, fewer nodes or GPUs, or a shorter walltime")) from None
            await self.submit_batch_script()

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
