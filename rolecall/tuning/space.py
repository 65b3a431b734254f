"""The search space of a tuning study: float, int and categorical config fields, and simplex groups of weights.

A simplex group is a set of reward weights that sum to a total (1 by default), such as OPERA's plan weights (Eq. 7:
λ1 f_logic + λ2 f_struct + λ3 f_exec + ...) or MultiAgent-OPD's 0.9 / 0.1 split. Sampling each weight as an
independent float would waste trials on sums far from 1 and make the weights' scale a hidden parameter; instead the
group is sampled on the simplex:

- TPE (and any other sampler): k - 1 free parameters u_i ~ U(0, 1) are turned into weights by stick breaking with the
  inverse CDF of Beta(1, k - 1 - i)::

      b_i = 1 - (1 - u_i) ** (1 / (k - 1 - i)),   w_i = b_i * (total - Σ_{j<i} w_j),   w_{k-1} = total - Σ_{j<k-1} w_j

  which maps U(0, 1)^(k-1) one-to-one onto the simplex and makes w ~ Dirichlet(1, ..., 1), uniform on it (the
  stick-breaking construction of the Dirichlet). Each u_i is a trial parameter named ``stick:<field>``.
- grid (the paper's grid search): every point of the simplex whose weights are multiples of ``step``, as one
  categorical parameter named after the group, enumerated by optuna's ``GridSampler``.

Example:
    >>> space = SearchSpace(params=(FloatParam("learning_rate", 1e-3, 3e-3, step=1e-3),),
    ...                     simplexes=(Simplex("plan_weights", ("logic", "feasibility", "execution")),))
    >>> grid = space.grid(step=0.5)
    >>> grid["learning_rate"], grid["plan_weights"]
    ([0.001, 0.002, 0.003], ['0,0,1', '0,0.5,0.5', '0,1,0', '0.5,0,0.5', '0.5,0.5,0', '1,0,0'])
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rolecall.errors import ConfigError

__all__ = [
    "CategoricalParam",
    "FloatParam",
    "IntParam",
    "SearchSpace",
    "Simplex",
    "parse_param",
    "parse_simplex",
    "simplex_grid",
    "stick_breaking",
    "unstick",
]

GRID_DECIMALS = 10
"""Grid values are rounded to this many decimals (0.1 * 3 is 0.3, not 0.30000000000000004)."""


@dataclass(frozen=True)
class FloatParam:
    """A float config field in ``[low, high]``, on a log scale or a ``step`` grid (grid mode needs ``step``)."""

    name: str
    low: float
    high: float
    log: bool = False
    step: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ConfigError(f"param {self.name}: needs finite low < high; got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ConfigError(f"param {self.name}: a log scale needs low > 0; got {self.low}")
        if self.step is not None and (self.log or not self.step > 0):
            raise ConfigError(f"param {self.name}: step must be > 0 and cannot be combined with log; got {self.step}")

    def suggest(self, trial: Any) -> float:
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list[float]:
        if self.step is None:
            raise ConfigError(f"grid search needs a step for float param {self.name} (e.g. float:0:1:step=0.1)")
        n = math.floor((self.high - self.low) / self.step + 1e-9)
        return [round(self.low + i * self.step, GRID_DECIMALS) for i in range(n + 1)]


@dataclass(frozen=True)
class IntParam:
    """An integer config field in ``[low, high]`` (inclusive), on a log scale or every ``step``."""

    name: str
    low: int
    high: int
    log: bool = False
    step: int = 1

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ConfigError(f"param {self.name}: needs low <= high; got low={self.low}, high={self.high}")
        if self.step < 1 or (self.log and (self.low < 1 or self.step != 1)):
            raise ConfigError(f"param {self.name}: step must be >= 1, and a log scale needs low >= 1 and step 1")

    def suggest(self, trial: Any) -> int:
        return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


@dataclass(frozen=True)
class CategoricalParam:
    """A config field taking one of ``choices`` (None, bool, int, float or str)."""

    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ConfigError(f"param {self.name}: needs at least one choice")
        bad = [c for c in self.choices if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            raise ConfigError(f"param {self.name}: choices must be null, booleans, numbers or strings; got {bad}")

    def suggest(self, trial: Any) -> Any:
        return trial.suggest_categorical(self.name, list(self.choices))

    def grid(self) -> list[Any]:
        return list(self.choices)


@dataclass(frozen=True)
class Simplex:
    """Weights of ``fields`` (under the config field ``name``, when given) that sum to ``total``.

    ``Simplex("plan_weights", ("logic", "execution"))`` sets ``plan_weights.logic`` and ``plan_weights.execution``;
    ``Simplex("", ("alpha", "beta"))`` sets the top-level fields ``alpha`` and ``beta``.
    """

    name: str
    fields: tuple[str, ...]
    total: float = 1.0

    def __post_init__(self) -> None:
        if len(self.fields) < 2 or len(set(self.fields)) != len(self.fields):
            raise ConfigError(f"simplex {self.label}: needs at least two distinct fields; got {list(self.fields)}")
        if not (math.isfinite(self.total) and self.total > 0):
            raise ConfigError(f"simplex {self.label}: total must be > 0; got {self.total}")

    @property
    def label(self) -> str:
        """The group's parameter name in grid mode: ``name``, or the fields joined by ``+``."""
        return self.name or "+".join(self.fields)

    @property
    def keys(self) -> tuple[str, ...]:
        """The dotted config fields the weights go to."""
        return tuple(f"{self.name}.{f}" if self.name else f for f in self.fields)

    def suggest(self, trial: Any) -> dict[str, float]:
        """Weights from k - 1 stick-breaking parameters ``stick:<field>`` (uniform on the simplex)."""
        u = [trial.suggest_float(f"stick:{key}", 0.0, 1.0) for key in self.keys[:-1]]
        return dict(zip(self.keys, stick_breaking(u, self.total), strict=True))

    def suggest_grid(self, trial: Any, step: float) -> dict[str, float]:
        """Weights from the categorical grid parameter ``label`` (a point of :func:`simplex_grid`)."""
        point = trial.suggest_categorical(self.label, self.grid_choices(step))
        return dict(zip(self.keys, (float(w) for w in point.split(",")), strict=True))

    def grid_choices(self, step: float) -> list[str]:
        """The grid points of :meth:`suggest_grid`'s categorical parameter, as its choice strings."""
        return [_point_text(p) for p in simplex_grid(len(self.fields), step, self.total)]

    def params(self, weights: Sequence[float], grid_step: float | None = None) -> dict[str, Any]:
        """The trial parameters :meth:`suggest` (or, with ``grid_step``, :meth:`suggest_grid`) turns into ``weights``.

        Raises:
            ConfigError: If ``weights`` are not a point of the simplex (of its grid, with ``grid_step``).
        """
        if grid_step is not None:
            text = _point_text(tuple(round(w, GRID_DECIMALS) for w in weights))
            if text not in self.grid_choices(grid_step):
                raise ConfigError(f"simplex {self.label}: ({text}) is not a point of its grid (step {grid_step:g})")
            return {self.label: text}
        try:
            u = unstick(weights, self.total)
        except ConfigError as err:
            raise ConfigError(f"simplex {self.label}: {err}") from err
        return {f"stick:{key}": ui for key, ui in zip(self.keys[:-1], u, strict=True)}


