"""jupyter-hpcai: interactive multi-node deep learning on HPC clusters from JupyterHub."""

__version__ = "0.1.0"
