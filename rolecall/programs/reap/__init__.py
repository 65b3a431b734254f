"""REAP (arXiv 2511.09966): decomposer, extractor, re-planner and synthesizer over a forking task plan."""

from rolecall.programs.reap.plan import PlanNode, TaskPlan
from rolecall.programs.reap.program import REAP

__all__ = ["REAP", "TaskPlan", "PlanNode"]
