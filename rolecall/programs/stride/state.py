"""STRIDE's execution state Ω = (S, P, F) and the helpers its control layer uses (SIGIR 2026, Sec. 3.2.2).

    S  = solved sub-questions with their answers          -> StrideState.solved   {id: a_i}
    P  = pending sub-questions, S ∩ P = ∅                  -> StrideState.pending  [id, ...]
    F  = failed queries per pending sub-question           -> StrideState.failures [Failure(id, z, reason), ...]
    P_ready = {c_i ∈ P | deps(c_i) ⊆ S}                    -> StrideState.ready()

The plan, its dependencies, the ready set and the filling of answers into later sub-questions are the shared
:class:`~rolecall.programs.core.plan.PlanGraph`: dependencies are the ``[type from step j]`` (or ``#j``) references of
a sub-question, and a reference to the same or a later step, or to a step outside the plan, is dropped when the plan is
read (so the earliest pending sub-question is always ready). :func:`causal_rewrite_steps` reads back, from a
trajectory, the Supervisor calls STRIDE-FT trains on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rolecall.programs.core.plan import PlanGraph, PlanStep
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.signatures.stride import Action
from rolecall.signatures.types import is_null_answer

__all__ = [
    "Failure",
    "Directive",
    "BranchOutcome",
    "StrideState",
    "normalize_query",
    "fresh_query",
    "format_facts",
    "causal_rewrite_steps",
]

_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or is was were are be been did does do has had have "
    "who whom whose what which where when why how many much that this these those it its as into".split()
)
_QUESTION_WORDS = frozenset({"Who", "What", "Which", "Where", "When", "Why", "How", "In", "Is", "Was", "Did", "Does"})


@dataclass(frozen=True)
class Failure:
    """One entry of the failure log F: query ``z_i`` for sub-question ``c_i`` gave no usable result.

    Attributes:
        sub_question: the sub-question id.
        query: the query that failed (for an ``answer`` action: the question given to the Reasoner).
        reason: ``"empty retrieval"``, ``"no facts"``, ``"extractor error"``, ``"no answer"`` or ``"repeated query"``.
        iteration: the iteration t in which it failed.
    """

    sub_question: int
    query: str
    reason: str
    iteration: int


@dataclass
class Directive:
    """One Supervisor decision ``(α_i, z_i)`` for a ready sub-question, after the program's rules were applied.

    Attributes:
        sub_question: the sub-question id.
        action: ``retrieve``, ``rewrite`` or ``answer``.
        query: the query executed (``z_i``).
        proposed_query: the query the Supervisor wrote (may differ from ``query`` after a rule changed it).
        attempt: search attempts already made for this sub-question (0: this is the first).
        repeated: the Supervisor proposed a query already in F for this sub-question.
    """

    sub_question: int
    action: Action
    query: str
    proposed_query: str = ""
    attempt: int = 0
    repeated: bool = False

    @property
    def is_rewrite(self) -> bool:
        """A search that is not the first attempt for its sub-question (whatever the Supervisor called it)."""
        return self.action != "answer" and self.attempt > 0


@dataclass
class BranchOutcome:
    """What executing one ready sub-question produced, merged into Ω after the iteration's join (branches run
    concurrently and only read Ω; their steps go to the trajectory through
    :func:`~rolecall.programs.core.parallel.run_branches`).

    Attributes:
        sq_id: the sub-question id.
        directive: the directive executed, None when the Supervisor's was rejected.
        supervisor_step: the Supervisor's step (its ``executed`` / ``resolved`` meta is set when the branch ends).
        executed: a search ran.
        answer: the Reasoner's answer (empty when it failed).
        facts: E_i (the passage lines without an Extractor).
        failure: why the sub-question stays pending, None when it was resolved.
        failures: the entries this branch adds to F (a repeated query, then the directive's failure), in order.
    """

    sq_id: int
    directive: Directive | None = None
    supervisor_step: Step | None = None
    executed: bool = False
    answer: str = ""
    facts: list[str] = field(default_factory=list)
    failure: str | None = None
    failures: list[Failure] = field(default_factory=list)

    @property
    def resolved(self) -> bool:
        """The Reasoner gave an answer (not a null one)."""
        return not is_null_answer(self.answer)


def normalize_query(query: str) -> str:
    """Lowercase, punctuation removed, spaces collapsed: two queries are the same when these are equal.

    Example:
        >>> normalize_query("  Where was  Ada Quell born? ")
        'where was ada quell born'
    """
    return " ".join(re.sub(r"[^\w\s]", " ", query.lower()).split())


def _keywords(text: str) -> str:
    return " ".join(w for w in re.sub(r"[^\w\s'-]", " ", text).split() if w.lower() not in _STOPWORDS)


def _names(text: str) -> str:
    words = re.sub(r"[^\w\s'-]", " ", text).split()
    return " ".join(w for i, w in enumerate(words) if w[:1].isupper() and not (i == 0 and w in _QUESTION_WORDS))


def fresh_query(sub_question: str, failed: Sequence[str]) -> str | None:
    """A query for ``sub_question`` that is not in ``failed``: the sub-question itself, its keywords, then the names
    it mentions; None when all of them already failed.

    This is the rule behind the paper's ``z_i ∉ F(c_i)`` (scheduling principle 2), used when the Supervisor repeats a
    failed query or its output cannot be read.

    Example:
        >>> fresh_query("In which city was the band Thuvex Hollows formed?",
        ...             ["In which city was the band Thuvex Hollows formed?"])
        'city band Thuvex Hollows formed'
    """
    seen = {normalize_query(q) for q in failed}
    for candidate in (sub_question.strip(), _keywords(sub_question), _names(sub_question)):
        key = normalize_query(candidate)
        if key and key not in seen:
            return candidate
    return None


def format_facts(facts: Sequence[str], *, max_chars: int = 900) -> str:
    """Facts as ``- fact`` lines cut to ``max_chars`` in all (``"(no facts)"`` when there are none).

    Example:
        >>> format_facts(["Varn is in Ostria.", "Ostria's language is Ostrian."])
        "- Varn is in Ostria.\\n- Ostria's language is Ostrian."
    """
    lines: list[str] = []
    total = 0
    for fact in facts:
        line = f"- {' '.join(str(fact).split())}"
        if lines and total + len(line) > max_chars:
            break
        lines.append(line[:max_chars])
        total += len(line) + 1
    return "\n".join(lines) if lines else "(no facts)"


@dataclass
class StrideState:
    """Ω = (S, P, F) over a Concrete Plan, plus the General Strategy and the facts E_i gathered per sub-question.

    Attributes:
        graph: the Concrete Plan C_q as a plan graph; its ``answers`` are S.
        strategy: the General Strategy S_q (empty without the Meta-Planner).
        facts: E_i of each sub-question resolved by a search, by id.
        failures: the failure log F, in the order the failures happened.
        attempts: search attempts made per sub-question id.
        seen: ids of the passages shown for each sub-question so far (a retry shows unseen passages first).
    """

    graph: PlanGraph
    strategy: list[str] = field(default_factory=list)
    facts: dict[int, list[str]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    seen: dict[int, set[str]] = field(default_factory=dict)

    @classmethod
    def from_plan(cls, sub_questions: Sequence[str], strategy: Sequence[str] = ()) -> tuple[StrideState, list[str]]:
        """Read a Concrete Plan: dependencies from its references, invalid references dropped.

        Returns:
            ``(state, dropped)`` where ``dropped`` lists the references that point to the same step, a later step or a
            step outside the plan (``"3->4"``: step 3 referred to step 4).
        """
        graph, dropped = PlanGraph.from_texts(list(sub_questions))
        return cls(graph=graph, strategy=list(strategy)), dropped

    # ------------------------------------------------------------------ views
    @property
    def plan(self) -> list[PlanStep]:
        """C_q: the sub-questions in plan order (``id``, ``text`` with references as planned, ``depends_on``)."""
        return self.graph.steps

    @property
    def solved(self) -> dict[int, str]:
        """S: sub-question id -> answer (the plan graph's answers)."""
        return self.graph.answers

    def get(self, sq_id: int) -> PlanStep:
        """The sub-question with id ``sq_id``."""
        return self.graph.get(sq_id)

    @property
    def pending(self) -> list[int]:
        """P: ids of the sub-questions without an answer, in plan order."""
        return self.graph.pending

    def ready(self) -> list[int]:
        """P_ready: pending ids whose dependencies are all solved."""
        return self.graph.ready()

    def filled(self, sq_id: int) -> str:
        """The sub-question with the answers of its solved dependencies filled in."""
        return self.graph.filled(sq_id)

    def failed_queries(self, sq_id: int) -> list[str]:
        """F(c_i): the queries that failed for ``sq_id``, without duplicates."""
        return list(dict.fromkeys(f.query for f in self.failures if f.sub_question == sq_id))

    def all_facts(self) -> list[str]:
        """⋃ E_j over the solved sub-questions, in plan order, without duplicates."""
        return list(dict.fromkeys(f for sq in self.plan for f in self.facts.get(sq.id, [])))

    def known_answers(self) -> list[str]:
        """``"sub-question -> answer"`` lines for the solved sub-questions (facts for the ``answer`` action)."""
        return [f"{self.filled(i)} -> {self.solved[i]}" for i in sorted(self.solved)]

    def last_solved(self) -> int | None:
        """The id of the solved sub-question latest in the plan, None when nothing is solved."""
        return max(self.solved) if self.solved else None

    def render(self) -> str:
        """The Concrete Plan as the Supervisor sees it: one line per sub-question with its answer or ``pending``."""
        return "\n".join(f"{sq.id}. {self.filled(sq.id)} -> {self.solved.get(sq.id, 'pending')}" for sq in self.plan)

    def render_plan(self) -> str:
        """The whole plan P_q = (S_q, C_q) as the Fallback Reasoner sees it: the General Strategy, then every
        sub-question with its answer or ``pending`` (just the latter without a strategy).

        Example:
            >>> state, _ = StrideState.from_plan(["Who directed X?", "Where was [person from step 1] born?"],
            ...                                  ["Find the film's director.", "Find where the person was born."])
            >>> state.resolve(1, "Ada Quell")
            >>> print(state.render_plan())
            Strategy:
            1. Find the film's director.
            2. Find where the person was born.
            Plan:
            1. Who directed X? -> Ada Quell
            2. Where was Ada Quell born? -> pending
        """
        if not self.strategy:
            return self.render()
        steps = "\n".join(f"{i}. {s}" for i, s in enumerate(self.strategy, start=1))
        return f"Strategy:\n{steps}\nPlan:\n{self.render()}"

    # ------------------------------------------------------------------ updates
    def resolve(self, sq_id: int, answer: str, facts: Sequence[str] = ()) -> None:
        """Move ``sq_id`` from P to S with ``answer`` (and its facts E_i).

        Raises:
            ValueError: ``answer`` is a null answer (``""``, ``unknown``, ...): the sub-question stays pending.
        """
        self.graph.resolve(sq_id, answer)
        if facts:
            self.facts[sq_id] = list(facts)

    def log_failure(self, sq_id: int, query: str, reason: str, iteration: int) -> Failure:
        """Add ``(sq_id, query, reason)`` to F and return the entry."""
        failure = Failure(sub_question=sq_id, query=query, reason=reason, iteration=iteration)
        self.failures.append(failure)
        return failure

    def to_dict(self) -> dict[str, Any]:
        """Ω as plain JSON data: plan, strategy, solved, pending, facts, failures."""
        return {
            "strategy": list(self.strategy),
            "plan": [{"id": sq.id, "text": sq.text, "depends_on": list(sq.depends_on)} for sq in self.plan],
            "solved": {str(k): v for k, v in sorted(self.solved.items())},
            "pending": self.pending,
            "facts": {str(k): v for k, v in sorted(self.facts.items())},
            "failures": [asdict(f) for f in self.failures],
        }


def causal_rewrite_steps(trajectory: Trajectory) -> list[Step]:
    """The Supervisor calls whose rewrite was causal (STRIDE-FT, Sec. 3.3): the query was executed, it was not the
    sub-question's first attempt, and that attempt resolved the sub-question.

    Whether the run's final answer was correct is for the caller to check (the trajectory does not know the gold).

    Example:
        >>> causal_rewrite_steps(Trajectory())
        []
    """
    return [
        s
        for s in trajectory.role_steps("supervisor")
        if s.ok and s.meta.get("executed") and s.meta.get("attempt", 0) > 0 and s.meta.get("resolved")
    ]
