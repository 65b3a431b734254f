"""The run folder of ``rolecall eval``: what it may hold before a run starts, and what ``--resume`` may continue.

An evaluation folder holds ``config.json`` (the call's flags, and ``settings``: those that define the results),
``records.jsonl`` and ``summary.json``. Before the data or the model load, :func:`check_run_folder` refuses

* an ``--out`` that is a file, or lies under one;
* a folder with records, unless ``--resume`` continues them or ``--overwrite`` starts again;
* ``--resume`` of a folder whose saved settings differ from this call's (one line naming each field with both values),
  or whose records have no ``config.json`` to compare with;
* ``--resume`` of a ``records.jsonl`` with a damaged line before its last (the file and the line); a damaged last line
  is what a kill leaves, so it is cut with a warning and that question runs again.

What may differ on resume: ``--threads``, ``--no-progress``, ``-v``, ``--out`` and ``--limit``. A different ``--limit``
takes a longer or shorter prefix of the same question list, so the saved records are still answers to this call's
questions; the summary covers this call's questions, and ``config.json`` is rewritten to say so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.utils.paths import check_out_folder

__all__ = [
    "CONFIG_FILE",
    "RUN_ONLY_FLAGS",
    "result_settings",
    "check_run_folder",
    "start_run_folder",
    "max_tokens_advice",
]

logger = logging.getLogger("rolecall.cli")

CONFIG_FILE = "config.json"
RUN_ONLY_FLAGS = ("threads", "no_progress", "verbose", "out", "resume", "overwrite", "limit", "command")
"""Flags of ``rolecall eval`` that change how a run goes, not what its records say; ``--resume`` ignores them."""

# The flag that sets each result setting, for messages.
_FLAGS = {
    "program": "--program",
    "load": "--load",
    "dataset": "--dataset",
    "data_path": "--data-path",
    "corpus_path": "--corpus-path",
    "corpus_level": "--corpus-level",
    "split": "--split",
    "seed": "--seed",
    "retriever": "--retriever",
    "index": "--index",
    "k": "--k",
    "model": "--model",
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "option": "-o",
}


def _path(value: Any) -> str | None:
    return None if value in (None, "") else str(Path(value).expanduser().resolve())


def _options(program: Any, options: Any) -> Any:
    """The ``-o KEY=VALUE`` options as parsed values (so ``top_k=02`` equals ``top_k=2``), else the raw strings."""
    from rolecall.programs.registry import parse_program_options

    raw = [str(o) for o in options or []]
    try:
        parsed = parse_program_options(str(program), raw)  # in the given order: a repeated key's last value wins
    except (ConfigError, KeyError, ValueError, ImportError):  # a program no longer registered: compare the text
        return sorted(raw)
    return json.loads(json.dumps(parsed, sort_keys=True, default=str))  # tuples as lists, as config.json reads back


def result_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that define an evaluation's records, from its flags (``vars(args)`` or a saved ``config.json``),
    with defaults filled in and paths made absolute, so two calls compare equal exactly when they evaluate the same
    program the same way on the same questions.

    A ``config.json`` written before the split default changed has ``split: null``: the synthetic world's ``test``
    then, and ``all`` for the real datasets.
    """
    from rolecall.data.corpus import DEV_SUBSET_FILES, dev_subset_path
    from rolecall.lm.embedded import DEFAULT_LM

    dataset = config.get("dataset") or "synthetic"
    data_path = config.get("data_path")
    if data_path is None and dataset in DEV_SUBSET_FILES:
        data_path = dev_subset_path(dataset)
    corpus_path = config.get("corpus_path")
    if corpus_path is None and dataset == "flashrag" and data_path is not None:
        corpus_path = Path(data_path).parent / "corpus.jsonl"
    settings: dict[str, Any] = {
        "program": config.get("program"),
        "load": _path(config.get("load")),
        "dataset": dataset,
        "data_path": _path(data_path),
        "corpus_path": _path(corpus_path),
        "split": config.get("split") or ("test" if dataset == "synthetic" else "all"),
        "retriever": config.get("retriever") or "bm25",
        "k": config.get("k", 5),
        "model": config.get("model") or DEFAULT_LM,
        "max_tokens": config.get("max_tokens"),
        "temperature": config.get("temperature", 0.0),
        "option": _options(config.get("program"), config.get("option")),
    }
    if dataset == "synthetic":  # the seed builds the synthetic world; real data ignores it
        settings["seed"] = config.get("seed", 0)
    elif corpus_path is None:  # the level of the closed corpus built from the dataset file
        settings["corpus_level"] = config.get("corpus_level") or "paragraph"
    if settings["retriever"] == "colbert":
        settings["index"] = _path(config.get("index"))
    return settings


