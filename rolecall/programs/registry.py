"""The program registry: CLI names mapped to lazily imported program classes.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.programs.core.demos import DEMO_POLICIES
from rolecall.programs.core.options import parse_option
from rolecall.programs.core.saving import read_payload

__all__ = [
    "PROGRAMS",
    "program_names",
    "get_program_class",
    "build_program",
    "option_names",
    "parse_program_options",
    "saved_program",
    "default_demos",
]

logger = logging.getLogger(__name__)

PROGRAMS: dict[str, str] = {
    # the five seed systems
    "opera": "rolecall.programs.opera.program:OPERA",
    "reap": "rolecall.programs.reap.program:REAP",
    "cascaded_team": "rolecall.programs.team.program:CascadedTeam",
    "hierarchical_team": "rolecall.programs.team.program:HierarchicalTeam",
    "d2plan": "rolecall.programs.d2plan.program:D2Plan",
    "stride": "rolecall.programs.stride.program:STRIDE",
    # the baselines the papers compare against
    "no_retrieval_cot": "rolecall.programs.baselines:NoRetrievalCoT",
    "single_step_rag": "rolecall.programs.baselines:SingleStepRAG",
    "ircot": "rolecall.programs.baselines:IRCoT",
    "iter_retgen": "rolecall.programs.baselines:IterRetGen",
    "self_ask": "rolecall.programs.baselines:SelfAsk",
    "react": "rolecall.programs.baselines:ReActAgent",
    "search_r1": "rolecall.programs.baselines:SearchR1Agent",
}
"""CLI name → ``"module:Class"`` of every program ``rolecall eval --program`` can build."""


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
