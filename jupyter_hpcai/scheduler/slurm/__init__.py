"""Slurm, the scheduler implemented: every member of ``interface.Scheduler``, from its commands (commands.py), its
part of a batch script (script.py), a job's variables (environment.py) and its client inside a container
(client.py). Version differences are handled where they show (e.g. ``gres_gpus`` reads both spellings of a job's
TresPerNode)."""

from __future__ import annotations

from . import client, environment
from .accounting import associations, job_end, qos_limits, recent_ends
from .versions import version
from .commands import (COMMANDS, PING, SUBMITTERS, cancel_argv, expand_hostlist, expected_start, follow_output, gres_gpus,
                       job_info, job_of_its_own, jobs_info, narrow_argv, node_address, node_addresses, nodes,
                       partitions, set_time_limit, shared_between_users, step, submit, test_only, test_script,
                       user_jobs)
from .script import (DEFAULT_OUTPUT, JOB_ID_IN_ENVIRON, JOB_ID_IN_SHELL, TASK_ENDED, WHOLE_ENVIRONMENT,
                     export_node_addresses, header, job_options, node_address_in_shell, rank_launch)

NAME = "slurm"

__all__ = ["COMMANDS", "DEFAULT_OUTPUT", "JOB_ID_IN_ENVIRON", "JOB_ID_IN_SHELL", "NAME", "PING", "SUBMITTERS", "TASK_ENDED",
           "WHOLE_ENVIRONMENT", "associations", "qos_limits", "cancel_argv", "client", "environment", "expand_hostlist",
           "expected_start", "export_node_addresses", "follow_output", "gres_gpus", "header", "job_end", "job_info",
           "job_of_its_own", "job_options", "jobs_info", "narrow_argv", "node_address", "node_address_in_shell",
           "node_addresses", "nodes", "partitions", "rank_launch", "recent_ends", "set_time_limit",
           "shared_between_users", "step", "submit", "test_only", "test_script", "user_jobs", "version"]
