"""OPERA (arXiv 2508.16438): plan, analysis-answer and rewrite agents."""

from rolecall.programs.opera.program import OPERA, SubGoalResult

__all__ = ["OPERA", "SubGoalResult"]
