"""The system registry: every program by CLI name, with SFT's gold-path targets, its rewards and the optimizers
that train it (:class:`System`; the optimizers themselves are in :mod:`rolecall.optimizers.registry`).

``rolecall eval`` / ``compile`` / ``tune`` / ``programs``, SFT's gold lookup, the "optimizer X does not apply to
program Y" error and the paper experiments' rows are generated from it. Adding a system is one
:func:`register_system` call (a test registers a toy and compiles it through the CLI).

Every registered class follows the program contract ``cls(retriever=None, *, lm=None, **options)`` and is called as
``program(question=...)``, returning a ``dspy.Prediction`` with ``answer`` and ``trajectory``. Classes are imported
only when asked for, so listing the names (``rolecall eval --help``) never loads a program module.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.programs.core.demos import DEMO_POLICIES
from rolecall.programs.core.options import parse_option
from rolecall.programs.core.saving import read_payload

__all__ = [
    "PROGRAMS",
    "SYSTEMS",
    "System",
    "get_system",
    "gold_builder",
    "gold_programs",
    "register_system",
    "unregister_system",
    "program_names",
    "get_program_class",
    "build_program",
    "option_names",
    "parse_program_options",
    "saved_program",
    "default_demos",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class System:
    """One registered program: its class, SFT's gold-path targets, its rewards and the optimizers that train it."""

    name: str
    """The CLI name (``rolecall eval --program NAME``)."""
    program: str
    """``"module:Class"`` of the program class (the program contract of this module's docstring)."""
    gold: str | None = None
    """``"module:function"`` building the gold-path override ``builder(example, corpus=None)`` SFT trains on (None:
    no gold-path targets, so ``sft`` does not apply)."""
    rewards: str | None = None
    """The module of the reward functions its RL optimizers score with (informational: ``rolecall programs NAME``)."""
    optimizers: tuple[str, ...] = ()
    """The registered optimizers (:mod:`rolecall.optimizers.registry`) written for it, besides ``sft``."""
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Other ``--optimizer`` names it takes, each meaning one of ``optimizers`` (search_r1: ``grpo`` is
    ``search_r1_grpo``)."""

    def resolve(self, optimizer: str) -> str | None:
        """The registered optimizer that ``--optimizer optimizer`` means for this program (None: it does not apply)."""
        if optimizer == "sft":
            return "sft" if self.gold is not None else None
        if optimizer in self.optimizers:
            return optimizer
        return self.aliases.get(optimizer)

    def optimizer_names(self) -> list[str]:
        """Every ``--optimizer`` name that applies: ``sft`` (with gold-path targets), its optimizers and aliases."""
        return [*(["sft"] if self.gold is not None else []), *self.optimizers, *self.aliases]


SYSTEMS: dict[str, System] = {}
"""Name -> :class:`System`, in registration order."""

PROGRAMS: dict[str, str] = {}
"""CLI name -> ``"module:Class"`` of every program ``rolecall eval --program`` can build (kept by
:func:`register_system`; a name here without a :class:`System` is a program no optimizer knows)."""


def register_system(system: System) -> System:
    """Adds (or replaces) a system; returns it. Its program becomes buildable by name, its gold builder SFT's
    targets and its optimizers ``rolecall compile --optimizer`` choices.

    Raises:
        ConfigError: the name is not an identifier or a target is not ``"module:attribute"``.
    """
    if not system.name.isidentifier():
        raise ConfigError(f"program name {system.name!r} must be a Python identifier")
    for target in (system.program, system.gold):
        if target is not None and target.count(":") != 1:
            raise ConfigError(f"program {system.name!r}: {target!r} must be 'module:attribute'")
    SYSTEMS[system.name] = system
    PROGRAMS[system.name] = system.program
    return system


def unregister_system(name: str) -> None:
    """Removes a registered system (a test's toy); unknown names are ignored."""
    SYSTEMS.pop(name, None)
    PROGRAMS.pop(name, None)


def get_system(name: str) -> System:
    """The system registered as ``name`` (a bare :data:`PROGRAMS` entry: a system without gold or optimizers).

    Raises:
        ConfigError: ``name`` is not registered.
    """
    if name in SYSTEMS and SYSTEMS[name].program == PROGRAMS.get(name):
        return SYSTEMS[name]
    if name in PROGRAMS:
        return System(name=name, program=PROGRAMS[name])
    raise ConfigError(f"unknown program {name!r}; choose one of: {', '.join(program_names())}")


def gold_builder(cls: type) -> Callable[..., Any] | None:
    """SFT's gold-path override builder for programs of class ``cls`` (None: the class has no gold-path targets)."""
    for name, system in SYSTEMS.items():
        if system.gold is not None and name in PROGRAMS and get_program_class(name) is cls:
            return _load(system.gold, f"program {name!r}'s gold builder")
    return None


def gold_programs() -> list[str]:
    """The registered programs with gold-path targets (where ``--optimizer sft`` applies), sorted."""
    return [n for n in program_names() if get_system(n).gold is not None]


_P, _G, _R = "rolecall.programs.", "rolecall.optimizers.gold:", "rolecall.optimizers.rewards."
_BUILT_IN = (
    # the five seed systems: program, SFT's gold-path targets, rewards, the optimizers written for them
    System(name="opera", program=_P + "opera.program:OPERA", gold=_G + "opera_gold", rewards=_R + "opera",
           optimizers=("mapgrpo", "grpo")),
    System(name="reap", program=_P + "reap.program:REAP", gold=_G + "reap_gold", optimizers=("multitask_sft",)),
    System(name="cascaded_team", program=_P + "team.program:CascadedTeam", gold=_G + "team_gold",
           rewards=_R + "team", optimizers=("opd_teacher",)),
    System(name="hierarchical_team", program=_P + "team.program:HierarchicalTeam", gold=_G + "team_gold",
           rewards=_R + "team", optimizers=("opd",)),
    System(name="d2plan", program=_P + "d2plan.program:D2Plan", gold=_G + "d2plan_gold", rewards=_R + "d2plan",
           optimizers=("splanrl",)),
    System(name="stride", program=_P + "stride.program:STRIDE", gold=_G + "stride_gold",
           rewards="rolecall.optimizers.stride_ft.selection", optimizers=("stride_ft",)),
    # the baselines the papers compare against (SFT targets for the two direct ones and Search-R1)
    System(name="no_retrieval_cot", program=_P + "baselines:NoRetrievalCoT", gold=_G + "direct_gold"),
    System(name="single_step_rag", program=_P + "baselines:SingleStepRAG", gold=_G + "direct_gold"),
    *(System(name=name, program=_P + f"baselines:{cls}") for name, cls in
      (("ircot", "IRCoT"), ("iter_retgen", "IterRetGen"), ("self_ask", "SelfAsk"), ("react", "ReActAgent"))),
    System(name="search_r1", program=_P + "baselines:SearchR1Agent", gold=_G + "search_r1_gold",
           rewards=_R + "search_r1", optimizers=("search_r1_grpo",), aliases={"grpo": "search_r1_grpo"}),
)  # fmt: skip
for _system in _BUILT_IN:
    register_system(_system)


def program_names() -> list[str]:
    """The registered program names, sorted."""
    return sorted(PROGRAMS)


def get_program_class(name: str) -> type:
    """Import and return the program class registered as ``name``.

    Args:
        name: a key of :data:`PROGRAMS` (``"opera"``, ``"single_step_rag"``, ...).

    Returns:
        The class.

    Raises:
        ConfigError: ``name`` is not registered, or its registered module or class does not exist.

    Example:
        >>> get_program_class("no_such_program")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rolecall.errors.ConfigError: unknown program 'no_such_program'; choose one of: no_retrieval_cot, opera, ...
    """
    if name not in PROGRAMS:
        raise ConfigError(f"unknown program {name!r}; choose one of: {', '.join(program_names())}")
    module_name, _, class_name = PROGRAMS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise  # a missing third-party dependency: its own ImportError says what to install
        raise ConfigError(
            f"program {name!r} is registered as {PROGRAMS[name]!r} but module {module_name!r} does not exist in this "
            "rolecall installation; update rolecall or fix the entry in rolecall.programs.registry.PROGRAMS."
        ) from err
    try:
        return getattr(module, class_name)
    except AttributeError as err:
        raise ConfigError(
            f"program {name!r} is registered as {PROGRAMS[name]!r} but {module_name} has no {class_name!r}; "
            "fix the entry in rolecall.programs.registry.PROGRAMS."
        ) from err


def _load(target: str, what: str) -> Any:
    module_name, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ModuleNotFoundError, AttributeError) as err:
        raise ConfigError(f"{what} is registered as {target!r}, which does not exist: {err}") from err


