"""Search-R1-style single agent: one role interleaves reasoning with ``<search>`` calls until it ``<answer>``\\ s.

Jin et al., "Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement Learning",
arXiv 2503.09516. The agent is one policy π; the program is its environment (a
:class:`~rolecall.programs.core.search.SearchLoop` of ``max_turns`` turns):

    H_0 = ""                                                   # the interaction so far
    for t = 0 .. max_turns - 1:
        (think_t, a_t) = agent(q, H_t)                         # a_t: <search>s</search> or <answer>y</answer>
        if a_t = <answer>y</answer>: return y
        if a_t = <search>s</search>: H_{t+1} = H_t + <search>s</search><information>retrieve(s, k)</information>
        else:                        H_{t+1} = H_t + (invalid-action note)     # a "continue" turn
    (think, a) = agent(q, H_T + "no searches left")            # forced answer
    return y of a

Every agent step records ``meta``: ``turn``, ``action`` (search / answer / invalid), ``query`` or ``answer``,
``valid_action`` (the per-step format flag a GRPO format reward reads), ``format_error`` and ``forced``. The agent is
trained with plain GRPO on the recorded messages and completions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import dspy

from rolecall.programs.baselines.agent_demos import default_search_r1_demos
from rolecall.programs.baselines.search_r1_actions import (
    FORCE_ANSWER_NOTE,
    NO_SEARCHES_YET,
    SearchR1Action,
    parse_action,
    recover_action,
    render_turn,
)
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.signatures.baselines import SearchR1Turn

__all__ = ["SearchR1Agent", "SearchR1Options"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SearchR1Options(PassageOptions):
    """Options of :class:`SearchR1Agent` (``max_passage_chars`` / ``max_context_chars`` inherited: one passage and
    one ``<information>`` block)."""

    top_k: int = option(3, low=1)
    """Passages per search (Search-R1 uses 3)."""
    max_turns: int = option(4, low=1)
    """Most agent turns (searches and invalid actions) before the forced answer."""
    strict_format: bool = False
    """Execute only strictly valid actions (sloppy ones count as invalid and the agent is told so)."""
    show_reasoning: bool = True
    """Earlier turns show their ``<think>`` text in the interaction (Search-R1 keeps it; False keeps prompts short)."""
    force_answer: bool = True
    """After ``max_turns`` without an answer, ask once more for an answer (False: return "")."""


@dataclass
class _Episode:
    """One question's interaction: the rendered turns, and the reasoning of the search now being run."""

    question: str
    turns: list[str] = field(default_factory=list)
    reasoning: str = ""

    @property
    def interaction(self) -> str:
        return "\n".join(self.turns) if self.turns else NO_SEARCHES_YET


