"""Scheduling the steps of a weight optimizer's stages and splitting its time budget by their measured cost.

The loop state is a JSON dict (checkpointed every step, so a resumed run keeps the same split):
``steps[s]`` (steps done), ``costs[s] = [seconds, count]`` (measured step costs), ``elapsed_s``, ``allotments[s]``
(the share of the budget stage ``s`` was given when it started) and ``stopped`` (stage -> why it ended early).

The split, for the sequential schedule: when stage ``s`` starts with ``R`` seconds of the budget left, it gets

    share_s = R * D_s / sum_j D_j,    D_j = (remaining steps of j) * c_j

where ``c_j`` is stage ``j``'s measured mean step cost, else the mean over the measured stages (equal costs before
anything is measured). ``D_s`` is re-evaluated with ``s``'s own cost as its steps are measured, so a stage whose steps
are expensive gets the larger share and every stage trains the same fraction of its steps. A step runs when it
fits, rounded to the nearest step, in its stage's share, and never past the whole budget. The interleaved schedule
(SFT's round-robin) always picks the stage with the smallest fraction of its steps done, which keeps that fraction
equal across stages; a step then runs while it fits in what is left of the budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["Schedule", "check_budget", "next_stage", "stage_progress", "step_cost"]

Schedule = Literal["sequential", "interleaved"]
"""``sequential``: stage after stage (MAPGRPO); ``interleaved``: one step of each stage in turn (SFT)."""


def step_cost(state: Mapping, stage: str) -> float | None:
    """The estimated seconds of one step of ``stage``: its measured mean, else the mean over measured stages."""
    costs = state["costs"]
    if costs.get(stage, [0.0, 0])[1]:
        seconds, count = costs[stage]
        return seconds / count
    total, count = sum(c[0] for c in costs.values()), sum(c[1] for c in costs.values())
    return total / count if count else None


def next_stage(planned: Mapping[str, int], state: Mapping, schedule: Schedule) -> str | None:
    """The stage whose step runs next (None when every stage is done or stopped)."""
    open_ = [s for s, n in planned.items() if state["steps"].get(s, 0) < n and s not in state["stopped"]]
    if not open_:
        return None
    if schedule == "sequential":
        return open_[0]
    return min(open_, key=lambda s: state["steps"].get(s, 0) / planned[s])  # ties: the earlier stage


def _share(stage: str, state: Mapping, allotment: Mapping, cost: float) -> float:
    """The seconds of the budget a sequential stage gets (module docstring): its part of the demand when it started."""
    demand = {s: n * (step_cost(state, s) or cost) for s, n in allotment["remaining"].items()}
    return allotment["budget_s"] * demand[stage] / (sum(demand.values()) or 1.0)


def stage_progress(
    stage: str, planned: Mapping[str, int], state: Mapping, budget_s: float | None, schedule: Schedule
) -> float:
    """How far ``stage`` is through its training, in [0, 1], before its next step: the larger of its fraction of
    planned steps done and of its time spent (the whole budget when interleaved, its share when sequential).
    A learning-rate schedule follows it, so a run the budget stops early still ends its schedule.

    Example:
        >>> state = {"steps": {"a": 5}, "costs": {}, "elapsed_s": 30.0, "allotments": {}, "stopped": {}}
        >>> stage_progress("a", {"a": 20}, state, 60.0, "interleaved")
        0.5
    """
    progress = state["steps"].get(stage, 0) / max(1, planned[stage])
    if budget_s is not None:
        if schedule == "interleaved":
            progress = max(progress, state["elapsed_s"] / budget_s)
        elif (allotment := state["allotments"].get(stage)) is not None:
            cost = step_cost(state, stage)
            share = _share(stage, state, allotment, cost) if cost is not None else allotment["budget_s"]
            progress = max(progress, (state["elapsed_s"] - allotment["start_s"]) / (share or 1.0))
    return min(1.0, progress)


def check_budget(
    stage: str, planned: Mapping[str, int], state: dict, budget_s: float | None, schedule: Schedule
) -> str | None:
    """Whether the next step of ``stage`` fits the budget: None if it does, else why not.

    Records the stage's allotment in ``state["allotments"]`` the first time it is asked about a stage (sequential):
    the seconds left then and the steps every open stage had left.
    The very first step of a run always runs (it measures the cost that everything else is judged by).
    """
    if budget_s is None:
        return None
    elapsed = state["elapsed_s"]
    left = budget_s - elapsed
    allotment = None
    if schedule == "sequential":
        open_ = [s for s, n in planned.items() if state["steps"].get(s, 0) < n and s not in state["stopped"]]
        remaining = {s: planned[s] - state["steps"].get(s, 0) for s in open_}
        allotment = state["allotments"].setdefault(
            stage, {"start_s": elapsed, "budget_s": left, "remaining": remaining}
        )
    cost = step_cost(state, stage)
    if cost is None:
        return None if left > 0 else f"time budget of {budget_s:.1f}s spent before the first step"
    if cost > left:
        return f"time budget of {budget_s:.1f}s spent ({left:.1f}s left, a {stage} step takes about {cost:.1f}s)"
    if allotment is None:
        return None
    share = _share(stage, state, allotment, cost)
    if elapsed - allotment["start_s"] + cost / 2 > share:
        return f"the stage's share of the time budget ({share:.1f}s of {budget_s:.1f}s) is spent"
    return None