def build_program(name: str, retriever: Any = None, lm: Any = None, **options: Any) -> Any:
    """Build the program registered as ``name``: ``cls(retriever=retriever, lm=lm, **options)``.

    Args:
        name: a key of :data:`PROGRAMS`.
        retriever: the retriever the program searches with (ignored by programs that do not retrieve).
        lm: the LM its roles call (None: the LM configured in ``dspy.settings``).
        **options: program-specific options, passed through.

    Returns:
        The program.

    Raises:
        ConfigError: ``name`` is not registered (see :func:`get_program_class`).
    """
    cls = get_program_class(name)
    logger.debug("building program %s (%s) with options %s", name, PROGRAMS[name], options)
    return cls(retriever=retriever, lm=lm, **options)


def option_names(cls: type) -> list[str]:
    """The option names of a program class: the fields of its ``Options`` dataclass, or, for a class that follows
    the contract without one, the keyword parameters its ``__init__`` names (not those behind ``**kwargs``)."""
    options = getattr(cls, "Options", None)
    if dataclasses.is_dataclass(options):
        return [f.name for f in dataclasses.fields(options)]
    try:
        params = inspect.signature(cls.__init__).parameters  # not cls: dspy.Module's metaclass hides it
    except (TypeError, ValueError):
        return []
    skip = {"self", "retriever", "lm"}
    return [n for n, p in params.items() if n not in skip and p.kind is inspect.Parameter.KEYWORD_ONLY]


