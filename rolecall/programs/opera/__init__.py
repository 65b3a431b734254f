"""OPERA (arXiv 2508.16438): plan, analysis-answer, rewrite and synthesis agents."""

from rolecall.programs.opera.demos import default_opera_demos, opera_demos
from rolecall.programs.opera.program import OPERA, OPERAOptions, SubGoalResult

__all__ = ["OPERA", "OPERAOptions", "SubGoalResult", "opera_demos", "default_opera_demos"]
