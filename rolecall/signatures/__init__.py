"""Typed role signatures, one module per system, and the shared value types they use.

Each system's module also holds its own value types (``rolecall.signatures.reap.FactTuple``, ...); only the signatures
and the shared types are re-exported here. Reading role outputs back (plans, actions, facts) is the programs' job:
``rolecall.programs.reap.parse``, ``rolecall.programs.stride.parse``, ``rolecall.programs.core.plan``, ....
"""

from rolecall.signatures.baselines import (
    AnswerFollowUp,
    AnswerFromPassages,
    AnswerFromReasoning,
    AnswerQuestion,
    AskFollowUp,
    GenerateWithPassages,
    NextReasoningSentence,
    ReActQuestion,
    SearchR1Turn,
)
from rolecall.signatures.d2plan import (
    Purify,
    ReasonerAnswer,
    ReasonerPlan,
    ReasonerRefine,
    ReasonerRevise,
    ReasonerStep,
)
from rolecall.signatures.opera import AnalyzeAnswer, PlanSubGoals, RewriteQuery, SynthesizeAnswer
from rolecall.signatures.reap import DecomposeTaskPlan, ExtractStructuredFact, RepairPlan, SynthesizeFromFacts
from rolecall.signatures.stride import (
    ConcretePlan,
    DirectPlan,
    ExtractFacts,
    FallbackAnswer,
    MetaPlan,
    ReasonAnswer,
    Supervise,
)
from rolecall.signatures.team import AnswerFromReports, DelegateOrAnswer, SearchOrReport
from rolecall.signatures.types import (
    CONFIDENCE_SCORES,
    NULL_ANSWERS,
    Confidence,
    Sufficiency,
    is_null_answer,
)

__all__ = [
    # baselines
    "AnswerQuestion",
    "AnswerFromPassages",
    "NextReasoningSentence",
    "AnswerFromReasoning",
    "GenerateWithPassages",
    "AskFollowUp",
    "AnswerFollowUp",
    "ReActQuestion",
    "SearchR1Turn",
    # REAP
    "DecomposeTaskPlan",
    "ExtractStructuredFact",
    "RepairPlan",
    "SynthesizeFromFacts",
    # MultiAgent-OPD teams
    "DelegateOrAnswer",
    "SearchOrReport",
    "AnswerFromReports",
    # D2Plan
    "ReasonerPlan",
    "ReasonerStep",
    "ReasonerRefine",
    "ReasonerRevise",
    "ReasonerAnswer",
    "Purify",
    # STRIDE
    "MetaPlan",
    "ConcretePlan",
    "DirectPlan",
    "Supervise",
    "ExtractFacts",
    "ReasonAnswer",
    "FallbackAnswer",
    # OPERA
    "AnalyzeAnswer",
    "PlanSubGoals",
    "RewriteQuery",
    "SynthesizeAnswer",
    "CONFIDENCE_SCORES",
    "NULL_ANSWERS",
    "Confidence",
    "Sufficiency",
    "is_null_answer",
]
