"""A weight optimizer's unit of work: a stage (one adapter or adapter group, its steps and loss) and a step's context.

:class:`StepContext` also carries the stage's sample stream: ``take(items, n)`` returns the next ``n`` items of
``items`` reshuffled every epoch with a seed of ``(seed, stage, epoch)``, so the stream is resumed from its position
(an integer in the checkpoint) alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rolecall.errors import ConfigError
from rolecall.optimizers.core.config import TrainerConfig

__all__ = ["Stage", "StepContext"]


@dataclass(kw_only=True)
class Stage:
    """One adapter (or adapter group) trained for ``steps`` steps with one loss."""

    name: str
    """Unique within the optimizer (MAPGRPO: the role; SFT: the adapter)."""
    adapter: str
    """The LoRA adapter it trains (created as the identity if missing)."""
    steps: int
    """Planned steps (each one ``collect -> generate -> execute -> score -> update``)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimizer, batching and loss of its :class:`AdapterTrainer`."""
    roles: tuple[str, ...] = ()
    """The roles whose calls the adapter serves (informational; an adapter group has several)."""

    def __post_init__(self) -> None:
        if not self.name or not self.adapter:
            raise ConfigError(f"A stage needs a name and an adapter; got name={self.name!r}, adapter={self.adapter!r}.")
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ConfigError(f"Stage {self.name!r}: steps must be an integer >= 0; got {self.steps!r}.")


@dataclass
class StepContext:
    """What a subclass's phases see of the loop: the stage, the step, the sample-stream position and the RNG."""

    stage: Stage
    step: int
    """Steps of this stage done before this one (0-based index of this step)."""
    global_step: int
    """Steps of all stages done before this one."""
    position: int
    """Items taken from this stage's sample stream so far (advanced by :meth:`take`)."""
    rng: random.Random
    """The optimizer's own RNG (checkpointed)."""
    seed: int = 0
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def take(self, items: Sequence[Any], n: int) -> list[Any]:
        """The next ``n`` items of the stage's sample stream: ``items`` reshuffled every epoch, seeded by
        ``(seed, stage, epoch)``, so the stream resumes from ``position`` alone.

        Raises:
            ValueError: If ``items`` is empty.
        """
        if not items:
            raise ValueError(f"Stage {self.stage.name!r} has no items to sample from.")
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(items))
            if epoch not in self._orders:
                order = list(range(len(items)))
                random.Random(f"{self.seed}-{self.stage.name}-{epoch}").shuffle(order)
                self._orders = {epoch: order}
            out.append(items[self._orders[epoch][offset]])
            self.position += 1
        return out
