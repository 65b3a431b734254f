"""Retrievers: BM25 (bm25s), dense (sentence-transformers + FAISS), all behind one interface."""

from rolecall.retrievers.base import Passage, Retriever

__all__ = ["Passage", "Retriever"]
