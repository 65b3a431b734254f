"""The baselines every paper reports, as rolecall programs (PAPERS.md, "Baselines every paper compares against")."""

from rolecall.programs.baselines.direct import NoRetrievalCoT, SingleStepRAG
from rolecall.programs.baselines.ircot import IRCoT
from rolecall.programs.baselines.iter_retgen import IterRetGen
from rolecall.programs.baselines.react import ReActAgent
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.baselines.self_ask import SelfAsk
from rolecall.signatures.baselines import AnswerFromPassages, AnswerQuestion

__all__ = [
    "NoRetrievalCoT",
    "SingleStepRAG",
    "IRCoT",
    "IterRetGen",
    "SelfAsk",
    "ReActAgent",
    "SearchR1Agent",
    "AnswerQuestion",
    "AnswerFromPassages",
]
