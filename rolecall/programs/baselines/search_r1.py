"""Search-R1-style single agent: one role interleaves reasoning with ``<search>`` calls until it ``<answer>``\\ s.

Jin et al., "Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement Learning",
arXiv 2503.09516. The agent is one policy π; the program is its environment:

    H_0 = ""                                                   # the interaction so far
    for t = 0 .. max_turns - 1:
        (think_t, a_t) = agent(q, H_t)                         # a_t: <search>s</search> or <answer>y</answer>
        if a_t = <answer>y</answer>: return y
        if a_t = <search>s</search>: H_{t+1} = H_t + <search>s</search><information>retrieve(s, k)</information>
        else:                        H_{t+1} = H_t + (invalid-action note)
    (think, a) = agent(q, H_T + "no searches left")            # forced answer
    return y of a

Every agent step records ``meta``: ``turn``, ``action`` (search / answer / invalid), ``query`` or ``answer``,
``valid_action`` (the per-step format flag a GRPO format reward reads), ``format_error`` and ``forced``. The agent is
trained with plain GRPO on the recorded messages and completions.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.agent_demos import default_agent_demos
from rolecall.programs.core.program import COMPLETED_MARKER, Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.base import Retriever
from rolecall.signatures.search_r1 import (
    FORCE_ANSWER_NOTE,
    NO_SEARCHES_YET,
    SearchR1Action,
    SearchR1Turn,
    parse_action,
    render_turn,
)

__all__ = ["SearchR1Agent"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"agent": 96}


class SearchR1Agent(Program):
    """One agent that thinks, searches with ``<search>query</search>`` and ends with ``<answer>answer</answer>``.

    Jin et al., arXiv 2503.09516 (see the module docstring for the loop). Role ``agent`` (a ``Predict`` of
    :class:`~rolecall.signatures.search_r1.SearchR1Turn`: question, interaction -> reasoning (the ``<think>`` text),
    action). The program parses the action with :func:`~rolecall.signatures.search_r1.parse_action`, retrieves
    ``top_k`` passages per search and inserts them as ``<information>`` blocks; at most ``max_turns`` turns (so at most
    ``max_turns`` searches), then one forced answer turn.

    A turn whose output does not parse, or whose action is not exactly one complete tag, has
    ``meta["valid_action"] = False`` and a ``meta["format_error"]``. With ``strict_format=False`` (default) a sloppy
    but readable action (an unclosed tag, text around the tag, or tags in a completion that missed DSPy's field
    headers) is still executed; with ``strict_format=True`` it counts as an invalid action and the agent is told so.

    Args:
        retriever: the retriever behind ``<search>``.
        lm: LM for the ``agent`` role (a ``LocalLM`` gets its own LoRA adapter, see :class:`Program`).
        demos: ``"auto"`` (turns of gold episodes: first search, follow-up search, answer), None (zero-shot) or a
            dict ``{"agent": [...]}``.
        top_k: passages per search (Search-R1 uses 3).
        max_turns: most agent turns (searches and invalid actions) before the forced answer.
        max_passage_chars: characters of one passage inside ``<information>``.
        max_context_chars: characters of one ``<information>`` block.
        strict_format: execute only strictly valid actions (sloppy ones count as invalid).
        show_reasoning: earlier turns show their ``<think>`` text in the interaction (Search-R1 keeps it; False
            keeps prompts short).
        force_answer: after ``max_turns`` without an answer, ask once more for an answer (False: return "").
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls.
        lm_kwargs: LM call arguments by role (see :class:`Program`). Default: stop on the completion marker, 96 new
            tokens for ``agent``.

    Example:
        >>> program = SearchR1Agent(BM25(world.corpus), lm=LocalLM())          # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> [s.meta["valid_action"] for s in pred.trajectory.role_steps("agent")]  # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 3,
        max_turns: int = 4,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        strict_format: bool = False,
        show_reasoning: bool = True,
        force_answer: bool = True,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        if top_k < 1 or max_turns < 1:
            raise ConfigError(f"top_k and max_turns must be >= 1, got top_k={top_k}, max_turns={max_turns}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_turns = top_k, max_turns
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self.strict_format, self.show_reasoning, self.force_answer = strict_format, show_reasoning, force_answer
        self._config |= {
            "top_k": top_k,
            "max_turns": max_turns,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "strict_format": strict_format,
            "show_reasoning": show_reasoning,
            "force_answer": force_answer,
        }
        self.agent = dspy.Predict(SearchR1Turn)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_agent_demos("search_r1", show_reasoning=self.show_reasoning)
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        self.set_demos(demos)

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Run the agent on ``question``; returns ``Prediction(answer, trajectory, interaction, searches,
        format_valid)`` and never raises. ``format_valid`` is True when every agent turn was strictly well-formed."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        turns: list[str] = []
        searches = 0
        answer: str | None = None
        for turn in range(self.max_turns):
            reasoning, action = self._act(question, turns, trajectory, turn=turn, forced=False)
            if action.kind == "answer":
                answer = action.content
                break
            result = ""
            if action.kind == "search":
                searches += 1
                passages = self.retrieve(trajectory, action.content, self.top_k)
                trajectory.steps[-1].meta.update(turn=turn)
                result = format_passages(
                    passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars
                )
            turns.append(render_turn(reasoning, action, result, show_reasoning=self.show_reasoning))
        if answer is None:
            answer = self._forced_answer(question, turns, trajectory)
        steps = trajectory.role_steps("agent")
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            interaction=_interaction(turns),
            searches=searches,
            format_valid=bool(steps) and all(s.meta.get("valid_action") for s in steps),
        )

    def _forced_answer(self, question: str, turns: list[str], trajectory: Trajectory) -> str:
        step = trajectory.event("budget_exhausted", max_turns=self.max_turns, force_answer=self.force_answer)
        step.error = f"no <answer> within max_turns={self.max_turns}"
        if not self.force_answer:
            return ""
        _, action = self._act(question, turns, trajectory, turn=self.max_turns, forced=True)
        if action.kind == "answer":
            return action.content
        trajectory.event("no_answer", action=action.kind).error = "the forced turn gave no <answer>"
        return ""

    def _act(
        self, question: str, turns: list[str], trajectory: Trajectory, *, turn: int, forced: bool
    ) -> tuple[str, SearchR1Action]:
        """One agent turn: call the role, parse its action and record the per-turn meta."""
        interaction = _interaction(turns)
        if forced:
            interaction = f"{interaction}\n{FORCE_ANSWER_NOTE}" if turns else FORCE_ANSWER_NOTE
        pred = self.call_role("agent", trajectory, question=question, interaction=interaction)
        step = trajectory.steps[-1]
        reasoning = str(pred.get("reasoning") or "") if pred is not None else ""
        action = self._parse(pred, step)
        if forced and action.kind == "search":  # no searches left: a search here is an invalid action
            action = SearchR1Action(kind="invalid", error="a search after the search budget was spent")
        step.meta.update(
            turn=turn,
            action=action.kind,
            valid_action=action.valid,
            format_error=action.error,
            forced=forced,
        )
        if action.kind == "search":
            step.meta["query"] = action.content
        elif action.kind == "answer":
            step.meta["answer"] = action.content
        return reasoning, action

    def _parse(self, pred: dspy.Prediction | None, step: Step) -> SearchR1Action:
        """The action of a role call. Unless ``strict_format``, an action field without a usable tag, or an output
        that did not parse at all, falls back to the tags anywhere in the raw completion (flagged invalid)."""
        if pred is not None:
            action = parse_action(str(pred.get("action") or ""), lenient=not self.strict_format)
            if action.kind != "invalid" or self.strict_format:
                return action
            error = f"action field: {action.error}"
        elif self.strict_format:
            return SearchR1Action(kind="invalid", error="output did not parse")
        else:
            error = "output did not parse"
        attempts = step.meta.get("attempts") or [{"completions": [step.completion or ""]}]
        for attempt in attempts:  # DSPy's JSON fallback may have retried; the first (ChatAdapter) text comes first
            text = (attempt["completions"] or [""])[0] or ""
            recovered = parse_action(text.split(COMPLETED_MARKER)[0], lenient=True)
            if recovered.kind != "invalid":
                return recovered.model_copy(update={"valid": False, "error": f"{error}; recovered from the completion"})
        return SearchR1Action(kind="invalid", error=error)


def _interaction(turns: list[str]) -> str:
    return "\n".join(turns) if turns else NO_SEARCHES_YET
