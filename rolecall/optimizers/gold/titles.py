"""The title of a gold passage, which the gold paths use as the query that retrieves it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from rolecall.data.types import Document
from rolecall.programs.core.trajectory import Step

__all__ = ["passage_title"]

logger = logging.getLogger(__name__)


def passage_title(doc_id: str, corpus: Mapping[str, Document] | None, retrievals: Iterable[Step]) -> str | None:
    """The title of ``doc_id``: from the corpus, else a retrieval step that returned it, else its id's title part
    (``"<title>::<hash>"``, see ``rolecall.data.types.doc_id``); None when none of them knows it."""
    if corpus is not None and doc_id in corpus:
        return corpus[doc_id].title
    for step in retrievals:
        ids, titles = step.outputs.get("passage_ids") or [], step.outputs.get("titles") or []
        if doc_id in ids and len(titles) == len(ids) and titles[ids.index(doc_id)]:
            return titles[ids.index(doc_id)]
    if "::" in doc_id:
        return doc_id.split("::", 1)[0]
    logger.debug("no title for passage %s", doc_id)
    return None
