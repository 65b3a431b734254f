"""Role rewards of the trained programs, each a pure formula over numbers plus an adapter that reads a trajectory:
OPERA (:mod:`~rolecall.optimizers.rewards.opera`), MultiAgent-OPD (:mod:`~rolecall.optimizers.rewards.team`), D2Plan's
SPlanRL (:mod:`~rolecall.optimizers.rewards.d2plan`) and the Search-R1 baseline
(:mod:`~rolecall.optimizers.rewards.search_r1`)."""

from rolecall.optimizers.rewards import d2plan, opera, search_r1, team
from rolecall.optimizers.rewards.d2plan import *  # noqa: F403
from rolecall.optimizers.rewards.opera import *  # noqa: F403
from rolecall.optimizers.rewards.search_r1 import *  # noqa: F403
from rolecall.optimizers.rewards.team import *  # noqa: F403

__all__ = [*d2plan.__all__, *opera.__all__, *search_r1.__all__, *team.__all__]
