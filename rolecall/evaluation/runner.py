"""Parallel evaluation of a program on QA examples, with one record per question (``rolecall.evaluate``).

Each example runs as ``program(question=...)`` in a thread pool: LM calls from many threads are batched into one
forward pass by ``LocalLM``, so more threads than cores is the point. Each thread runs in a copy of the caller's
``contextvars`` context, so ``with dspy.context(lm=...)`` around :func:`evaluate` reaches every worker.

Failure is data: a program that raises, returns no trajectory or an empty answer gets a record with ``success=False``
(and the exception as ``error``), scored 0; the run never crashes on it. A role call that failed inside the program
(the LM raised, not a parse error: ``step.meta["call_failed"]``) is counted in the record's ``failed_calls``, so a run
whose every LM call failed reports every question as an error rather than as wrong answers.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolecall.data.corpus import paragraph_id_of
from rolecall.data.types import Example
from rolecall.errors import ConfigError, DataFormatError
from rolecall.evaluation.metrics import qa_scores
from rolecall.evaluation.records import (
    EvaluationRecord,
    EvaluationSummary,
    RecordWriter,
    read_records,
    to_jsonable,
    write_summary,
)
from rolecall.programs.core.trajectory import Trajectory

__all__ = ["EvaluationResult", "evaluate", "evaluate_one", "RECORDS_FILE", "SUMMARY_FILE"]

logger = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class _Item:
    """The fields of one example the runner needs, whatever type it came as."""

    id: str
    question: str
    answers: list[str]
    supporting_ids: list[str]


@dataclass
class EvaluationResult:
    """What :func:`evaluate` returns.

    Attributes:
        records: one record per example, in the order of the examples given.
        summary: the aggregate numbers.
        output_dir: where ``records.jsonl`` and ``summary.json`` were written, or None.
        metric_prefix: the prefix of :attr:`metrics` keys.
    """

    records: list[EvaluationRecord]
    summary: EvaluationSummary
    output_dir: Path | None = None
    metric_prefix: str = ""

    @property
    def metrics(self) -> dict[str, float | int | None]:
        """The summary as a flat dict with prefixed keys (``f"{metric_prefix}em"``, ...), for loggers."""
        return self.summary.to_dict(self.metric_prefix)


def _get(example: Any, key: str) -> Any:
    if isinstance(example, Mapping):
        return example.get(key)
    try:  # dspy.Example supports .get; attribute access covers other record types
        return example.get(key)
    except AttributeError:
        return getattr(example, key, None)


def _as_item(example: Any, index: int) -> _Item:
    """Read id, question, gold answers and supporting ids from a rolecall Example, a dspy.Example or a mapping."""
    if isinstance(example, Example):
        if not example.answers:
            raise DataFormatError(
                f"example {index} (id {example.id!r}) has no gold answer; every evaluated example needs one"
            )
        return _Item(example.id, example.question, list(example.answers), list(example.supporting_ids))
    question = _get(example, "question")
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(f"example {index} has no question text (got {question!r}); every example needs one.")
    answers = _get(example, "answers")
    if answers is None:
        answers = _get(example, "answer")
    answers = [answers] if isinstance(answers, str) else list(answers or [])
    if not answers or not all(isinstance(a, str) for a in answers):
        raise DataFormatError(f"example {index} ({question[:60]!r}) needs `answer`/`answers` as str, not {answers!r}")
    ex_id = _get(example, "id")
    return _Item(
        id=f"#{index}" if ex_id is None else str(ex_id),
        question=question,
        answers=answers,
        supporting_ids=[str(s) for s in (_get(example, "supporting_ids") or [])],
    )


def _trajectory_of(prediction: Any) -> Trajectory | None:
    traj = getattr(prediction, "trajectory", None)
    if isinstance(traj, Trajectory):
        return traj
    if isinstance(traj, Mapping):
        try:
            return Trajectory.from_dict(dict(traj))
        except (TypeError, ValueError) as err:
            logger.debug("ignoring a trajectory dict that is not a Trajectory: %s", err)
    return None


def _retrieval_recall(retrieved_ids: Sequence[str], gold_ids: Sequence[str]) -> float | None:
    """|gold ∩ retrieved| / |gold|, where a retrieved sentence id also counts as its paragraph's id."""
    gold = set(gold_ids)
    if not gold:
        return None
    hits = set(retrieved_ids) | {paragraph_id_of(i) for i in retrieved_ids}
    return len(gold & hits) / len(gold)


