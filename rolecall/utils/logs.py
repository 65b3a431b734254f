"""Logging helpers for the command line and the experiment scripts.

A small model at a modest ``max_tokens`` hits the token limit on many calls, and DSPy logs a warning for every one:
a 20-minute ``rolecall demo`` printed over a hundred identical lines that buried its progress bars. The truncation
itself is not lost: the answer is parsed (or recorded as a parse failure) like any other output. So
:class:`RepeatedWarningFilter` shows the first such warning, then only a running count at 10, 100, 1000, ... repeats.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

__all__ = ["DEFAULT_REPEATED_WARNINGS", "RepeatedWarningFilter", "quiet_repeated_warnings"]

# (logger name, message prefix) of warnings that repeat on every call and say nothing new after the first
DEFAULT_REPEATED_WARNINGS: tuple[tuple[str, str], ...] = (("dspy.clients.lm", "LM response was truncated"),)


class RepeatedWarningFilter(logging.Filter):
    """Let the first record of each known repeating warning through, then only one at 10, 100, 1000, ... repeats.

    A shown repeat has ``(N times so far)`` added to its message; records that match no pattern pass unchanged.

    Args:
        patterns: ``(logger name, message prefix)`` pairs; a record matches when its logger name and the start of its
            message equal them.

    Example:
        >>> f = RepeatedWarningFilter([("demo", "too long")])
        >>> rec = lambda: logging.LogRecord("demo", logging.WARNING, __file__, 1, "too long", None, None)
        >>> [f.filter(rec()) for _ in range(11)].count(True)
        2
    """

    def __init__(self, patterns: Iterable[tuple[str, str]] = DEFAULT_REPEATED_WARNINGS) -> None:
        super().__init__()
        self.patterns = tuple(patterns)
        self.counts: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to emit ``record`` (rewriting the message of a shown repeat)."""
        message: str | None = None  # formatted only for records from a pattern's logger: filters see every record
        for pattern in self.patterns:
            name, prefix = pattern
            if record.name != name:
                continue
            message = record.getMessage() if message is None else message
            if message.startswith(prefix):
                n = self.counts.get(pattern, 0) + 1
                self.counts[pattern] = n
                if n == 1:
                    return True
                if _is_power_of_ten(n):
                    record.msg, record.args = f"{message} ({n} times so far; repeats are counted, not shown)", None
                    return True
                return False
        return True


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


def quiet_repeated_warnings(
    logger: logging.Logger | None = None, patterns: Iterable[tuple[str, str]] = DEFAULT_REPEATED_WARNINGS
) -> RepeatedWarningFilter:
    """Attach one :class:`RepeatedWarningFilter` to every handler that can emit the ``patterns``' records.

    That is the handlers of ``logger`` (default: the root logger) and of each pattern's logger and its ancestors up
    to the first that does not propagate. Filters sit on handlers, not loggers, because a logger's own filters do not
    see records propagated from its children; and DSPy gives its ``dspy`` logger a handler of its own and stops
    propagation there, so the root handlers never see ``dspy.clients.lm``.

    Returns:
        The filter, whose ``counts`` say how many of each warning were seen.
    """
    patterns = tuple(patterns)
    log_filter = RepeatedWarningFilter(patterns)
    handlers: list[logging.Handler] = list((logger or logging.getLogger()).handlers)
    for name, _ in patterns:
        current: logging.Logger | None = logging.getLogger(name)
        while current is not None:
            handlers.extend(current.handlers)
            current = current.parent if current.propagate else None
    for handler in dict.fromkeys(handlers):  # once each, in order
        if log_filter not in handler.filters:
            handler.addFilter(log_filter)
    return log_filter
