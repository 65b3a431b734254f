"""Reading an eval run back, and its static HTML report (``rolecall show`` / ``rolecall report``).

An eval run is the folder ``rolecall eval --out`` writes: ``records.jsonl`` (one :class:`EvaluationRecord` per
question, its trajectory included), ``summary.json`` and ``config.json``. :func:`load_run` reads it, :func:`step_views`
turns a record's trajectory into one :class:`StepView` per step (which role or adapter acted, what it saw, what it said,
what it retrieved, its error and any reward), and :func:`write_report` writes one self-contained HTML page of the run:
inline CSS, no scripts, no external assets, every text escaped with :func:`html.escape`.

Example::

    from rolecall.evaluation.report import write_report
    write_report("runs/opera-hotpot")   # -> runs/opera-hotpot/report.html
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.evaluation.records import EvaluationRecord, EvaluationSummary, format_summary, read_records

__all__ = ["Run", "StepView", "load_run", "step_views", "run_summary", "render_html", "write_report", "clip"]

logger = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"  # the runner's names (rolecall.evaluation.runner), kept here to stay import-light
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
REPORT_FILE = "report.html"


@dataclass
class Run:
    """One eval output folder, read back.

    Attributes:
        path: the folder.
        records: the finished questions, in file order.
        summary: ``summary.json`` (``{}`` when absent).
        config: ``config.json``, the ``rolecall eval`` arguments (``{}`` when absent).
    """

    path: Path
    records: list[EvaluationRecord]
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """``"opera on synthetic (2 questions, bm25 k=5)"``, as ``rolecall eval`` prints it (the folder's name
        stands in for the program when ``config.json`` is missing)."""
        c = self.config
        program = c.get("program") or self.summary.get("program") or self.path.name
        where = f" on {c['dataset']}" if c.get("dataset") else ""
        retriever = f", {c['retriever']} k={c.get('k')}" if c.get("retriever") else ""
        return f"{program}{where} ({len(self.records)} questions{retriever})"

    def record(self, question_id: str) -> EvaluationRecord:
        """The record of question ``question_id``.

        Raises:
            ConfigError: no record has that id (the message names a few valid ones).
        """
        for record in self.records:
            if record.id == question_id:
                return record
        ids = [r.id for r in self.records]
        shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
        raise ConfigError(f"no question {question_id!r} in {self.path / RECORDS_FILE}; its ids are: {shown}")


def load_run(path: str | Path) -> Run:
    """Read the eval output folder ``path`` (``records.jsonl``, ``summary.json``, ``config.json``).

    Raises:
        ConfigError: ``path`` does not exist, is not an eval output folder (the message says what it is when it is a
            compile or demo folder, and what to pass instead), or holds no finished question yet.
        DataFormatError: ``records.jsonl`` has a malformed line other than the last.
    """
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist or is not a folder; pass the --out folder of `rolecall eval`")
    records_path = path / RECORDS_FILE
    if not records_path.is_file():
        runs = sorted(p.parent.name for p in path.glob(f"*/{RECORDS_FILE}"))
        if runs:
            hint = f"it holds the eval runs {', '.join(runs)}: pass one of them ({path / runs[0]})"
        elif (path / "program.json").is_file():
            hint = f"it holds a compiled program; evaluate it with: rolecall eval --load {path} --out RUN"
        else:
            hint = "pass the --out folder of `rolecall eval`"
        raise ConfigError(f"{path} is not an eval output folder (no {RECORDS_FILE}); {hint}")
    records = read_records(records_path)
    if not records:
        raise ConfigError(f"{records_path} holds no finished question yet; wait for the run or rerun it with --resume")
    return Run(
        path=path, records=records, summary=_read_json(path / SUMMARY_FILE), config=_read_json(path / CONFIG_FILE)
    )


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or ``{}`` when it is missing or unreadable (it only labels the report; the records count)."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        logger.warning("%s is unreadable (%s); the report goes without it", path, err)
        return {}
    return value if isinstance(value, dict) else {}


def run_summary(run: Run) -> EvaluationSummary:
    """The run's aggregate numbers, recomputed from its records (so a resumed or partial run is summarised as it is
    now), with the wall time ``summary.json`` recorded."""
    wall_s = float(run.summary.get("wall_s") or 0.0)
    n_run = min(int(run.summary.get("n_run") or len(run.records)), len(run.records))
    return EvaluationSummary.from_records(run.records, wall_s=wall_s, n_run=n_run)


# ---------------------------------------------------------------------------------------------------- step views
@dataclass
class StepView:
    """One trajectory step, as a reader wants it.

    Attributes:
        index: 1-based position in the trajectory.
        kind: ``"role"``, ``"retrieval"`` or ``"event"``.
        name: the role, retriever or event name.
        adapter: the LoRA adapter of a role call (None on the base model, for retrievals and events).
        saw: the step's inputs, ``(name, text)``.
        said: the parsed outputs; for a call that did not parse, the fields salvaged from it, else its raw completion.
        retrieved: ``(title, passage id)`` of each passage a retrieval returned.
        error: the parse error or failure reason.
        rewards: meta entries whose key names a reward (``reward``, ``reward/format``, ...), as an optimizer logs them.
        notes: the other meta entries (sub-goal, attempt, fallback reason, ...), the raw retries left out.
        seconds: wall time of the step.
        tokens: prompt plus completion tokens of a role call.
    """

    index: int
    kind: str
    name: str
    adapter: str | None = None
    saw: list[tuple[str, str]] = field(default_factory=list)
    said: list[tuple[str, str]] = field(default_factory=list)
    retrieved: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    rewards: dict[str, Any] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0


def _text(value: Any) -> str:
    """A field value as text: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def clip(text: str, limit: int, *, one_line: bool = False) -> str:
    """``text`` cut to at most ``limit`` characters (an ellipsis marks a cut); ``one_line`` also folds whitespace.

    Example:
        >>> clip("a  b\\n c", 20, one_line=True), clip("abcdef", 4)
        ('a b c', 'abc…')
    """
    if one_line:
        text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def step_views(record: EvaluationRecord) -> list[StepView]:
    """The steps of ``record``'s trajectory as :class:`StepView` s (``[]`` without a trajectory)."""
    steps = (record.trajectory or {}).get("steps") or []
    return [_view(i, step) for i, step in enumerate(steps, start=1)]


