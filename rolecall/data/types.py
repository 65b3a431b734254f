"""The one record type every dataset loader produces, and the corpus document type."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Document", "SubStep", "Example", "doc_id"]


def doc_id(title: str, text: str) -> str:
    """Stable id of a paragraph: its title plus a short hash of its text.

    The same (title, text) pair gets the same id in every loader and corpus builder, so gold supporting ids of an
    :class:`Example` always match the ids of a closed corpus built from the same files.

    Example:
        >>> doc_id("Paris", "Paris is the capital of France.").startswith("Paris::")
        True
    """
    digest = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:8]
    return f"{title}::{digest}"


@dataclass(frozen=True)
class Document:
    """One retrievable unit of a corpus (a paragraph, a sentence or a synthetic encyclopedia entry)."""

    id: str
    title: str
    text: str


@dataclass
class SubStep:
    """One step of a gold decomposition.

    ``question`` may hold ``#k`` placeholders (1-based) that refer to the answer of step k.
    """

    question: str
    answer: str
    supporting_ids: list[str] = field(default_factory=list)


@dataclass
class Example:
    """A multi-hop QA example in rolecall's single format.

    Attributes:
        id: the dataset's question id.
        question: the question text.
        answers: the gold answer first, then its aliases; metrics take the maximum over all of them.
        supporting_ids: ids (see :func:`doc_id`) of the gold supporting passages.
        decomposition: the gold decomposition, where the dataset has one.
        hops: number of reasoning hops (1 for single-hop).
        type: the question type (``bridge``, ``comparison``, ``compositional``, ``inference``, ...).
        dataset: the source dataset name.
        metadata: anything else the source record carried that a user may want.
    """

    id: str
    question: str
    answers: list[str]
    supporting_ids: list[str] = field(default_factory=list)
    decomposition: list[SubStep] | None = None
    hops: int = 1
    type: str = "unknown"
    dataset: str = "unknown"
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> str:
        """The canonical gold answer (the first of :attr:`answers`)."""
        return self.answers[0] if self.answers else ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of this example."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Example:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        if d.get("decomposition") is not None:
            d["decomposition"] = [SubStep(**s) for s in d["decomposition"]]
        return cls(**d)

    def to_dspy(self) -> Any:
        """This example as a ``dspy.Example`` with ``question`` as its only input.

        The gold fields ride along (``answer``, ``answers``, ``supporting_ids``, ``decomposition``, ``hops``, ``type``)
        so metrics and rewards can read them.
        """
        import dspy

        return dspy.Example(
            id=self.id,
            question=self.question,
            answer=self.answer,
            answers=list(self.answers),
            supporting_ids=list(self.supporting_ids),
            decomposition=[asdict(s) for s in self.decomposition] if self.decomposition else None,
            hops=self.hops,
            type=self.type,
            dataset=self.dataset,
        ).with_inputs("question")
