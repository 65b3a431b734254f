"""The training core every weight optimizer shares: samples, trajectory-to-sample conversion, losses, the trainer,
and the weight-optimizer base (stages, budget, checkpoints, resume, metrics)."""

from rolecall.optimizers.core.base import WeightOptimizer, WeightOptimizerConfig
from rolecall.optimizers.core.checkpoint import TrainingWriteError
from rolecall.optimizers.core.config import LossName, TrainerConfig
from rolecall.optimizers.core.eval_hook import EvalHook, EvalPoint
from rolecall.optimizers.core.interrupt import TrainingInterrupted
from rolecall.optimizers.core.logprobs import per_token_logps, reference_per_token_logps
from rolecall.optimizers.core.losses import LOSSES, dpo_loss, get_loss, nll_loss, token_advantage_loss
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import completion_target, encode_completion, mask_spans, samples_from_trajectory
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.core.trainer import AdapterTrainer

__all__ = [
    "WeightOptimizer",
    "WeightOptimizerConfig",
    "EvalHook",
    "EvalPoint",
    "Stage",
    "StepContext",
    "LOSSES",
    "AdapterTrainer",
    "LossName",
    "TrainerConfig",
    "TrainingInterrupted",
    "TrainingSample",
    "TrainingWriteError",
    "completion_target",
    "dpo_loss",
    "encode_completion",
    "get_loss",
    "mask_spans",
    "nll_loss",
    "per_token_logps",
    "reference_per_token_logps",
    "samples_from_trajectory",
    "token_advantage_loss",
]
