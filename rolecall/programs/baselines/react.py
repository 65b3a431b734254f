"""ReAct baseline: ``dspy.ReAct`` with the retriever as its ``search`` tool, every LM call and search recorded.

Yao et al., "ReAct: Synergizing Reasoning and Acting in Language Models" (ICLR 2023), as DSPy implements it:

    for i = 0 .. max_iters - 1:
        (thought_i, tool_i, args_i) = react(question, trajectory)       # role "react"
        observation_i = tool_i(**args_i)                                 # search(query) or finish()
        if tool_i = finish: break
    (reasoning, answer) = extract(question, trajectory)                  # role "extract" (chain of thought)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import dspy

from rolecall.programs.baselines.agent_demos import default_react_demos
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import NO_PASSAGES
from rolecall.signatures.baselines import REACT_HISTORY_FIELD, ReActQuestion

__all__ = ["ReActAgent", "ReActOptions"]

logger = logging.getLogger(__name__)


class _StepFailed(ValueError):
    """Raised inside ``dspy.ReAct``'s loop when a ``react`` call failed; ReAct ends the loop on a ``ValueError``."""


@dataclass(kw_only=True)
class ReActOptions(PassageOptions):
    """Options of :class:`ReActAgent` (``max_passage_chars`` / ``max_context_chars`` inherited: one passage and all
    passages of one observation)."""

    top_k: int = option(3, low=1)
    """Passages one search returns."""
    max_iters: int = option(5, low=1)
    """Most ``react`` turns (tool calls, ``finish`` included) before the answer is extracted."""


class ReActAgent(PassageProgram):
    """ReAct over the retriever: DSPy's own ``dspy.ReAct`` loop with roles ``react`` and ``extract``.

    Design: the program's roles are the two predictors of a ``dspy.ReAct`` built in :meth:`_build_roles` (``react``,
    a ``Predict`` choosing ``next_thought`` / ``next_tool_name`` / ``next_tool_args``; ``extract``, a
    ``ChainOfThought`` giving the answer from the trajectory). Each question runs DSPy's unmodified ``ReAct.forward``
    loop on a fresh runner that shares those predictors and whose one hook, the call of a predictor on the trajectory
    so far, goes through :meth:`Program.call_role`. So every LM call is one recorded role step (exact messages,
    completion, usage, ``meta["iteration"]``, the chosen tool and arguments), while the loop, the prompts and the
    ``finish`` tool stay DSPy's (which is why this program does not use
    :class:`~rolecall.programs.core.search.SearchLoop`: the loop is ``dspy.ReAct``'s). The runner's ``search`` tool
    closes over the question's :class:`Trajectory` and calls :meth:`Program.retrieve`, so each search is also a
    recorded retrieval step (``meta["iteration"]``); its observation is the passages cut to ``max_passage_chars`` /
    ``max_context_chars``.

    Two departures from plain ``dspy.ReAct``: the trajectory input field is named ``past_trajectory`` (``call_role``
    already takes a ``trajectory`` argument), and an unparseable ``react`` output ends the loop and moves on to
    ``extract`` (in DSPy 3.4 an ``AdapterParseError`` is no ``ValueError``, so ``dspy.ReAct`` would raise instead).

    Options: :class:`ReActOptions`; the other arguments: :class:`Program` (the DSPy ``adapter`` also formats the
    trajectory, as in ``dspy.ReAct``). Default token budgets: react 128, extract 96. Built-in demos: hand-built turns
    of gold episodes (first search, follow-up search, finish) and whole episodes for ``extract``.

    Example:
        >>> program = ReActAgent(BM25(world.corpus), lm=LocalLM())           # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> [s.meta["tool_name"] for s in pred.trajectory.role_steps("react") if s.ok]  # doctest: +SKIP
    """

    Options: ClassVar[type[ReActOptions]] = ReActOptions
    ROLES: ClassVar[tuple[str, ...]] = ("react", "extract")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"react": 128, "extract": 96}

    top_k: int
    max_iters: int

    def _build_roles(self) -> None:
        template = dspy.ReAct(ReActQuestion, tools=[self._search_tool(None)], max_iters=self.max_iters)
        self.react = template.react
        self.react.signature = _rename_history(self.react.signature)
        self.extract = template.extract
        self.extract.predict.signature = _rename_history(self.extract.predict.signature)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """Turns and whole episodes of gold searches
        (:func:`~rolecall.programs.baselines.agent_demos.default_react_demos`)."""
        return default_react_demos()

    def _search_tool(self, runner: _RecordedReAct | None) -> dspy.Tool:
        """The ``search`` tool; with a runner, each call is a recorded retrieval into the runner's trajectory."""

        def search(query: str) -> str:
            if runner is None:  # the template tool only lends its name and description to the prompt
                return NO_PASSAGES
            passages = self.retrieve(runner.record, query, self.top_k)
            runner.record.steps[-1].meta.update(iteration=runner.iteration, tool="search")
            if not passages:
                return NO_PASSAGES
            return self.show_passages(passages)

        desc = (
            f"Search the corpus and return the top {self.top_k} passages for `query`, numbered as '[i] title | text'. "
            "Ask for one fact at a time: a short question or keywords naming the entity you need."
        )
        return dspy.Tool(search, name="search", desc=desc, arg_desc={"query": "keywords or a question to search for"})

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """Run the ReAct loop; ``Prediction(answer, trajectory, reasoning, react_steps)`` (``react_steps`` is
        ``dspy.ReAct``'s own trajectory dict)."""
        runner = _RecordedReAct(self, trajectory)
        overrides = {} if self.adapter is None else {"adapter": self.adapter}  # it also formats the trajectory
        with dspy.context(**overrides):
            out = runner(question=question)
        return dspy.Prediction(
            answer=str(out.get("answer") or "").strip(),
            trajectory=trajectory,
            reasoning=str(out.get("reasoning") or ""),
            react_steps=_plain(out.get("trajectory") or {}),
        )


