"""Program options: one ``@dataclass(kw_only=True)`` per program, validated before any model loads.

Each field is typed; ranges are declared next to the field with :func:`option` and checked by
:meth:`ProgramOptions.__post_init__`, so a bad value gives one message naming the option, the value and the valid range
or choices. :func:`parse_option` turns the CLI's ``-o KEY=VALUE`` strings into typed values against the same class,
and :meth:`ProgramOptions.from_kwargs` turns an unknown keyword into the same kind of message instead of a
``TypeError``.

Example:
    >>> @dataclass(kw_only=True)
    ... class Demo(ProgramOptions):
    ...     top_k: int = option(5, low=1)
    ...     mode: Literal["fast", "slow"] = "fast"
    >>> Demo(top_k=0)
    Traceback (most recent call last):
    ...
    rolecall.errors.ConfigError: option top_k must be an int >= 1, got 0
    >>> parse_option(Demo, "mode", "slow")
    'slow'
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from rolecall.errors import ConfigError

__all__ = ["ProgramOptions", "PassageOptions", "option", "parse_option", "parse_value", "option_types", "describe_type"]

OptionsT = TypeVar("OptionsT", bound="ProgramOptions")

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def option(default: Any, *, low: float | None = None, high: float | None = None) -> Any:
    """A dataclass field with a default and an inclusive range ``low <= value <= high`` (either may be None)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple default for a sequence option")
    return field(default=default, metadata={"low": low, "high": high})


def option_types(cls: type[ProgramOptions]) -> dict[str, Any]:
    """Field name -> resolved type annotation of an options class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def describe_type(tp: Any) -> str:
    """A short human description of an option type (``int``, ``one of 'a', 'b'``, ``a list of int``, ...)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is tuple:
        return f"a list of {describe_type(args[0])}" if args else "a list"
    if origin is dict:
        return f"a mapping of {describe_type(args[0])} to {describe_type(args[1])}" if args else "a mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _conforms(value: Any, tp: Any) -> bool:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return True
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is tuple:
        item = args[0] if args else Any
        return isinstance(value, (tuple, list)) and all(_conforms(v, item) for v in value)
    if origin is dict:
        key, item = args if args else (Any, Any)
        return isinstance(value, dict) and all(_conforms(k, key) and _conforms(v, item) for k, v in value.items())
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _range_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


@dataclass(kw_only=True)
class ProgramOptions:
    """Base of every program's options: type and range checks of all fields in ``__post_init__``.

    Subclasses add fields (ranges through :func:`option`) and may extend ``__post_init__`` with cross-field checks;
    they call ``super().__post_init__()`` first.
    """

    def __post_init__(self) -> None:
        hints = option_types(type(self))
        for f in fields(self):
            tp = hints[f.name]
            value = getattr(self, f.name)
            tuple_typed = get_origin(tp) is tuple or any(get_origin(a) is tuple for a in get_args(tp))
            if isinstance(value, list) and tuple_typed:
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            low, high = f.metadata.get("low"), f.metadata.get("high")
            bad_range = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and ((low is not None and value < low) or (high is not None and value > high))
            )
            if not _conforms(value, tp) or bad_range:
                raise ConfigError(
                    f"option {f.name} must be {_article(describe_type(tp))}{_range_text(low, high)}, got {value!r}"
                )

    @classmethod
    def from_kwargs(cls: type[OptionsT], owner: str, values: Mapping[str, Any]) -> OptionsT:
        """Build the options from keyword arguments; an unknown name gives a :class:`ConfigError` listing the known.

        Args:
            owner: the program's name, for the message.
            values: option name -> value.
        """
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"{owner} has no option {', '.join(map(repr, unknown))}; its options are: {', '.join(known) or 'none'}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON data (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _article(text: str) -> str:
    if text.startswith(("one of", "a ", "null")):
        return text
    return f"an {text}" if text[:1] in "aeiou" else f"a {text}"


@dataclass(kw_only=True)
class PassageOptions(ProgramOptions):
    """Options of programs that show passages to an LM: how much of them one prompt holds."""

    max_passage_chars: int = option(300, low=20)
    """Characters of one passage shown to an LM."""
    max_context_chars: int = option(900, low=20)
    """Characters of all passages shown in one prompt (at least ``max_passage_chars``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_context_chars < self.max_passage_chars:
            raise ConfigError(
                f"option max_context_chars ({self.max_context_chars}) must be >= max_passage_chars "
                f"({self.max_passage_chars})"
            )


def parse_option(cls: type[ProgramOptions], key: str, raw: str) -> Any:
    """The value of option ``key`` of ``cls`` written as ``raw`` on the command line.

    Booleans accept true/false/yes/no/1/0/on/off; numbers and lists (``1,2,3`` or JSON ``[1, 2, 3]``) are parsed by
    the field's type; other text is kept as a string. The parsed value is type- and range-checked by building ``cls``
    with it.

    Raises:
        ConfigError: ``key`` is not an option of ``cls``, or ``raw`` does not fit its type (the message names the
            option, the value and what it accepts).
    """
    types_ = option_types(cls)
    if key not in types_:
        raise ConfigError(f"unknown option {key!r}; the options are: {', '.join(types_) or 'none'}")
    tp = types_[key]
    value = parse_value(raw, tp)
    if not _conforms(value, tp):
        raise ConfigError(f"option {key}={raw!r} is not valid: {key} must be {_article(describe_type(tp))}")
    return value


def parse_value(raw: str, tp: Any) -> Any:
    """``raw`` parsed by the type ``tp`` (bool, int, float, a tuple, a union of them; other text kept as it is); a
    value that does not parse is returned as ``raw``, for the caller's type check to reject with its message."""
    origin, args = get_origin(tp), get_args(tp)
    text = raw.strip()
    if origin in (Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            value = parse_value(raw, arg)
            if _conforms(value, arg):
                return value
        return raw
    if tp is bool:
        low = text.lower()
        return True if low in _TRUE else False if low in _FALSE else raw
    if tp in (int, float):
        try:
            number = float(text) if tp is float else int(text)
        except ValueError:
            return raw
        return number
    if origin is tuple:
        item = args[0] if args else str
        try:
            items = json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t.strip()]
        except ValueError:
            return raw
        if not isinstance(items, list):
            return raw
        return tuple(parse_value(str(t), item) if isinstance(t, str) else t for t in items)
    return raw
