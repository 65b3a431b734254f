"""Programs: rolecall's multi-agent systems and baselines as ``dspy.Module``\\ s, and their Trajectory Memory."""

from rolecall.programs.base import LMCallRecorder, Program, format_passages
from rolecall.programs.baselines import NoRetrievalCoT, SingleStepRAG
from rolecall.programs.demos import cot_demos, default_demos, opera_demos, rag_demos
from rolecall.programs.opera import OPERA
from rolecall.programs.trajectory import Step, Trajectory

__all__ = [
    "Program",
    "OPERA",
    "NoRetrievalCoT",
    "SingleStepRAG",
    "Trajectory",
    "Step",
    "LMCallRecorder",
    "format_passages",
    "default_demos",
    "opera_demos",
    "cot_demos",
    "rag_demos",
]
