"""Weight optimizers (``dspy.Teleprompter`` s that update each role's LoRA adapter) and their building blocks."""

from rolecall.optimizers.mapgrpo import MAPGRPO, JointGRPO
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.sft import SFT, SFTConfig
from rolecall.optimizers.stride_ft import STRIDEFT, STRIDEFTConfig

__all__ = ["MAPGRPO", "JointGRPO", "MAPGRPOConfig", "SFT", "SFTConfig", "STRIDEFT", "STRIDEFTConfig"]
