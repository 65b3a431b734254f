"""Gold outputs of D2Plan's roles, built from an example's gold decomposition (SFT with ``source="gold"``).

:func:`d2plan_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs D2Plan with. Each role's
gold output mirrors what the built-in demos (:mod:`rolecall.programs.d2plan.demos`) teach, since that is what the
model is prompted with (the demos' own key-sentence and summary helpers write the Purifier's notes):

- reasoner_plan: ``multi-hop`` and the gold sub-questions with ``#A_j``; ``single-hop`` and ``[question]`` for a
  one-step decomposition;
- reasoner_step on gold step i: ``answer`` with ``a_i`` (query ``none``) once a gold passage of step i was shown in
  one of this sub-question's searches; else ``search`` (answer ``unknown``): with the sub-question on an empty
  notebook, after a miss with the first query this position has not run yet of: each gold passage's title, then that
  title with the words of its key sentence but the answer, the sub-question's capitalised words, the sub-question;
- purifier: ``yes`` and the sentence of the shown gold passage that holds ``a_i`` when one is among the passages
  shown, else ``no`` and ``passages about <title> and <title>`` (the first two shown);
- reasoner_refine: the gold sub-question with the earlier gold answers filled in;
- reasoner_revise (only after a failed sub-question): the remaining gold plan from the failed position on;
- reasoner_answer: the gold answer ``example.answers[0]``.

Decisions where the paper and the program leave room:

- *Shown* means in the prompt, not just retrieved: the passages the Purifier's input lists (the context budget cuts
  later ones), or without the Purifier the raw search blocks the Reasoner's notes still hold. A gold passage cut
  mid-text counts only when the cut kept the sub-answer: a ``yes`` must point at text the model can see.
- The Reasoner answers a gold step without supporting passages at once (nothing to search for), and searches on (the
  program then stops) when the budget is spent without a gold passage: no answer is recorded that no note supports.
- The title-plus-key-sentence query (``Trabryn Fefelmar She is married to``) goes past the demos, which show only the
  title: a person named in many film casts is ranked below those films by BM25 for the bare name, and the relation
  as the corpus words it finds the passage (without it 2 of 200 synthetic gold paths failed a sub-question). It
  needs the corpus (the passage's full text); without one the title is the last new query.
- A revision on the gold path repeats the remaining gold plan: the plan was right, the searches failed; the revised
  position runs again, from the sub-question (an empty notebook) to queries it has not run. The final answer is the
  gold answer even after such a failure (the program asks for it; the measured gold paths of the synthetic world
  have no failure).
- The sub-question a call is for is matched by its text (filled for step and Purifier, ``#A_j`` for refinement), else
  taken by plan position, read from the program's ``sub_question_done`` and ``revision`` events.

Example:
    >>> with gold_path(d2plan_gold(example, corpus=world.corpus)):          # doctest: +SKIP
    ...     pred = D2Plan(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example, SubStep
from rolecall.optimizers.gold.text import relation_words
from rolecall.optimizers.gold.titles import passage_title
from rolecall.programs.core.demo_source import as_corpus_mapping, filled_steps
from rolecall.programs.core.gold import Override
from rolecall.programs.core.plan import to_answer_refs
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.d2plan.context import NO_ANSWER, NO_NOTES, entity_query

# The demos' own wording of a key sentence and of an irrelevant search (private there; shared so they cannot drift).
from rolecall.programs.d2plan.demos import _about as about_passages
from rolecall.programs.d2plan.demos import _key_sentence as key_sentence

__all__ = ["d2plan_gold", "d2plan_gold_plan"]

logger = logging.getLogger(__name__)

_NO_QUERY = "none"  # the demos' query when the Reasoner answers
_LINE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)  # one passage of format_passages
_BLOCK = re.compile(r"^Search (\d+):$", re.MULTILINE)  # one search in the raw notes (no Purifier)


def d2plan_gold_plan(example: Example) -> list[str]:
    """The plan the Reasoner should write, as the demos write it: the gold sub-questions with ``#A_j``, or the
    question itself when the decomposition has one step.

    Example:
        >>> e = Example("e", "Q?", ["Ostrian"], decomposition=[SubStep("Where is Varn?", "Ostria"),
        ...     SubStep("What is the language of #1?", "Ostrian")])
        >>> d2plan_gold_plan(e)
        ['Where is Varn?', 'What is the language of #A_1?']
    """
    steps = example.decomposition or []
    return [to_answer_refs(s.question) for s in steps] if len(steps) > 1 else [example.question]


def _shown(block: str, step: Step) -> list[tuple[str, str, str]]:
    """``(id, title, shown text)`` of the passages of retrieval ``step`` that ``block`` (a formatted passage list)
    shows, in order."""
    ids, titles = step.outputs.get("passage_ids") or [], step.outputs.get("titles") or []
    out = []
    for match in _LINE.finditer(block):
        j, line = int(match.group(1)) - 1, match.group(2)
        if j < len(ids):
            title = titles[j] if j < len(titles) else ""
            out.append((ids[j], title, line.removeprefix(f"{title} | ") if title else line))
    return out


def _key(text: str) -> str:
    return " ".join(str(text).split()).casefold()


class _D2PlanGold:
    """The override of one example (a class so the per-example tables are built once)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example, self.corpus = example, corpus
        self.steps: list[SubStep] = list(example.decomposition or [])
        self.plan = d2plan_gold_plan(example)
        filled = [text for text, _ in filled_steps(example)] if len(self.steps) > 1 else [example.question]
        self.filled = filled
        self._by_filled = {_key(t): i for i, t in reversed(list(enumerate(filled)))}
        self._by_planned = {_key(t): i for i, t in reversed(list(enumerate(self.plan)))}

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if not self.steps:
            logger.debug("example %s has no gold decomposition; role %s left to the LM", self.example.id, role)
            return None
        if role == "reasoner_plan":
            return {"complexity": "multi-hop" if len(self.steps) > 1 else "single-hop", "plan": list(self.plan)}
        if role == "reasoner_step":
            return self._step(program, inputs, trajectory)
        if role == "purifier":
            return self._purifier(inputs, trajectory)
        if role == "reasoner_refine":
            i = self._index(self._by_planned, inputs.get("sub_question", ""), _position(trajectory))
            return {"refined": self.filled[i]}
        if role == "reasoner_revise":
            failed = _last_done(trajectory)
            i = self._index(self._by_filled, inputs.get("failed", ""), failed)
            return {"plan": self.plan[i:]}
        if role == "reasoner_answer":
            return {"answer": self.example.answer}
        return None

    def _index(self, table: dict[str, int], text: str, position: int) -> int:
        """The 0-based gold step a call on ``text`` is for: the one whose text matches, else plan ``position``."""
        index = table.get(_key(text))
        if index is None:
            logger.debug("%r matches no gold step of %s; taking step %d", text, self.example.id, position)
            index = position - 1
        return max(0, min(index, len(self.steps) - 1))

    def _hit(self, step: SubStep, shown: Sequence[tuple[str, str, str]]) -> tuple[str, str] | None:
        """``(title, text)`` of the first shown gold passage of ``step`` whose shown text keeps the sub-answer (or
        was not cut); None when none is shown."""
        for doc_id, title, text in shown:
            if doc_id in step.supporting_ids and (
                step.answer.casefold() in text.casefold() or not text.endswith("...")
            ):
                return title, text
        return None

    def _purifier(self, inputs: dict[str, Any], trajectory: Trajectory) -> dict[str, str]:
        sub_question = str(inputs.get("sub_question", ""))
        step = self.steps[self._index(self._by_filled, sub_question, _position(trajectory))]
        retrievals = trajectory.retrievals()
        shown = _shown(str(inputs.get("passages", "")), retrievals[-1]) if retrievals else []
        hit = self._hit(step, shown)
        if hit is not None:
            title, text = hit
            return {"relevant": "yes", "information": key_sentence(Document("", title, text), step.answer)}
        return {"relevant": "no", "information": about_passages([Document(i, t, "") for i, t, _ in shown])}

    def _step(self, program: Program, inputs: dict[str, Any], trajectory: Trajectory) -> dict[str, str]:
        sub_question, position = str(inputs.get("sub_question", "")), _position(trajectory)
        step = self.steps[self._index(self._by_filled, sub_question, position)]
        searches = _loop_searches(str(inputs.get("notes", "")), trajectory)
        use_purifier = bool(getattr(program, "use_purifier", True))
        seen = any(self._hit(step, _shown_in_search(r, k, inputs, trajectory, use_purifier)) for k, r in searches)
        if seen or not step.supporting_ids:
            return {"action": "answer", "query": _NO_QUERY, "answer": step.answer}
        if not searches:  # an empty notebook: the sub-question itself, as the demos search
            return {"action": "search", "query": sub_question, "answer": NO_ANSWER}
        # every query this position ran, a revised run's included: a deterministic retriever repeats its misses
        tried = {
            _key(r.inputs.get("query", "")) for r in trajectory.retrievals() if r.meta.get("sub_question") == position
        }
        tried |= {_key(r.inputs.get("query", "")) for _, r in searches}
        candidates = [q for i in step.supporting_ids for q in self._queries(i, step.answer, trajectory)]
        candidates = [q for q in dict.fromkeys([*candidates, entity_query(sub_question), sub_question]) if q]
        query = next((q for q in candidates if _key(q) not in tried), candidates[0])
        return {"action": "search", "query": query, "answer": NO_ANSWER}

    def _queries(self, doc_id: str, answer: str, trajectory: Trajectory) -> list[str]:
        """Queries for a missing gold passage: its title (the demos' query after a miss), then the title with the
        words of its key sentence but the answer (``Trabryn Fefelmar She is married to``: the relation as the
        passage words it, for a name that many other passages mention)."""
        title = self._title(doc_id, trajectory)
        if not title:
            return []
        doc = self.corpus.get(doc_id) if self.corpus is not None else None
        if doc is None or not answer:
            return [title]
        words = relation_words(doc, answer)
        return [title, " ".join([title, *words])] if words else [title]

    def _title(self, doc_id: str, trajectory: Trajectory) -> str | None:
        return passage_title(doc_id, self.corpus, trajectory.retrievals())


