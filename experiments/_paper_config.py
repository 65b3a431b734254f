"""The paper experiments' configuration: methods, rows, sizes, and the TOML file that lists them.

A paper's config (``experiments/configs/<paper>.toml``) names its rows: a row is one program trained (or not) by one
method, evaluated on every dataset the paper reports, with the paper's own numbers beside it. Everything is checked on
load, before any model loads: an unknown program, method, option, warm start or dataset raises ``ValueError`` naming
the valid choices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "experiments" / "configs"
DATASETS = ("synthetic", "hotpotqa", "2wiki", "musique")
REAL_DATASETS = DATASETS[1:]
SIZE_NAMES = ("smoke", "default")

Needs = Literal["nothing", "answers", "decomposition"]


@dataclass(frozen=True)
class Method:
    """A way to obtain a row's program: how it trains, which programs it applies to and what its data must carry."""

    label: str
    """The method's name in tables (a row's ``label`` overrides it)."""
    trains: bool
    """Whether the row trains (prompt-only and the ablation evaluation of a saved program do not)."""
    needs: Needs = "nothing"
    """What a training example must carry: ``decomposition`` (gold-path targets or a gold expert) or ``answers``."""
    programs: tuple[str, ...] | None = None
    """The programs it applies to (None: any registered program; ``sft``: those with gold-path targets)."""
    warm_start: Literal["none", "optional", "required"] = "none"
    """Whether the row starts from another row's saved program."""
    params: tuple[str, ...] = ()
    """The optimizer settings a row's ``params`` may set."""


def _methods() -> dict[str, Method]:
    """Every registered optimizer as a training method (from :mod:`rolecall.optimizers.registry` and the system
    registry: label, what its data must carry, the programs it applies to, its warm start, and its config fields as
    the settings a row may set), besides the three that do not train a registered optimizer."""
    import dataclasses as dc

    from rolecall.optimizers.registry import OPTIMIZERS, config_class
    from rolecall.programs.registry import get_system, program_names

    methods = {
        "prompt-only": Method("prompt-only", trains=False),
        "bootstrap_fewshot": Method("BootstrapFewShot", trains=True, needs="answers",
                                    params=("max_bootstrapped_demos",)),
    }  # fmt: skip
    for name, entry in OPTIMIZERS.items():
        programs = None if name == "sft" else tuple(p for p in program_names() if name in get_system(p).optimizers)
        fields = tuple(f.name for f in dc.fields(config_class(name)) if f.init)
        extras = ("task_weights",) if name == "multitask_sft" else ()
        methods[name] = Method(entry.label or name, trains=True, needs=entry.needs, programs=programs,
                               warm_start=entry.warm_start, params=(*fields, *extras))  # fmt: skip
    methods["eval"] = Method("ablation (evaluation only)", trains=False, warm_start="required")
    return methods


METHODS: dict[str, Method] = _methods()
"""Method name -> what it is. ``eval`` evaluates another row's saved program with some program options changed
(OPERA w/o Plan Agent, REAP w/o Re-Planner, STRIDE w/o Supervisor): an inference-time ablation of a trained system."""


