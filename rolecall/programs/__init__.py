"""Programs: rolecall's multi-agent systems and baselines as ``dspy.Module``\\ s, and their Trajectory Memory.

One package per system (``opera``, ``reap``, ``team``, ``d2plan``, ``stride``), ``baselines``, and ``core``: the
``Program`` base and the building blocks every program shares.
"""

from rolecall.programs.baselines import (
    IRCoT,
    IterRetGen,
    NoRetrievalCoT,
    ReActAgent,
    SearchR1Agent,
    SelfAsk,
    SingleStepRAG,
)
from rolecall.programs.baselines.direct_demos import cot_demos, rag_demos
from rolecall.programs.core.gold import gold_path
from rolecall.programs.core.options import ProgramOptions
from rolecall.programs.core.parallel import run_branches
from rolecall.programs.core.plan import PlanGraph
from rolecall.programs.core.program import LMCallRecorder, Program, format_passages, parallel_map
from rolecall.programs.core.search import SearchLoop
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.d2plan.facts import D2PlanFacts, d2plan_facts
from rolecall.programs.d2plan.program import D2Plan
from rolecall.programs.opera.demos import opera_demos
from rolecall.programs.opera.program import OPERA
from rolecall.programs.reap.program import REAP
from rolecall.programs.registry import default_demos
from rolecall.programs.stride.program import STRIDE
from rolecall.programs.stride.state import StrideState, causal_rewrite_steps
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam, tool_steps

__all__ = [
    "Program",
    "ProgramOptions",
    "PlanGraph",
    "SearchLoop",
    "run_branches",
    "gold_path",
    "OPERA",
    "REAP",
    "CascadedTeam",
    "HierarchicalTeam",
    "D2Plan",
    "STRIDE",
    "NoRetrievalCoT",
    "SingleStepRAG",
    "IRCoT",
    "IterRetGen",
    "SelfAsk",
    "ReActAgent",
    "SearchR1Agent",
    "Trajectory",
    "Step",
    "LMCallRecorder",
    "format_passages",
    "parallel_map",
    "tool_steps",
    "d2plan_facts",
    "D2PlanFacts",
    "StrideState",
    "causal_rewrite_steps",
    "default_demos",
    "opera_demos",
    "cot_demos",
    "rag_demos",
]
