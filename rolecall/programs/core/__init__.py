"""Building blocks every rolecall program shares: the ``Program`` base, the trajectory, and the demo sources."""

from rolecall.programs.core.program import LMCallRecorder, Program, default_lm_kwargs, format_passages, parallel_map
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = ["Program", "LMCallRecorder", "Step", "Trajectory", "default_lm_kwargs", "format_passages", "parallel_map"]
