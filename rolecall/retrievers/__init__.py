"""Retrievers: BM25 (bm25s), dense (sentence-transformers + FAISS), ColBERT (PyLate, PLAID), one interface."""

from rolecall.retrievers.base import Passage, Retriever
from rolecall.retrievers.bm25 import BM25
from rolecall.retrievers.colbert import ColBERTRetriever
from rolecall.retrievers.colbert_train import (
    ColBERTTrainConfig,
    ColBERTTriple,
    fine_tune_colbert,
    hard_negative_triples,
)
from rolecall.retrievers.dense import DenseRetriever
from rolecall.retrievers.tool import retriever_tool

__all__ = [
    "Passage",
    "Retriever",
    "BM25",
    "DenseRetriever",
    "ColBERTRetriever",
    "ColBERTTrainConfig",
    "ColBERTTriple",
    "fine_tune_colbert",
    "hard_negative_triples",
    "retriever_tool",
]
