"""Default few-shot demos for the MultiAgent-OPD team roles, built from examples with gold decompositions.

SmolLM2-135M parses DSPy's ChatAdapter format only with demos, so every role gets some, in the exact prompt formats
the programs use at run time (:func:`~rolecall.programs.team.searcher.format_notes` and ``format_reports``):

- leader, in this order: (question, reports including an unfinished one) -> answer, selecting the useful reports
  only; (question, the first hop's report) -> delegate the next hop; (question, no reports) -> delegate the
  independent sub-questions, in parallel when there are several;
- searcher: (sub-question, no notes) -> search the entity; (sub-question, notes that missed) -> search again by name;
  (sub-question, notes holding the gold passage) -> report ``"<answer> (from <title>)"``;
- answerer: (question, the gold chain as reports) -> the short answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example
from rolecall.programs.core.demo_source import (
    DEMO_PASSAGE_CHARS,
    as_corpus_mapping,
    distractor_docs,
    docs_by_id,
    filled_steps,
    select_examples,
)
from rolecall.programs.core.demos import built_in_demos
from rolecall.programs.team.searcher import NO_NOTES, NO_REPORTS, SearcherRun, fallback_report, format_notes
from rolecall.programs.team.searcher import format_reports as _format_reports

__all__ = ["team_demos", "default_team_demos", "demo_report"]

_HASH_REF = re.compile(r"#\d+")
_PARALLEL_TYPES = ("comparison", "bridge_comparison", "intersection")
_NOTES_CHARS = 3 * DEMO_PASSAGE_CHARS


def demo_report(answer: str, title: str) -> str:
    """The report a demo Searcher writes: the answer and the passage it came from.

    Example:
        >>> demo_report("Ada Quell", "Morrow Books")
        'Ada Quell (from Morrow Books)'
    """
    return f"{answer} (from {title})"


def _reports(runs: Sequence[SearcherRun]) -> str:
    return _format_reports(runs, max_report_chars=DEMO_PASSAGE_CHARS)


def _gold_runs(example: Example, corpus: Mapping[str, Document]) -> list[SearcherRun]:
    """One finished Searcher per gold step (sub-question filled with earlier answers), numbered from 1."""
    runs = []
    for i, (question, step) in enumerate(filled_steps(example), start=1):
        docs = docs_by_id(corpus, step.supporting_ids)
        report = demo_report(step.answer, docs[0].title) if docs else step.answer
        runs.append(SearcherRun(index=i, subtask=question, report=report))
    return runs


def _leader(question: str, reports: str, action: str, subtasks: list[str], selected: list[int]) -> dspy.Example:
    return dspy.Example(
        question=question, reports=reports, action=action, subtasks=subtasks, selected=selected
    ).with_inputs("question", "reports")


def _leader_demos(
    chains: Sequence[Example], parallel: Example | None, corpus: Mapping[str, Document], n: int, rng: random.Random
) -> list[dspy.Example]:
    demos: list[dspy.Example] = []
    first = parallel or (chains[0] if chains else None)
    if first is not None:  # first wave: every sub-question that needs no earlier answer, searched at once
        independent = [q for q, s in filled_steps(first) if not _HASH_REF.search(s.question)]
        demos.append(_leader(first.question, NO_REPORTS, "delegate", independent, []))
    for i, chain in enumerate(chains):
        if len(demos) >= n:
            break
        runs = _gold_runs(chain, corpus)
        if i % 2 == 0 and len(runs) >= 2:  # next wave: the first report resolves the entity of the second hop
            demos.append(_leader(chain.question, _reports(runs[:1]), "delegate", [runs[1].subtask], []))
        else:  # answer: an unfinished report sits between the useful ones and is not selected
            noise = distractor_docs(corpus, chain.supporting_ids, 1, rng)
            stuck = SearcherRun(index=2, subtask=runs[-1].subtask, history=[(runs[-1].subtask, noise)])
            stuck.report = fallback_report(stuck, max_report_chars=120)
            shown = [runs[0], stuck, *[SearcherRun(r.index + 1, r.subtask, report=r.report) for r in runs[1:]]]
            useful = [r.index for r in shown if r is not stuck]
            demos.append(_leader(chain.question, _reports(shown), "answer", [], useful))
    # the first wave last: SmolLM2-135M copies the nearest demo most, and every question starts with a first wave
    return demos[:n][::-1]


def _searcher(subtask: str, notes: str, action: str, content: str) -> dspy.Example:
    return dspy.Example(subtask=subtask, notes=notes, action=action, content=content).with_inputs("subtask", "notes")


def _searcher_demos(
    chains: Sequence[Example], corpus: Mapping[str, Document], n: int, rng: random.Random
) -> list[dspy.Example]:
    steps = [(q, s) for e in chains for q, s in filled_steps(e) if docs_by_id(corpus, s.supporting_ids)]
    demos: list[dspy.Example] = []
    for i, (question, step) in enumerate(steps[:n]):
        gold = docs_by_id(corpus, step.supporting_ids)[0]
        noise = distractor_docs(corpus, step.supporting_ids, 2, rng)
        if i % 3 == 0:  # first turn: look the entity up
            demos.append(_searcher(question, NO_NOTES, "search", gold.title))
        elif i % 3 == 1:  # the question as a query missed: search the entity by name
            notes = format_notes(
                [(question, noise)], max_passage_chars=DEMO_PASSAGE_CHARS, max_notes_chars=_NOTES_CHARS
            )
            demos.append(_searcher(question, notes, "search", gold.title))
        else:  # the gold passage is in the notes: report
            shown = [noise[0], gold] if rng.random() < 0.5 else [gold, noise[0]]
            notes = format_notes(
                [(gold.title, shown)], max_passage_chars=DEMO_PASSAGE_CHARS, max_notes_chars=_NOTES_CHARS
            )
            demos.append(_searcher(question, notes, "report", demo_report(step.answer, gold.title)))
    return demos


def team_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for the team roles ``leader``, ``searcher`` and ``answerer`` (up to ``n`` each).

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them), for the gold and distractor passages.
        n: demos per role.
        seed: picks the distractor passages.

    Returns:
        Role name -> list of ``dspy.Example`` with the role's input and output fields (a program keeps the roles it
        has: ``CascadedTeam`` has no leader).
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = select_examples(examples, 2 * n)
    chains = [e for e in chosen if len(e.decomposition or []) >= 2] or chosen
    usable = [e for e in examples if e.decomposition and all(s.question and s.answer for s in e.decomposition)]
    parallel = next(
        (
            e
            for e in usable
            if e.type in _PARALLEL_TYPES and sum(not _HASH_REF.search(s.question) for s in e.decomposition) >= 2
        ),
        None,
    )
    leader = _leader_demos(chains, parallel, corpus, n, rng)
    searcher = _searcher_demos(chains, corpus, n, rng)
    answerer = [
        dspy.Example(question=e.question, reports=_reports(_gold_runs(e, corpus)), answer=e.answer).with_inputs(
            "question", "reports"
        )
        for e in chosen[:n]
    ]
    return {"leader": leader, "searcher": searcher, "answerer": answerer}


default_team_demos = built_in_demos(team_demos)
