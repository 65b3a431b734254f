"""REAP (arXiv 2511.09966): decomposer, extractor, re-planner and synthesizer over a forking task plan."""

from rolecall.programs.reap.options import REAPOptions
from rolecall.programs.reap.plan import PlanNode, TaskPlan
from rolecall.programs.reap.program import REAP, RepairDecision

__all__ = ["REAP", "REAPOptions", "RepairDecision", "TaskPlan", "PlanNode"]
