"""Gold outputs of OPERA's roles, built from an example's gold decomposition (SFT with ``source="gold"``).

:func:`opera_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs OPERA with. Each role's gold
output mirrors what the built-in demos (:mod:`rolecall.programs.opera.demos`) teach, since that is what the model is
prompted with:

- plan: the gold sub-questions, ``#k`` written as ``[entity from step k]`` (:func:`placeholder_plan`);
- analysis for gold step i on passages D: ``yes, a_i, high, none`` when a supporting passage of step i is shown in D,
  else ``no, unknown, low, "a passage about <title>"``;
- rewrite: the title of the missing supporting passage (the entity to look up);
- synthesis: the gold answer.

Example:
    >>> with gold_path(opera_gold(example, corpus=world.corpus)):           # doctest: +SKIP
    ...     pred = OPERA(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example, SubStep
from rolecall.optimizers.gold.text import text_key
from rolecall.optimizers.gold.titles import passage_title
from rolecall.programs.core.demo_source import as_corpus_mapping, placeholder_plan
from rolecall.programs.core.gold import Override
from rolecall.programs.core.plan import fill_placeholders
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory

__all__ = ["opera_gold", "gold_sub_goals", "shown_passage_ids"]

logger = logging.getLogger(__name__)

_NULL_ANSWER = "unknown"  # the demos' null answer and "nothing missing" (rolecall.programs.opera.demos)
_NO_MISSING = "none"
_NO_TITLE = "a passage that answers the sub-question"  # when the missing passage's title is unknown
_SHOWN_LINE = re.compile(r"^\[\d+\] ", re.MULTILINE)


def gold_sub_goals(example: Example) -> list[tuple[str, str, SubStep]]:
    """``(placeholder form, filled form, gold step)`` of each gold step: the plan the Plan agent should write, and
    each sub-goal as OPERA fills it once the earlier sub-goals got their gold answers (the program's own filling).

    Example:
        >>> e = Example("e", "q", ["Ostrian"], decomposition=[SubStep("Where is Varn?", "Ostria"),
        ...     SubStep("What is the language of #1?", "Ostrian")])
        >>> [filled for _, filled, _ in gold_sub_goals(e)]
        ['Where is Varn?', 'What is the language of Ostria?']
    """
    steps = example.decomposition or []
    answers = {i: s.answer for i, s in enumerate(steps, start=1)}
    plan = placeholder_plan(example)
    return [
        (text, fill_placeholders(text, answers, before=i)[0], step)
        for i, (text, step) in enumerate(zip(plan, steps, strict=True), start=1)
    ]


def shown_passage_ids(trajectory: Trajectory, sub_goal: str, passages: str) -> list[str]:
    """The ids of the passages shown to the analysis agent: OPERA records them on the retrieval step it shows
    (``meta["shown_ids"]``: unseen passages first, cut by ``format_passages``)."""
    retrievals = trajectory.retrievals()
    return list(retrievals[-1].meta.get("shown_ids", [])) if retrievals else []


class _OperaGold:
    """The override of one example (a class so the per-example tables are built once)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example = example
        self.corpus = corpus
        self.sub_goals = gold_sub_goals(example)
        self._filled = {text_key(filled): i for i, (_, filled, _) in enumerate(self.sub_goals)}

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if not self.sub_goals:  # HotpotQA: only the answer is gold, so only the synthesis role has a target
            if role == "synthesis" and self.example.answers:
                return {"answer": self.example.answer}
            logger.debug("example %s has no gold decomposition; role %s left to the LM", self.example.id, role)
            return None
        if role == "plan":
            return {"sub_goals": [text for text, _, _ in self.sub_goals]}
        if role == "analysis":
            return self._analysis(inputs, trajectory)
        if role == "rewrite":
            return self._rewrite(inputs, trajectory)
        if role == "synthesis":
            return {"answer": self.example.answer}
        return None

    def _step(self, sub_goal: str, trajectory: Trajectory) -> SubStep:
        """The gold step a call on ``sub_goal`` is for: the one whose filled text matches, else by position."""
        index = self._filled.get(text_key(sub_goal))
        if index is None:
            asked = list(dict.fromkeys(s.inputs.get("sub_goal") for s in trajectory.role_steps("analysis")))
            index = asked.index(sub_goal) if sub_goal in asked else len(asked)
            logger.debug("sub-goal %r matches no gold step of %s; taking step %d", sub_goal, self.example.id, index + 1)
        return self.sub_goals[min(index, len(self.sub_goals) - 1)][2]

    def _missing(self, step: SubStep, shown: Sequence[str]) -> str | None:
        """The first supporting passage id of ``step`` not in ``shown``; None when one is shown (or it needs none)."""
        if not step.supporting_ids or set(step.supporting_ids) & set(shown):
            return None
        return step.supporting_ids[0]

    def _analysis(self, inputs: dict[str, Any], trajectory: Trajectory) -> dict[str, str]:
        sub_goal = str(inputs.get("sub_goal", ""))
        step = self._step(sub_goal, trajectory)
        missing = self._missing(step, shown_passage_ids(trajectory, sub_goal, str(inputs.get("passages", ""))))
        if missing is None:
            return {
                "sufficient": "yes",
                "answer": step.answer,
                "confidence": "high",
                "missing_information": _NO_MISSING,
            }
        title = self._title(missing, trajectory)
        return {
            "sufficient": "no",
            "answer": _NULL_ANSWER,
            "confidence": "low",
            "missing_information": f"a passage about {title}" if title else _NO_TITLE,
        }

    def _rewrite(self, inputs: dict[str, Any], trajectory: Trajectory) -> dict[str, str]:
        sub_goal = str(inputs.get("sub_goal", ""))
        step = self._step(sub_goal, trajectory)
        analyses = [s for s in trajectory.role_steps("analysis") if s.inputs.get("sub_goal") == sub_goal]
        shown = (
            shown_passage_ids(trajectory, sub_goal, str(analyses[-1].inputs.get("passages", ""))) if analyses else []
        )
        missing = self._missing(step, shown) or (step.supporting_ids[0] if step.supporting_ids else None)
        return {"query": (self._title(missing, trajectory) if missing else None) or sub_goal}

    def _title(self, doc_id: str, trajectory: Trajectory) -> str | None:
        return passage_title(doc_id, self.corpus, trajectory.retrievals())


def opera_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold outputs of every OPERA role for ``example``, as an override for :func:`gold_path`.

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids); without one (HotpotQA) only the synthesis role gets its target, the gold answer, and every
            other call is left to the LM.
        corpus: documents by id, or a list of them, to name a missing passage in ``missing_information`` and in the
            rewrite query; without it the titles come from the run's retrievals, else the ids (``title::hash``), else
            the sub-goal is the query.

    Returns:
        ``override(program, role, inputs, trajectory)``: the outputs of the ``plan``, ``analysis``, ``rewrite`` and
        ``synthesis`` roles (exactly their signatures' output fields), None for any other role.
    """
    return _OperaGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