def stick_breaking(u: Sequence[float], total: float = 1.0) -> list[float]:
    """k weights summing to ``total`` from k - 1 numbers in [0, 1]: uniform u gives Dirichlet(1, ..., 1) weights.

    ``b_i = 1 - (1 - u_i) ** (1 / (k - 1 - i))`` is the inverse CDF of Beta(1, k - 1 - i), the share of the rest of
    the stick weight i takes; the last weight is what remains.

    Example:
        >>> stick_breaking([0.5])
        [0.5, 0.5]
        >>> [round(w, 4) for w in stick_breaking([0.75, 0.5])]  # b_0 = 1 - 0.25 ** 0.5 = 0.5, then half the rest
        [0.5, 0.25, 0.25]
    """
    k = len(u) + 1
    weights, rest = [], float(total)
    for i, ui in enumerate(u):
        if not 0.0 <= ui <= 1.0:
            raise ValueError(f"stick-breaking parameters must be in [0, 1]; got u[{i}] = {ui}")
        w = rest * (1.0 - (1.0 - ui) ** (1.0 / (k - 1 - i)))
        weights.append(w)
        rest -= w
    weights.append(max(rest, 0.0))
    return weights


def unstick(weights: Sequence[float], total: float = 1.0) -> list[float]:
    """The k - 1 stick-breaking parameters that give ``weights`` back (the inverse of :func:`stick_breaking`).

    Raises:
        ConfigError: If a weight is negative or the weights do not sum to ``total``.

    Example:
        >>> [round(u, 4) for u in unstick([0.5, 0.25, 0.25])]
        [0.75, 0.5]
    """
    k = len(weights)
    if k < 2 or any(w < 0 for w in weights) or not math.isclose(sum(weights), total, rel_tol=1e-6, abs_tol=1e-9):
        raise ConfigError(f"weights {list(weights)} are not a point of the simplex: they must be >= 0 and sum to "
                          f"{total:g} (they sum to {sum(weights):g})")  # fmt: skip
    u, rest = [], float(total)
    for i, w in enumerate(weights[:-1]):
        share = min(max(w / rest, 0.0), 1.0) if rest > 0 else 0.0
        u.append(1.0 - (1.0 - share) ** (k - 1 - i))
        rest -= w
    return u