def _legacy_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`result_settings` of a ``config.json`` written before it recorded them. Its ``max_tokens`` (default 256)
    was the budget of LM calls without a role budget of their own, which is what no ``--max-tokens`` gives now."""
    config = dict(config)
    if config.get("max_tokens") == 256:
        config["max_tokens"] = None
    return result_settings(config)


def _differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    names = [*now, *(name for name in saved if name not in now)]
    return [
        f"{_FLAGS.get(name, name)}: saved {saved.get(name)!r}, now {now.get(name)!r}"
        for name in names
        if saved.get(name) != now.get(name)
    ]


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path} is not readable JSON ({err}); pass --overwrite to start the run again") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object; pass --overwrite to start the run again")
    return config


def check_run_folder(out: Path, settings: Mapping[str, Any], *, resume: bool, overwrite: bool) -> None:
    """Check that this call may write its records to ``out`` (see the module docstring); writes nothing, except
    that ``--resume`` cuts a truncated last line from ``records.jsonl`` (with a warning: that question runs again).

    Args:
        out: the run folder.
        settings: this call's :func:`result_settings`.
        resume: ``--resume`` was given.
        overwrite: ``--overwrite`` was given.

    Raises:
        ConfigError: ``out`` is a file, holds records this call may not write beside, or holds another evaluation.
        DataFormatError: ``--resume`` of a ``records.jsonl`` with a damaged line before its last.
    """
    from rolecall.evaluation.records import read_records
    from rolecall.evaluation.runner import RECORDS_FILE

    check_out_folder(out, "the run's records")
    records, config = out / RECORDS_FILE, out / CONFIG_FILE
    has_records = records.is_file() and records.stat().st_size > 0
    if overwrite:
        return
    if not resume:
        if has_records:
            raise ConfigError(
                f"{records} holds the records of an earlier run; pass --resume to continue it, --overwrite to start "
                "again (its records are deleted), or another --out"
            )
        return
    if config.is_file():
        saved = _read_config(config)
        differences = _differences(saved.get("settings") or _legacy_settings(saved), settings)
        if differences:
            raise ConfigError(
                f"{out} holds another evaluation ({'; '.join(differences)}); --resume continues only the same "
                "evaluation: pass the saved values, --overwrite to start again, or another --out"
            )
    elif has_records:
        raise ConfigError(
            f"{records} has no {CONFIG_FILE} beside it, so rolecall cannot tell which evaluation it holds; pass "
            "--overwrite to start again, or another --out"
        )
    if has_records:
        read_records(records, repair=True)


def start_run_folder(out: Path, config: Mapping[str, Any], *, overwrite: bool) -> None:
    """Create ``out``, delete an earlier run's records and summary with ``overwrite``, and write ``config.json``."""
    from rolecall.evaluation.runner import RECORDS_FILE, SUMMARY_FILE

    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in (RECORDS_FILE, SUMMARY_FILE):
            (out / name).unlink(missing_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2) + "\n", encoding="utf-8")


class _TruncationAdvice(logging.Filter):
    """Rewords DSPy's "LM response was truncated; increase max_tokens ..." (advice about ``dspy.LM(max_tokens=...)``,
    which a ``rolecall eval`` user cannot pass) to name ``--max-tokens``. The message keeps its first words, so
    :class:`rolecall.utils.logs.RepeatedWarningFilter` still counts the repeats."""

    PREFIX = "LM response was truncated"

    def __init__(self, max_tokens: int | None) -> None:
        super().__init__()
        if max_tokens is None:
            self.advice = (
                f"{self.PREFIX} at its role's own token budget; rerun with --max-tokens N to give every LM call N "
                "tokens (the record's trajectory shows the cut completion)"
            )
        else:
            self.advice = (
                f"{self.PREFIX} at --max-tokens {max_tokens}; rerun with a larger --max-tokens to give every LM call "
                "more (the record's trajectory shows the cut completion)"
            )

    def filter(self, record: logging.LogRecord) -> bool:
        """Reword a truncation warning; let every other record through unchanged."""
        if record.getMessage().startswith(self.PREFIX):
            record.msg, record.args = self.advice, None
        return True


@contextmanager
def max_tokens_advice(max_tokens: int | None) -> Iterator[None]:
    """While active, DSPy's truncation warnings name ``--max-tokens`` (``max_tokens``: the flag's value, or None)."""
    dspy_logger = logging.getLogger("dspy.clients.lm")
    advice = _TruncationAdvice(max_tokens)
    dspy_logger.addFilter(advice)
    try:
        yield
    finally:
        dspy_logger.removeFilter(advice)
