"""The tests' helpers (fixtures live in conftest.py, nothing else does):

- ``record``: the attack table and the benchmark lines a run prints and writes to test-artifacts/;
- ``kernels``: a real kernel in a dev-cluster job, beside one (salloc), or in none; JupyterLab in a job;
- ``hub``: a real JupyterHub with the demo config, users, a logged-in Chromium page;
- ``jupyter``: a Jupyter server on this host, code run over a kernel's websocket;
- ``channel`` and ``envs``: the local conda channel, the small recipes, the shipped envs;
- ``image``: the small Debian image the container tests run.
"""
