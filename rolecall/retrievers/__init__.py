"""Retrievers: BM25 (bm25s), dense (sentence-transformers + FAISS), all behind one interface."""

from rolecall.retrievers.base import Passage, Retriever
from rolecall.retrievers.bm25 import BM25
from rolecall.retrievers.dense import DenseRetriever
from rolecall.retrievers.tool import retriever_tool

__all__ = ["Passage", "Retriever", "BM25", "DenseRetriever", "retriever_tool"]
