"""Gold outputs of STRIDE's roles, built from an example's gold decomposition (SFT with ``source="gold"``).

:func:`stride_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs STRIDE with. Each role's
gold output mirrors what the built-in demos (:mod:`rolecall.programs.stride.demos`) teach:

- meta_planner: the gold General Strategy (:func:`~rolecall.programs.stride.demos.gold_strategy`);
- planner: the gold Concrete Plan (:func:`~rolecall.programs.stride.demos.gold_plan`), for the direct-plan ablation
  too; a comparison or yes/no question gets the plan's last, reasoning-only step;
- supervisor, for a ready sub-question: ``answer`` (query: the filled sub-question) for a reasoning-only step, and for
  a gold step whose supporting passages already gave facts of solved sub-questions and whose answer is in the evidence
  the ``answer`` action shows (an intersection's "who is in both"); else ``retrieve`` with the filled sub-question
  first, then after a failure ``rewrite`` with the first query not in F(c_i) among: the supporting passage's title
  (the demos' rewrite), the title with one more word of the sub-question, the program's own reformulations
  (:func:`~rolecall.programs.stride.state.fresh_query`), the title after the passage's entity type;
- extractor: the demos' facts (``demos._fact``: the sentences holding the sub-answer, a leading pronoun replaced by
  the title) of each supporting passage *shown* (the branch's last retrieval, cut to the lines of the ``passages``
  input, each read from its shown, possibly cut, text), one ``- fact`` line each; ``none`` when none is shown;
- reasoner: the gold sub-answer when the evidence holds it, ``unknown`` when it does not (only possible without the
  Extractor, where the Reasoner reads the raw passages); the last plan step answers ``example.answers[0]``, which is
  what STRIDE returns when the plan finishes (the last sub-answer);
- fallback: ``example.answers[0]``.

Decisions the paper and program leave open: a reasoning-only step's "supporting passages" are those of the steps it
refers to (searched only without the Supervisor); a sub-question matching no gold step (a plan from
:meth:`~rolecall.programs.stride.program.STRIDE.execute_plan`) is left to the LM, since a position guess could record
a wrong gold; without a corpus the Meta-Planner is left to the LM (the strategy's entity types come from the corpus)
and titles come from the run's retrievals; a rewrite with every title and reformulation already failed is left to the
LM. Ω is not visible to a role call, so the override keeps the facts each solved sub-question stored (keyed by its
filled text) and reads S from the Supervisor's ``progress`` input.

Example:
    >>> with gold_path(stride_gold(example, corpus=world.corpus)):        # doctest: +SKIP
    ...     pred = STRIDE(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example
from rolecall.optimizers.gold.text import text_key
from rolecall.programs.core.demo_source import as_corpus_mapping
from rolecall.programs.core.gold import Override
from rolecall.programs.core.plan import dependencies
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.stride.demos import _fact, gold_plan, gold_strategy
from rolecall.programs.stride.parse import parse_facts
from rolecall.programs.stride.state import StrideState, format_facts, fresh_query, normalize_query

__all__ = ["stride_gold"]

logger = logging.getLogger(__name__)

_NULL_ANSWER = "unknown"  # ReasonAnswer's "or unknown"
_NO_FACTS = "none"  # the Extractor demos' empty output
_SHOWN_LINE = re.compile(r"^\[(\d+)\] ")
_PROGRESS_LINE = re.compile(r"^\d+\. (.*) -> (.*)$")


class _StrideGold:
    """The override of one example (a class: the per-example tables are built once, Ω's facts are remembered)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example = example
        self.corpus = corpus
        self.steps = example.decomposition or []
        self.plan = gold_plan(example, corpus or {}) if self.steps else []
        self.strategy = gold_strategy(example, corpus) if self.steps and corpus is not None else None
        n = len(self.plan)
        self.answers = {
            i: self.steps[i - 1].answer if i <= len(self.steps) else example.answer for i in range(1, n + 1)
        }
        if n:
            self.answers[n] = example.answer  # the last sub-answer is STRIDE's final answer
        state, _ = StrideState.from_plan(self.plan)
        state.solved.update(self.answers)  # gold answers, taken as they are (as the demos do)
        self.index = {text_key(state.filled(i)): i for i in self.answers}
        self.sources = {i: self._sources(i) for i in self.answers}
        self.solved_facts: dict[str, tuple[list[str], set[str]]] = {}  # filled sub-question -> (E_i, passage ids)
        self.titles: dict[str, str] = {}  # passage id -> title, from the retrievals seen
        self.lock = threading.Lock()  # ready sub-questions run in concurrent branches

    def _sources(self, i: int) -> list[tuple[str, str]]:
        """``(passage id, answer it holds)`` of plan step ``i``: its supporting passages, or for a reasoning-only
        step those of the steps it refers to."""
        if i <= len(self.steps):
            return [(d, self.steps[i - 1].answer) for d in self.steps[i - 1].supporting_ids]
        deps = [self.steps[j - 1] for j in dependencies(self.plan[i - 1]) if j <= len(self.steps)]
        return [(d, step.answer) for step in deps for d in step.supporting_ids]

    def __call__(
        self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory
    ) -> dict[str, Any] | None:
        if not self.plan:
            logger.debug("example %s has no gold decomposition; role %s left to the LM", self.example.id, role)
            return None
        if role == "meta_planner":
            return {"steps": list(self.strategy)} if self.strategy is not None else None
        if role == "planner":
            return {"sub_questions": list(self.plan)}
        if role == "fallback":
            return {"answer": self.example.answer}
        handler = {"supervisor": self._supervisor, "extractor": self._extractor, "reasoner": self._reasoner}.get(role)
        return handler(program, inputs, trajectory) if handler is not None else None

    def _step_of(self, sub_question: str) -> int | None:
        i = self.index.get(text_key(sub_question))
        if i is None:
            logger.debug("sub-question %r matches no gold step of %s; left to the LM", sub_question, self.example.id)
        return i

    # ------------------------------------------------------------------ control layer
    def _supervisor(self, program: Program, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        filled = str(inputs.get("sub_question", ""))
        i = self._step_of(filled)
        if i is None:
            return None
        failed_text = str(inputs.get("failed_queries", "")).strip()
        failed = [] if failed_text.lower() in ("", "none") else failed_text.split("; ")
        if self._answerable(program, i, str(inputs.get("progress", ""))):
            return {"action": "answer", "query": filled}
        if not failed:
            return {"action": "retrieve", "query": filled}
        seen = {normalize_query(q) for q in failed}
        query = next((q for q in self._rewrites(i, filled) if normalize_query(q) not in seen), None)
        if query is None:
            logger.debug("every query for %r already failed (%s); left to the LM", filled, self.example.id)
            return None
        return {"action": "rewrite", "query": query}

    def _rewrites(self, i: int, filled: str) -> list[str]:
        """Rewrite queries for step ``i`` in order: each supporting passage's title (the demos' rewrite), the title
        with one more word of the sub-question, the program's own reformulations (keywords, names), then the title
        after the passage's entity type."""
        titles = list(dict.fromkeys(t for d, _ in self.sources[i] if (t := self._title(d))))
        reformulations: list[str] = []  # the program's own: keywords, then names (fresh_query's order)
        while (q := fresh_query(filled, [filled, *reformulations])) is not None:
            reformulations.append(q)
        keywords = reformulations[0].split() if reformulations else []
        words = [w for w in keywords if all(w.lower() not in t.lower().split() for t in titles)]
        kinds = [(d.split("/", 1)[0], t) for d, _ in self.sources[i] if "/" in d and (t := self._title(d))]
        typed = [f"{kind} {t}" for kind, t in kinds if kind.isalpha()]  # "person Ada Quell", as the demos type ids
        queries = [*titles, *(f"{t} {w}" for t in titles for w in words), *reformulations, *typed]
        return [q for q in dict.fromkeys(" ".join(q.split()) for q in queries) if q]

    def _answerable(self, program: Program, i: int, progress: str) -> bool:
        """Whether Ω already answers step ``i``: a reasoning-only step, or one whose passages gave facts of solved
        sub-questions and whose answer is in the evidence the ``answer`` action shows."""
        if i > len(self.steps):
            return True
        solved = [(m.group(1), m.group(2)) for m in map(_PROGRESS_LINE.match, progress.splitlines()) if m]
        solved = [(q, a) for q, a in solved if a != "pending"]
        with self.lock:
            stored = [self.solved_facts.get(text_key(q), ([], set())) for q, _ in solved]
        ids = set().union(*(d for _, d in stored)) if stored else set()
        needed = {d for d, _ in self.sources[i]}
        if not needed or not needed <= ids:
            return False
        facts = list(dict.fromkeys(f for fs, _ in stored for f in fs))
        evidence = format_facts(facts + [f"{q} -> {a}" for q, a in solved], max_chars=program.max_context_chars)
        return _holds(evidence, self.answers[i])

    # ------------------------------------------------------------------ execution layer
    def _shown_facts(self, i: int, trajectory: Trajectory, shown: str) -> tuple[list[str], set[str]]:
        """The demos' facts of step ``i``'s passages among those ``shown`` (the lines of the branch's last
        retrieval), each from its shown text, with the ids they came from."""
        retrievals = trajectory.retrievals()
        if not retrievals:
            return [], set()
        ids = list(retrievals[-1].outputs.get("passage_ids") or [])
        titles = list(retrievals[-1].outputs.get("titles") or [])
        title_of = {d: t for d, t in zip(ids, titles, strict=False) if t}
        with self.lock:
            self.titles.update(title_of)
        shown_ids = list(retrievals[-1].meta.get("shown_ids") or ids)  # the prompt's order: unseen passages first
        return self._facts_in(i, shown_ids, [title_of.get(d, "") for d in shown_ids], shown)

    def _facts_in(self, i: int, ids: list[str], titles: list[str], shown: str) -> tuple[list[str], set[str]]:
        """The facts of step ``i``'s passages in ``shown``, the formatted passages ``ids`` (in order)."""
        answers = dict(reversed(self.sources[i]))  # the first answer listed for a passage
        facts: list[str] = []
        found: set[str] = set()
        for line in shown.splitlines():
            m = _SHOWN_LINE.match(line)
            n = int(m.group(1)) - 1 if m else -1
            if not m or n >= len(ids) or ids[n] not in answers:
                continue
            title = titles[n] if n < len(titles) else ""
            text = line[m.end() :]
            text = text[len(title) + 3 :] if title and text.startswith(f"{title} | ") else text
            text = text.removesuffix("...")  # format_passages' cut: a shown fact is a visible one
            hits = [f for f in _fact(Document(ids[n], title, text), answers[ids[n]]) if _holds(f, answers[ids[n]], 1)]
            if hits:
                facts.extend(hits)
                found.add(ids[n])
        return list(dict.fromkeys(facts)), found

    def _extractor(self, program: Program, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        supervised = trajectory.role_steps("supervisor")
        sub_question = supervised[-1].inputs.get("sub_question") if supervised else inputs.get("query")
        i = self._step_of(str(sub_question or ""))
        if i is None:
            return None
        facts, _ = self._shown_facts(i, trajectory, str(inputs.get("passages", "")))
        return {"facts": format_facts(facts) if facts else _NO_FACTS}

    def _reasoner(self, program: Program, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        sub_question = str(inputs.get("sub_question", ""))
        i = self._step_of(sub_question)
        if i is None:
            return None
        answer = self.answers[i]
        if not trajectory.retrievals():  # the answer action: the Supervisor chose it because Ω holds the answer
            return {"answer": answer}
        if i > len(self.steps):  # a reasoning step's filled question holds the answers it compares
            return {"answer": answer}
        extracted = trajectory.role_steps("extractor")
        if extracted:  # E_i is what the Extractor wrote; its passage ids are those of the retrieval it read
            facts = parse_facts(str(extracted[-1].outputs.get("facts") or ""))
            _, ids = self._shown_facts(i, trajectory, str(extracted[-1].inputs.get("passages", "")))
        else:  # without the Extractor E_i is the shown passages themselves
            facts = str(inputs.get("facts", "")).splitlines()
            _, ids = self._shown_facts(i, trajectory, str(inputs.get("facts", "")))
        if not ids or not _holds("\n".join(facts), answer):
            return {"answer": _NULL_ANSWER}
        with self.lock:
            self.solved_facts[text_key(sub_question)] = (facts, ids)
        return {"answer": answer}

    def _title(self, doc_id: str) -> str | None:
        """The title of ``doc_id``: from the corpus, else a retrieval that returned it, else its id's title part."""
        if self.corpus is not None and doc_id in self.corpus:
            return self.corpus[doc_id].title
        with self.lock:
            if doc_id in self.titles:
                return self.titles[doc_id]
        return doc_id.split("::", 1)[0] if "::" in doc_id else None  # rolecall.data.types.doc_id: "<title>::<hash>"


def _holds(text: str, answer: str, at_least: int | None = None) -> bool:
    """Whether ``text`` names every part of ``answer`` (a list answer's names; ``at_least`` of them when given),
    case-insensitively, as whole words."""
    parts = [p.strip() for p in re.split(r",\s+(?=[A-Za-z])| and ", answer) if p.strip()] or [answer]
    hits = sum(bool(re.search(rf"(?<!\w){re.escape(p)}(?!\w)", text, re.IGNORECASE)) for p in parts)
    return hits >= (len(parts) if at_least is None else at_least)


def stride_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold outputs of every STRIDE role for ``example``, as an override for :func:`gold_path`.

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids); without one every call is left to the LM.
        corpus: documents by id, or a list of them: the entity types of the strategy and plan, and the titles a
            rewrite searches for; without it the Meta-Planner is left to the LM, the plan's placeholders are
            ``[entity from step k]`` and titles come from the run's retrievals.

    Returns:
        ``override(program, role, inputs, trajectory)``: the outputs of ``meta_planner``, ``planner``,
        ``supervisor``, ``extractor``, ``reasoner`` and ``fallback`` (exactly their signatures' output fields), None
        where the gold decomposition does not determine them.
    """
    return _StrideGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
