"""D2Plan (arXiv 2601.08282): a Reasoner that plans, searches, refines and revises, and a Purifier."""

from rolecall.programs.d2plan.demos import d2plan_demos, default_d2plan_demos
from rolecall.programs.d2plan.facts import D2PlanFacts, Refinement, Revision, d2plan_facts
from rolecall.programs.d2plan.program import REASONER_ROLES, D2Plan, D2PlanOptions

__all__ = [
    "D2Plan",
    "D2PlanOptions",
    "REASONER_ROLES",
    "D2PlanFacts",
    "Refinement",
    "Revision",
    "d2plan_facts",
    "d2plan_demos",
    "default_d2plan_demos",
]
