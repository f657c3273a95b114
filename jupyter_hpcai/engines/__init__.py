"""Engines: ipyparallel engines on the allocation's ranks, frameworks initialised on them, cells run on them."""

from .cluster import Engines, Rank, current
from .launch import LAUNCHERS, Layout, plan
from .output import OUTPUT_MODES, RankFailure

__all__ = ["LAUNCHERS", "OUTPUT_MODES", "Engines", "Layout", "Rank", "RankFailure", "current", "plan"]
