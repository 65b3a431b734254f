"""Building blocks every rolecall program shares: the ``Program`` base (roles, adapter groups, demo policy, forward that
records failures), options dataclasses, the trajectory, the plan graph, the bounded search loop, ``run_branches`` and
the demo sources."""

from rolecall.programs.core.calls import COMPLETED_MARKER, LMCallRecorder, default_lm_kwargs, salvage_fields
from rolecall.programs.core.demos import DEMO_POLICIES, DemoPolicy, Demos, built_in_demos
from rolecall.programs.core.options import PassageOptions, ProgramOptions, option, parse_option
from rolecall.programs.core.parallel import parallel_map, run_branches
from rolecall.programs.core.plan import PlanGraph, PlanStep, fill_references, find_references
from rolecall.programs.core.program import Program
from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.text import format_passages, fresh_first, shorten
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = [
    "Program",
    "ProgramOptions",
    "PassageOptions",
    "option",
    "parse_option",
    "DemoPolicy",
    "DEMO_POLICIES",
    "Demos",
    "built_in_demos",
    "Step",
    "Trajectory",
    "PlanGraph",
    "PlanStep",
    "find_references",
    "fill_references",
    "SearchLoop",
    "SearchAction",
    "Observation",
    "parallel_map",
    "run_branches",
    "format_passages",
    "fresh_first",
    "shorten",
    "LMCallRecorder",
    "COMPLETED_MARKER",
    "default_lm_kwargs",
    "salvage_fields",
]
