"""Gold outputs of the MultiAgent-OPD team roles (leader, searcher, answerer) from an example's gold decomposition.

:func:`team_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs ``CascadedTeam`` or
``HierarchicalTeam`` with. Each output mirrors the built-in demos (:mod:`rolecall.programs.team.demos`):

- leader: ``delegate`` the gold sub-questions, filled with the earlier gold answers, in waves (first every step that
  needs no earlier answer, then each step once the steps it refers to are reported), ``selected=[]``; once a report
  holds the gold answer of every step to look up, ``answer`` with those reports' numbers, ``subtasks=[]``;
- searcher: ``search`` the title of the first gold passage of its subtask not shown yet; once one gold passage of each
  of its steps was shown, ``report`` ``"<answer> (from <title>)"`` (:func:`~rolecall.programs.team.demos.demo_report`);
- answerer: the gold answer ``example.answers[0]`` (with ``answer_candidates > 1`` the gold call is one candidate,
  which wins the vote).

Decisions where the paper and the program leave it open:

- A step whose passages all belong to the steps it refers to (the intersection type's "Which person is in both #1 and
  #2?") needs no search: the Leader never delegates it and the Answerer does it from the reports.
- A Searcher's subtask is matched to the gold step whose filled text it is; the question itself (the cascaded
  workflow) stands for all the steps, reported with the gold answer, from the passage of the last step that gives it
  (else the passage titled by the answer, else the last step's). Any other subtask has no gold: None.
- A Searcher sees only its notes (its turns run on a fresh branch trajectory each), so "shown" is read from them: a
  gold passage is shown when its line, cut as the notes cut it, is in the notes (its title alone without a corpus).
  The notes shrink older searches to their query line, so what each turn showed is remembered per subtask.
- The query is the gold passage's title (the demos' "search the entity"); when that search missed, the sub-question;
  then the passage's first five words ("Nutwen Traeltwick is a writer": a prolific person's name alone finds the
  passages that mention her, and her trade is in them); when all missed, None. A step without a known gold passage
  counts as found once the Searcher searched (by its subtask, when nothing else was to be searched); a report
  without a passage is the bare answer (the demos' report then).
- The Answerer's gold is the gold answer whatever its reports say: where the step budget forced an unfinished report
  (a cascaded 4-step question with one missed search) that answer is not in its input.
- Without a gold decomposition every role is left to the LM, the Answerer too (its reports would not be gold).

Example:
    >>> with gold_path(team_gold(example, corpus=world.corpus)):           # doctest: +SKIP
    ...     pred = HierarchicalTeam(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.core.demo_source import as_corpus_mapping, filled_steps
from rolecall.programs.core.gold import Override
from rolecall.programs.core.plan import dependencies
from rolecall.programs.core.program import Program
from rolecall.programs.core.text import format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.demos import demo_report
from rolecall.programs.team.searcher import NO_NOTES, UNFINISHED
from rolecall.utils.text import holds_answer

__all__ = ["team_gold", "lookup_steps"]

logger = logging.getLogger(__name__)

_SEARCH_LINE = re.compile(r"^Search \d+: (.*)$", re.MULTILINE)
_REPORT_LINE = re.compile(r"^\[(\d+)\] (.*)$")


def lookup_steps(example: Example) -> list[int]:
    """The 0-based gold steps a Searcher must look up: all but those whose passages all belong to the steps they
    refer to (answered from the earlier reports, not searched).

    Example:
        >>> e = Example("e", "q", ["Ada"], decomposition=[SubStep("Cast of F?", "Ada, Bo", ["f"]),
        ...     SubStep("Cast of G?", "Ada, Cy", ["g"]), SubStep("Who is in both #1 and #2?", "Ada", ["f", "g"])])
        >>> lookup_steps(e)
        [0, 1]
    """
    steps = example.decomposition or []
    out = []
    for i, step in enumerate(steps):
        refs = [j - 1 for j in dependencies(step.question) if 1 <= j <= i]
        earlier = {pid for j in refs for pid in steps[j].supporting_ids}
        if not (refs and step.supporting_ids and set(step.supporting_ids) <= earlier):
            out.append(i)
    return out


class _TeamGold:
    """The override of one example (a class so the per-example tables are built once)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example = example
        self.corpus = corpus
        self.steps: list[tuple[str, SubStep]] = filled_steps(example)
        self.lookups = lookup_steps(example)
        self._by_text = {_key(text): i for i, (text, _) in enumerate(self.steps)}
        self._shown: dict[str, set[str]] = {}  # subtask -> gold passage ids its notes have shown

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if not self.steps:
            logger.debug("example %s has no gold decomposition; role %s left to the LM", self.example.id, role)
            return None
        if role == "leader":
            return self._leader(program, str(inputs.get("reports", "")))
        if role == "searcher":
            return self._searcher(program, str(inputs.get("subtask", "")), str(inputs.get("notes", "")))
        if role == "answerer":
            return {"answer": self.example.answer} if self.example.answers else None
        return None

    # ------------------------------------------------------------------ leader
    def _reported(self, reports: str) -> dict[int, int]:
        """Gold step -> the number of the first finished report on its sub-question holding its gold answer."""
        done: dict[int, int] = {}
        for line in reports.splitlines():
            match = _REPORT_LINE.match(line.strip())
            if match is None:
                continue
            number, rest = int(match.group(1)), _key(match.group(2))
            for i, (text, step) in enumerate(self.steps):
                prefix = _key(text) + " -> "
                if i in done or not rest.startswith(prefix):
                    continue
                report = rest[len(prefix) :]
                if not report.startswith(_key(UNFINISHED)) and holds_answer(report, step.answer):
                    done[i] = number
        return done

    def _leader(self, program: Program, reports: str) -> dict[str, Any] | None:
        done = self._reported(reports)
        if all(i in done for i in self.lookups):
            return {"action": "answer", "selected": sorted(done[i] for i in self.lookups), "subtasks": []}
        answered = set(done) | {i for i in range(len(self.steps)) if i not in self.lookups}
        ready = [
            i
            for i in self.lookups
            if i not in done and all(j - 1 in answered for j in dependencies(self.steps[i][1].question) if 1 <= j <= i)
        ]
        if not ready:  # cannot happen with references to earlier steps only
            logger.debug("example %s: no gold step is ready to delegate", self.example.id)
            return None
        limit = getattr(program, "max_subtasks", len(ready))
        return {"action": "delegate", "selected": [], "subtasks": [self.steps[i][0] for i in ready[:limit]]}

    # ------------------------------------------------------------------ searcher
    def _searcher(self, program: Program, subtask: str, notes: str) -> dict[str, str] | None:
        if _key(subtask) == _key(self.example.question):
            indices, answer = self.lookups, self.example.answer
        elif _key(subtask) in self._by_text:
            index = self._by_text[_key(subtask)]
            indices, answer = [index], self.steps[index][1].answer
        else:
            logger.debug("subtask %r of %s matches no gold step; left to the LM", subtask, self.example.id)
            return None
        shown = self._shown_ids(program, subtask, notes)
        queries = {_key(q) for q in _SEARCH_LINE.findall(notes)} if notes.strip() != NO_NOTES else set()
        for i in indices:
            text, step = self.steps[i]
            docs = self._docs(step)
            if docs and not any(d.id in shown for d in docs):
                for query in (docs[0].title, text, _opening(docs[0])):
                    if query and _key(query) not in queries:
                        return {"action": "search", "content": query}
                logger.debug("searches for step %d of %s missed its passage; left to the LM", i + 1, self.example.id)
                return None
        if not queries:  # no step has a known gold passage: search once, as every Searcher starts with a search
            return {"action": "search", "content": self.steps[indices[0]][0] if len(indices) == 1 else subtask}
        title = self._source_title(indices, answer, shown)
        return {"action": "report", "content": demo_report(answer, title) if title else answer}

    def _shown_ids(self, program: Program, subtask: str, notes: str) -> set[str]:
        """The gold passage ids this Searcher's notes showed so far (remembered across its turns)."""
        if notes.strip() == NO_NOTES:
            self._shown[subtask] = set()
        shown = self._shown.setdefault(subtask, set())
        lines = {line.split("] ", 1)[-1] for line in notes.splitlines() if line.startswith("[")}
        max_chars = getattr(program, "max_passage_chars", 250)
        for _, step in self.steps:
            for doc in self._docs(step):
                if doc.text:
                    shown_line = format_passages([doc], max_chars=max_chars, max_total_chars=10**9)[4:]
                    seen = shown_line in lines
                else:
                    seen = any(line.startswith(f"{doc.title} | ") for line in lines)
                if seen:
                    shown.add(doc.id)
        return shown

    def _source_title(self, indices: Sequence[int], answer: str, shown: set[str]) -> str | None:
        """The title the report names: the shown gold passage of the last step giving ``answer``, else the passage
        titled by the answer, else the last step's."""
        docs = {i: [d for d in self._docs(self.steps[i][1]) if d.id in shown] for i in indices}
        giving = [i for i in indices if _key(self.steps[i][1].answer) == _key(answer) and docs[i]]
        if giving:
            return docs[giving[-1]][0].title
        titled = [d.title for i in indices for d in docs[i] if _key(d.title) == _key(answer)]
        if titled:
            return titled[0]
        last = [d for i in indices for d in docs[i]]
        return last[-1].title if last else None

    def _docs(self, step: SubStep) -> list[Document]:
        """The gold passages of ``step`` whose title is known (from the corpus, else the ``title::hash`` id)."""
        out = []
        for pid in step.supporting_ids:
            if self.corpus is not None and pid in self.corpus:
                out.append(self.corpus[pid])
            elif "::" in pid:  # rolecall.data.types.doc_id
                out.append(Document(pid, pid.split("::", 1)[0], ""))
        return out


def _opening(doc: Document, words: int = 5) -> str:
    """The first words of ``doc`` (``"Nutwen Traeltwick is a writer"``): an entity's own entry when its name alone
    finds the passages that mention it."""
    return " ".join(doc.text.split()[:words])


def _key(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def team_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold outputs of every MultiAgent-OPD team role for ``example``, as an override for :func:`gold_path`.

    Works for ``CascadedTeam`` (searcher, answerer) and ``HierarchicalTeam`` (leader, searcher, answerer).

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids); without one every call is left to the LM.
        corpus: documents by id, or a list of them, to recognize the gold passages in a Searcher's notes and name
            them in its queries and reports; without it only ``title::hash`` ids are recognized (by title).

    Returns:
        ``override(program, role, inputs, trajectory)``: the outputs of the ``leader``, ``searcher`` and
        ``answerer`` roles (exactly their signatures' output fields), None where no gold output is known.
    """
    return _TeamGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
