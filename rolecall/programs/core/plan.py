"""The plan graph every planning program shares: sub-questions, their dependencies, ``#k`` placeholders, the ready set.

A plan is an ordered list of sub-questions; sub-question ``i`` may refer to the answer of an earlier one ``j < i``.
Papers and small models write that reference in several ways, and one grammar reads them all:

- ``#j`` (MuSiQue's gold decompositions, REAP's Decomposer),
- ``#A_j`` and the sloppy ``#A j`` / ``#Aj`` (D2Plan's answer placeholders),
- ``[type from step j]`` (OPERA's typed placeholders; STRIDE's Concrete Plan).

:func:`find_references` lists them, :func:`fill_references` substitutes answers (OPERA's placeholder filling, D2Plan's
rule-based refinement, REAP's fact substitution, STRIDE's filled sub-questions), :func:`renumber_references` rewrites
them after a plan edit, and :class:`PlanGraph` holds the dependencies and the ready set (the pending sub-questions whose
dependencies are all answered: STRIDE's P_ready, REAP's executable sub-tasks, D2Plan's next sub-question).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field

from rolecall.signatures.types import is_null_answer

if TYPE_CHECKING:
    from rolecall.programs.core.trajectory import Trajectory

__all__ = [
    "Reference",
    "Placeholder",
    "SubGoal",
    "PlanStep",
    "PlanGraph",
    "find_references",
    "find_placeholders",
    "fill_references",
    "fill_placeholders",
    "renumber_references",
    "hash_refs_to_placeholders",
    "to_answer_refs",
    "drop_repeats",
    "truncate_plan",
]

RefStyle = Literal["keep", "answer_ref", "hash"]
"""How :func:`renumber_references` writes a reference: as it was written, as ``#A_j`` or as ``#j``."""

