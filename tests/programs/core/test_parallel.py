"""Concurrent branches: dspy.context survives, and the trajectory keeps item order whatever finishes first."""

from __future__ import annotations

import time

import dspy

from rolecall.programs.core.parallel import parallel_map, run_branches
from rolecall.programs.core.trajectory import Trajectory


def test_parallel_map_keeps_dspy_context_and_order():
    with dspy.context(adapter="marker"):
        assert parallel_map(lambda x: (x, dspy.settings.adapter), [1, 2, 3]) == [
            (1, "marker"),
            (2, "marker"),
            (3, "marker"),
        ]


def test_run_branches_merges_in_item_order_not_completion_order():
    def branch(delay: float, local: Trajectory) -> float:
        local.event("start", delay=delay)
        time.sleep(delay)
        local.event("end", delay=delay)
        return delay

    trajectory = Trajectory(question="q")
    trajectory.event("before")
    assert run_branches(branch, [0.05, 0.0], trajectory) == [0.05, 0.0]
    assert [(s.role, s.meta.get("delay")) for s in trajectory.steps] == [
        ("before", None),
        ("start", 0.05),
        ("end", 0.05),
        ("start", 0.0),
        ("end", 0.0),
    ]
    assert run_branches(branch, [0.0], trajectory, parallel=False) == [0.0]
