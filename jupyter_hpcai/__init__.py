"""jupyter-hpcai: interactive multi-node deep learning on HPC clusters from JupyterHub."""

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext jupyter_hpcai`: the %hpc and %%horovod_run magics."""
    from .magics import load

    load(ipython)