def evaluate_one(program: Any, example: Any, index: int = 0) -> EvaluationRecord:
    """Run ``program`` on one example and score it; never raises for a failing program.

    Args:
        program: called as ``program(question=...)``; should return a prediction with ``answer`` and ``trajectory``.
        example: a rolecall ``Example``, a ``dspy.Example`` or a mapping with ``question`` and ``answer(s)``.
        index: the example's position (its id when it has none).

    Returns:
        The record.

    Raises:
        DataFormatError: the example lacks a question or gold answers.
    """
    item = example if isinstance(example, _Item) else _as_item(example, index)
    prediction, error = None, None
    start = time.perf_counter()
    try:
        prediction = program(question=item.question)
    except Exception as err:  # failure is data: the record keeps the error, the run goes on
        error = f"{type(err).__name__}: {err}"
        logger.warning("example %s: the program raised %s", item.id, error)
        logger.debug("traceback of example %s", item.id, exc_info=True)
    latency = time.perf_counter() - start
    answer = getattr(prediction, "answer", None) if prediction is not None else None
    answer = "" if answer is None else answer if isinstance(answer, str) else str(answer)
    traj = _trajectory_of(prediction)
    record = EvaluationRecord(
        id=item.id,
        question=item.question,
        answers=item.answers,
        prediction=answer,
        latency_s=latency,
        success=error is None and bool(answer.strip()),
        error=error,
        supporting_ids=item.supporting_ids,
        **qa_scores(answer, item.answers),
    )
    if traj is not None:
        record.steps = len(traj.steps)
        record.lm_calls, record.prompt_tokens = traj.lm_calls, traj.prompt_tokens
        record.completion_tokens = traj.completion_tokens
        for step in traj.role_steps():
            info = record.parse.setdefault(step.role, {"calls": 0, "parsed": 0})
            info["calls"] += 1
            info["parsed"] += int(step.ok)
            if step.meta.get("call_failed"):
                record.failed_calls += 1
                record.call_error = record.call_error or f"{step.role}: {step.error}"
        record.retrieved_ids = list(traj.retrieved_ids)
        record.trajectory = to_jsonable(traj.to_dict())
    record.retrieval_recall = _retrieval_recall(record.retrieved_ids, item.supporting_ids)
    return record


def _check_options(num_threads: int, output_dir: str | Path | None, resume: bool) -> None:
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ConfigError(f"num_threads must be a positive int (8-64 lets LocalLM batch well), got {num_threads!r}.")
    if resume and output_dir is None:
        raise ConfigError("resume=True needs the output_dir of the run to resume (it holds records.jsonl).")
    if output_dir is not None and not resume and (Path(output_dir) / RECORDS_FILE).exists():
        raise ConfigError(
            f"{Path(output_dir) / RECORDS_FILE} already exists; pass resume=True to continue that run, "
            "or choose a new output_dir."
        )


