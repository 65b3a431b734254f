"""Command-line flags generated from config dataclasses: one flag per field, its ``--help`` text the field's
docstring, its value parsed by the field's type and checked by the config class before any model loads.

``rolecall compile --optimizer CHAIN`` gives every field of the trained optimizer (the chain's last) a flag named
after it, ``learning_rate`` -> ``--learning-rate``; a warm start earlier in the chain takes its fields with its name in
front, ``--sft.epochs``. The run settings every optimizer shares are the exceptions: ``output_dir``, ``resume`` and
``show_progress`` come from ``--out``, ``--resume`` and ``--no-progress``, ``seed`` from ``--seed`` (the world's
seed too), and ``--num-threads`` sets every optimizer of the chain.

Values: numbers and strings as written; booleans ``true/false/yes/no/1/0/on/off`` (a bare ``--flag`` is true); lists
``a,b,c``; a mapping field (MAPGRPO's per-role ``steps``) ``plan=4,analysis=8`` (the roles not named keep their
defaults) or one value for every key (``--steps 2``); a nested dataclass (reward weights) ``logic=0.2,format=0.1``;
``none`` where the field may be None; JSON (``{...}``, ``[...]``) anywhere.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from rolecall.errors import ConfigError
from rolecall.programs.core.options import parse_value

__all__ = [
    "FROM_OTHER_FLAGS",
    "SHARED_FIELDS",
    "SHARED",
    "TRAINED",
    "add_config_flags",
    "config_flags",
    "default_text",
    "flag_of",
    "option_docs",
    "parse_field",
    "parsed_fields",
    "with_flags",
    "type_text",
]

FROM_OTHER_FLAGS: dict[str, str] = {
    "output_dir": "--out",
    "resume": "--resume",
    "show_progress": "--no-progress",
    "seed": "--seed",
}
"""Run-config fields set by a command's own flags instead of a generated one (field -> that flag)."""

SHARED_FIELDS: tuple[str, ...] = ("num_threads",)
"""Fields whose one flag sets every optimizer of the chain that has them."""


# ----------------------------------------------------------------------------------------------------- field docs
def option_docs(options_cls: type) -> dict[str, str]:
    """Field name -> attribute docstring (the string literal under the field) of a dataclass and its dataclass bases,
    read from their source, as the house style writes them; a field without one is absent.

    Example:
        >>> from rolecall.programs.core.options import PassageOptions
        >>> option_docs(PassageOptions)["max_passage_chars"]
        'Characters of one passage shown to an LM.'
    """
    docs: dict[str, str] = {}
    for klass in reversed(options_cls.__mro__):  # a subclass's doc of a redeclared field wins
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (a frozen or generated class): no docs
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def type_text(field: dataclasses.Field, tp: Any) -> str:
    """A field's type and declared range in words (``an int >= 1``, ``one of 'a', 'b'``)."""
    from rolecall.programs.core.options import describe_type

    low, high = field.metadata.get("low"), field.metadata.get("high")
    text = describe_type(tp)
    if low is not None and high is not None:
        return f"{text} in [{low}, {high}]"
    return text + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")


def default_text(field: dataclasses.Field) -> str:
    """A field's default as the command line writes it."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return _shown(value)


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_shown(v)}" for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ",".join(f"{f.name}={getattr(value, f.name)}" for f in dataclasses.fields(value))
    return str(value)


# ------------------------------------------------------------------------------------------------------- the flags
def flag_of(field: str, prefix: str | None = None) -> str:
    """The flag of ``field``: ``--learning-rate``, or ``--sft.learning-rate`` with ``prefix="sft"``."""
    name = field.replace("_", "-")
    return f"--{prefix}.{name}" if prefix else f"--{name}"


def _dest(owner: str, field: str) -> str:
    return f"field:{owner}:{field}"


def config_flags(cls: type, prefix: str | None) -> list[tuple[str, str]]:
    """``(field, flag)`` of every field of config ``cls`` that gets a generated flag."""
    skip = set(FROM_OTHER_FLAGS) | set(SHARED_FIELDS)
    return [(f.name, flag_of(f.name, prefix)) for f in dataclasses.fields(cls) if f.init and f.name not in skip]


TRAINED = "@"
"""The owner of an unprefixed flag's value: the chain's last optimizer, known only once ``--optimizer`` is read."""
SHARED = "*"
"""The owner of a shared field's value: every optimizer of the chain."""


