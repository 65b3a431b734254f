"""Gold outputs of the Search-R1 agent's one role, built from an example's gold decomposition (SFT with
``source="gold"``), so SFT can warm-start :class:`~rolecall.programs.baselines.search_r1.SearchR1Agent` before GRPO.

:func:`search_r1_gold` gives the override :func:`rolecall.programs.core.gold.gold_path` runs the agent with. Its one
role, ``agent`` (``reasoning``, ``action``), gets on each turn the move the built-in demos
(:func:`~rolecall.programs.baselines.agent_demos.search_r1_demos`) teach, in their exact wording, since that is what
the model is prompted with and evaluated on:

- the next gold step i is the first one none of whose supporting passages the interaction has shown yet;
- while there is one: ``<search>q_i</search>``, q_i the gold sub-question with the earlier gold answers filled in
  (``Which country is Shigra Sikarndal from?``), with the demos' thought (``First find: q_1``, then ``Found a_{i-1}.
  Now find: q_i``);
- once every step is covered: ``<answer>a</answer>`` with the gold answer ``example.answers[0]`` and the thought
  ``Found a_last. Done.``; the forced answer turn (search budget spent) gets the same gold answer.

Every action is exactly one complete tag, so each gold turn parses as a valid action (``meta["valid_action"]``).

Decisions where the paper and the program leave room:

- *Shown* means in the prompt: a passage listed in one of the interaction's ``<information>`` blocks (the k-th block
  is the k-th retrieval; ``max_context_chars`` cuts later passages). A gold passage cut mid-text counts only when the
  cut kept the sub-answer, as in D2Plan's gold: the agent must be able to read what it moves on with. A passage
  shown by an earlier step's search counts too (a step can be covered without its own search).
- A step without supporting passages is covered at once (there is nothing to search for).
- After a miss (q_i ran and showed no gold passage of step i) the next query is the first not yet run of, as in
  D2Plan's gold: each gold passage's title, then (with a corpus) that title with the words of the passage's sentence
  holding a_i but the title's and a_i's (``Trabryn Fefelmar She is married to``: BM25 ranks the films a director's
  name fills above her own passage for the bare name). Its thought is ``Not found yet. Now find: <query>`` (the demos
  show no miss; this keeps their shape). BM25 is deterministic, so a query is never repeated.
- When every one of those queries has run without showing a gold passage, the agent *moves on* to step i+1 rather
  than leaving the call to the LM: every turn stays a gold sample, the turn budget still bounds the episode, and the
  next filled sub-question names a_i as the demos do. None of the first 200 synthetic train gold paths gets there;
  4 of them run out of turns after a miss instead (3 and 4 hops, ``max_turns=4``), and all 200 end with every turn
  valid and the gold answer.
- The final answer is the gold answer even when a step was never covered (the budget ran out, or the step was
  skipped): the program asks for an answer and the gold target is the right one.
- An example without a gold decomposition (or without an answer) leaves every call to the LM: there is no gold
  search to write, and answering at once would teach the agent not to search.

Example:
    >>> with gold_path(search_r1_gold(example, corpus=world.corpus)):      # doctest: +SKIP
    ...     pred = SearchR1Agent(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.types import Document, Example, SubStep
from rolecall.optimizers.gold.text import relation_words, text_key
from rolecall.optimizers.gold.titles import passage_title

# The demos' own thought wording (private there; shared so the gold turns cannot drift from what the prompt shows).
from rolecall.programs.baselines.agent_demos import _thought as demo_thought
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.baselines.search_r1_actions import FORCE_ANSWER_NOTE
from rolecall.programs.core.demo_source import as_corpus_mapping, filled_steps
from rolecall.programs.core.gold import Override
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = ["search_r1_gold", "shown_passages", "relation_words"]

logger = logging.getLogger(__name__)

_ROLE = "agent"
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)  # one search's results in the interaction
_LINE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)  # one passage of format_passages


def shown_passages(interaction: str, retrievals: Sequence[Step]) -> dict[str, str]:
    """The passages an agent turn's ``interaction`` shows: passage id -> its shown text (title prefix removed).

    The k-th ``<information>`` block holds the passages of the k-th retrieval step, as ``format_passages`` numbers
    them; a passage the context budget cut off is not listed, so it is not shown.

    Example:
        >>> step = Step(kind="retrieval", role="retrieve", outputs={"passage_ids": ["d1"], "titles": ["Varn"]})
        >>> shown_passages("<search>Varn</search>\\n<information>[1] Varn | A city in Ostria.</information>", [step])
        {'d1': 'A city in Ostria.'}
    """
    shown: dict[str, str] = {}
    for block, step in zip(_INFORMATION.findall(interaction), retrievals, strict=False):
        ids, titles = step.outputs.get("passage_ids") or [], step.outputs.get("titles") or []
        for match in _LINE.finditer(block):
            j, line = int(match.group(1)) - 1, match.group(2)
            if j < len(ids):
                title = titles[j] if j < len(titles) else ""
                shown.setdefault(ids[j], line.removeprefix(f"{title} | ") if title else line)
    return shown


def _readable(step: SubStep, shown: Mapping[str, str]) -> bool:
    """True when a shown gold passage of ``step`` keeps its sub-answer (or was not cut)."""
    for doc_id in step.supporting_ids:
        text = shown.get(doc_id)
        if text is not None and (step.answer.casefold() in text.casefold() or not text.endswith("...")):
            return True
    return False


class _SearchR1Gold:
    """The override of one example (a class so the filled sub-questions are built once)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example, self.corpus = example, corpus
        self.steps = filled_steps(example)  # (q_i with earlier gold answers filled in, gold step i)
        self.turns = [{"query": question, "answer": step.answer} for question, step in self.steps]

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if role != _ROLE or not isinstance(program, SearchR1Agent):
            logger.debug("%s role %r has no Search-R1 gold; left to the LM", type(program).__name__, role)
            return None
        if not self.steps or not self.example.answer:
            logger.debug("example %s has no gold decomposition or answer; left to the LM", self.example.id)
            return None
        interaction = str(inputs.get("interaction", ""))
        if interaction.endswith(FORCE_ANSWER_NOTE):  # the forced turn: only an answer is valid
            return self._answer()
        retrievals = trajectory.retrievals()
        shown = shown_passages(interaction, retrievals)
        tried = {text_key(str(r.inputs.get("query", ""))) for r in retrievals}
        for i, (question, step) in enumerate(self.steps):
            if not step.supporting_ids or _readable(step, shown):
                continue
            if text_key(question) not in tried:
                return {"reasoning": demo_thought(self.turns, i), "action": f"<search>{question}</search>"}
            query = next((q for q in self._fallbacks(step, retrievals) if text_key(q) not in tried), None)
            if query is not None:
                return {"reasoning": f"Not found yet. Now find: {query}", "action": f"<search>{query}</search>"}
            logger.debug("gold step %d of %s not found by any gold query; moving on", i + 1, self.example.id)
        return self._answer()

    def _answer(self) -> dict[str, str]:
        """The final turn: the demos' closing thought and the gold answer."""
        return {
            "reasoning": demo_thought(self.turns, len(self.turns)),
            "action": f"<answer>{self.example.answer}</answer>",
        }

    def _fallbacks(self, step: SubStep, retrievals: Sequence[Step]) -> list[str]:
        """The queries after a miss, without repeats: each gold passage's title, then (with a corpus) that title with
        the words of the passage's sentence holding the sub-answer, title and answer words dropped (``Trabryn
        Fefelmar She is married to``: a name many other passages mention is found by the relation as worded)."""
        queries: list[str] = []
        for doc_id in step.supporting_ids:
            title = passage_title(doc_id, self.corpus, retrievals)
            if title and title.strip():
                queries.append(" ".join(title.split()))
        for doc_id in step.supporting_ids:
            doc = self.corpus.get(doc_id) if self.corpus is not None else None
            if doc is not None and doc.title.strip() and step.answer:
                words = relation_words(doc, step.answer)
                if words:
                    queries.append(" ".join([*doc.title.split(), *words]))
        return list(dict.fromkeys(queries))


def search_r1_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold turns of the Search-R1 agent for ``example``, as an override for
    :func:`~rolecall.programs.core.gold.gold_path`.

    Args:
        example: an example with a gold decomposition (sub-questions with ``#k`` references, answers and supporting
            passage ids) and a gold answer; without either every call is left to the LM.
        corpus: documents by id, or a list of them, to name a missed gold passage by its title and relation words;
            without it the titles come from the run's retrievals, else from the ids (``title::hash``), and there is
            no title-plus-relation query.

    Returns:
        ``override(program, role, inputs, trajectory)``: ``{"reasoning": ..., "action": "<search>q</search>"}`` or
        ``{"reasoning": ..., "action": "<answer>a</answer>"}`` (the ``agent`` role's output fields) for a
        :class:`~rolecall.programs.baselines.search_r1.SearchR1Agent`; None for any other program or role.
    """
    return _SearchR1Gold(example, as_corpus_mapping(corpus) if corpus is not None else None)
