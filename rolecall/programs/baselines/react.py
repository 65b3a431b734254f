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
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.agent_demos import default_agent_demos
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Retriever
from rolecall.retrievers.tool import NO_PASSAGES
from rolecall.signatures.search_r1 import REACT_HISTORY_FIELD, ReActQuestion

__all__ = ["ReActAgent"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"react": 128, "extract": 96}


class _StepFailed(ValueError):
    """Raised inside ``dspy.ReAct``'s loop when a ``react`` call failed; ReAct ends the loop on a ``ValueError``."""


class ReActAgent(Program):
    """ReAct over the retriever: DSPy's own ``dspy.ReAct`` loop with roles ``react`` and ``extract``.

    Design: the program's roles are the two predictors of a ``dspy.ReAct`` built in ``__init__`` (``react``, a
    ``Predict`` choosing ``next_thought`` / ``next_tool_name`` / ``next_tool_args``; ``extract``, a ``ChainOfThought``
    giving the answer from the trajectory). Each question runs DSPy's unmodified ``ReAct.forward`` loop on a fresh
    runner that shares those predictors and whose one hook, the call of a predictor on the trajectory so far, goes
    through :meth:`Program.call_role`. So every LM call is one recorded role step (exact messages, completion, usage,
    ``meta["iteration"]``, the chosen tool and arguments), while the loop, the prompts and the ``finish`` tool stay
    DSPy's. The runner's ``search`` tool closes over the question's :class:`Trajectory` and calls
    :meth:`Program.retrieve`, so each search is also a recorded retrieval step (``meta["iteration"]``); its
    observation is the passages cut to ``max_passage_chars`` / ``max_context_chars``.

    Two departures from plain ``dspy.ReAct``: the trajectory input field is named ``past_trajectory`` (``call_role``
    already takes a ``trajectory`` argument), and an unparseable ``react`` output ends the loop and moves on to
    ``extract`` (in DSPy 3.4 an ``AdapterParseError`` is no ``ValueError``, so ``dspy.ReAct`` would raise instead).

    Args:
        retriever: the retriever behind the ``search`` tool.
        lm: LM for both roles (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (hand-built turns of gold episodes: first search, follow-up search, finish; and whole
            episodes for ``extract``), None (zero-shot) or a dict role -> list of ``dspy.Example``.
        top_k: passages one search returns.
        max_iters: most ``react`` turns (tool calls, ``finish`` included) before the answer is extracted.
        max_passage_chars: characters of one passage in an observation.
        max_context_chars: characters of all passages of one observation.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls (it also formats the trajectory, as in ``dspy.ReAct``).
        lm_kwargs: LM call arguments by role (see :class:`Program`). Default: stop on the completion marker, 128 new
            tokens for ``react`` and 96 for ``extract``.

    Example:
        >>> program = ReActAgent(BM25(world.corpus), lm=LocalLM())           # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> [s.meta["tool_name"] for s in pred.trajectory.role_steps("react") if s.ok]  # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 3,
        max_iters: int = 5,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        if top_k < 1 or max_iters < 1:
            raise ConfigError(f"top_k and max_iters must be >= 1, got top_k={top_k}, max_iters={max_iters}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_iters = top_k, max_iters
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self._config |= {
            "top_k": top_k,
            "max_iters": max_iters,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
        }
        template = dspy.ReAct(ReActQuestion, tools=[self._search_tool(None)], max_iters=max_iters)
        self.react = template.react
        self.react.signature = _rename_history(self.react.signature)
        self.extract = template.extract
        self.extract.predict.signature = _rename_history(self.extract.predict.signature)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_agent_demos("react")
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        self.set_demos(demos)

    def _search_tool(self, runner: _RecordedReAct | None) -> dspy.Tool:
        """The ``search`` tool; with a runner, each call is a recorded retrieval into the runner's trajectory."""

        def search(query: str) -> str:
            if runner is None:  # the template tool only lends its name and description to the prompt
                return NO_PASSAGES
            passages = self.retrieve(runner.record, query, self.top_k)
            runner.record.steps[-1].meta.update(iteration=runner.iteration, tool="search")
            if not passages:
                return NO_PASSAGES
            return format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)

        desc = (
            f"Search the corpus and return the top {self.top_k} passages for `query`, numbered as '[i] title | text'. "
            "Ask for one fact at a time: a short question or keywords naming the entity you need."
        )
        return dspy.Tool(search, name="search", desc=desc, arg_desc={"query": "keywords or a question to search for"})

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Run the ReAct loop on ``question``; returns ``Prediction(answer, trajectory, reasoning, react_steps)`` and
        never raises (``react_steps`` is ``dspy.ReAct``'s own trajectory dict)."""
        trajectory = Trajectory(question=question)
        try:
            runner = _RecordedReAct(self, trajectory)
            if self.adapter is not None:
                with dspy.context(adapter=self.adapter):
                    out = runner(question=question)
            else:
                out = runner(question=question)
            answer = str(out.get("answer") or "").strip()
            return dspy.Prediction(
                answer=answer,
                trajectory=trajectory,
                reasoning=str(out.get("reasoning") or ""),
                react_steps=_plain(out.get("trajectory") or {}),
            )
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)


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