def simplex_grid(k: int, step: float, total: float = 1.0) -> list[tuple[float, ...]]:
    """Every k-tuple of non-negative multiples of ``step`` summing to ``total`` (C(n + k - 1, k - 1) of them, n =
    total / step).

    Raises:
        ConfigError: If ``total`` is not a whole number of steps.

    Example:
        >>> simplex_grid(2, 0.25)
        [(0.0, 1.0), (0.25, 0.75), (0.5, 0.5), (0.75, 0.25), (1.0, 0.0)]
    """
    n = round(total / step) if step > 0 else 0
    if step <= 0 or n < 1 or not math.isclose(n * step, total, rel_tol=1e-9):
        raise ConfigError(f"simplex grid step {step} must divide the total {total} into a whole number of steps")
    points = []
    for cuts in itertools.combinations(range(n + k - 1), k - 1):  # stars and bars
        counts = [b - a - 1 for a, b in zip((-1, *cuts), (*cuts, n + k - 1), strict=True)]
        points.append(tuple(round(c * step, GRID_DECIMALS) for c in counts))
    return sorted(points)


def _point_text(point: Sequence[float]) -> str:
    return ",".join(f"{w:g}" for w in point)


@dataclass(frozen=True)
class SearchSpace:
    """The config fields a study searches: independent params and simplex groups of weights."""

    params: tuple[FloatParam | IntParam | CategoricalParam, ...] = ()
    simplexes: tuple[Simplex, ...] = ()
    grid_step: float = 0.1
    """Grid mode: the spacing of the simplex grid (0.1: weights 0, 0.1, ..., 1)."""
    names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        keys = [p.name for p in self.params] + [k for s in self.simplexes for k in s.keys]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ConfigError(f"the search space sets {repeated} more than once")
        if not keys:
            raise ConfigError("the search space is empty: give at least one param or simplex")
        object.__setattr__(self, "names", tuple(keys))

    def suggest(self, trial: Any, *, grid: bool = False) -> dict[str, Any]:
        """Dotted config field -> the value of this trial (grid mode: simplex groups from their grid points)."""
        values = {p.name: p.suggest(trial) for p in self.params}
        for simplex in self.simplexes:
            values.update(simplex.suggest_grid(trial, self.grid_step) if grid else simplex.suggest(trial))
        return values

    def trial_params(self, values: Mapping[str, Any], *, grid: bool = False) -> dict[str, Any]:
        """The Optuna parameters of the trial whose dotted config fields are ``values`` (for
        ``study.enqueue_trial``): params as they are, simplex groups as their stick-breaking parameters (grid mode:
        their grid point).

        Raises:
            ConfigError: If a field is missing, a value is outside its param's range or choices, or a simplex group's
                values are not a point of it (grid mode: not a point of its grid).
        """
        missing = [k for k in self.names if k not in values]
        if missing:
            raise ConfigError(f"no value for the searched fields {missing}")
        out: dict[str, Any] = {}
        for p in self.params:
            value = values[p.name]
            if isinstance(p, CategoricalParam):
                if value not in p.choices:
                    raise ConfigError(f"{p.name} = {value!r} is not one of the searched choices {list(p.choices)}")
            elif not (isinstance(value, int | float) and p.low <= value <= p.high):
                raise ConfigError(f"{p.name} = {value!r} is outside the searched range [{p.low:g}, {p.high:g}]; "
                                  "widen the --param range to include it")  # fmt: skip
            out[p.name] = value
        for s in self.simplexes:
            out.update(s.params([float(values[k]) for k in s.keys], self.grid_step if grid else None))
        return out

    def corners(self, *, grid: bool = False) -> list[dict[str, Any]]:
        """Two points of the space as dotted config fields: every param at its low end (first choice), then at its
        high end (last choice), the simplex groups at equal weights (grid: their first grid point). Building the
        optimizers at both checks the field names and the ranges before any trial runs."""
        points = []
        for end in (0, -1):
            values: dict[str, Any] = {}
            for p in self.params:
                values[p.name] = p.choices[end] if isinstance(p, CategoricalParam) else (p.low, p.high)[end]
            for s in self.simplexes:
                k = len(s.fields)
                weights = simplex_grid(k, self.grid_step, s.total)[0] if grid else [s.total / k] * k
                values.update(zip(s.keys, weights, strict=True))
            points.append(values)
        return points

    def grid(self, step: float | None = None) -> dict[str, list[Any]]:
        """``GridSampler``'s search space: each param's grid values and each simplex group's points.

        Raises:
            ConfigError: If a float param has no step, or ``step`` does not divide a simplex total.
        """
        step = self.grid_step if step is None else step
        space: dict[str, list[Any]] = {p.name: p.grid() for p in self.params}
        for s in self.simplexes:
            space[s.label] = [_point_text(p) for p in simplex_grid(len(s.fields), step, s.total)]
        return space

    def grid_size(self) -> int:
        """How many points the full grid has (the product of the axes' sizes)."""
        return math.prod(len(v) for v in self.grid().values())