def _view(index: int, step: dict[str, Any]) -> StepView:
    outputs = dict(step.get("outputs") or {})
    meta = dict(step.get("meta") or {})
    kind = str(step.get("kind", "event"))
    view = StepView(index=index, kind=kind, name=str(step.get("role", "?")), adapter=step.get("adapter"))
    view.saw = [(k, _text(v)) for k, v in (step.get("inputs") or {}).items()]
    if kind == "retrieval":
        ids, titles = outputs.pop("passage_ids", []) or [], outputs.pop("titles", []) or []
        view.retrieved = [(str(titles[i]) if i < len(titles) else "", str(pid)) for i, pid in enumerate(ids)]
    salvaged = meta.pop("salvaged", None)
    view.said = [(k, _text(v)) for k, v in outputs.items()]
    if not view.said and salvaged:
        view.said = [(f"{k} (salvaged)", _text(v)) for k, v in salvaged.items()]
    if not view.said and step.get("completion"):
        view.said = [("raw completion", str(step["completion"]))]
    view.error = step.get("error")
    meta.pop("attempts", None)  # the raw messages of each retry: for optimizers, not for reading
    view.rewards = {k: v for k, v in meta.items() if "reward" in k.lower()}
    view.notes = [(k, _text(v)) for k, v in meta.items() if k not in view.rewards]
    view.seconds = float(step.get("seconds") or 0.0)
    usage = step.get("usage") or {}
    view.tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    return view