def _position(trajectory: Trajectory) -> int:
    """The 1-based plan position running now: after the last finished one, or a revised one again."""
    position = 1
    for s in trajectory.steps:
        if s.kind == "event" and s.role == "sub_question_done":
            position = int(s.meta.get("sub_question", 0)) + 1
        elif s.kind == "event" and s.role == "revision" and s.meta.get("applied"):
            position = int(s.meta.get("sub_question", position))
    return position


def _last_done(trajectory: Trajectory) -> int:
    """The 1-based position of the last finished sub-question (the failed one, when a revision is asked for)."""
    done = [s for s in trajectory.steps if s.kind == "event" and s.role == "sub_question_done"]
    return int(done[-1].meta.get("sub_question", 1)) if done else 1


def _loop_searches(notes: str, trajectory: Trajectory) -> list[tuple[int, Step]]:
    """``(k, retrieval)`` of the searches of the sub-question being run (k from 1): the retrievals since its first
    Reasoner step (turn 0); none while its notes are still empty."""
    if notes.strip() == NO_NOTES:
        return []
    starts = [
        k
        for k, s in enumerate(trajectory.steps)
        if s.kind == "role" and s.role == "reasoner_step" and s.meta.get("turn") == 0
    ]
    later = trajectory.steps[starts[-1] :] if starts else trajectory.steps
    return list(enumerate((s for s in later if s.kind == "retrieval"), start=1))


