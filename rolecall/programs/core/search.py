"""The bounded search loop the agentic programs share: act, search, observe, under a turn budget.

    for turn = 0 .. max_turns - 1:
        a_t = act(loop)                      # a role call: search with a query, answer, or stop
        if a_t = search(q): D_t = retrieve(q, k); observations += (q, D_t)
        elif a_t ends the loop: return
    record budget_exhausted                  # no answer within the budget

The team Searcher, D2Plan's per-sub-question search, Search-R1, Self-Ask and IRCoT each supply their own ``act`` (and
an optional ``observe`` that post-processes what was retrieved, e.g. D2Plan's Purifier); the loop owns the budget,
the recorded retrieval steps (with the turn and the loop's ``meta``) and the exhaustion event. A caller that
interleaves several loops (a Leader's wave of Searchers) drives them with :meth:`SearchLoop.step`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Passage

if TYPE_CHECKING:
    from rolecall.programs.core.program import Program

__all__ = ["SearchAction", "Observation", "SearchLoop"]

ActionKind = Literal["search", "answer", "stop", "continue"]
"""``search``: retrieve with ``content`` as the query; ``answer``: end with ``content`` as the answer; ``stop``: end
without an answer; ``continue``: spend the turn without searching (an invalid action the policy wants to retry)."""


@dataclass
class SearchAction:
    """What the policy does on one turn."""

    kind: ActionKind
    content: str = ""
    """The query of a search, the answer of an answer."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything the policy wants recorded about the turn (validity, the raw action, ...)."""


@dataclass
class Observation:
    """One search: the turn, the query and the passages it found (after ``observe`` post-processing)."""

    turn: int
    query: str
    passages: list[Passage]
    notes: str = ""
    """What the observer made of the passages (a Purifier's summary); empty without one."""


class SearchLoop:
    """One bounded act-search-observe loop over a program's retriever, recorded in ``trajectory``.

    Args:
        program: the program whose :meth:`~rolecall.programs.core.program.Program.retrieve` records the searches.
        trajectory: where retrieval steps and the exhaustion event are recorded.
        act: the policy: ``act(loop) -> SearchAction`` (it reads ``loop.observations`` and ``loop.turn``).
        k: passages per search.
        max_turns: the turn budget (each call of ``act`` is a turn).
        observe: optional ``observe(loop, observation)``, run after each search (may set ``observation.notes``).
        meta: fields added to each recorded retrieval step and to the exhaustion event (sub-question, searcher, ...).
        exhausted_event: the event recorded when the budget runs out without an answer or a stop.

    Example:
        >>> answer_at_once = lambda loop: SearchAction("answer", "Varn")
        >>> SearchLoop(program, trajectory, act=answer_at_once, k=3, max_turns=2).run().answer  # doctest: +SKIP
        'Varn'
    """

    def __init__(
        self,
        program: Program,
        trajectory: Trajectory,
        *,
        act: Callable[[SearchLoop], SearchAction],
        k: int,
        max_turns: int,
        observe: Callable[[SearchLoop, Observation], None] | None = None,
        meta: dict[str, Any] | None = None,
        exhausted_event: str = "budget_exhausted",
    ) -> None:
        if max_turns < 1 or k < 1:
            raise ValueError(f"a search loop needs max_turns >= 1 and k >= 1, got {max_turns} and {k}")
        self.program, self.trajectory = program, trajectory
        self.act, self.observe = act, observe
        self.k, self.max_turns = k, max_turns
        self.meta = dict(meta or {})
        self.exhausted_event = exhausted_event
        self.turn = 0
        self.observations: list[Observation] = []
        self.actions: list[SearchAction] = []
        self.final: SearchAction | None = None
        self.exhausted = False

    @property
    def done(self) -> bool:
        """True once the policy answered or stopped, or the budget is spent."""
        return self.final is not None or self.exhausted

    @property
    def answer(self) -> str | None:
        """The answer the policy gave, None when it stopped or ran out of turns."""
        return self.final.content if self.final is not None and self.final.kind == "answer" else None

    @property
    def searches(self) -> int:
        """Searches made so far."""
        return len(self.observations)

    @property
    def passages(self) -> list[Passage]:
        """Every passage found, in order, without repeats."""
        return list({p.id: p for o in self.observations for p in o.passages}.values())

    def search(self, query: str, **meta: Any) -> Observation:
        """Retrieve with ``query`` outside the policy (IRCoT's first retrieval with the question); no turn spent."""
        passages = self.program.retrieve(self.trajectory, query, self.k)
        self.trajectory.steps[-1].meta.update(self.meta, turn=self.turn, **meta)
        observation = Observation(turn=self.turn, query=query, passages=passages)
        if self.observe is not None:
            self.observe(self, observation)
        self.observations.append(observation)
        return observation

    def step(self) -> SearchAction | None:
        """One turn: ask the policy, then search when it asks to; None when the loop was already done."""
        if self.done:
            return None
        if self.turn >= self.max_turns:
            self._exhaust()
            return None
        action = self.act(self)
        self.actions.append(action)
        if action.kind == "search":
            self.search(action.content)
        elif action.kind in ("answer", "stop"):
            self.final = action
        self.turn += 1
        if not self.done and self.turn >= self.max_turns:
            self._exhaust()
        return action

    def run(self) -> SearchLoop:
        """Turns until the policy answers or stops or the budget is spent; returns the loop."""
        while not self.done:
            self.step()
        return self

    def _exhaust(self) -> None:
        self.exhausted = True
        event = self.trajectory.event(self.exhausted_event, **self.meta, turns=self.turn, max_turns=self.max_turns)
        event.error = f"no answer within {self.max_turns} turns"