def fmt_number(value: Any, digits: int = 2) -> str:
    """A score for a table: ``n/a`` for None / NaN, else ``digits`` decimals (ints and strings as they are)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# ---------------------------------------------------------------------------------------------------------- HTML
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;
color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
.sub{color:#5a6473;margin:0 0 16px}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{background:#fff;border:1px solid #d8dde6;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:#5a6473;font-size:12px}
pre{background:#fff;border:1px solid #d8dde6;border-radius:6px;padding:10px;overflow-x:auto;font-size:12.5px;margin:0}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{border:1px solid #d8dde6;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f6;position:sticky;top:0}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}td.id{white-space:nowrap}
tr.right td{background:#eefaf0}tr.failed td:last-child{color:#b3261e}
details.q{background:#fff;border:1px solid #d8dde6;border-radius:6px;margin:8px 0;padding:6px 12px}
details.q>summary{cursor:pointer;font-weight:600}details.q>summary .m{font-weight:400;color:#5a6473}
ol.steps{padding-left:28px}ol.steps>li{margin:8px 0;padding:6px 10px;border-left:4px solid #9aa5b8;background:#f6f8fb}
li.role{border-color:#3b6fd8!important}li.retrieval{border-color:#2e9e5b!important}li.bad{background:#fdf1f0!important}
.tag{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;background:#e3e8f1;margin-left:6px}
.kv{margin:2px 0;display:grid;grid-template-columns:minmax(120px,max-content) 1fr;gap:10px}
.kv>i{color:#5a6473;font-style:normal}.v{white-space:pre-wrap;word-break:break-word}
.err{color:#b3261e}.reward{color:#7a4fbf;font-weight:600}.muted{color:#5a6473}
"""

_INPUT_CHARS = 400  # what a step saw, in brief; the full prompt stays in records.jsonl
_OUTPUT_CHARS = 1500


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _kv(label: str, value: str, limit: int, css: str = "") -> str:
    return f'<div class="kv {css}"><i>{_e(label)}</i><span class="v">{_e(clip(value, limit))}</span></div>'


def _step_html(view: StepView) -> str:
    kind_css = f"{view.kind} bad" if view.error else view.kind
    head = f"<b>{_e(view.name)}</b>"
    head += f'<span class="tag">{_e(view.kind)}</span>'
    if view.adapter:
        head += f'<span class="tag">adapter {_e(view.adapter)}</span>'
    cost = f"{view.seconds:.2f} s" + (f", {view.tokens} tokens" if view.tokens else "")
    parts = [f'<div>{head} <span class="muted">{_e(cost)}</span></div>']
    parts += [_kv(f"saw {k}", v, _INPUT_CHARS) for k, v in view.saw]
    parts += [_kv(f"said {k}", v, _OUTPUT_CHARS) for k, v in view.said]
    if view.retrieved:
        items = "; ".join(f"{title} [{pid}]" if title else pid for title, pid in view.retrieved)
        parts.append(_kv("retrieved", items, _OUTPUT_CHARS))
    parts += [_kv(k, v, _INPUT_CHARS, "muted") for k, v in view.notes]
    parts += [_kv(k, fmt_number(v, 3), 100, "reward") for k, v in view.rewards.items()]
    if view.error:
        parts.append(_kv("error", view.error, _OUTPUT_CHARS, "err"))
    return f'<li class="{kind_css}">{"".join(parts)}</li>'


def _question_html(number: int, record: EvaluationRecord) -> str:
    meta = f"EM {fmt_number(record.em, 0)} · F1 {fmt_number(record.f1)} · {record.steps} steps"
    meta += f" · {record.lm_calls} LM calls"
    lines = [
        f'<details class="q" id="q{number}"><summary>#{number} {_e(record.id)}: {_e(record.question)} '
        f'<span class="m">({_e(meta)})</span></summary>',
        _kv("gold", " | ".join(record.answers), _OUTPUT_CHARS),
        _kv("prediction", record.prediction or "(empty)", _OUTPUT_CHARS),
    ]
    if record.error or record.call_error:
        lines.append(_kv("error", record.error or record.call_error, _OUTPUT_CHARS, "err"))
    views = step_views(record)
    if views:
        lines.append('<ol class="steps">' + "".join(_step_html(v) for v in views) + "</ol>")
    else:
        lines.append('<p class="muted">no trajectory recorded</p>')
    return "\n".join(lines) + "</details>"


