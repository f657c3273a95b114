"""Site template: JupyterHub with jupyter-hpcai on a real Slurm GPU cluster. Copy it, then edit the marked lines.

Run the hub as root on a host that submits jobs, or as a user that sudo allows to run, as any hub user, the
commands it runs as them (exec_prefix "sudo -E -u {username}"): sbatch (and sbatch --test-only), scancel,
install (the job log folder) and timeout (with tail: a failed job's log).
"""

import sys

import jupyter_hpcai.spawner  # registers the hub's API handlers: our /hub/api/batchspawner (a port, nothing else; batchspawner's own is taken out), extend, continue

c = get_config()  # noqa: F821

# EDIT: where the hub's API listens, and the address your compute nodes reach it at (not 127.0.0.1). With
# hub_ip = "0.0.0.0", hub_connect_ip must name the login node's address on the compute nodes' network.
c.JupyterHub.hub_ip = "10.0.0.1"
c.JupyterHub.hub_connect_ip = "10.0.0.1"
c.JupyterHub.bind_url = "https://jupyter.example.org"
c.JupyterHub.cleanup_servers = False  # notebook jobs outlive a hub restart

# EDIT: your authenticator (PAM, LDAP, OAuth...). Hub users must be unix users of the cluster.
c.JupyterHub.authenticator_class = "pam"

c.JupyterHub.spawner_class = "jupyter_hpcai.spawner.HPCSlurmSpawner"
# The hub runs as root: no server for system accounts (uid below min_uid) or the accounts named here.
c.HPCSlurmSpawner.min_uid = 1000
c.HPCSlurmSpawner.denied_users = {"nobody"}
c.HPCSlurmSpawner.job_umask = 0o077  # job logs and what servers create are private to their user
c.Spawner.cmd = [f"{sys.prefix}/bin/jupyterhub-singleuser"]  # a python every compute node can run
c.HPCSlurmSpawner.batchspawner_singleuser_cmd = f"{sys.prefix}/bin/batchspawner-singleuser"
# Servers listen on their node's Slurm NodeAddr (the default, ""), where the hub connects; "0.0.0.0" for every
# interface. Inside a kernel, the engines' controller binds the NodeAddr too, and every rank talks on the
# interface holding its node's NodeAddr (Open MPI, Gloo, NCCL), unless OMPI_MCA_btl_tcp_if_include,
# HOROVOD_GLOO_IFACE, GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME are set (e.g. in a module or the job prologue).
c.HPCSlurmSpawner.bind_ip = ""
c.Spawner.default_url = "/lab"
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "HPCAI_ENV_PATH", "HPCAI_CONFIG"]
c.Spawner.start_timeout = 900  # queues can be long; the spawn page shows why a job waits
c.Spawner.poll_interval = 30
# Job logs: ~/.hpcai/logs/jupyterhub-JOBID.log (0600), each job deleting its user's logs older than 14 days.
# c.HPCSlurmSpawner.job_log_dir = ".hpcai/logs"
# c.HPCSlurmSpawner.job_log_max_age = 14
# batchspawner's settings that reach every job: req_memory (--mem), req_qos (--qos), req_reservation
# (--reservation), req_options (more #SBATCH options), req_prologue and req_epilogue (shell lines before and after
# the server), req_keepvars_extra (more variables passed), exec_prefix, batch_submit_cmd, batch_cancel_cmd. The
# others (batch_script, req_partition, req_runtime, req_srun, ...) stop the hub with what to use instead.
# c.HPCSlurmSpawner.req_qos = "interactive"
# c.HPCSlurmSpawner.req_prologue = "module load cuda/12.4"

# EDIT: profiles are starting points; users adjust nodes, GPUs, walltime, account and env within limits.
c.HPCSlurmSpawner.profiles = [
    {"name": "Interactive, 1 GPU", "partition": "gpu-interactive", "nodes": 1, "gpus_per_node": 1,
     "walltime": "02:00:00", "extra_sbatch": ["--qos=interactive"]},
    {"name": "Multi-node training, 2 x 4 GPUs", "partition": "gpu", "nodes": 2, "gpus_per_node": 4,
     "walltime": "08:00:00", "environment": "tf-horovod-nccl"},
]
# Limits come from sinfo (nodes, GPUs per node, MaxTime); these only narrow them.
c.HPCSlurmSpawner.limits = {"gpu": {"max_nodes": 8, "max_walltime": "1-00:00:00"}}
c.HPCSlurmSpawner.partitions = ["gpu", "gpu-interactive"]
# The walltime guard: Slurm signals each notebook job this many seconds before its walltime; the notebook and
# the side panel warn, and the ranks' walltime hooks (hpc.on_walltime: a checkpoint) run. 0: off. A profile's
# "walltime_warning" overrides it.
c.HPCSlurmSpawner.walltime_warning = 600
# %hpc extend and the side panel's Extend button: how long a notebook job may grow, per partition ("*": any
# other), never past the partition's own limit. Left empty, nobody extends (the hub runs scontrol as root).
# c.HPCSlurmSpawner.extend_max_walltime = {"gpu-interactive": "04:00:00"}
# %hpc continue: a follow-up notebook job with the same options, queued as the named server after-<job> to start
# when the current job ends (its start timeout covers the wait). Needs named servers; off without them. A
# named_server_limit_per_user counts stopped servers too: users delete old after-<job> ones from the home page.
c.JupyterHub.allow_named_servers = True
# Each user's servers at most (stopped ones count: old after-<job> servers are deleted from the home page); one
# follow-up per user waits at a time, and every pending start counts against concurrent_spawn_limit.
c.JupyterHub.named_server_limit_per_user = 5
# Environments offered in the form: left unset, every env the admins built into the site roots
# (`hpcai env build RECIPE --site`; HPCAI_ENV_PATH or [envs] site_roots in /etc/jupyter-hpcai/config.toml).
# c.HPCSlurmSpawner.environments = {"tf-horovod-nccl": "TensorFlow 2.15 + Horovod (NCCL)"}

# Last: stop here on a batchspawner setting HPCSlurmSpawner does not use (it names it and what to use instead).
jupyter_hpcai.spawner.compat.check(c)
