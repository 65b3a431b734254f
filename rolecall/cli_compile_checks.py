"""The checks of ``rolecall compile``'s flags that need more than argparse, all made before the data or the model
load: numeric ranges (:func:`check_numbers`, nan and inf included), the adapters a per-adapter ``--max-steps`` names
(:func:`check_max_steps_names`) and the program a ``--from`` folder holds (:func:`check_from`, its ``program.json``
and adapter files read without a model). Each raises :class:`~rolecall.errors.ConfigError` with one line naming the
flag, the value or the damaged file."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError, RolecallError
from rolecall.programs.registry import get_program_class

__all__ = ["check_from", "check_max_steps_names", "check_numbers", "parse_roles"]

_FLAGS = {"limit": "--limit", "batch_size": "--batch-size", "grad_accum": "--grad-accum", "epochs": "--epochs",
          "learning_rate": "--learning-rate", "budget_minutes": "--budget-minutes",
          "rl_minutes": "--rl-minutes"}  # fmt: skip


def parse_roles(text: str | None) -> tuple[str, ...] | None:
    """``--roles plan,synthesis`` as a tuple (None when not given); SFT checks the names against the program.

    Example:
        >>> parse_roles(" plan, synthesis ")
        ('plan', 'synthesis')
    """
    if text is None:
        return None
    return tuple(r.strip() for r in text.split(",") if r.strip()) or None


def check_numbers(args: argparse.Namespace) -> None:
    """Every numeric training flag in its range: ``--limit``, ``--batch-size``, ``--grad-accum`` >= 1 (and
    ``--max-steps`` through its parser); ``--epochs``, ``--learning-rate``, ``--budget-minutes``, ``--rl-minutes``
    finite and > 0.

    Raises:
        ConfigError: the first flag out of range, with its value.
    """
    from rolecall.optimizers.sft import parse_max_steps

    for name, what in (("limit", ""), ("batch_size", " (micro_batch_size)"), ("grad_accum", "")):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"{_FLAGS[name]}{what} must be >= 1, got {value}")
    for name in ("epochs", "learning_rate", "budget_minutes", "rl_minutes"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{_FLAGS[name]} must be a finite number > 0, got {value}")
    parse_max_steps(getattr(args, "max_steps", None))


def check_max_steps_names(args: argparse.Namespace, chain: Sequence[str], options: Mapping[str, Any]) -> None:
    """``--max-steps`` must reach an optimizer of the chain, and a per-adapter one may name only the adapters SFT
    trains; the program is built without a model to learn them (``--from``: the saved one).

    Raises:
        ConfigError: no optimizer of the chain takes ``--max-steps``, or it names an adapter the program lacks (the
            message lists its adapters) or one that ``--roles`` leaves untrained.
    """
    from rolecall.optimizers.multitask_sft import PLANNING_ROLES
    from rolecall.optimizers.sft import check_max_steps, parse_max_steps
    from rolecall.programs.core.saving import load_program
    from rolecall.programs.registry import build_program

    max_steps = parse_max_steps(args.max_steps)
    if max_steps is None:
        return
    if not {"sft", "multitask_sft", "splanrl", "opd"} & set(chain):
        raise ConfigError(f"--max-steps caps SFT, multitask_sft, splanrl's cold start and opd; --optimizer "
                          f"{','.join(chain)} does not use it: drop it")  # fmt: skip
    if not isinstance(max_steps, dict):
        return
    folder = getattr(args, "from_dir", None)
    cls = get_program_class(args.program)
    program = load_program(cls, folder) if folder is not None else build_program(args.program, None, None, **options)
    roles = parse_roles(args.roles)
    if "multitask_sft" in chain:  # MultiTaskSFT rebinds its roles to one adapter; the others keep their own
        merged = roles or PLANNING_ROLES
        adapters, trained = ["multitask", *(r for r in program.roles if r not in merged)], ["multitask"]
    else:
        groups = program.adapter_roles()
        adapters = list(groups)
        trained = [a for a, members in groups.items() if roles is None or set(members) & set(roles)]
    check_max_steps(max_steps, adapters, trained, cls.__name__, flags=("--max-steps", "--roles"))


def check_from(args: argparse.Namespace) -> None:
    """``--from DIR`` must hold an intact saved program of ``--program``'s class (its ``program.json`` and adapter
    files are read, no model loads), and comes without ``-o`` options.

    Raises:
        ConfigError: DIR holds no saved program, one of another program, a damaged file (the message names it), or
            ``-o`` was given too.
    """
    from rolecall.programs.registry import saved_program

    folder = getattr(args, "from_dir", None)
    if folder is None:
        return
    try:
        name, cls = saved_program(folder)
    except RolecallError as err:
        raise ConfigError(f"--from {folder}: {err}") from err
    if cls is not get_program_class(args.program):
        raise ConfigError(f"--from {folder} holds a {cls.__module__}.{cls.__qualname__} program, not --program "
                          f"{args.program}; pass --program {name}")  # fmt: skip
    if getattr(args, "option", None):
        dropped = " -o ".join(args.option)
        raise ConfigError(f"--from {folder}: the program's options come from its program.json; drop -o {dropped}, "
                          "or train from the untrained program without --from")  # fmt: skip
    _check_saved_files(folder, cls)


def _check_saved_files(folder: Path, cls: type) -> None:
    """Reads the program saved in ``folder`` without a model, and checks each adapter folder it names.

    Raises:
        ConfigError: ``program.json`` does not describe a program of ``cls``, or an adapter file is damaged.
    """
    from rolecall.programs.core.saving import STATE_FILE, check_saved_adapters, load_program

    try:
        check_saved_adapters(folder)
        load_program(cls, folder)
    except RolecallError as err:
        raise ConfigError(f"--from {folder}: {err}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"--from {folder}: {folder / STATE_FILE} is damaged ({type(err).__name__}: {err}); save the "
                          "program again, or train without --from") from None  # fmt: skip
