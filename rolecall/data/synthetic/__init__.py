"""The synthetic world: an offline multi-hop QA benchmark generated from a seed (``synthetic_world(seed=0)``)."""

from rolecall.data.synthetic.config import WorldConfig
from rolecall.data.synthetic.entities import KINDS, Entity, EntityGraph
from rolecall.data.synthetic.questions import QUESTION_TYPES
from rolecall.data.synthetic.resolver import resolve
from rolecall.data.synthetic.world import SyntheticWorld, synthetic_world

__all__ = [
    "KINDS",
    "QUESTION_TYPES",
    "Entity",
    "EntityGraph",
    "SyntheticWorld",
    "WorldConfig",
    "resolve",
    "synthetic_world",
]