def _table_html(records: list[EvaluationRecord]) -> str:
    columns = ("#", "id", "question", "prediction", "gold", "EM", "F1", "steps", "LM calls", "status")
    head = "".join(f"<th>{h}</th>" for h in columns)
    rows = []
    for number, r in enumerate(records, start=1):
        css = "right" if r.em >= 1 else "failed" if r.failed or not r.success else ""
        status = r.error or r.call_error or ("ok" if r.success else "no answer")
        prediction = _e(clip(r.prediction, 200)) if r.prediction else '<span class="muted">(empty)</span>'
        cells = [
            f'<td class="n"><a href="#q{number}">{number}</a></td>',
            f'<td class="id">{_e(r.id)}</td>',
            f"<td>{_e(clip(r.question, 200))}</td>",
            f"<td>{prediction}</td>",
            f"<td>{_e(clip(' | '.join(r.answers), 200))}</td>",
            f'<td class="n">{fmt_number(r.em, 0)}</td>',
            f'<td class="n">{fmt_number(r.f1)}</td>',
            f'<td class="n">{r.steps}</td>',
            f'<td class="n">{r.lm_calls}</td>',
            f"<td>{_e(clip(status, 200))}</td>",
        ]
        rows.append(f'<tr class="{css}">{"".join(cells)}</tr>')
    return f'<table id="questions"><thead><tr>{head}</tr></thead><tbody>\n' + "\n".join(rows) + "\n</tbody></table>"


def render_html(run: Run) -> str:
    """The run's report as one self-contained HTML page (inline CSS, no scripts, no external assets): headline
    numbers, the summary table, the run's configuration, a ``<table id="questions">`` with one row per question, and
    each question's trajectory in a ``<details>`` block."""
    summary = run_summary(run)
    cards = [
        ("EM", fmt_number(summary.em, 3)),
        ("F1", fmt_number(summary.f1, 3)),
        ("questions", str(summary.n)),
        ("success rate", fmt_number(summary.success_rate, 3)),
        ("retrieval recall", fmt_number(summary.retrieval_recall, 3)),
        ("steps / question", fmt_number(summary.steps)),
    ]
    config = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_text(v))}</td></tr>" for k, v in run.config.items())
    body = [
        f"<h1>{_e(run.title)}</h1>",
        f'<p class="sub">{_e(run.path.resolve())}</p>',
        '<div class="cards">' + "".join(f"<div class=card><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards),
        "</div>",
        "<h2>Summary</h2>",
        f"<pre>{_e(format_summary(summary))}</pre>",
        "<h2>Questions</h2>",
        _table_html(run.records),
        "<h2>Trajectories</h2>",
        *(_question_html(i, r) for i, r in enumerate(run.records, start=1)),
    ]
    if config:
        body += ["<h2>Configuration</h2>", f"<table>{config}</table>"]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(run.title)}</title><style>{_CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of the eval run in ``run_dir`` (see :func:`render_html`).

    Args:
        run_dir: an eval output folder (``records.jsonl``, ``summary.json``, ``config.json``).
        out: the HTML file to write (default: ``run_dir/report.html``); its folder is created.

    Returns:
        The path written.

    Raises:
        ConfigError: ``run_dir`` is not an eval output folder, or holds no finished question (see :func:`load_run`).
    """
    run = load_run(run_dir)
    path = Path(out) if out is not None else run.path / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(run), encoding="utf-8")
    logger.info("report of %s written to %s", run.path, path)
    return path
