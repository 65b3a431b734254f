"""``max_steps``: the cap on an SFT-style optimizer's steps, for every adapter (``12``) or per adapter
(``plan=60,analysis=25``), as parsed from the command line and checked against the program's adapters before any
training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rolecall.errors import ConfigError

__all__ = ["check_max_steps", "parse_max_steps"]


def parse_max_steps(text: str | None) -> int | dict[str, int] | None:
    """``max_steps`` from the command line: ``"12"`` (every adapter) or ``"plan=60,analysis=25"`` (per adapter).

    Raises:
        ConfigError: ``text`` is neither form, a cap is below 1, or an adapter is named twice; the message shows both
            forms.

    Example:
        >>> parse_max_steps("plan=60, analysis=25")
        {'plan': 60, 'analysis': 25}
    """
    if text is None:
        return None
    usage = f"--max-steps takes N >= 1 or adapter=N,adapter=N (e.g. plan=60,analysis=25); got {text!r}"
    try:
        if "=" not in text:
            caps: int | dict[str, int] = int(text)
            values = [caps]
        else:
            pairs = [(k.strip(), int(v)) for k, v in (item.split("=", 1) for item in text.split(",") if item.strip())]
            caps, values = dict(pairs), [v for _, v in pairs]
            if len(caps) != len(pairs) or not pairs or "" in caps:
                raise ConfigError(f"{usage}: name each adapter once")
    except ValueError:
        raise ConfigError(usage) from None
    if min(values) < 1:
        raise ConfigError(f"{usage}: a cap below 1 trains nothing (--roles leaves an adapter untrained)")
    return caps


def check_max_steps(
    max_steps: Any,
    adapters: Sequence[str],
    trained: Sequence[str],
    program: str,
    *,
    flags: tuple[str, str] = ("max_steps", "roles"),
) -> None:
    """A per-adapter ``max_steps`` may name only the adapters that train (``trained``, of the program's ``adapters``);
    ``flags`` are the names of the max-steps and roles settings in the message (the CLI's ``--max-steps``).

    Raises:
        ConfigError: it names an adapter the program lacks (the message lists its adapters), or one that ``roles``
            leaves untrained.
    """
    if not isinstance(max_steps, dict):
        return
    if unknown := [a for a in max_steps if a not in adapters]:
        raise ConfigError(f"{flags[0]} names adapter(s) {', '.join(unknown)}, which {program} does not have; its "
                          f"adapters are {', '.join(adapters)}")  # fmt: skip
    if untrained := [a for a in max_steps if a not in trained]:
        raise ConfigError(f"{flags[0]} names adapter(s) {', '.join(untrained)}, which {flags[1]} leaves untrained; "
                          f"the trained adapters are {', '.join(trained)}")  # fmt: skip