def add_config_flags(
    parser: argparse.ArgumentParser,
    configs: Sequence[tuple[str, type, bool]],
    shown: Sequence[tuple[str, type]] | None = None,
) -> None:
    """Adds the generated flags to ``parser``: one unprefixed flag per field name of any config in ``configs``
    (``[(optimizer, config class, may warm-start a chain)]``, every registered optimizer), set on the chain's last
    optimizer; ``--NAME.FIELD`` for the optimizers that may warm-start a chain; the shared fields once.

    ``shown`` (the chain the command line names, ``[(name, config class)]``) decides the help: its optimizers' flags
    in one group each, with the field's docstring, type and default; the others are accepted but not listed (None:
    every flag is listed)."""
    classes = {name: cls for name, cls, _ in configs}
    classes.update(dict(shown or ()))  # the program's own meaning of a name (search_r1: grpo is Search-R1's GRPO)
    warm_names = {name for name, _, warm in configs if warm}
    configs = [(name, cls, name in warm_names) for name, cls in classes.items()]
    docs = {name: option_docs(cls) for name, cls, _ in configs}
    hints = {name: typing.get_type_hints(cls) for name, cls, _ in configs}
    fields = {name: {f.name: f for f in dataclasses.fields(cls)} for name, cls, _ in configs}
    shown_names = None if shown is None else [name for name, _ in shown]
    owner_of: dict[str, str] = {}  # field -> the optimizer whose doc an unprefixed flag shows
    for name, cls, _ in [*(c for c in configs if shown_names and c[0] == shown_names[-1]), *configs]:
        for field, _flag in config_flags(cls, None):
            owner_of.setdefault(field, name)
    run = parser.add_argument_group("run settings (every optimizer of the chain)")
    for field in SHARED_FIELDS:
        holder = next((n for n, c, _ in configs if field in fields[n]), None)
        if holder is not None:
            f, tp = fields[holder][field], hints[holder][field]
            run.add_argument(flag_of(field), dest=_dest(SHARED, field), default=None, metavar=_metavar(tp),
                             help=_help(f, tp, docs[holder]))  # fmt: skip
    groups: dict[str, Any] = {}

    def group(name: str, title: str) -> Any:
        if name not in groups:
            groups[name] = parser.add_argument_group(title)
        return groups[name]

    trained = shown_names[-1] if shown_names else None
    for field, name in owner_of.items():
        f, tp = fields[name][field], hints[name][field]
        visible = shown_names is None or name == trained
        cls_name = next(c.__name__ for n, c, _ in configs if n == name)
        title = (
            f"{name} settings ({cls_name})"
            if shown_names
            else "optimizer settings (of the trained optimizer: "
            "the last of --optimizer's chain; `rolecall compile --optimizer NAME --help` lists one optimizer's)"
        )
        target = group(name if shown_names else "*", title) if visible else parser
        target.add_argument(flag_of(field), dest=_dest(TRAINED, field), default=None, metavar=_metavar(tp),
                            nargs="?" if _is_bool(tp) else None, const="true" if _is_bool(tp) else None,
                            help=_help(f, tp, docs[name]) if visible else argparse.SUPPRESS)  # fmt: skip
    for name, cls, warm in configs:
        if not warm:
            continue
        visible = shown_names is None or (name in shown_names and name != trained)
        title = f"{name} settings ({cls.__name__}; as the chain's warm start: --{name}.FIELD)"
        for field, flag in config_flags(cls, name):
            f, tp = fields[name][field], hints[name][field]
            target = group(f"{name}.", title) if visible else parser
            target.add_argument(flag, dest=_dest(name, field), default=None, metavar=_metavar(tp),
                                nargs="?" if _is_bool(tp) else None, const="true" if _is_bool(tp) else None,
                                help=_help(f, tp, docs[name]) if visible else argparse.SUPPRESS)  # fmt: skip


def _help(f: dataclasses.Field, tp: Any, docs: Mapping[str, str]) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", docs.get(f.name, "")).replace("``", "").replace("%", "%%")
    return f"{text} [{type_text(f, tp)}; default: {default_text(f).replace('%', '%%')}]"


def _is_bool(tp: Any) -> bool:
    return tp is bool or (
        get_origin(tp) in (Union, types.UnionType) and bool in get_args(tp) and len(get_args(tp)) <= 2
    )


