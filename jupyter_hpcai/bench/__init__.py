"""Benchmarks: ResNet-50 scaling and the overhead of every layer."""
