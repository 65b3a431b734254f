"""Evaluation: answer and retrieval metrics, the statistics reported over them, and the parallel runner."""

from rolecall.evaluation.feedback import ScoreName, answer_feedback, answer_score, gold_answers
from rolecall.evaluation.metrics import (
    cover_exact_match,
    exact_match,
    f1_precision_recall,
    f1_score,
    ndcg_at_k,
    normalize_answer,
    qa_scores,
    recall_at_k,
)
from rolecall.evaluation.records import EvaluationRecord, EvaluationSummary, format_summary, read_records
from rolecall.evaluation.runner import EvaluationResult, evaluate, evaluate_one
from rolecall.evaluation.stats import avg_at_k, mean_and_ci, pass_at_k

__all__ = [
    # metrics
    "normalize_answer",
    "exact_match",
    "f1_score",
    "f1_precision_recall",
    "cover_exact_match",
    "qa_scores",
    "recall_at_k",
    "ndcg_at_k",
    # DSPy metrics (GEPA feedback)
    "ScoreName",
    "answer_score",
    "answer_feedback",
    "gold_answers",
    # stats
    "mean_and_ci",
    "avg_at_k",
    "pass_at_k",
    # runner
    "evaluate",
    "evaluate_one",
    "EvaluationResult",
    "EvaluationRecord",
    "EvaluationSummary",
    "read_records",
    "format_summary",
]
