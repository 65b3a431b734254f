"""STRIDE-FT (``seeds/stride.txt`` Sec. 3.3): STRIDE tunes its modules from its own executed runs."""

from rolecall.optimizers.stride_ft import optimizer, selection
from rolecall.optimizers.stride_ft.optimizer import *  # noqa: F403
from rolecall.optimizers.stride_ft.selection import *  # noqa: F403

__all__ = [*optimizer.__all__, *selection.__all__]
