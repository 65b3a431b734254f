"""The baselines every paper reports, as rolecall programs (PAPERS.md, "Baselines every paper compares against")."""

from rolecall.programs.baselines.direct import NoRetrievalCoT, SingleStepRAG, SingleStepRAGOptions
from rolecall.programs.baselines.ircot import IRCoT, IRCoTOptions
from rolecall.programs.baselines.iter_retgen import IterRetGen, IterRetGenOptions
from rolecall.programs.baselines.react import ReActAgent, ReActOptions
from rolecall.programs.baselines.search_r1 import SearchR1Agent, SearchR1Options
from rolecall.programs.baselines.self_ask import SelfAsk, SelfAskOptions
from rolecall.signatures.baselines import AnswerFromPassages, AnswerQuestion

__all__ = [
    "NoRetrievalCoT",
    "SingleStepRAG",
    "IRCoT",
    "IterRetGen",
    "SelfAsk",
    "ReActAgent",
    "SearchR1Agent",
    "SingleStepRAGOptions",
    "IRCoTOptions",
    "IterRetGenOptions",
    "SelfAskOptions",
    "ReActOptions",
    "SearchR1Options",
    "AnswerQuestion",
    "AnswerFromPassages",
]
