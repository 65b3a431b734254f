"""Optimizer config files: reading them, and building an optimizer with their fields.

A config file (JSON, YAML or TOML) holds optimizer config fields that override the defaults. With one optimizer it
may list the fields directly; with a chain (``sft,mapgrpo``) it groups them under the optimizer names::

    {"mapgrpo": {"group_size": 4, "plan_weights": {"logic": 0.2, "execution": 0.4, ...}}}

A nested mapping merges into a dataclass-typed field (the reward weights) or a dict-typed field (MAPGRPO's per-role
``steps``); a dotted key (``"plan_weights.logic": 0.2``) is the same as the nesting. ``rolecall tune`` writes its best
trial in this format (``best_config.json``) and ``rolecall compile --config`` reads it.

Example:
    >>> cfg = apply_fields(MAPGRPOConfig(), {"plan_weights.logic": 0.2, "group_size": 4})  # doctest: +SKIP
    >>> cfg.plan_weights.logic, cfg.group_size                                               # doctest: +SKIP
    (0.2, 4)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union

from rolecall.errors import ConfigError

__all__ = [
    "apply_config_file",
    "apply_fields",
    "config_sections",
    "load_config_file",
    "nest",
    "optimizer_config",
    "with_fields",
    "write_config_file",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SUFFIXES = (".json", ".yaml", ".yml", ".toml")
"""The config file formats, by suffix."""


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a JSON, YAML or TOML file (by its suffix).

    Raises:
        ConfigError: If the file is missing, has another suffix, does not parse, or holds no mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (working directory: {Path.cwd()})")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"config file {path}: unknown format {suffix!r}; use one of {', '.join(SUFFIXES)}")
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            data = _toml().loads(text)
        else:
            data = _yaml().safe_load(text)
    except ConfigError:
        raise
    except Exception as err:  # each parser has its own error type; the message names the file and the cause
        raise ConfigError(f"config file {path} does not parse as {suffix[1:].upper()}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of config fields; got {type(data).__name__}")
    return data


def write_config_file(path: str | Path, sections: Mapping[str, Mapping[str, Any]]) -> Path:
    """Writes ``{optimizer: fields}`` as JSON (what :func:`load_config_file` and ``--config`` read); returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: dict(v) for k, v in sections.items()}, indent=2) + "\n", encoding="utf-8")
    return path