def _shown_in_search(
    retrieval: Step, k: int, inputs: dict[str, Any], trajectory: Trajectory, use_purifier: bool
) -> list[tuple[str, str, str]]:
    """The passages of search ``k`` the Reasoner's notes rest on: those shown to the Purifier (the role step right
    after the retrieval), or without it those of search k's block in the raw notes (cut blocks show nothing)."""
    if use_purifier:
        at = next(i for i, s in enumerate(trajectory.steps) if s is retrieval)
        after = trajectory.steps[at + 1] if at + 1 < len(trajectory.steps) else None
        if after is None or after.kind != "role" or after.role != "purifier":
            return []  # nothing retrieved: no Purifier call
        return _shown(str(after.inputs.get("passages", "")), retrieval)
    notes = str(inputs.get("notes", ""))
    heads = list(_BLOCK.finditer(notes))
    for n, head in enumerate(heads):
        if int(head.group(1)) == k:
            end = heads[n + 1].start() if n + 1 < len(heads) else len(notes)
            return _shown(notes[head.end() : end], retrieval)
    return []


def d2plan_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold outputs of every D2Plan role for ``example``, as an override for :func:`gold_path`.

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids); without one every call is left to the LM.
        corpus: documents by id, or a list of them, to name a missing gold passage in the Reasoner's search queries;
            without it the titles come from the run's retrievals, else the ids (``title::hash``), else the queries
            are the sub-question and its capitalised words.

    Returns:
        ``override(program, role, inputs, trajectory)``: the outputs of the ``reasoner_plan``, ``reasoner_step``,
        ``reasoner_refine``, ``reasoner_revise``, ``reasoner_answer`` and ``purifier`` roles (exactly their
        signatures' output fields), None for any other role.
    """
    return _D2PlanGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
