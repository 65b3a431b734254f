"""Running a program along a gold path: each role's output replaced by a given one, its input exactly what it sees.

SFT with gold targets (issue "training core + SFT") runs the program once per training question with an *override*
installed: a function ``override(program, role, inputs, trajectory) -> outputs | None``. When it returns the outputs
of a role call, :meth:`Program.call_role` does not call the LM; it records a step whose messages are what the role's
DSPy adapter would have sent (same instructions, demos or none, inputs) and whose completion is the adapter's
formatting of the gold outputs, and the program continues with those outputs. So each later role sees exactly what it
would see at inference with earlier roles answering right (its own retriever's passages included), and every recorded
``(messages, completion)`` pair is a training sample. Returning None lets the LM answer that call.

Example:
    >>> def always_paris(program, role, inputs, trajectory):
    ...     return {"answer": "Paris"} if role == "answer" else None
    >>> with gold_path(always_paris):                                     # doctest: +SKIP
    ...     pred = program(question="Capital of France?")
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import dspy

from rolecall.programs.core.calls import jsonable
from rolecall.programs.core.trajectory import Step, Trajectory

if TYPE_CHECKING:
    from rolecall.programs.core.protocol import ProgramLike

__all__ = ["Override", "gold_path", "gold_call", "format_pair"]

Override = Callable[["ProgramLike", str, dict[str, Any], Trajectory], "dict[str, Any] | None"]
"""``override(program, role, inputs, trajectory)``: the outputs the role call should have, or None for the LM's."""

_OVERRIDE: contextvars.ContextVar[Override | None] = contextvars.ContextVar("rolecall_gold_override", default=None)


@contextlib.contextmanager
def gold_path(override: Override) -> Iterator[None]:
    """Install ``override`` for the role calls made inside the block (this context only: concurrent questions in
    other threads keep their own, and ``parallel_map`` branches inherit it)."""
    token = _OVERRIDE.set(override)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def gold_call(
    program: ProgramLike, role: str, predictor: dspy.Predict, inputs: dict[str, Any], trajectory: Trajectory
) -> dspy.Prediction | None:
    """The gold answer of one role call when an override is installed and gives one (recorded as a step with
    ``meta["gold"] = True``), else None."""
    override = _OVERRIDE.get()
    if override is None:
        return None
    outputs = override(program, role, dict(inputs), trajectory)
    if outputs is None:
        return None
    signature = predictor.signature
    missing = sorted(set(signature.output_fields) - set(outputs))
    if missing:
        raise ValueError(f"the gold outputs of role {role!r} lack the fields {missing}")
    step = Step(kind="role", role=role, inputs=jsonable(inputs), adapter=program.adapter_name(role))
    step.messages, step.completion = format_pair(program, role, inputs, outputs)
    step.outputs = {name: jsonable(outputs[name]) for name in signature.output_fields}
    step.meta["gold"] = True
    trajectory.add(step)
    return dspy.Prediction(**{name: outputs[name] for name in signature.output_fields})


def format_pair(
    program: ProgramLike, role: str, inputs: dict[str, Any], outputs: dict[str, Any]
) -> tuple[list[dict[str, Any]], str]:
    """``(messages, completion)`` of one call of ``role``: the messages its DSPy adapter sends now (its demos, or none
    when it runs demo-free; the short trained prompt once its adapter is trained) and ``outputs`` in that adapter's
    output format."""
    predictor = program.roles[role]
    adapter = program.role_adapter(role) or dspy.settings.adapter or dspy.ChatAdapter()
    demos = [] if program.runs_demo_free(role) else list(predictor.demos)
    messages = adapter.format(predictor.signature, demos=demos, inputs=inputs)
    return messages, adapter.format_assistant_message_content(predictor.signature, outputs).rstrip("\n")