_REFERENCE = re.compile(
    r"(?P<answer>#\s*A[_ ]?(?P<a>\d+)\b)"
    r"|(?P<hash>#(?P<h>\d+)\b)"
    r"|(?P<typed>\[\s*(?P<type>[^\[\]]*?)\s+from\s+step\s+(?P<t>\d+)\s*\])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Reference:
    """One reference to an earlier sub-question's answer inside a sub-question."""

    text: str
    """The reference exactly as written (``#2``, ``#A_2``, ``[person from step 2]``)."""
    step: int
    """The 1-based position of the sub-question whose answer fills it."""
    type: str = "entity"
    """The expected type (``[year from step 1]`` -> ``year``; ``entity`` for the untyped forms)."""
    start: int = 0
    """Character offset in the text."""


def _reference(match: re.Match[str]) -> Reference:
    if match.group("answer"):
        return Reference(match.group(0), int(match.group("a")), "entity", match.start())
    if match.group("hash"):
        return Reference(match.group(0), int(match.group("h")), "entity", match.start())
    return Reference(match.group(0), int(match.group("t")), match.group("type").strip() or "entity", match.start())


def find_references(text: str) -> list[Reference]:
    """Every reference in ``text`` (all three forms), in order of position; references to step 0 are ignored.

    Example:
        >>> [(r.step, r.type) for r in find_references("Is #A_2 older than #1 or [person from step 3]?")]
        [(2, 'entity'), (1, 'entity'), (3, 'person')]
    """
    return [r for r in (_reference(m) for m in _REFERENCE.finditer(text)) if r.step >= 1]


def dependencies(text: str) -> list[int]:
    """The steps ``text`` refers to, in order of first mention, without repeats.

    Example:
        >>> dependencies("Where was #2 born, and #1, and #A_2?")
        [2, 1]
    """
    return list(dict.fromkeys(r.step for r in find_references(text)))


def fill_references(text: str, answers: Mapping[int, str], *, before: int | None = None) -> tuple[str, list[str]]:
    """Replace each reference whose step has an answer; return the filled text and the references left as written.

    Args:
        text: a sub-question.
        answers: the answer of each solved step, by 1-based position (null answers count as unsolved).
        before: when given, only steps ``j < before`` may fill (a reference forward stays as written).

    Returns:
        ``(filled_text, unresolved)``.

    Example:
        >>> fill_references("Who founded [company from step 1], born in #A_2?", {1: "Totom Pictures"})
        ('Who founded Totom Pictures, born in #A_2?', ['#A_2'])
    """
    unresolved: list[str] = []

    def replace(match: re.Match[str]) -> str:
        ref = _reference(match)
        answer = answers.get(ref.step)
        if answer is None or is_null_answer(answer) or (before is not None and ref.step >= before) or ref.step < 1:
            unresolved.append(ref.text)
            return ref.text
        return answer.strip()

    return _REFERENCE.sub(replace, text), unresolved


def renumber_references(text: str, mapping: Mapping[int, int], *, style: RefStyle = "keep") -> str:
    """Point each reference at ``mapping[step]`` (steps not in ``mapping`` keep their number).

    Args:
        text: a sub-question.
        mapping: old step -> new step.
        style: ``"keep"`` writes each reference in its own form, ``"answer_ref"`` as ``#A_j``, ``"hash"`` as ``#j``.

    Example:
        >>> renumber_references("Where was #1 born, after [year from step 2]?", {1: 4, 2: 5})
        'Where was #4 born, after [year from step 5]?'
        >>> renumber_references("Where was #A_3 born, near #1?", {3: 2}, style="answer_ref")
        'Where was #A_2 born, near #A_1?'
    """

    def replace(match: re.Match[str]) -> str:
        ref = _reference(match)
        step = mapping.get(ref.step, ref.step)
        if style == "answer_ref":
            return f"#A_{step}"
        if style == "hash" or match.group("hash"):
            return f"#{step}"
        if match.group("answer"):
            return f"#A_{step}"
        return f"[{ref.type} from step {step}]"

    return _REFERENCE.sub(replace, text)


def to_answer_refs(text: str) -> str:
    """Every reference written as D2Plan's ``#A_j`` (for demos built from gold ``#j`` decompositions).

    Example:
        >>> to_answer_refs("What is the population of the city of #2?")
        'What is the population of the city of #A_2?'
    """
    return renumber_references(text, {}, style="answer_ref")


def hash_refs_to_placeholders(text: str, answers: Mapping[int, str] | None = None) -> str:
    """Rewrite ``#k`` references as OPERA's ``[type from step k]``; the type is ``year`` or ``entity``.

    Args:
        text: a gold sub-question.
        answers: gold answers by 1-based step, used to guess the type (three or four digits -> ``year``).

    Example:
        >>> hash_refs_to_placeholders("What is the official language of #1?")
        'What is the official language of [entity from step 1]?'
    """
    answers = answers or {}

    def replace(match: re.Match[str]) -> str:
        if not match.group("hash"):
            return match.group(0)
        step = int(match.group("h"))
        kind = "year" if re.fullmatch(r"\d{3,4}", (answers.get(step) or "").strip()) else "entity"
        return f"[{kind} from step {step}]"

    return _REFERENCE.sub(replace, text)


def drop_repeats(items: Sequence[str], *, offset: int = 0, style: RefStyle = "keep") -> list[str]:
    """``items`` without repeats of an earlier item or truncated repeats (a small model's plan often loops until its
    token budget cuts the last item), with the references renumbered to the kept positions.

    Args:
        items: sub-questions at plan positions ``offset + 1, offset + 2, ...``.
        offset: plan positions before the first item (a revised plan starts at the failed position).
        style: how renumbered references are written (see :func:`renumber_references`).

    Example:
        >>> drop_repeats(["Who is X?", "Who is X?", "Where was #A_2 born?", "Where was #A_2 b"])
        ['Who is X?', 'Where was #A_1 born?']
    """
    kept: list[str] = []
    positions: dict[int, int] = {}
    for k, text in enumerate(items, start=offset + 1):
        key = text.casefold()
        repeats = [
            j for j, t in enumerate(kept, 1) if t.casefold() == key or (len(key) >= 12 and t.casefold().startswith(key))
        ]
        if not repeats:
            kept.append(text)
        positions[k] = offset + (repeats[0] if repeats else len(kept))
    if len(kept) == len(items):
        return kept
    return [renumber_references(t, positions, style=style) for t in kept]


# ---------------------------------------------------------------------------------------------------------------------
# OPERA's typed view of a plan (kept as pydantic models: the reward code and the signatures' docs use them).
# ---------------------------------------------------------------------------------------------------------------------
class Placeholder(BaseModel):
    """One ``[type from step j]`` (or ``#j``) reference inside a sub-goal."""

    text: str = Field(description="the placeholder exactly as written")
    type: str = Field(description="expected information type, e.g. entity, location, year")
    step: int = Field(ge=1, description="1-based index of the sub-goal whose answer fills it")


_T = TypeVar("_T")


def truncate_plan(plan: list[_T], keep: int, trajectory: Trajectory, **meta: Any) -> list[_T]:
    """``plan`` cut to its first ``keep`` items; a cut is recorded as a ``plan_truncated`` event (``planned``,
    ``kept`` and ``meta``). Naive equivalent: ``plan[:keep]``."""
    if len(plan) <= keep:
        return plan
    trajectory.event("plan_truncated", planned=len(plan), kept=keep, **meta)
    return plan[:keep]


def find_placeholders(text: str) -> list[Placeholder]:
    """:func:`find_references` as pydantic :class:`Placeholder` s.

    Example:
        >>> [p.step for p in find_placeholders("Who directed [film from step 1] with #2?")]
        [1, 2]
    """
    return [Placeholder(text=r.text, type=r.type, step=r.step) for r in find_references(text)]


fill_placeholders = fill_references
"""OPERA's name for :func:`fill_references`."""


class SubGoal(BaseModel):
    """One planned sub-goal ``p_i`` and the placeholders it holds."""

    index: int = Field(ge=1, description="1-based position in the plan")
    text: str
    placeholders: list[Placeholder] = Field(default_factory=list)

    @classmethod
    def parse(cls, text: str, index: int) -> SubGoal:
        """Build a sub-goal from its text, collecting its placeholders."""
        return cls(index=index, text=text, placeholders=find_placeholders(text))

    @property
    def dependencies(self) -> list[int]:
        """The earlier steps this sub-goal refers to, in order of first mention."""
        return list(dict.fromkeys(p.step for p in self.placeholders))


# ---------------------------------------------------------------------------------------------------------------------
# The graph.
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanStep:
    """One sub-question of a plan: its 1-based ``id``, its text (references as written) and the steps it needs."""

    id: int
    text: str
    depends_on: tuple[int, ...] = ()


@dataclass
class PlanGraph:
    """A plan's sub-questions, their dependencies and answers, and the ready set.

    Example:
        >>> plan, dropped = PlanGraph.from_texts(["Who directed X?", "Where was #1 born?", "Is #3 old?"])
        >>> dropped, plan.ready()
        (['3->3'], [1, 3])
        >>> plan.resolve(1, "Ada Quell")
        >>> plan.ready(), plan.filled(2)
        ([2, 3], 'Where was Ada Quell born?')
    """

    steps: list[PlanStep]
    answers: dict[int, str] = field(default_factory=dict)
    """Step id -> answer, for the solved steps."""

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> tuple[PlanGraph, list[str]]:
        """Read a plan: each step's dependencies are the earlier steps its references name.

        Returns:
            ``(graph, dropped)``; ``dropped`` lists references to the same step, a later step or a step outside the
            plan as ``"i->j"`` (step ``i`` referred to step ``j``). They stay in the text but are no dependency, so
            the graph is always acyclic.
        """
        steps, dropped = [], []
        for i, text in enumerate(texts, start=1):
            deps = dependencies(text)
            dropped += [f"{i}->{d}" for d in deps if d >= i]
            steps.append(PlanStep(id=i, text=text, depends_on=tuple(d for d in deps if d < i)))
        return cls(steps=steps), dropped

    def get(self, step_id: int) -> PlanStep:
        """The step with id ``step_id``."""
        return self.steps[step_id - 1]

    @property
    def pending(self) -> list[int]:
        """Ids of the steps without an answer, in plan order."""
        return [s.id for s in self.steps if s.id not in self.answers]

    def ready(self) -> list[int]:
        """The pending steps whose dependencies are all answered, in plan order."""
        return [i for i in self.pending if all(d in self.answers for d in self.get(i).depends_on)]

    @property
    def finished(self) -> bool:
        """True when every step has an answer."""
        return not self.pending

    def filled(self, step_id: int) -> str:
        """The step's text with the answers of its solved dependencies filled in."""
        return fill_references(self.get(step_id).text, self.answers, before=step_id)[0]

    def resolve(self, step_id: int, answer: str) -> None:
        """Record ``answer`` for ``step_id``.

        Raises:
            ValueError: ``answer`` is a null answer (``""``, ``unknown``, ...): an unsolved step stays pending.
        """
        if is_null_answer(answer):
            raise ValueError(f"step {step_id} cannot be resolved with the null answer {answer!r}")
        self.answers[step_id] = answer.strip()
