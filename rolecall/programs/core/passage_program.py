"""The base of programs that show retrieved passages to their roles, within the budgets of
:class:`~rolecall.programs.core.options.PassageOptions`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rolecall.programs.core.options import PassageOptions
from rolecall.programs.core.program import Program
from rolecall.programs.core.text import format_passages, show_fresh
from rolecall.retrievers.base import Passage

__all__ = ["PassageProgram"]


class PassageProgram(Program):
    """A :class:`Program` whose options are :class:`PassageOptions`: it shows passages cut to ``max_passage_chars``
    each and ``max_context_chars`` in all. Other arguments: :class:`Program`."""

    Options: ClassVar[type[PassageOptions]] = PassageOptions

    max_passage_chars: int
    max_context_chars: int

    def show_passages(self, passages: Sequence[Passage]) -> str:
        """``passages`` as prompt text within this program's budgets (:func:`format_passages`)."""
        return format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)

    def show_unseen_first(self, passages: list[Passage], seen: set[str]) -> tuple[list[Passage], str, list[str]]:
        """:func:`show_fresh` within this program's budgets: ``(ordered passages, the prompt text, the ids shown)``,
        the shown ids added to ``seen``."""
        return show_fresh(passages, seen, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