def parse_program_options(name: str, pairs: Sequence[str]) -> dict[str, Any]:
    """The constructor options of program ``name`` written as ``KEY=VALUE`` strings (the CLI's ``-o``), parsed by
    each option's type and validated against the program's ``Options`` class before anything loads.

    Besides the options, ``demos`` (auto / none), ``demo_policy`` (always / never / until_trained) and
    ``per_role_adapters`` (a bool) are accepted. For a registered class without an ``Options`` dataclass, values are
    parsed as JSON when they can be.

    Raises:
        ConfigError: a pair that is not ``KEY=VALUE``, an option the program does not have (the message lists the
            ones it has), or a value of the wrong type or out of range (the message names option, value and what is
            accepted).

    Example:
        >>> parse_program_options("opera", ["max_rewrites=1", "use_rewrite=no"])
        {'max_rewrites': 1, 'use_rewrite': False}
    """
    cls = get_program_class(name)
    names = option_names(cls) if dataclasses.is_dataclass(getattr(cls, "Options", None)) else []
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"--option expects KEY=VALUE with KEY a Python identifier, got {pair!r}")
        if not names:
            try:
                values[key] = json.loads(raw)
            except json.JSONDecodeError:
                values[key] = raw
        elif key == "demos":
            if raw.strip().lower() not in ("auto", "none", "null"):
                raise ConfigError(f"option demos={raw!r} is not valid: choose auto (built-in demos) or none")
            values[key] = "auto" if raw.strip().lower() == "auto" else None
        elif key == "demo_policy":
            if raw not in DEMO_POLICIES:
                raise ConfigError(f"option demo_policy={raw!r} is not valid: choose one of {', '.join(DEMO_POLICIES)}")
            values[key] = raw
        elif key == "per_role_adapters":
            values[key] = parse_option(_BaseSwitches, key, raw)
        elif key not in names:
            raise ConfigError(
                f"program {name!r} has no option {key!r}; its options are: {', '.join(names)} "
                "(and demos, demo_policy, per_role_adapters)"
            )
        else:
            values[key] = parse_option(cls.Options, key, raw)
    if names:
        cls.Options.from_kwargs(name, {k: v for k, v in values.items() if k in names})  # ranges, cross-field checks
    return values


@dataclasses.dataclass(kw_only=True)
class _BaseSwitches:
    per_role_adapters: bool = True


def saved_program(path: str | Path) -> tuple[str, type]:
    """The registered name and class of the program saved in directory ``path`` (by :meth:`Program.save`).

    Raises:
        ModelLoadError: ``path`` holds no readable ``program.json``.
        ConfigError: the saved class is not a registered program.
    """
    payload = read_payload(Path(path))
    saved = str(payload.get("program", ""))
    for name in program_names():
        cls = get_program_class(name)
        if f"{cls.__module__}.{cls.__qualname__}" == saved:
            return name, cls
    raise ConfigError(
        f"{path} holds a {saved or 'program of unknown class'}, which is not a registered program; registered: "
        f"{', '.join(program_names())}"
    )


def default_demos(kind: str, *, n: int = 3) -> dict[str, list[Any]]:
    """At most ``n`` of each role's built-in demos of a program (fresh copies; programs ship 3 per role): ``kind``
    is a registered program name, or ``"cot"`` / ``"rag"`` for the two direct baselines (the names this function took
    before each program had its own ``default_demos()``).

    Raises:
        ConfigError: ``kind`` names no program.

    Example:
        >>> sorted(default_demos("opera"))
        ['analysis', 'plan', 'rewrite', 'synthesis']
    """
    name = {"cot": "no_retrieval_cot", "rag": "single_step_rag"}.get(kind, kind)
    if name not in PROGRAMS:
        raise ConfigError(f"unknown demo kind {kind!r}; choose a program ({', '.join(program_names())}), cot or rag")
    program = get_program_class(name)(None, demos=None)
    return {role: role_demos[:n] for role, role_demos in program.default_demos().items()}
