"""Search-R1's action tags: reading ``<search>`` / ``<answer>`` from one agent turn, and writing a finished turn back
into the interaction (Jin et al., arXiv 2503.09516).

The agent writes its ``<think>`` text in the ``reasoning`` field and exactly one ``<search>query</search>`` or
``<answer>answer</answer>`` tag in ``action``; :func:`parse_action` reads it (and, when asked, recovers sloppy output
while flagging it invalid, so a GRPO format reward sees every malformed step). :func:`recover_action` looks for a tag
in the raw completions of a failed call (through :mod:`rolecall.programs.core.calls`); :func:`render_turn` writes a
turn the way later turns see it, with the results inside ``<information>...</information>``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from rolecall.programs.core.calls import COMPLETED_MARKER, completion_texts
from rolecall.programs.core.trajectory import Step

__all__ = [
    "ActionKind",
    "SearchR1Action",
    "parse_action",
    "recover_action",
    "render_turn",
    "INVALID_ACTION_NOTE",
    "NO_SEARCHES_YET",
    "FORCE_ANSWER_NOTE",
]

ActionKind = Literal["search", "answer", "invalid"]
"""What one Search-R1 turn did: searched, answered, or wrote no usable action."""

INVALID_ACTION_NOTE = "(invalid action: write <search>query</search> to search or <answer>answer</answer> to answer)"
"""What the program inserts into the interaction after an invalid action, so the agent can correct itself."""

NO_SEARCHES_YET = "(no searches yet)"
"""The interaction shown on a Search-R1 agent's first turn."""

FORCE_ANSWER_NOTE = "(no searches left: give the final answer now as <answer>answer</answer>)"
"""Appended to the interaction when the search budget is spent and the agent must answer."""


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


def recover_action(step: Step, error: str) -> SearchR1Action:
    """The first tag readable in what a role call wrote, flagged invalid with ``error`` (``"...; recovered from the
    completion"``); ``"invalid"`` when there is none.

    Looked at in order: the ``action`` field salvaged by ``call_role`` (``step.meta["salvaged"]``), then every raw
    completion (:func:`~rolecall.programs.core.calls.completion_texts`: DSPy's ChatAdapter attempt before its JSON
    fallback), each cut at ChatAdapter's completion marker.

    Example:
        >>> recover_action(Step(kind="role", role="agent", completion="Sure. <answer>G</answer>"), "bad").content
        'G'
    """
    salvaged = step.meta.get("salvaged", {}).get("action", "")
    for text in [salvaged, *completion_texts(step)]:
        recovered = parse_action(text.split(COMPLETED_MARKER)[0], lenient=True)
        if recovered.kind != "invalid":
            return recovered.model_copy(update={"valid": False, "error": f"{error}; recovered from the completion"})
    return SearchR1Action(kind="invalid", error=error)


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


def _clean(text: str) -> str:
    return " ".join(text.split())
