"""Weight optimizers (``dspy.Teleprompter`` s that update each role's LoRA adapter) and their building blocks."""

from rolecall.optimizers.mapgrpo import MAPGRPO
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.sft import SFT, SFTConfig

__all__ = ["MAPGRPO", "MAPGRPOConfig", "SFT", "SFTConfig"]
