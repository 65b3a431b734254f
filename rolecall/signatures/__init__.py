"""Typed role signatures, one module per system, and the shared value types they use."""

from rolecall.signatures.opera import AnalyzeAnswer, PlanSubGoals, RewriteQuery, SynthesizeAnswer
from rolecall.signatures.types import (
    CONFIDENCE_SCORES,
    NULL_ANSWERS,
    Confidence,
    Placeholder,
    SubGoal,
    Sufficiency,
    fill_placeholders,
    find_placeholders,
    hash_refs_to_placeholders,
    is_null_answer,
)

__all__ = [
    "AnalyzeAnswer",
    "PlanSubGoals",
    "RewriteQuery",
    "SynthesizeAnswer",
    "CONFIDENCE_SCORES",
    "NULL_ANSWERS",
    "Confidence",
    "Placeholder",
    "SubGoal",
    "Sufficiency",
    "fill_placeholders",
    "find_placeholders",
    "hash_refs_to_placeholders",
    "is_null_answer",
]
