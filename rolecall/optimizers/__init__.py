"""Weight optimizers (``dspy.Teleprompter`` s that update each role's LoRA adapter) and their building blocks."""

from rolecall.optimizers.mapgrpo import MAPGRPO, JointGRPO
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.opd import OPD, OPDConfig
from rolecall.optimizers.search_r1_grpo import SearchR1GRPO, SearchR1GRPOConfig
from rolecall.optimizers.sft import SFT, SFTConfig
from rolecall.optimizers.splanrl import SPlanRL, SPlanRLConfig
from rolecall.optimizers.stride_ft import STRIDEFT, STRIDEFTConfig

__all__ = [
    "MAPGRPO",
    "JointGRPO",
    "MAPGRPOConfig",
    "OPD",
    "OPDConfig",
    "SearchR1GRPO",
    "SearchR1GRPOConfig",
    "SFT",
    "SFTConfig",
    "SPlanRL",
    "SPlanRLConfig",
    "STRIDEFT",
    "STRIDEFTConfig",
]
