"""Session fixtures shared by every test (the dev cluster, and later the env, the hub, the browser)."""

pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]
