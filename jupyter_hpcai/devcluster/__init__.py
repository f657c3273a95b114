"""A real Slurm cluster of several nodes with fake GPUs, on one machine, for development and tests."""

from .cluster import SEPARATE, SHARED, DevCluster, check_prerequisites

__all__ = ["SEPARATE", "SHARED", "DevCluster", "check_prerequisites"]
