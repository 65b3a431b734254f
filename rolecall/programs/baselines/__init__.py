"""The baselines every paper reports, as rolecall programs (PAPERS.md, "Baselines every paper compares against")."""

from rolecall.programs.baselines.direct import NoRetrievalCoT, SingleStepRAG
from rolecall.signatures.baselines import AnswerFromPassages, AnswerQuestion

__all__ = ["NoRetrievalCoT", "SingleStepRAG", "AnswerQuestion", "AnswerFromPassages"]
