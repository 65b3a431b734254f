"""Evaluation records and summaries: one :class:`EvaluationRecord` per question, streamed to ``records.jsonl``.

``records.jsonl`` is written one flushed line per finished question, so a run that is killed loses at most the line it
was writing; :func:`read_records` drops such a truncated last line (with a warning) and ``evaluate(..., resume=True)``
continues after it. :class:`EvaluationSummary` aggregates records into the numbers a paper table reports:

    em = (1/n) Σ_q em_q     (likewise f1, cover-EM, steps, LM calls, tokens, latency, success)
    parse_rate/<role> = Σ_q parsed_q,role / Σ_q calls_q,role          (micro average over that role's calls)
    retrieval_recall = mean over questions with gold ids of |gold ∩ retrieved| / |gold|

with percentile-bootstrap 95% intervals for EM and F1 (:func:`rolecall.evaluation.stats.mean_and_ci`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rolecall.errors import DataFormatError
from rolecall.evaluation.stats import mean_and_ci

__all__ = [
    "EvaluationRecord",
    "EvaluationSummary",
    "RecordWriter",
    "read_records",
    "write_summary",
    "format_summary",
    "to_jsonable",
]

logger = logging.getLogger(__name__)


@dataclass
class EvaluationRecord:
    """What happened on one question.

    Attributes:
        id: the example id (``"#<index>"`` for examples without one).
        question: the question text.
        answers: the gold answer and its aliases.
        prediction: the program's answer (``""`` when it failed).
        em: exact match (0/1).
        f1: token F1.
        precision: token precision of the best-F1 alias.
        recall: token recall of the best-F1 alias.
        cover_em: cover exact match (0/1).
        steps: number of trajectory steps (0 without a trajectory).
        lm_calls: LM calls made by the roles.
        prompt_tokens: prompt tokens over all role calls.
        completion_tokens: completion tokens over all role calls.
        latency_s: wall time of the program call.
        success: the program finished without an exception and gave a non-empty answer.
        error: ``"ExceptionType: message"`` when the program raised, else None.
        failed_calls: role calls that failed other than by a parse error (the LM raised: out of memory, a bad
            sampling setting, ...); the program may still have answered with a fallback.
        call_error: the first such failure, ``"role: ExceptionType: message"``, else None.
        parse: ``{role: {"calls": n, "parsed": k}}`` from the trajectory's role steps.
        supporting_ids: the gold supporting passage ids.
        retrieved_ids: every passage id retrieved, in order, without duplicates.
        retrieval_recall: fraction of gold supporting ids retrieved (None without gold ids).
        trajectory: the trajectory as a dict (see ``Trajectory.to_dict``), None without one.
    """

    id: str
    question: str
    answers: list[str]
    prediction: str = ""
    em: float = 0.0
    f1: float = 0.0
    precision: float = 0.0
    recall: float = 0.0
    cover_em: float = 0.0
    steps: int = 0
    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    success: bool = False
    error: str | None = None
    failed_calls: int = 0
    call_error: str | None = None
    parse: dict[str, dict[str, int]] = field(default_factory=dict)
    supporting_ids: list[str] = field(default_factory=list)
    retrieved_ids: list[str] = field(default_factory=list)
    retrieval_recall: float | None = None
    trajectory: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (one ``records.jsonl`` line)."""
        return to_jsonable(asdict(self))

    @property
    def failed(self) -> bool:
        """The program raised or one of its role calls failed (what :attr:`EvaluationSummary.n_errors` counts)."""
        return self.error is not None or self.failed_calls > 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvaluationRecord:
        """Inverse of :meth:`to_dict`; unknown keys (from a newer rolecall) are ignored.

        Raises:
            TypeError: ``d`` is not a dict, lacks ``id``, ``question`` or ``answers``, or a field has the wrong type.
        """
        if not isinstance(d, dict):
            raise TypeError(f"a record is a JSON object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for name in ("id", "question", "answers"):
            if name not in d:
                raise TypeError(f"the record has no {name!r}")
        for name, value in d.items():
            if name in known and (want := _type_problem(name, value)) is not None:
                raise TypeError(f"field {name!r} should be {want}, got {str(value)[:60]!r}")
        return cls(**{k: v for k, v in d.items() if k in known})


_NUMBER_FIELDS = ("em", "f1", "precision", "recall", "cover_em", "latency_s", "steps", "lm_calls", "prompt_tokens",
                  "completion_tokens", "failed_calls")  # fmt: skip
_STRING_LIST_FIELDS = ("answers", "supporting_ids", "retrieved_ids")


def _type_problem(name: str, value: Any) -> str | None:
    """What record field ``name`` should be when ``value`` (read from JSON) is not that, else None."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in _NUMBER_FIELDS or name == "retrieval_recall":
        ok, want = is_number or (value is None and name == "retrieval_recall"), "a number"
    elif name in ("id", "question", "prediction"):
        ok, want = isinstance(value, str), "a string"
    elif name in ("error", "call_error"):
        ok, want = value is None or isinstance(value, str), "a string or null"
    elif name in _STRING_LIST_FIELDS:
        ok, want = isinstance(value, list) and all(isinstance(v, str) for v in value), "a list of strings"
    elif name == "success":
        ok, want = isinstance(value, bool), "true or false"
    elif name in ("parse", "trajectory"):
        ok, want = isinstance(value, dict) or (value is None and name == "trajectory"), "an object"
    else:
        ok, want = True, ""
    return None if ok else want


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


@dataclass
class EvaluationSummary:
    """Aggregate numbers of one evaluation (means over questions unless said otherwise).

    ``wall_s`` and ``throughput`` (questions per second) cover only the questions run by this call, not those read
    back by a resume. ``n_errors`` counts the questions whose program raised or one of whose role calls failed
    (:attr:`EvaluationRecord.failed`); a failed call the program recovered from still counts.
    """

    n: int
    em: float
    em_ci: tuple[float, float]
    f1: float
    f1_ci: tuple[float, float]
    precision: float
    recall: float
    cover_em: float
    steps: float
    lm_calls: float
    prompt_tokens: float
    completion_tokens: float
    latency_s: float
    success_rate: float
    n_errors: int
    parse_rates: dict[str, float]
    retrieval_recall: float | None
    wall_s: float = 0.0
    throughput: float = 0.0
    n_run: int = 0

    @classmethod
    def from_records(
        cls, records: Sequence[EvaluationRecord], *, wall_s: float = 0.0, n_run: int | None = None, seed: int = 0
    ) -> EvaluationSummary:
        """Aggregate ``records``.

        Args:
            records: at least one record.
            wall_s: wall time of the run that produced the new records.
            n_run: how many of the records that run produced (default: all).
            seed: seed of the bootstrap resampling.

        Raises:
            ValueError: if ``records`` is empty.
        """
        if not records:
            raise ValueError("cannot summarise an empty evaluation: pass at least one record.")
        n_run = len(records) if n_run is None else n_run
        em, em_lo, em_hi = mean_and_ci([r.em for r in records], seed=seed)
        f1, f1_lo, f1_hi = mean_and_ci([r.f1 for r in records], seed=seed)
        calls: dict[str, int] = {}
        parsed: dict[str, int] = {}
        for r in records:
            for role, info in r.parse.items():
                calls[role] = calls.get(role, 0) + int(info.get("calls", 0))
                parsed[role] = parsed.get(role, 0) + int(info.get("parsed", 0))
        parse_rates = {role: parsed[role] / calls[role] for role in sorted(calls) if calls[role] > 0}
        recalls = [r.retrieval_recall for r in records if r.retrieval_recall is not None]

        def mean_of(name: str) -> float:
            return _mean([float(getattr(r, name)) for r in records])

        return cls(
            n=len(records),
            em=em,
            em_ci=(em_lo, em_hi),
            f1=f1,
            f1_ci=(f1_lo, f1_hi),
            precision=mean_of("precision"),
            recall=mean_of("recall"),
            cover_em=mean_of("cover_em"),
            steps=mean_of("steps"),
            lm_calls=mean_of("lm_calls"),
            prompt_tokens=mean_of("prompt_tokens"),
            completion_tokens=mean_of("completion_tokens"),
            latency_s=mean_of("latency_s"),
            success_rate=mean_of("success"),
            n_errors=sum(r.failed for r in records),
            parse_rates=parse_rates,
            retrieval_recall=_mean(recalls) if recalls else None,
            wall_s=wall_s,
            throughput=n_run / wall_s if wall_s > 0 else 0.0,
            n_run=n_run,
        )

    def to_dict(self, prefix: str = "") -> dict[str, float | int | None]:
        """A flat dict with namespaced keys (``em``, ``em/ci_low``, ``parse_rate/plan``, ...), each led by ``prefix``.

        Example:
            >>> s = EvaluationSummary.from_records([EvaluationRecord(id="a", question="q", answers=["x"], em=1.0)])
            >>> s.to_dict(prefix="test/")["test/em"]
            1.0
        """
        flat: dict[str, float | int | None] = {"n": self.n, "em": self.em}
        flat["em/ci_low"], flat["em/ci_high"] = self.em_ci
        flat["f1"] = self.f1
        flat["f1/ci_low"], flat["f1/ci_high"] = self.f1_ci
        for name in ("precision", "recall", "cover_em", "steps", "lm_calls", "prompt_tokens", "completion_tokens"):
            flat[name] = getattr(self, name)
        flat.update(latency_s=self.latency_s, success_rate=self.success_rate, n_errors=self.n_errors)
        flat.update({f"parse_rate/{role}": rate for role, rate in self.parse_rates.items()})
        flat["retrieval_recall"] = self.retrieval_recall
        flat.update(wall_s=self.wall_s, throughput=self.throughput, n_run=self.n_run)
        return {f"{prefix}{k}": (None if isinstance(v, float) and math.isnan(v) else v) for k, v in flat.items()}


def to_jsonable(value: Any) -> Any:
    """``value`` with dataclasses, pydantic models, tuples and sets turned into JSON types; other objects become
    ``str(obj)``, so a trajectory holding arbitrary program objects still serialises."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if hasattr(value, "model_dump"):  # pydantic v2
        return to_jsonable(value.model_dump())
    return str(value)


class RecordWriter:
    """Appends records to a JSONL file, one flushed (and fsynced) line each, so a killed run keeps every finished one.

    Use as a context manager; call :meth:`write` from one thread (the runner's main thread does).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
        self._file: TextIO = self.path.open("a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")

    def write(self, record: EvaluationRecord) -> None:
        """Append one record as one line."""
        self.write_json(record.to_dict())

    def write_json(self, value: dict[str, Any]) -> None:
        """Append one JSON object (already made of JSON types, e.g. by :func:`to_jsonable`) as one line."""
        self._file.write(json.dumps(value, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def read_records(path: str | Path, *, repair: bool = False) -> list[EvaluationRecord]:
    """Read a ``records.jsonl`` written by :class:`RecordWriter`.

    A last line that is not valid JSON (a run killed mid-write) is dropped with a warning; with ``repair=True`` it is
    also cut from the file so appending can continue cleanly. A later record with the same id replaces an earlier one.

    Args:
        path: the file; a missing file gives ``[]``.
        repair: truncate a corrupt last line from the file.

    Returns:
        The records in file order.

    Raises:
        DataFormatError: a line other than the last is not a valid record.
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: dict[str, EvaluationRecord] = {}
    offset = 0
    for lineno, line in enumerate(lines, start=1):
        is_last = lineno == len(lines) or all(not rest.strip() for rest in lines[lineno:])
        if line.strip():
            try:
                record = EvaluationRecord.from_dict(json.loads(line.decode("utf-8")))
            except (ValueError, TypeError, UnicodeDecodeError) as err:
                if not is_last:
                    raise DataFormatError(f"not a valid evaluation record: {err}", path=str(path), line=lineno) from err
                logger.warning("%s:%d: dropping a truncated last record (%s); it will be re-run", path, lineno, err)
                if repair:
                    with path.open("r+b") as f:
                        f.truncate(offset)
                break
            if record.id in records:
                logger.warning("%s:%d: record id %r appears twice; keeping the later one", path, lineno, record.id)
                records.pop(record.id)
            records[record.id] = record
        offset += len(line) + 1
    return list(records.values())


def write_summary(summary: EvaluationSummary, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``summary`` (flat metrics plus ``extra``) as indented JSON."""
    payload = {**summary.to_dict(), **to_jsonable(extra or {})}
    Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def format_summary(summary: EvaluationSummary) -> str:
    """A two-column text table of a summary, for the CLI and logs.

    Example:
        >>> rec = EvaluationRecord(id="a", question="q", answers=["x"], prediction="x", em=1.0, f1=1.0, success=True)
        >>> print(format_summary(EvaluationSummary.from_records([rec])).splitlines()[2])
        EM                       1.000  (95% CI 1.000-1.000)
    """
    rows = [
        ("questions", f"{summary.n} ({summary.n_run} run now, {summary.n_errors} errors)"),
        ("EM", f"{_fmt(summary.em)}  (95% CI {_fmt(summary.em_ci[0])}-{_fmt(summary.em_ci[1])})"),
        ("F1", f"{_fmt(summary.f1)}  (95% CI {_fmt(summary.f1_ci[0])}-{_fmt(summary.f1_ci[1])})"),
        ("cover-EM", _fmt(summary.cover_em)),
        ("precision / recall", f"{_fmt(summary.precision)} / {_fmt(summary.recall)}"),
        ("success rate", _fmt(summary.success_rate)),
        ("retrieval recall", _fmt(summary.retrieval_recall)),
        ("steps / question", _fmt(summary.steps, 2)),
        ("LM calls / question", _fmt(summary.lm_calls, 2)),
        ("tokens / question", f"{_fmt(summary.prompt_tokens, 1)} prompt, {_fmt(summary.completion_tokens, 1)} out"),
        ("latency / question", f"{_fmt(summary.latency_s, 2)} s"),
    ]
    rows += [(f"parse rate: {role}", _fmt(rate)) for role, rate in summary.parse_rates.items()]
    rows.append(("wall time", f"{summary.wall_s:.1f} s ({summary.throughput:.2f} questions/s)"))
    width = max(len(name) for name, _ in rows) + 2
    width = max(width, 25)
    return "\n".join([f"{'metric':<{width}}value"] + [f"{name:<{width}}{value}" for name, value in rows])