@dataclass(frozen=True)
class Size:
    """How big a run is: questions, training budgets and caps (``0`` means no cap)."""

    test_questions: int
    train_questions: int
    threads: int = 16
    sft_minutes: float = 10.0
    sft_epochs: float = 2.0
    sft_max_steps: int = 0
    rl_minutes: float = 10.0
    rl_max_steps: int = 0
    group_size: int = 4
    max_tokens: int = 0
    """The LM's default completion length (0: LocalLM's own); the smoke size keeps tiny-model runs short."""

    def __post_init__(self) -> None:
        for name in ("test_questions", "train_questions", "threads", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"size field {name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"size field group_size must be >= 2 (a GRPO group), got {self.group_size}")
        for name in ("sft_minutes", "rl_minutes", "sft_epochs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"size field {name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Row:
    """One row of a paper's table: a program obtained by a method, evaluated per dataset."""

    name: str
    """Its id: the folder under runs/ and the key in the results JSON (letters, digits, ``_``)."""
    program: str
    method: str
    label: str = ""
    """The row's name in tables (default: the method's label)."""
    paper_row: str = ""
    """The paper's name for this row (empty: the paper has no such row)."""
    paper_table: str = ""
    """Which of the paper's tables it belongs to (``main``, ``ablation``, ...)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Program options (``rolecall eval -o``), checked against the program's Options."""
    params: dict[str, Any] = field(default_factory=dict)
    """Optimizer settings, from the method's ``params``."""
    warm_start: str = ""
    """The row whose saved program this one starts from (or, for ``eval``, evaluates)."""
    teacher: str = ""
    """``opd``: the row whose saved cascaded team is the frozen Teacher (empty: OPD trains its own Stage I)."""
    train_on: str = "auto"
    """``auto``: the evaluated dataset when its train split carries what the method needs, else the synthetic world;
    ``synthetic``: always the synthetic world."""
    train_questions: int = 0
    """A cap below the size's train questions (0: the size's)."""
    datasets: tuple[str, ...] = ()
    """The datasets this row runs on (empty: all of the paper's)."""
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    """dataset (or ``macro``) -> the paper's numbers, in percent: ``{"em": 57.3, "f1": 69.5}``."""
    note: str = ""

    @property
    def title(self) -> str:
        return self.label or METHODS[self.method].label

    @property
    def has_program(self) -> bool:
        """Whether the row saves a program: it trains, or (``eval``) derives one from its warm start's."""
        return METHODS[self.method].trains or self.method == "eval"


@dataclass(frozen=True)
class PaperConfig:
    """One paper's experiment: its rows, datasets, sizes and how its reported numbers were measured."""

    paper: str
    title: str
    paper_model: str
    paper_metric: str
    tables: str
    datasets: tuple[str, ...]
    rows: tuple[Row, ...]
    sizes: dict[str, Size]
    notes: tuple[str, ...] = ()
    primary_metric: Literal["em", "f1"] = "em"

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise ValueError(f"{self.paper} has no row {name!r}; its rows: {', '.join(r.name for r in self.rows)}")

    def row_datasets(self, row: Row) -> tuple[str, ...]:
        return tuple(d for d in self.datasets if not row.datasets or d in row.datasets)


def load_config(path: str | Path) -> PaperConfig:
    """Read and check a paper config.

    Raises:
        ValueError: the file is not valid TOML, a field is missing or unknown, or a row names an unknown program,
            method, option, parameter, warm start or dataset (the message lists the valid ones).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: cannot read the experiment config: {err}") from err
    where = path.name
    rows = tuple(_row(r, f"{where} row {i}") for i, r in enumerate(raw.pop("rows", [])))
    sizes = {name: _fields(Size, value, f"{where} [sizes.{name}]") for name, value in raw.pop("sizes", {}).items()}
    missing = sorted(set(SIZE_NAMES) - set(sizes))
    if missing:
        raise ValueError(f"{where}: sizes {missing} are missing; a config defines {', '.join(SIZE_NAMES)}")
    raw["datasets"] = tuple(raw.get("datasets", DATASETS))
    raw["notes"] = tuple(raw.get("notes", ()))
    config = _fields(PaperConfig, {**raw, "rows": rows, "sizes": sizes}, where)
    check_config(config)
    return config


def _fields(cls: type, values: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; valid: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from err


def _row(raw: dict[str, Any], where: str) -> Row:
    raw = dict(raw)
    raw["datasets"] = tuple(raw.get("datasets", ()))
    return _fields(Row, raw, f"{where} ({raw.get('name', '?')})")


def check_config(config: PaperConfig) -> None:
    """Check every row against the program registry, the methods and the other rows.

    Raises:
        ValueError: the first problem found, naming the valid choices.
    """
    from rolecall.programs.registry import gold_programs, program_names

    bad = sorted(set(config.datasets) - set(DATASETS))
    if bad or not config.datasets:
        raise ValueError(f"{config.paper}: datasets {bad or '[]'}; valid: {', '.join(DATASETS)}")
    if config.primary_metric not in ("em", "f1"):
        raise ValueError(f"{config.paper}: primary_metric must be em or f1, got {config.primary_metric!r}")
    names = [r.name for r in config.rows]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{config.paper}: row names must be unique and non-empty; got {names}")
    by_name = {r.name: r for r in config.rows}
    for row in config.rows:
        where = f"{config.paper} row {row.name!r}"
        if not row.name.replace("_", "").isalnum():
            raise ValueError(f"{where}: a row name is letters, digits and '_' (it names a folder)")
        if row.program not in program_names():
            raise ValueError(f"{where}: unknown program {row.program!r}; valid: {', '.join(program_names())}")
        if row.method not in METHODS:
            raise ValueError(f"{where}: unknown method {row.method!r}; valid: {', '.join(METHODS)}")
        method = METHODS[row.method]
        if method.programs is not None and row.program not in method.programs:
            raise ValueError(f"{where}: method {row.method} applies to {', '.join(method.programs)}, not {row.program}")
        if row.method == "sft" and row.program not in gold_programs():
            raise ValueError(f"{where}: sft has gold-path targets for {', '.join(gold_programs())}, not {row.program}")
        unknown = sorted(set(row.params) - set(method.params))
        if unknown:
            raise ValueError(f"{where}: unknown params {unknown} for {row.method}; valid: {list(method.params)}")
        _check_options(row, where)
        _check_links(config, row, by_name, where)
        bad = sorted(set(row.datasets) - set(config.datasets))
        if bad:
            raise ValueError(f"{where}: datasets {bad} are not the paper's {list(config.datasets)}")
        if row.train_on not in ("auto", "synthetic"):
            raise ValueError(f"{where}: train_on is auto or synthetic, got {row.train_on!r}")
        for key, numbers in row.paper.items():
            if key not in (*DATASETS, "macro") or set(numbers) - {"em", "f1"}:
                raise ValueError(f"{where}: paper numbers are {{dataset or macro: {{em, f1}}}}; got {key}={numbers}")


def _check_options(row: Row, where: str) -> None:
    from rolecall.programs.registry import parse_program_options

    pairs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row.options.items()]
    try:
        parse_program_options(row.program, pairs)
    except Exception as err:  # the registry's ConfigError names the option and the valid ones
        raise ValueError(f"{where}: {err}") from err


def _check_links(config: PaperConfig, row: Row, by_name: dict[str, Row], where: str) -> None:
    method = METHODS[row.method]
    if method.warm_start == "required" and not row.warm_start:
        raise ValueError(f"{where}: method {row.method} starts from another row's program: set warm_start")
    if method.warm_start == "none" and row.warm_start:
        raise ValueError(f"{where}: method {row.method} takes no warm_start")
    for link, value in (("warm_start", row.warm_start), ("teacher", row.teacher)):
        if not value:
            continue
        other = by_name.get(value)
        if other is None:
            raise ValueError(f"{where}: {link} {value!r} is not a row; rows: {', '.join(by_name)}")
        if not METHODS[other.method].trains:
            raise ValueError(f"{where}: {link} {value!r} is not a trained row (it saves no program)")
        expected = "cascaded_team" if link == "teacher" else (row.program if row.method != "eval" else other.program)
        if other.program != expected:
            raise ValueError(f"{where}: {link} {value!r} is a {other.program} program, not {expected}")
        missing = sorted(set(config.row_datasets(row)) - set(config.row_datasets(other)))
        if missing:
            raise ValueError(f"{where}: {link} {value!r} does not run on {missing}")
        if _reaches(by_name, value, row.name):
            raise ValueError(f"{where}: {link} {value!r} leads back to {row.name!r}")
    if row.warm_start and row.method != "eval" and row.options:
        raise ValueError(f"{where}: a warm-started row keeps its warm start's options; set them on {row.warm_start!r}")
    if row.teacher and row.method != "opd":
        raise ValueError(f"{where}: only method opd takes a teacher")
    if row.method == "eval" and not row.options:
        raise ValueError(f"{where}: an eval row changes program options (e.g. use_replanner = false)")


def _reaches(by_name: dict[str, Row], start: str, target: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == target:
            return True
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        todo += [x for x in (by_name[name].warm_start, by_name[name].teacher) if x]
    return False


def config_path(paper: str) -> Path:
    return CONFIGS / f"{paper}.toml"
