"""Evaluation: answer and retrieval metrics, the statistics reported over them, and the parallel runner."""

from rolecall.evaluation import feedback, metrics, records, runner, stats
from rolecall.evaluation.feedback import *  # noqa: F403
from rolecall.evaluation.metrics import *  # noqa: F403
from rolecall.evaluation.records import *  # noqa: F403
from rolecall.evaluation.runner import *  # noqa: F403
from rolecall.evaluation.stats import *  # noqa: F403

__all__ = [*feedback.__all__, *metrics.__all__, *records.__all__, *runner.__all__, *stats.__all__]