def _metavar(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "{" + ",".join(map(str, args)) + "}"
    if origin in (Union, types.UnionType):
        parts = [_metavar(a) for a in args if a is not type(None)]
        return "|".join(dict.fromkeys(parts)) + ("|none" if type(None) in args else "")
    if origin is dict or (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
        return "K=V,..."
    if origin is tuple:
        return "A,B,..."
    return {bool: "BOOL", int: "N", float: "X", str: "TEXT"}.get(tp, "VALUE")


# ------------------------------------------------------------------------------------------------------ the values
def parse_field(cls: type, field: str, raw: str, default: Any = None) -> Any:
    """The value of ``cls``'s field ``field`` written as ``raw`` (see the module docstring): a mapping for a dict or
    dataclass field (one value alone sets every key of ``default``, the field's current value), which
    :func:`with_flags` merges into the current value. Types and ranges are checked by the config class."""
    return _parse(raw, typing.get_type_hints(cls)[field], default)


def _parse(raw: str, tp: Any, default: Any = None) -> Any:
    text = raw.strip()
    origin, args = get_origin(tp), get_args(tp)
    structured = origin in (dict, tuple, list, Union, types.UnionType) or dataclasses.is_dataclass(tp)
    if text[:1] in ("{", "[") and structured:
        try:
            value = json.loads(text)
        except ValueError:
            return raw
        return tuple(value) if isinstance(value, list) else value
    if origin in (Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        choices = [a for a in args if a is not type(None)]
        if "=" in text:  # a mapping: the dict or dataclass member of the union
            choices = [a for a in choices if get_origin(a) is dict or dataclasses.is_dataclass(a)] or choices
        for arg in choices:
            value = _parse(raw, arg, default)
            if value is not raw:
                return value
        return raw
    if origin is dict or (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
        return _pairs(text, tp, default)
    return parse_value(raw, tp)  # bool, int, float, a list: as program options parse them


def _pairs(text: str, tp: Any, default: Any) -> Any:
    """``k=v,k=v`` as a mapping parsed by the value types (a dict field: one value alone sets every key)."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        out = {}
        for part in (p for p in text.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in hints:
                return text
            out[key] = _parse(value, hints[key])
        return out
    _, value_type = get_args(tp) or (str, Any)
    if "=" not in text:
        if not isinstance(default, Mapping) or not default:
            return text
        value = _parse(text, value_type)
        return {k: value for k in default}
    out = {}
    for part in (p for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            return text
        if key.strip() in out:
            raise ConfigError(f"names {key.strip()!r} twice")
        out[key.strip()] = _parse(value, value_type)
    return out


def parsed_fields(args: argparse.Namespace, name: str, config: Any, *, last: bool) -> dict[str, tuple[str, str]]:
    """The fields of the chain's optimizer ``name`` (its ``config``) set on the command line, as field -> (its flag,
    the value as written); ``last``: it is the trained optimizer, which the unprefixed flags set.

    Raises:
        ConfigError: an unprefixed flag names a field the trained optimizer does not have (the message lists its
            settings and how to reach the warm start's).
    """
    cls = type(config)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    out: dict[str, tuple[str, str]] = {}
    for key, raw in sorted(vars(args).items()):
        if raw is None or not key.startswith("field:"):
            continue
        _, owner, field = key.split(":", 2)
        if owner == TRAINED and not last or owner not in (TRAINED, SHARED, name):
            continue
        flag = flag_of(field, None if owner in (TRAINED, SHARED) else owner)
        if field not in known:
            if owner == SHARED:
                continue
            settings = ", ".join(flag_of(f) for f, _ in config_flags(cls, None))
            raise ConfigError(f"{flag} is not a setting of {name} ({cls.__name__}), the optimizer trained here; its "
                              f"settings: {settings} (a warm start's: --sft.FIELD)")  # fmt: skip
        out[field] = (flag, raw)
    return out


def with_flags(config: Any, args: argparse.Namespace, name: str, *, last: bool) -> Any:
    """``config`` with the fields the command line sets for the chain's optimizer ``name`` (:func:`parsed_fields`),
    each parsed by its type and validated by the config class.

    Raises:
        ConfigError: one line naming the flag, the value as written, and what is allowed.
    """
    from rolecall.tuning.config_file import apply_fields  # a mapping merges into the field's current value

    for field, (flag, raw) in parsed_fields(args, name, config, last=last).items():
        try:
            config = apply_fields(config, {field: parse_field(type(config), field, raw, getattr(config, field))})
        except ConfigError as err:
            raise ConfigError(f"{flag} {raw}: {err}") from None
    return config


def _field_default(cls: type, field: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == field:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None