def evaluate(
    program: Any,
    examples: Sequence[Any],
    *,
    num_threads: int = 8,
    output_dir: str | Path | None = None,
    show_progress: bool = True,
    metric_prefix: str = "",
    resume: bool = False,
) -> EvaluationResult:
    """Run ``program`` on every example in parallel and score it (EM, F1, cover-EM, steps, tokens, latency, ...).

    Args:
        program: a rolecall program or any callable ``program(question=...)`` returning a prediction with ``answer``
            (and ideally ``trajectory``).
        examples: rolecall ``Example``s or ``dspy.Example``s (``question``, ``answer``/``answers``, optional ``id``
            and ``supporting_ids``). Ids must be unique; examples without one are named by position (``"#3"``).
        num_threads: worker threads; LM calls from them are batched, so use many (8-64).
        output_dir: write ``records.jsonl`` (one flushed line per finished question) and ``summary.json`` here.
        show_progress: show a tqdm bar with the running EM.
        metric_prefix: prefix of the keys of :attr:`EvaluationResult.metrics` (e.g. ``"test/"``).
        resume: skip the examples whose ids are already in ``output_dir/records.jsonl``.

    Returns:
        The records (in example order) and their summary.

    Raises:
        ConfigError: ``examples`` is empty, ids repeat, ``num_threads < 1``, ``resume`` without ``output_dir``, or
            ``output_dir`` already holds records and ``resume`` is False.
        DataFormatError: an example lacks a question or answers, or ``records.jsonl`` is corrupt before its last line.

    Example:
        >>> import dspy
        >>> echo = lambda question: dspy.Prediction(answer=question.split()[-1])
        >>> result = evaluate(echo, [dspy.Example(question="say yes", answer="yes")], show_progress=False)
        >>> result.summary.em, result.records[0].prediction
        (1.0, 'yes')
    """
    _check_options(num_threads, output_dir, resume)
    if len(examples) == 0:
        raise ConfigError("examples is empty: pass at least one example to evaluate.")
    items = [_as_item(ex, i) for i, ex in enumerate(examples)]
    counts = Counter(it.id for it in items)
    dupes = sorted(i for i, c in counts.items() if c > 1)
    if dupes:
        raise ConfigError(f"example ids must be unique (records and resume key on them); repeated: {dupes[:5]}")

    out = Path(output_dir) if output_dir is not None else None
    done: dict[str, EvaluationRecord] = {}
    if out is not None and resume:
        done = {r.id: r for r in read_records(out / RECORDS_FILE, repair=True) if r.id in counts}
        logger.info("resuming %s: %d of %d examples already done", out, len(done), len(items))
    todo = [it for it in items if it.id not in done]

    start = time.perf_counter()
    new = _run_parallel(program, todo, num_threads, out, show_progress)
    wall = time.perf_counter() - start
    by_id = {**done, **new}
    records = [by_id[it.id] for it in items]
    summary = EvaluationSummary.from_records(records, wall_s=wall, n_run=len(new))
    if out is not None:
        write_summary(summary, out / SUMMARY_FILE, extra={"program": type(program).__name__})
    logger.info("evaluated %d examples (%d new) in %.1fs: EM %.3f", len(records), len(new), wall, summary.em)
    return EvaluationResult(records=records, summary=summary, output_dir=out, metric_prefix=metric_prefix)


def _run_parallel(
    program: Any, todo: list[_Item], num_threads: int, out: Path | None, show_progress: bool
) -> dict[str, EvaluationRecord]:
    """Run ``todo`` on a thread pool; the caller's thread writes each record as it finishes."""
    results: dict[str, EvaluationRecord] = {}
    if not todo:
        return results
    writer = RecordWriter(out / RECORDS_FILE) if out is not None else None
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="evaluate", unit="q", dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=min(num_threads, len(todo)), thread_name_prefix="rolecall-eval")
    try:
        # Each task gets its own copy of the caller's context, so dspy.context(...) settings reach the workers.
        futures = [pool.submit(contextvars.copy_context().run, evaluate_one, program, it) for it in todo]
        em_sum = 0.0
        for future in as_completed(futures):
            record = future.result()
            results[record.id] = record
            if writer is not None:
                writer.write(record)
            em_sum += record.em
            if bar is not None:
                bar.update(1)
                bar.set_postfix(em=f"{em_sum / len(results):.3f}", refresh=False)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: finished records are already on disk
        raise
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
    pool.shutdown(wait=True)
    return results
