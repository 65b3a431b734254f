"""STRIDE-FT (``seeds/stride.txt`` Sec. 3.3): STRIDE tunes its modules from its own executed runs."""

from rolecall.optimizers.stride_ft.optimizer import LEGS, STRIDEFT, STRIDEFTConfig
from rolecall.optimizers.stride_ft.selection import (
    Outcome,
    Run,
    causal_rewrites,
    clearly_better,
    concise_answer_targets,
    minimal_fact_targets,
    plan_text,
    preference_pairs,
    score_run,
)

__all__ = [
    "LEGS",
    "STRIDEFT",
    "STRIDEFTConfig",
    "Outcome",
    "Run",
    "causal_rewrites",
    "clearly_better",
    "concise_answer_targets",
    "minimal_fact_targets",
    "plan_text",
    "preference_pairs",
    "score_run",
]
