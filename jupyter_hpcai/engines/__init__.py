"""Engines: ipyparallel engines on the allocation's ranks, frameworks initialised on them, cells run on them."""

from .cluster import Engines, Rank, current
from .launch import LAUNCHERS, Layout, plan
from .run import OUTPUT_MODES, RankFailure, run_on_ranks

__all__ = ["LAUNCHERS", "OUTPUT_MODES", "Engines", "Layout", "Rank", "RankFailure", "current", "plan", "run_on_ranks"]
