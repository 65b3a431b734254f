"""REAP's options (Zhu et al., AAAI 2026, arXiv 2511.09966): the paper's budgets (top-5 passages, 5 iterations, one
sub-task per iteration) and this implementation's caps on plans, forks, repairs and prompt sizes."""

from __future__ import annotations

from dataclasses import dataclass

from rolecall.programs.core.options import PassageOptions, option

__all__ = ["REAPOptions"]


@dataclass(kw_only=True)
class REAPOptions(PassageOptions):
    """Options of :class:`~rolecall.programs.reap.program.REAP`, checked before any model loads.

    Example:
        >>> REAPOptions().max_tasks_per_iteration, REAPOptions(max_tasks_per_iteration=4).max_tasks_per_iteration
        (1, 4)
    """

    top_k: int = option(5, low=1)
    """Passages retrieved per sub-query (the paper's top-5)."""
    max_iterations: int = option(5, low=1)
    """Planner-Extractor iterations T (the paper's 5); sub-tasks still pending after them are recorded as
    ``budget_exhausted`` and the Synthesizer answers from the facts found."""
    max_tasks_per_iteration: int = option(1, low=1)
    """Ready sub-tasks one iteration executes. 1 is the paper's loop (pick the next ready sub-task, retrieve, extract,
    update the plan); more runs that many independent ready sub-tasks (e.g. forked branches) in one iteration,
    concurrently when ``parallel``, so ``max_iterations`` then allows up to this many times more extractions."""
    max_sub_tasks: int = option(5, low=1)
    """Longer plans (and longer injected sequences) are cut, recorded as ``plan_truncated``."""
    max_branches: int = option(3, low=1)
    """Most parallel branches one fork creates (further answers are dropped, recorded as ``fork_truncated``)."""
    max_repairs: int = option(2, low=0)
    """Re-Planner repairs per sub-task; past it the sub-task goes to the rule-based fallback."""
    max_known_facts: int = option(4, low=0)
    """Earlier facts F_{t-1} shown to the Fact Extractor and the Re-Planner."""
    max_context_chars: int = option(1000, low=20)
    """Characters of all passages shown in one prompt (at least ``max_passage_chars``)."""
    use_replanner: bool = True
    """False gives the paper's "REAP w/o Re-Planner" ablation: PartialClue / Failed facts go to the rule-based
    updater, which keeps the best partial answer or gives the sub-task up."""
    parallel: bool = True
    """Run the sub-tasks of one iteration concurrently (their LM calls batch in a ``LocalLM``); matters only when
    ``max_tasks_per_iteration`` > 1."""
