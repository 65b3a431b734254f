"""The checks of ``rolecall compile``'s flags that need more than argparse, all made before the data or the model
load: the command's own numbers (:func:`check_numbers`; an optimizer's settings are checked by its config class),
the adapters a per-adapter ``max_steps`` names (:func:`check_max_steps_names`) and the program a ``--from`` folder
holds (:func:`check_from`, its ``program.json`` and adapter files read without a model). Each raises
:class:`~rolecall.errors.ConfigError` with one line naming the flag, the value or the damaged file."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError, RolecallError
from rolecall.programs.registry import get_program_class

__all__ = ["check_from", "check_max_steps_names", "check_numbers"]


def check_numbers(args: argparse.Namespace) -> None:
    """The command's own numeric flags in range: ``--limit`` and ``--k`` >= 1 (every optimizer setting is checked by
    its config class).

    Raises:
        ConfigError: the first flag out of range, with its value.
    """
    for name in ("limit", "k"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be >= 1, got {value}")


def check_max_steps_names(
    args: argparse.Namespace, chain: Sequence[str], optimizers: Sequence[Any], options: Mapping[str, Any]
) -> None:
    """A per-adapter ``max_steps`` of an SFT-style optimizer of the chain may name only the adapters it trains; the
    program is built without a model to learn them (``--from``: the saved one).

    Raises:
        ConfigError: it names an adapter the program lacks (the message lists its adapters) or one that ``roles``
            leaves untrained.
    """
    from rolecall.cli_fields import flag_of
    from rolecall.optimizers.max_steps import check_max_steps
    from rolecall.optimizers.multitask_sft import PLANNING_ROLES
    from rolecall.programs.core.saving import load_program
    from rolecall.programs.registry import build_program

    for position, (name, optimizer) in enumerate(zip(chain, optimizers, strict=True)):
        config = getattr(optimizer, "sft_config", None)
        if config is None or not isinstance(config.max_steps, dict):
            continue
        folder = getattr(args, "from_dir", None)
        cls = get_program_class(args.program)
        if folder is not None:
            program = load_program(cls, folder)
        else:
            program = build_program(args.program, None, None, **options)
        roles = config.roles
        if config.multitask:  # MultiTaskSFT rebinds its roles to one adapter; the others keep their own
            merged = roles or PLANNING_ROLES
            adapters, trained = ["multitask", *(r for r in program.roles if r not in merged)], ["multitask"]
        else:
            groups = program.adapter_roles()
            adapters = list(groups)
            trained = [a for a, members in groups.items() if roles is None or set(members) & set(roles)]
        prefix = None if position == len(chain) - 1 else name
        flags = (flag_of("max_steps", prefix), flag_of("roles", prefix))
        check_max_steps(config.max_steps, adapters, trained, cls.__name__, flags=flags)


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
