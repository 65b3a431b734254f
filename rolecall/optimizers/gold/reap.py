"""Gold outputs of REAP's roles, built from an example's gold decomposition (SFT with ``source="gold"``).

:func:`reap_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs REAP with. Each role's gold
output mirrors what the built-in demos (:mod:`rolecall.programs.reap.demos`) teach, since that is what the model is
prompted with:

- decomposer: the gold decomposition as plan lines ``"2. Which country is #1 from? (deps: 1)"`` (``plan_lines``);
- extractor for gold step i: a DirectAnswer fact when a supporting passage of step i was shown (the retrieval's
  ``meta["shown_ids"]``) with ``a_i`` in its shown text: the sentence holding ``a_i`` as evidence, that sentence with
  a leading pronoun replaced by the passage's title as statement, ``a_i`` as answer, "The passage on <title> answers
  it." as reasoning; else the demos' Failed fact (``unknown``, ``unknown``, ``none``, "No passage is about this.");
- replanner (called only after a PartialClue / Failed fact): ``sufficient`` with ``a_i`` when a PartialClue's
  statement or answer holds ``a_i``; else ``edit`` towards the gold sub-question: the filled gold sub-question when
  the current wording is another one (a reference left unresolved, the demos' edit case, or an earlier edit), and
  ``"<title>: <gold sub-question>"``, naming the missing passage's title, when it is the gold wording already;
- synthesizer: the gold answer ``example.answers[0]``.

Decisions (the paper publishes neither its prompts nor its training targets):

- The gold step of an extractor call is its sub-task's id (``meta["task_id"]`` of the retrieval step; the gold plan
  numbers its sub-tasks as the decomposition does, and injected sub-tasks get larger ids), else the gold step whose
  filled question it asks; a call matching none, or a gold step without supporting ids, is left to the LM.
- A supporting passage counts as shown only when the text shown (cut to ``max_passage_chars``) holds ``a_i``: a
  DirectAnswer whose answer the extractor cannot see would teach it to guess. A step with several supporting
  passages (an intersection's last step) needs one of them shown; the known facts carry the others.
- A gold path never writes PartialClue (each gold sub-question asks one fact: the passages hold it or they do not)
  nor ``replace`` (the gold plan has no systemic defect); ``sufficient`` answers an LM-written PartialClue.
- The edits alternate between the gold wording and the title-led one, because the program ignores an edit that does
  not change the wording, and a changed wording retrieves again with the passages not yet shown first. An edit that
  would name an entity the Re-Planner was never shown (the earlier sub-task was given up) is no gold: that call is
  left to the LM.
- The synthesizer's gold is the gold answer even when a sub-task ran out of repairs or iterations (its facts may
  then lack a sub-answer).

Example:
    >>> with gold_path(reap_gold(example, corpus=world.corpus)):            # doctest: +SKIP
    ...     pred = REAP(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example
from rolecall.optimizers.gold.text import text_key
from rolecall.programs.core.demo_source import as_corpus_mapping, filled_steps
from rolecall.programs.core.gold import Override
from rolecall.programs.core.plan import dependencies
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.reap.demos import _fact, plan_lines

__all__ = ["reap_gold", "shown_passages"]

logger = logging.getLogger(__name__)

_NULL = "unknown"  # the demos' null statement and answer (rolecall.programs.reap.demos)
_NO_EVIDENCE = "none"
_FAILED_REASONING = "No passage is about this."
_LINE = re.compile(r"^\[(\d+)\] (.*)$")
_CURRENT = re.compile(r"^(\d+)(?:@\S*)?\. .* \[current\]$", re.MULTILINE)  # TaskPlan.view's line
_FACT = re.compile(r"^level: (?P<level>.*?); statement: (?P<statement>.*); answer: (?P<answer>.*)$", re.S)


def shown_passages(retrieval: Step, passages: str) -> dict[str, Document]:
    """The passages an extractor call was shown, by id, each with the text as shown (cut, ``"..."`` included).

    REAP records the ids it shows on the retrieval step (``meta["shown_ids"]``, in the order of the ``"[n] "`` lines
    of ``passages``); the titles come from the retrieval's outputs.

    Example:
        >>> r = Step(kind="retrieval", role="retrieve", meta={"shown_ids": ["b", "a"]},
        ...          outputs={"passage_ids": ["a", "b"], "titles": ["Varn", "Ostria"]})
        >>> shown_passages(r, "[1] Ostria | Ostria is a country.\\n[2] Varn | Varn is a city.")["a"]
        Document(id='a', title='Varn', text='Varn is a city.')
    """
    ids = list(retrieval.meta.get("shown_ids", []))
    titles = dict(zip(retrieval.outputs.get("passage_ids") or [], retrieval.outputs.get("titles") or [], strict=False))
    out: dict[str, Document] = {}
    for line in passages.splitlines():
        match = _LINE.match(line.strip())
        if match is None or not 1 <= int(match.group(1)) <= len(ids):
            continue
        doc_id = ids[int(match.group(1)) - 1]
        title, text = titles.get(doc_id) or "", match.group(2)
        if title and text.startswith(f"{title} | "):
            text = text[len(title) + 3 :]
        out[doc_id] = Document(doc_id, title, text)
    return out


class _ReapGold:
    """The override of one example (a class so the per-example tables and the extractions seen are kept)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example = example
        self.corpus = corpus
        self.steps = list(example.decomposition or [])
        self.filled = [question for question, _ in filled_steps(example)]
        self._by_text = {text_key(q): i for i, q in enumerate(self.filled)}
        self._missing: dict[str, tuple[int, str | None]] = {}  # sub-question -> (gold step, title not shown)

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if not self.steps:
            logger.debug("example %s has no gold decomposition; role %s left to the LM", self.example.id, role)
            return None
        if role == "decomposer":
            return {"plan": plan_lines(self.steps)}
        if role == "extractor":
            return self._extract(inputs, trajectory)
        if role == "replanner":
            return self._replan(inputs)
        if role == "synthesizer":
            return {"answer": self.example.answer}
        return None

    def _index(self, task_id: Any, sub_question: str) -> int | None:
        """The gold step of a call: by the sub-task's id, else by its filled question."""
        if isinstance(task_id, int) and 1 <= task_id <= len(self.steps):
            return task_id - 1
        index = self._by_text.get(text_key(sub_question))
        if index is None:
            logger.debug("sub-question %r matches no gold step of %s", sub_question, self.example.id)
        return index

    def _extract(self, inputs: dict[str, Any], trajectory: Trajectory) -> dict[str, str] | None:
        sub_question = str(inputs.get("sub_question", ""))
        retrievals = trajectory.retrievals()
        retrieval = retrievals[-1] if retrievals else Step(kind="retrieval", role="retrieve")
        index = self._index(retrieval.meta.get("task_id"), sub_question)
        if index is None:
            return None
        step = self.steps[index]
        if not step.supporting_ids:
            logger.debug(
                "gold step %d of %s has no supporting passage; extractor left to the LM", index + 1, self.example.id
            )
            return None
        shown = shown_passages(retrieval, str(inputs.get("passages", "")))
        visible = [shown[i] for i in step.supporting_ids if i in shown and _holds(shown[i].text, step.answer)]
        if visible:
            self._missing.pop(text_key(sub_question), None)
            evidence, statement = _fact(visible[0], step.answer)
            return {
                "statement": statement,
                "answer": step.answer,
                "level": "DirectAnswer",
                "evidence": evidence,
                "reasoning": f"The passage on {visible[0].title} answers it.",
            }
        unseen = [i for i in step.supporting_ids if i not in shown] or step.supporting_ids
        self._missing[text_key(sub_question)] = (index, self._title(unseen[0], retrieval))
        return {
            "statement": _NULL,
            "answer": _NULL,
            "level": "Failed",
            "evidence": _NO_EVIDENCE,
            "reasoning": _FAILED_REASONING,
        }

    def _replan(self, inputs: dict[str, Any]) -> dict[str, Any] | None:
        sub_question = str(inputs.get("sub_question", ""))
        current = _CURRENT.search(str(inputs.get("plan", "")))  # the node's own line in the plan view
        task_id = int(current.group(1)) if current else None
        index, title = self._missing.get(text_key(sub_question), (self._index(task_id, sub_question), None))
        if index is None:
            return None
        step = self.steps[index]
        fact = _FACT.match(str(inputs.get("fact", "")).strip())
        clue = f"{fact.group('statement')} {fact.group('answer')}" if fact is not None else ""
        if fact is not None and fact.group("level") == "PartialClue" and _holds(clue, step.answer):
            return {"action": "sufficient", "answer": step.answer, "sub_questions": []}
        edit = self._edit(index, sub_question, title, inputs)
        if edit is None or text_key(edit) == text_key(sub_question):
            logger.debug("no gold repair of %r in %s; left to the LM", sub_question, self.example.id)
            return None
        return {"action": "edit", "answer": "none", "sub_questions": [edit]}

    def _edit(self, index: int, sub_question: str, title: str | None, inputs: dict[str, Any]) -> str | None:
        """The gold rewording: the filled gold question when the current wording is another one (a reference left
        unresolved, or an earlier edit), else the gold question led by the title of the passage not shown."""
        gold = self.filled[index]
        if text_key(gold) != text_key(sub_question):
            seen = " ".join(str(inputs.get(name, "")) for name in ("sub_question", "fact", "known_facts", "plan"))
            refs = dependencies(self.steps[index].question)
            needed = [self.steps[d - 1].answer for d in refs if 1 <= d <= len(self.steps)]
            if all(_holds(seen, answer) for answer in needed):
                return gold
            logger.debug("the gold edit of %r names %s, which the Re-Planner was not shown", sub_question, needed)
            return None
        return f"{title}: {gold}" if title else None

    def _title(self, doc_id: str, retrieval: Step) -> str | None:
        """The title of ``doc_id``: from the corpus, else the retrieval that returned it, else its id's title part."""
        if self.corpus is not None and doc_id in self.corpus:
            return self.corpus[doc_id].title
        ids, titles = retrieval.outputs.get("passage_ids") or [], retrieval.outputs.get("titles") or []
        if doc_id in ids and len(titles) == len(ids) and titles[ids.index(doc_id)]:
            return titles[ids.index(doc_id)]
        if "::" in doc_id:  # rolecall.data.types.doc_id: "<title>::<hash>"
            return doc_id.split("::", 1)[0]
        logger.debug("no title for passage %s", doc_id)
        return None


def _holds(text: str, answer: str) -> bool:
    return bool(answer.strip()) and answer.strip().casefold() in text.casefold()


def reap_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold outputs of every REAP role for ``example``, as an override for :func:`gold_path`.

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids); without one every call is left to the LM.
        corpus: documents by id, or a list of them, to name a missing passage in the Re-Planner's edit; without it
            the title comes from the id (``title::hash``), else the call is left to the LM.

    Returns:
        ``override(program, role, inputs, trajectory)``: the outputs of the ``decomposer``, ``extractor``,
        ``replanner`` and ``synthesizer`` roles (exactly their signatures' output fields), None for any other role.
    """
    return _ReapGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
