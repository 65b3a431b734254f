"""STRIDE (SIGIR 2026): meta-planner, supervisor, extractor, reasoner and fallback over a state Ω = (S, P, F)."""

from rolecall.programs.stride.program import STRIDE, STRIDEOptions
from rolecall.programs.stride.state import StrideState, causal_rewrite_steps

__all__ = ["STRIDE", "STRIDEOptions", "StrideState", "causal_rewrite_steps"]
