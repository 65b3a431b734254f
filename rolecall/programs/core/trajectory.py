"""Trajectory Memory: what every role saw and said during one question, for evaluation records and credit assignment.

A :class:`Trajectory` is a list of :class:`Step` records. Each role call records its inputs, the exact messages sent to
the LM and the raw completion (so an optimizer can rebuild the training sample), the parsed outputs or the parse error,
and timing. Retrieval calls record the query and the passage ids. Failures (an unparseable output, an empty retrieval,
an exhausted budget) are steps too: they are data, never exceptions.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Step", "Trajectory"]

_ADD_LOCK = threading.Lock()  # module-level, so trajectories stay deep-copyable and picklable

StepKind = Literal["role", "retrieval", "event"]


@dataclass
class Step:
    """One recorded action.

    Attributes:
        kind: ``"role"`` (an LM role call), ``"retrieval"`` or ``"event"`` (a control-flow note such as
            ``budget_exhausted`` or ``plan_revised``).
        role: the role name (``"plan"``, ``"analysis"``, ...) or the retriever / event name.
        inputs: the role's input fields (for retrieval: ``{"query": ..., "k": ...}``).
        outputs: the parsed output fields (for retrieval: ``{"passage_ids": [...], "titles": [...]}``).
        messages: the exact chat messages sent to the LM (role calls only).
        completion: the raw LM completion text (role calls only).
        error: the parse error or failure reason, None when the step succeeded.
        seconds: wall time of the step.
        usage: ``{"prompt_tokens": ..., "completion_tokens": ..., "lm_calls": ...}`` for role calls.
        meta: anything else a program wants to remember (sub-goal index, attempt number, ...).
        adapter: the LoRA adapter that produced a role call (several roles may share one: an adapter group), None on
            the base model or another LM.
    """

    kind: StepKind
    role: str
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    completion: str | None = None
    error: str | None = None
    seconds: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    adapter: str | None = None

    @property
    def ok(self) -> bool:
        """True when the step succeeded."""
        return self.error is None


@dataclass
class Trajectory:
    """The ordered steps of one program run on one question."""

    question: str = ""
    steps: list[Step] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def add(self, step: Step) -> Step:
        """Append ``step`` and return it (thread-safe: concurrent sub-tasks of one question share a trajectory)."""
        with _ADD_LOCK:
            self.steps.append(step)
        return step

    def event(self, name: str, **meta: Any) -> Step:
        """Record a control-flow event (e.g. ``budget_exhausted``)."""
        return self.add(Step(kind="event", role=name, meta=meta))

    def role_steps(self, role: str | None = None, *, adapter: str | None = None) -> list[Step]:
        """The LM role calls, optionally of one role only, or only those an adapter (group) produced."""
        return [
            s
            for s in self.steps
            if s.kind == "role" and (role is None or s.role == role) and (adapter is None or s.adapter == adapter)
        ]

    def retrievals(self) -> list[Step]:
        """The retrieval steps."""
        return [s for s in self.steps if s.kind == "retrieval"]

    @property
    def lm_calls(self) -> int:
        """Number of LM calls (a role call may have retried inside DSPy's adapter fallback)."""
        return sum(s.usage.get("lm_calls", 1) for s in self.steps if s.kind == "role")

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all role calls."""
        return sum(s.usage.get("prompt_tokens", 0) for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens over all role calls."""
        return sum(s.usage.get("completion_tokens", 0) for s in self.steps)

    @property
    def errors(self) -> list[Step]:
        """Steps that failed."""
        return [s for s in self.steps if s.error is not None]

    def parse_rate(self, role: str | None = None) -> float:
        """Fraction of role calls (of ``role``, or all) whose output parsed."""
        calls = self.role_steps(role)
        return sum(s.ok for s in calls) / len(calls) if calls else 1.0

    @property
    def retrieved_ids(self) -> list[str]:
        """Every passage id retrieved, in order, without duplicates."""
        seen: dict[str, None] = {}
        for s in self.retrievals():
            for pid in s.outputs.get("passage_ids", []):
                seen.setdefault(pid, None)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (for JSONL records)."""
        return {"question": self.question, "steps": [asdict(s) for s in self.steps]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`."""
        return cls(question=d.get("question", ""), steps=[Step(**s) for s in d.get("steps", [])])
