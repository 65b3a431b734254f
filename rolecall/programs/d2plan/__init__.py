"""D2Plan (arXiv 2601.08282): a Reasoner that plans, searches, refines and revises, and a Purifier."""

from rolecall.programs.d2plan.facts import D2PlanFacts, d2plan_facts
from rolecall.programs.d2plan.program import D2Plan

__all__ = ["D2Plan", "D2PlanFacts", "d2plan_facts"]