def nest(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings: ``{"a.b": 1, "c": 2}`` -> ``{"a": {"b": 1}, "c": 2}``.

    Raises:
        ConfigError: If a key is both a value and a mapping (``{"a": 1, "a.b": 2}``).
    """
    out: dict[str, Any] = {}
    for key, value in fields.items():
        *parents, leaf = str(key).split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config field {key!r} nests under {part!r}, which is also given a value")
        if isinstance(value, Mapping):
            value = nest(value)
            if isinstance(node.get(leaf), dict):
                value = {**node[leaf], **value}
        elif isinstance(node.get(leaf), dict):
            raise ConfigError(f"config field {key!r} is given a value and nested fields")
        node[leaf] = value
    return out


def config_sections(data: Mapping[str, Any], chain: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{optimizer: fields}`` of a config file for the optimizer chain ``chain``.

    A file whose top-level keys name optimizers of the chain is sectioned; otherwise, for a chain of one, the whole
    file is that optimizer's fields.

    Raises:
        ConfigError: If a sectioned file names an optimizer outside the chain, a section is no mapping, or a chain of
            several optimizers gets fields without sections.
    """
    data = nest(data)
    named = [k for k in data if k in chain]
    if not named:
        if len(chain) != 1:
            example = json.dumps({name: {"...": "..."} for name in chain})
            raise ConfigError(f"with the optimizer chain {','.join(chain)}, group the config fields under the "
                              f"optimizer names, e.g. {example}")  # fmt: skip
        return {chain[0]: data} if data else {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key not in chain:
            raise ConfigError(f"config section {key!r} is not an optimizer of the chain; valid sections are: "
                              f"{', '.join(chain)}")  # fmt: skip
        if not isinstance(value, dict):
            raise ConfigError(f"config section {key!r} must be a mapping of {key}'s config fields; got {value!r}")
        sections[key] = value
    return sections


def apply_fields(config: T, fields: Mapping[str, Any], *, where: str = "") -> T:
    """A copy of the dataclass ``config`` with ``fields`` changed, validated again by its ``__post_init__``.

    A nested mapping merges into a dataclass-typed or dict-typed field; a list becomes a tuple where the field holds
    a tuple; dotted keys nest (:func:`nest`).

    Args:
        config: An optimizer config (any dataclass instance).
        fields: Field name -> new value.
        where: The path of ``config`` inside an outer config, for messages (``"plan_weights."``).

    Raises:
        ConfigError: If a key is not a field (the message names it and lists the valid ones) or a value is invalid.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"apply_fields needs a dataclass instance; got {type(config).__name__}")
    valid = [f.name for f in dataclasses.fields(config) if f.init]
    changes: dict[str, Any] = {}
    for key, value in nest(fields).items():
        if key not in valid:
            raise ConfigError(f"{type(config).__name__} has no field {where + key!r}; valid fields are: "
                              f"{', '.join(valid)}")  # fmt: skip
        current = getattr(config, key)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(current):
            value = apply_fields(current, value, where=f"{where}{key}.")
        elif isinstance(value, Mapping) and isinstance(current, dict):
            value = {**current, **value}
        elif isinstance(value, list) and isinstance(current, tuple):
            value = tuple(value)
        changes[key] = value
    try:
        return dataclasses.replace(config, **changes)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{type(config).__name__}: invalid config fields {sorted(changes)}: {err}") from err


def optimizer_config(optimizer: Any) -> Any:
    """The config dataclass ``optimizer`` was built from: its attribute of the type ``__init__``'s ``config`` takes.

    Raises:
        ConfigError: If the optimizer's class takes no typed ``config`` or holds none.
    """
    cls = type(optimizer)
    try:
        hint = typing.get_type_hints(cls.__init__).get("config")
    except Exception as err:  # an annotation that does not resolve: say which class
        raise ConfigError(f"{cls.__name__}.__init__'s config annotation does not resolve: {err}") from err
    options = [a for a in (typing.get_args(hint) if _is_union(hint) else (hint,)) if dataclasses.is_dataclass(a)]
    for value in vars(optimizer).values():
        if options and type(value) in options:
            return value
    raise ConfigError(f"{cls.__name__} holds no config dataclass of the type its __init__ takes ({hint}); its "
                      "fields cannot be set from a config file")  # fmt: skip


def with_fields(optimizer: T, fields: Mapping[str, Any]) -> T:
    """A new optimizer of ``optimizer``'s class, its config with ``fields`` changed (:func:`apply_fields`).

    The other keyword arguments its ``__init__`` takes and it keeps as attributes of the same name (``teacher``,
    ``warm_start``, ``metric``, ``task_weights``) are passed on; its training state (history, samples) is not.

    Raises:
        ConfigError: If a key is not a config field (the message lists the valid ones) or a value is invalid.
    """
    config = apply_fields(optimizer_config(optimizer), fields)
    extras = {}
    for name, param in inspect.signature(type(optimizer).__init__).parameters.items():
        if param.kind is inspect.Parameter.KEYWORD_ONLY and hasattr(optimizer, name):
            extras[name] = getattr(optimizer, name)
    return type(optimizer)(config, **extras)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _toml() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ConfigError("TOML config files need Python >= 3.11 or `pip install tomli`; or use JSON") from None
    return tomllib


def _yaml() -> Any:
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigError("YAML config files need PyYAML: `pip install pyyaml`; or use JSON") from None
    return yaml


def apply_config_file(path: str | Path, optimizers: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer chain ``{name: optimizer}`` with the fields of the config file ``path`` over each one's config
    (an optimizer the file does not name is kept as it is).

    Raises:
        ConfigError: If the file is unreadable, or names an optimizer outside the chain or an unknown field.
    """
    sections = config_sections(load_config_file(path), list(optimizers))
    for name, fields in sections.items():
        logger.info("config file %s: %s fields %s", path, name, sorted(fields))
    return {name: with_fields(o, sections[name]) if name in sections else o for name, o in optimizers.items()}
