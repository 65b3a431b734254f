"""Datasets: loaders for HotpotQA, 2WikiMultihopQA, MuSiQue and FlashRAG JSONL, corpora, and the synthetic world."""

from rolecall.data.types import Document, Example, SubStep, doc_id

__all__ = ["Document", "Example", "SubStep", "doc_id"]