class SearchR1Agent(PassageProgram):
    """One agent that thinks, searches with ``<search>query</search>`` and ends with ``<answer>answer</answer>``.

    Jin et al., arXiv 2503.09516 (see the module docstring for the loop). Role ``agent`` (a ``Predict`` of
    :class:`~rolecall.signatures.baselines.SearchR1Turn`: question, interaction -> reasoning (the ``<think>`` text),
    action). The program parses the action with :func:`~rolecall.programs.baselines.search_r1_actions.parse_action`,
    retrieves ``top_k`` passages per search and inserts them as ``<information>`` blocks; at most ``max_turns`` turns
    (so at most ``max_turns`` searches), then one forced answer turn. Options: :class:`SearchR1Options`; the other
    arguments: :class:`Program`. Default token budget: 96 for ``agent``.

    A turn whose output does not parse, or whose action is not exactly one complete tag, has
    ``meta["valid_action"] = False`` and a ``meta["format_error"]``. With ``strict_format=False`` (default) a sloppy
    but readable action (an unclosed tag, text around the tag, or tags in a completion that missed DSPy's field
    headers) is still executed; with ``strict_format=True`` it counts as an invalid action and the agent is told so.

    Example:
        >>> program = SearchR1Agent(BM25(world.corpus), lm=LocalLM())          # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> [s.meta["valid_action"] for s in pred.trajectory.role_steps("agent")]  # doctest: +SKIP
    """

    Options: ClassVar[type[SearchR1Options]] = SearchR1Options
    ROLES: ClassVar[tuple[str, ...]] = ("agent",)
    MAX_TOKENS: ClassVar[dict[str, int]] = {"agent": 96}

    top_k: int
    max_turns: int
    strict_format: bool
    show_reasoning: bool
    force_answer: bool

    def _build_roles(self) -> None:
        self.agent = dspy.Predict(SearchR1Turn)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """Turns of gold episodes: first search, follow-up search, answer
        (:func:`~rolecall.programs.baselines.agent_demos.default_search_r1_demos`)."""
        return default_search_r1_demos(show_reasoning=self.show_reasoning)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """Run the agent; ``Prediction(answer, trajectory, interaction, searches, format_valid)``, where
        ``format_valid`` is True when every agent turn was strictly well-formed."""
        episode = _Episode(question)
        loop = SearchLoop(
            self,
            trajectory,
            act=lambda lp: self._turn(lp, episode),
            k=self.top_k,
            max_turns=self.max_turns,
            observe=lambda lp, obs: self._inform(obs, episode),
        ).run()
        answer = loop.answer
        if answer is None:
            answer = self._forced_answer(episode, trajectory) if self.force_answer else ""
        steps = trajectory.role_steps("agent")
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            interaction=episode.interaction,
            searches=loop.searches,
            format_valid=bool(steps) and all(s.meta.get("valid_action") for s in steps),
        )

    def _turn(self, loop: SearchLoop, episode: _Episode) -> SearchAction:
        """One loop turn: an answer ends the loop, a search runs (rendered by :meth:`_inform`), an invalid action is
        rendered at once and spends the turn."""
        reasoning, action = self._act(episode, loop.trajectory, turn=loop.turn, forced=False)
        if action.kind == "answer":
            return SearchAction("answer", action.content)
        if action.kind == "search":
            episode.reasoning = reasoning
            return SearchAction("search", action.content)
        episode.turns.append(render_turn(reasoning, action, "", show_reasoning=self.show_reasoning))
        return SearchAction("continue")

    def _inform(self, observation: Observation, episode: _Episode) -> None:
        """Write the finished search turn, its passages inside ``<information>``, into the interaction."""
        result = self.show_passages(observation.passages)
        action = SearchR1Action(kind="search", content=observation.query, valid=True)
        episode.turns.append(render_turn(episode.reasoning, action, result, show_reasoning=self.show_reasoning))

    def _forced_answer(self, episode: _Episode, trajectory: Trajectory) -> str:
        """The forced turn after the budget: only an ``<answer>`` counts."""
        _, action = self._act(episode, trajectory, turn=self.max_turns, forced=True)
        if action.kind == "answer":
            return action.content
        trajectory.event("no_answer", action=action.kind).error = "the forced turn gave no <answer>"
        return ""

    def _act(self, episode: _Episode, trajectory: Trajectory, *, turn: int, forced: bool) -> tuple[str, SearchR1Action]:
        """One agent call: call the role, parse its action and record the per-turn meta."""
        interaction = episode.interaction
        if forced:
            interaction = f"{interaction}\n{FORCE_ANSWER_NOTE}" if episode.turns else FORCE_ANSWER_NOTE
        pred = self.call_role("agent", trajectory, question=episode.question, interaction=interaction)
        step = trajectory.steps[-1]
        reasoning = str(pred.get("reasoning") or "") if pred is not None else ""
        action = self._parse(pred, step)
        if forced and action.kind == "search":  # no searches left: a search here is an invalid action
            action = SearchR1Action(kind="invalid", error="a search after the search budget was spent")
        step.meta.update(
            turn=turn, action=action.kind, valid_action=action.valid, format_error=action.error, forced=forced
        )
        if action.kind == "search":
            step.meta["query"] = action.content
        elif action.kind == "answer":
            step.meta["answer"] = action.content
        return reasoning, action

    def _parse(self, pred: dspy.Prediction | None, step: Step) -> SearchR1Action:
        """The action of a role call. Unless ``strict_format``, an action field without a usable tag, or an output
        that did not parse at all, falls back to the tags anywhere in what the call wrote (flagged invalid)."""
        if pred is not None:
            action = parse_action(str(pred.get("action") or ""), lenient=not self.strict_format)
            if action.kind != "invalid" or self.strict_format:
                return action
            return recover_action(step, f"action field: {action.error}")
        if self.strict_format:
            return SearchR1Action(kind="invalid", error="output did not parse")
        return recover_action(step, "output did not parse")
