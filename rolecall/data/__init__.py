"""Datasets: loaders for HotpotQA, 2WikiMultihopQA, MuSiQue and FlashRAG JSONL, corpora, and the synthetic world."""

from rolecall.data.corpus import (
    DATASETS,
    build_corpus,
    corpus_by_id,
    detect_format,
    documents_from_paragraphs,
    load_corpus_jsonl,
    load_dataset,
    paragraph_id_of,
    save_corpus_jsonl,
)
from rolecall.data.flashrag import load_flashrag, load_flashrag_corpus, write_flashrag, write_flashrag_corpus
from rolecall.data.hotpotqa import load_hotpotqa
from rolecall.data.io import Paragraph, split_sentences
from rolecall.data.musique import load_musique
from rolecall.data.split import hash_split
from rolecall.data.synthetic import SyntheticWorld, synthetic_world
from rolecall.data.twowiki import load_twowiki
from rolecall.data.types import Document, Example, SubStep, doc_id

__all__ = [
    "SyntheticWorld",
    "synthetic_world",
    "Document",
    "Example",
    "SubStep",
    "doc_id",
    "Paragraph",
    "split_sentences",
    "DATASETS",
    "load_dataset",
    "detect_format",
    "load_hotpotqa",
    "load_twowiki",
    "load_musique",
    "load_flashrag",
    "load_flashrag_corpus",
    "write_flashrag",
    "write_flashrag_corpus",
    "build_corpus",
    "documents_from_paragraphs",
    "paragraph_id_of",
    "corpus_by_id",
    "save_corpus_jsonl",
    "load_corpus_jsonl",
    "hash_split",
]