class _RecordedReAct(dspy.ReAct):
    """``dspy.ReAct`` for one question: the program's predictors, recorded calls and a recording ``search`` tool."""

    def __init__(self, program: ReActAgent, record: Trajectory) -> None:
        self.record = record
        self.iteration = 0
        self.finished = False
        self.stopped_at: int | None = None
        super().__init__(ReActQuestion, tools=[program._search_tool(self)], max_iters=program.max_iters)
        # the program's (possibly optimised) predictors replace the fresh ones; a bound method is no sub-module
        self.react, self.extract = program.react, program.extract
        self._call_role = program.call_role
        self.tools["search"] = _ToolErrors(self.tools["search"], self)

    def _call_with_potential_trajectory_truncation(self, module: Any, trajectory: dict[str, Any], **input_args: Any):
        role = "react" if module is self.react else "extract"
        if role == "extract" and not self.finished and self.stopped_at is None:
            step = self.record.event("budget_exhausted", max_iters=self.max_iters)
            step.error = f"no finish within max_iters={self.max_iters}; the answer is extracted anyway"
        inputs = {**input_args, REACT_HISTORY_FIELD: self._format_trajectory(trajectory)}
        pred = self._call_role(role, self.record, **inputs)
        step = self.record.steps[-1]
        if role == "extract":
            return pred if pred is not None else dspy.Prediction(reasoning="", answer="")
        self.iteration = len(trajectory) // 4  # ReAct keeps thought, tool name, tool args and observation per turn
        step.meta["iteration"] = self.iteration
        if pred is None:  # end the loop the way dspy.ReAct ends it on an invalid tool choice
            self.stopped_at = self.iteration
            self.record.event("fallback", reason="react output unparseable", iteration=self.iteration)
            raise _StepFailed(f"react output unparseable at iteration {self.iteration}")
        step.meta.update(tool_name=pred.next_tool_name, tool_args=_plain(pred.next_tool_args))
        self.finished = pred.next_tool_name == "finish"
        return pred


class _ToolErrors:
    """Calls a tool; a failure (bad arguments) is recorded as a ``tool_error`` event and becomes a one-line
    ``Execution error`` observation (``dspy.ReAct`` would append a traceback, hundreds of tokens a small model cannot
    use)."""

    def __init__(self, tool: dspy.Tool, runner: _RecordedReAct) -> None:
        self.tool, self.runner = tool, runner

    def __call__(self, **kwargs: Any) -> Any:
        try:
            return self.tool(**kwargs)
        except Exception as e:
            message = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            step = self.runner.record.event("tool_error", tool=self.tool.name, iteration=self.runner.iteration)
            step.error = message
            return f"Execution error in {self.tool.name}: {message}"


def _rename_history(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """``signature`` with ``dspy.ReAct``'s ``trajectory`` input renamed to :data:`REACT_HISTORY_FIELD`, kept last
    among the inputs."""
    field = signature.input_fields["trajectory"]
    return signature.delete("trajectory").append(REACT_HISTORY_FIELD, field, type_=str)


def _plain(value: Any) -> Any:
    """``value`` as JSON data (tool arguments and ReAct's trajectory dict go into JSONL records)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)
