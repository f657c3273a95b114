"""Site template: JupyterHub with jupyter-hpcai on a real Slurm GPU cluster. Copy it, then edit the marked lines.

Run the hub as root (or a user allowed to `sudo -u <user> sbatch`) on a host that submits jobs.
"""

import sys

import batchspawner  # noqa: F401  registers the hub's /hub/api/batchspawner handler

c = get_config()  # noqa: F821

# EDIT: the address your compute nodes reach the hub at (not 127.0.0.1).
c.JupyterHub.hub_ip = "10.0.0.1"
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
c.HPCSlurmSpawner.bind_ip = "0.0.0.0"  # servers listen on their compute node; the hub connects to its NodeAddr
c.Spawner.default_url = "/lab"
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "HPCAI_ENV_ROOT"]
c.Spawner.start_timeout = 900  # queues can be long; the spawn page shows why a job waits
c.Spawner.poll_interval = 30

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
c.HPCSlurmSpawner.environments = {"tf-horovod-nccl": "TensorFlow 2.15 + Horovod (NCCL)"}
