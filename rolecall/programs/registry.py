"""The program registry: CLI names mapped to lazily imported program classes.

Every registered class follows the program contract ``cls(retriever=None, *, lm=None, **options)`` and is called as
``program(question=...)``, returning a ``dspy.Prediction`` with ``answer`` and ``trajectory``. Classes are imported
only when asked for, so listing the names (``rolecall eval --help``) never loads a program module.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from rolecall.errors import ConfigError

__all__ = ["PROGRAMS", "program_names", "get_program_class", "build_program"]

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