def parse_param(spec: str) -> FloatParam | IntParam | CategoricalParam:
    """A param from its command-line form ``NAME=float:LOW:HIGH[:log][:step=S]``, ``NAME=int:LOW:HIGH[:log]
    [:step=S]`` or ``NAME=cat:A,B,C`` (choices read as JSON where they parse: ``true``, ``3``, ``0.5``, ``null``).

    Raises:
        ConfigError: If ``spec`` has none of these forms (the message shows them).

    Example:
        >>> parse_param("learning_rate=float:1e-4:1e-2:log")
        FloatParam(name='learning_rate', low=0.0001, high=0.01, log=True, step=None)
        >>> parse_param("loss_type=cat:grpo,dapo").choices
        ('grpo', 'dapo')
    """
    forms = "NAME=float:LOW:HIGH[:log][:step=S], NAME=int:LOW:HIGH[:log][:step=S] or NAME=cat:A,B,C"
    name, sep, rest = spec.partition("=")
    kind, _, args = rest.partition(":")
    name, kind = name.strip(), kind.strip().lower()
    if not sep or not name or kind not in ("float", "int", "cat"):
        raise ConfigError(f"--param {spec!r}: use {forms}")
    if kind == "cat":
        return CategoricalParam(name, tuple(_choice(c) for c in args.split(",") if c.strip()))
    parts = [p.strip() for p in args.split(":")]
    flags = parts[2:]
    try:
        number = float if kind == "float" else int
        low, high = number(parts[0]), number(parts[1])
        step = next((number(f[5:]) for f in flags if f.startswith("step=")), None)
    except (ValueError, IndexError):
        raise ConfigError(f"--param {spec!r}: LOW, HIGH and step must be {kind}s; use {forms}") from None
    unknown = [f for f in flags if f != "log" and not f.startswith("step=")]
    if unknown:
        raise ConfigError(f"--param {spec!r}: unknown flag(s) {unknown}; use {forms}")
    if kind == "float":
        return FloatParam(name, low, high, log="log" in flags, step=step)
    return IntParam(name, low, high, log="log" in flags, step=step or 1)


def parse_simplex(spec: str) -> Simplex:
    """A simplex group from its command-line form ``GROUP=F1,F2,...`` (fields ``GROUP.F1``, ...) or ``F1,F2,...``
    (top-level fields), optionally with ``@TOTAL`` at the end (default 1).

    Raises:
        ConfigError: If ``spec`` names fewer than two fields.

    Example:
        >>> parse_simplex("plan_weights=logic,execution").keys
        ('plan_weights.logic', 'plan_weights.execution')
        >>> parse_simplex("alpha,beta@0.2").total
        0.2
    """
    body, _, total = spec.partition("@")
    group, sep, names = body.rpartition("=") if "=" in body else ("", "", body)
    fields = tuple(f.strip() for f in names.split(",") if f.strip())
    try:
        value = float(total) if total.strip() else 1.0
    except ValueError:
        raise ConfigError(f"--simplex {spec!r}: the total after @ must be a number") from None
    if len(fields) < 2:
        raise ConfigError(f"--simplex {spec!r}: use GROUP=F1,F2,... or F1,F2,... (at least two fields)[@TOTAL]")
    return Simplex(group.strip(), fields, total=value)


def _choice(text: str) -> Any:
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if value is None or isinstance(value, (bool, int, float, str)) else text
