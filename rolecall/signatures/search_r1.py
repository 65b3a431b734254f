"""Signatures of the two agentic baselines (PAPERS.md, "Baselines"): ReAct's task signature and the Search-R1-style
single agent's turn, plus the parser of Search-R1's ``<search>`` / ``<answer>`` action tags.

Search-R1 (Jin et al., arXiv 2503.09516) trains one LLM to interleave ``<think>`` reasoning with
``<search>query</search>`` calls; the environment inserts the results as ``<information>...</information>`` and the
episode ends at ``<answer>...</answer>``. Here one turn is a typed signature: ``reasoning`` holds the ``<think>`` text
and ``action`` exactly one ``<search>`` or ``<answer>`` tag, which :func:`parse_action` reads (and, when asked,
recovers from sloppy output while flagging it invalid, so a GRPO format reward can see every malformed step).
"""

from __future__ import annotations

import re
from typing import Literal

import dspy
from pydantic import BaseModel, Field

__all__ = [
    "ReActQuestion",
    "SearchR1Turn",
    "ActionKind",
    "SearchR1Action",
    "parse_action",
    "render_turn",
    "INVALID_ACTION_NOTE",
    "NO_SEARCHES_YET",
    "FORCE_ANSWER_NOTE",
    "REACT_HISTORY_FIELD",
]

ActionKind = Literal["search", "answer", "invalid"]
"""What one Search-R1 turn did: searched, answered, or wrote no usable action."""

INVALID_ACTION_NOTE = "(invalid action: write <search>query</search> to search or <answer>answer</answer> to answer)"
"""What the program inserts into the interaction after an invalid action, so the agent can correct itself."""


class ReActQuestion(dspy.Signature):
    """Answer the multi-hop question. Search for one fact at a time, using what earlier searches found, and finish
    once the passages name the answer. Give only the short answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a few words")


class SearchR1Turn(dspy.Signature):
    """Answer the question by searching a corpus. First think about what you know and what is missing. Then act with
    exactly one tag: <search>query</search> to look something up (the results come back inside
    <information>...</information>), or <answer>short answer</answer> once the information names the answer."""

    question: str = dspy.InputField()
    interaction: str = dspy.InputField(desc="your earlier searches and the information they returned")
    reasoning: str = dspy.OutputField(desc="what is known so far and what is still missing")
    action: str = dspy.OutputField(desc="exactly one <search>query</search> or <answer>answer</answer>")


class SearchR1Action(BaseModel):
    """One parsed turn of the Search-R1 agent.

    Attributes:
        kind: ``"search"``, ``"answer"`` or ``"invalid"``.
        content: the query or the answer (empty when invalid).
        valid: True only when the text is exactly one complete, non-empty tag (the format-reward flag).
        error: why the format is not valid (None when valid); set also for recovered actions.
    """

    kind: ActionKind
    content: str = ""
    valid: bool = False
    error: str | None = Field(default=None)


_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_OPEN = re.compile(r"<(search|answer)>", re.IGNORECASE)
_CUT = re.compile(r"<|\[\[|\n")  # an unclosed tag's content ends at the next tag, field header or line
_STRICT = re.compile(r"\s*<(search|answer)>(.*?)</\1>\s*", re.IGNORECASE | re.DOTALL)


def parse_action(text: str | None, *, lenient: bool = True) -> SearchR1Action:
    """Read the action of one turn: exactly one ``<search>...</search>`` or ``<answer>...</answer>``.

    Strictly valid: the whole text (up to whitespace) is one complete tag with non-empty content. With
    ``lenient=True`` a sloppy action is still recovered but flagged invalid: the first complete tag among several or
    with text around it, or an opening tag left unclosed (its content runs to the next ``<`` or the end).

    Args:
        text: the ``action`` field (or a raw completion).
        lenient: recover sloppy actions (still ``valid=False``); False makes them ``"invalid"``.

    Returns:
        The parsed action.

    Example:
        >>> parse_action("<search> Varn river </search>")
        SearchR1Action(kind='search', content='Varn river', valid=True, error=None)
        >>> parse_action("I think <answer>Ostrian").kind, parse_action("I think <answer>Ostrian").valid
        ('answer', False)
        >>> parse_action("Ostrian").kind
        'invalid'
    """
    text = text or ""
    strict = _STRICT.fullmatch(text)
    if strict and strict.group(2).strip() and not _OPEN.search(strict.group(2)):
        return SearchR1Action(kind=strict.group(1).lower(), content=_clean(strict.group(2)), valid=True)
    tags = [(m.group(1).lower(), _clean(m.group(2))) for m in _TAG.finditer(text)]
    nonempty = [(kind, content) for kind, content in tags if content]
    if nonempty:
        error = "several action tags" if len(tags) > 1 else "text outside the action tag"
    elif tags:
        error = "empty action tag"
    elif _OPEN.search(text):
        error = "unclosed action tag"
    else:
        error = "no <search> or <answer> tag"
    if not lenient:
        return SearchR1Action(kind="invalid", error=error)
    if nonempty:
        kind, content = nonempty[0]
        return SearchR1Action(kind=kind, content=content, valid=False, error=error)
    opened = _OPEN.search(text)
    if opened is not None and not tags:
        content = _clean(_CUT.split(text[opened.end() :], maxsplit=1)[0])
        if content:
            return SearchR1Action(kind=opened.group(1).lower(), content=content, valid=False, error=error)
    return SearchR1Action(kind="invalid", error=error)


def _clean(text: str) -> str:
    return " ".join(text.split())


REACT_HISTORY_FIELD = "past_trajectory"
"""Name of the input field that holds ReAct's formatted trajectory in rolecall's ReAct roles.

``dspy.ReAct`` calls it ``trajectory``; ``Program.call_role(role, trajectory, **inputs)`` already takes a parameter
of that name (the rolecall ``Trajectory``), so the field is renamed when the roles are built."""

NO_SEARCHES_YET = "(no searches yet)"
"""The interaction shown on a Search-R1 agent's first turn."""

FORCE_ANSWER_NOTE = "(no searches left: give the final answer now as <answer>answer</answer>)"
"""Appended to the interaction when the search budget is spent and the agent must answer."""


def render_turn(reasoning: str, action: SearchR1Action, result: str, *, show_reasoning: bool = True) -> str:
    """One finished turn as it appears in later turns' ``interaction``.

    A search becomes ``<search>q</search>`` followed by ``<information>result</information>``; an invalid action
    becomes :data:`INVALID_ACTION_NOTE`. With ``show_reasoning`` the turn opens with ``<think>reasoning</think>``.

    Example:
        >>> render_turn("Find Varn.", SearchR1Action(kind="search", content="Varn", valid=True), "[1] Varn | A city.")
        '<think>Find Varn.</think>\\n<search>Varn</search>\\n<information>[1] Varn | A city.</information>'
    """
    lines = [f"<think>{_clean(reasoning)}</think>"] if show_reasoning and reasoning.strip() else []
    if action.kind == "search":
        lines += [f"<search>{action.content}</search>", f"<information>{result}</information>"]
    elif action.kind == "answer":
        lines.append(f"<answer>{action.content}</answer>")
    else:
        lines.append(INVALID_ACTION_NOTE)
    return "\n".join(lines)
