"""JupyterHub config for the dev cluster (`hpcai demo`, and the tests).

Settings that differ per run come from the environment: HPCAI_HUB_DIR (state), HPCAI_HUB_PORT (and
HPCAI_HUB_INTERNAL_PORT, HPCAI_PROXY_API_PORT; default the two ports after it), HPCAI_HUB_HOST (the hub's name,
default hub.localhost; each user's server is at <user>.<that name>),
HPCAI_DEMO_PASSWORD (the DummyAuthenticator's shared password), HPCAI_DEMO_USERS (the accounts that may
log in with it, comma-separated; default hpcai-demo), HPCAI_HUB_API_TOKEN (an admin service token for
scripts), HPCAI_HUB_LOG_LEVEL (default INFO; the tests run the hub at DEBUG, to look for secrets in all it
logs), and the tests' HPCAI_JOB_STATE_INTERVAL and HPCAI_MAX_CONCURRENT_SUBMITS. Everything else is the site
config below.
"""

import os
import sys
from pathlib import Path

import jupyter_hpcai.spawner

from jupyter_hpcai.devcluster import DevCluster

c = get_config()  # noqa: F821
hub_dir = os.environ.get("HPCAI_HUB_DIR", "/var/lib/hpcai/hub")
port = int(os.environ.get("HPCAI_HUB_PORT", "8000"))
host = os.environ.get("HPCAI_HUB_HOST", "hub.localhost")  # the hub's name; each user's is <user>.<host>

c.Application.log_level = os.environ.get("HPCAI_HUB_LOG_LEVEL", "INFO")
c.JupyterHub.bind_url = f"http://127.0.0.1:{port}"  # users come through an ssh tunnel to this host
# One origin per user: the hub at hub.localhost, each user's server at <user>.hub.localhost. A page a user's server
# serves cannot read the hub's pages then, nor act there as whoever opens it (on one origin it could take their
# account). Browsers resolve every *.localhost name to loopback themselves: the tunnel needs no DNS entry.
c.JupyterHub.subdomain_host = f"http://{host}:{port}"
c.JupyterHub.cookie_host_prefix_enabled = True  # __Host- cookies: no user's subdomain can set the hub's
# ... which browsers take only when marked Secure: the servers' OAuth cookies are not where they see plain http (as
# here: browsers deem *.localhost secure), so every cookie is marked so
c.JupyterHub.tornado_settings = {"cookie_options": {"secure": True}}
# The hub's API listens where the servers on the nodes reach it: the login node's address on the dev cluster's
# bridge (loopback where the nodes share this host's address). hub_connect_ip is what the servers are told.
conf = os.environ.get("SLURM_CONF")
login = DevCluster.load(Path(conf).parent if conf else None).login_address
c.JupyterHub.hub_ip = login
c.JupyterHub.hub_connect_ip = login
c.JupyterHub.hub_port = int(os.environ.get("HPCAI_HUB_INTERNAL_PORT", port + 1))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('HPCAI_PROXY_API_PORT', port + 2)}"
c.JupyterHub.db_url = f"sqlite:///{hub_dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{hub_dir}/cookie_secret"
c.ConfigurableHTTPProxy.pid_file = f"{hub_dir}/proxy.pid"
c.JupyterHub.cleanup_servers = False  # notebook jobs outlive a hub restart and are picked up again
c.JupyterHub.cleanup_proxy = False

c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = os.environ.get("HPCAI_DEMO_PASSWORD", "")
# Only the demo's own accounts may log in with the shared password (never root, munge, slurm...); the spawner
# also refuses system accounts and denied users whatever the authenticator allowed.
c.Authenticator.allowed_users = set(os.environ.get("HPCAI_DEMO_USERS", "hpcai-demo").split(","))
c.HPCSlurmSpawner.min_uid = 1000
c.HPCSlurmSpawner.denied_users = {"nobody"}
if os.environ.get("HPCAI_HUB_API_TOKEN"):
    c.JupyterHub.services = [{"name": "hpcai-admin", "api_token": os.environ["HPCAI_HUB_API_TOKEN"]}]
    c.JupyterHub.load_roles = [{"name": "admin", "services": ["hpcai-admin"]}]

c.JupyterHub.spawner_class = "jupyter_hpcai.spawner.HPCSlurmSpawner"
# the hub's API for the notebook servers: the port a server reports (nothing else), extend, continue
jupyter_hpcai.spawner.hub_api.register()  # batchspawner's own /hub/api/batchspawner is taken out
c.Spawner.cmd = [f"{sys.prefix}/bin/jupyterhub-singleuser"]
# `hpcai demo` opens JupyterLab on the example notebook it copied into the demo user's home
notebook = os.environ.get("HPCAI_DEMO_NOTEBOOK")
c.Spawner.default_url = f"/lab/tree/{notebook}" if notebook else "/lab"
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "SLURM_CONF", "HPCAI_ENV_PATH", "HPCAI_CONFIG", "HPCAI_SCHEDULER"]
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 120
c.Spawner.poll_interval = 10
c.HPCSlurmSpawner.startup_poll_interval = 0.5
c.HPCSlurmSpawner.profiles = [
    {"name": "1 node, 1 GPU (debug)", "partition": "debug", "nodes": 1, "gpus_per_node": 1, "walltime": "01:00:00",
     "environment": "tf-horovod-cpu"},
    {"name": "2 nodes x 2 GPUs", "partition": "gpu", "nodes": 2, "gpus_per_node": 2, "walltime": "02:00:00",
     "environment": "tf-horovod-cpu", "no_kill": True,
     "start_engines": os.environ.get("HPCAI_DEMO_START_ENGINES", "1") == "1"},
]
c.HPCSlurmSpawner.environments = {"tf-horovod-cpu": "TensorFlow 2.15 + Horovod 0.28 (CPU)"}
c.HPCSlurmSpawner.limits = {"debug": {"max_walltime": "01:00:00"}, "gpu": {"max_walltime": "08:00:00"},
                            "cpu": {"max_gpus_per_node": 0, "max_nodes": 1}}
# %hpc extend / the side panel's Extend: gpu jobs up to 4 hours in all; debug jobs are not extended
c.HPCSlurmSpawner.extend_max_walltime = {"gpu": "04:00:00"}
# the spawn form's start estimates: a few users on one machine, whose queue changes in seconds
c.HPCSlurmSpawner.start_estimates_ttl = 5
# one squeue a second for every spawner's poll (0: each spawner asks Slurm on its own, as the load test compares)
c.HPCSlurmSpawner.job_state_interval = float(os.environ.get("HPCAI_JOB_STATE_INTERVAL", "1"))
c.HPCSlurmSpawner.max_concurrent_submits = int(os.environ.get("HPCAI_MAX_CONCURRENT_SUBMITS", "8"))
# %hpc continue queues a follow-up job as a named server (after-<job>) beside the running one
c.JupyterHub.allow_named_servers = True
# as the site template: each user's named servers at most (a pending start counts against concurrent_spawn_limit)
c.JupyterHub.named_server_limit_per_user = 5

# Last: stop here on a batchspawner setting HPCSlurmSpawner does not use (it names it and what to use instead).
jupyter_hpcai.spawner.compat.check(c)
