"""rolecall.utils.logs: DSPy's per-call truncation warning is shown once, then counted."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from rolecall.utils.logs import RepeatedWarningFilter, quiet_repeated_warnings


def _record(name: str, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)


def test_first_then_powers_of_ten_with_a_count():
    f = RepeatedWarningFilter([("dspy.clients.lm", "LM response was truncated")])
    shown = []
    for i in range(1, 1001):
        rec = _record("dspy.clients.lm", "LM response was truncated; increase max_tokens")
        if f.filter(rec):
            shown.append((i, rec.getMessage()))
    assert [i for i, _ in shown] == [1, 10, 100, 1000]
    assert shown[0][1] == "LM response was truncated; increase max_tokens"
    assert "(100 times so far" in shown[2][1]
    assert f.counts == {("dspy.clients.lm", "LM response was truncated"): 1000}


def test_other_records_pass_untouched():
    f = RepeatedWarningFilter()
    for _ in range(5):
        assert f.filter(_record("dspy.clients.lm", "some other warning"))
        assert f.filter(_record("rolecall.cli", "LM response was truncated"))  # same text, other logger
    assert f.counts == {}


@contextmanager
def _own_handler(name: str) -> Iterator[io.StringIO]:
    """Give logger ``name`` a handler writing to the yielded stream and stop it propagating (DSPy's shape)."""
    logger = logging.getLogger(name)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield stream
    finally:
        logger.removeHandler(handler)


def test_filter_on_handlers_sees_propagated_child_records():
    with _own_handler("rolecall-test-logs") as stream:
        root = logging.getLogger("rolecall-test-logs")
        counter = quiet_repeated_warnings(root, [("rolecall-test-logs.child", "noisy")])
        child = logging.getLogger("rolecall-test-logs.child")
        for _ in range(12):
            child.warning("noisy line")
        child.warning("a different line")
    lines = stream.getvalue().splitlines()
    assert lines == ["noisy line", "noisy line (10 times so far; repeats are counted, not shown)", "a different line"]
    assert counter.counts[("rolecall-test-logs.child", "noisy")] == 12


def test_reaches_a_non_propagating_parent_with_its_own_handler():
    """DSPy's shape: ``dspy`` has its own handler and propagate=False; root handlers never see its children."""
    with _own_handler("rolecall-test-own") as stream:
        elsewhere = logging.getLogger("rolecall-test-elsewhere")  # the logger passed has no handlers of its own
        counter = quiet_repeated_warnings(elsewhere, [("rolecall-test-own.clients", "truncated")])
        for _ in range(3):
            logging.getLogger("rolecall-test-own.clients").warning("truncated reply")
    assert stream.getvalue().splitlines() == ["truncated reply"]
    assert counter.counts[("rolecall-test-own.clients", "truncated")] == 3


def test_reaches_dspys_own_handler():
    import dspy  # noqa: F401  (creates the 'dspy' logger's handler)

    dspy_handlers = logging.getLogger("dspy").handlers
    counter = quiet_repeated_warnings(logging.getLogger("rolecall-test-none"))
    try:
        assert dspy_handlers and all(counter in h.filters for h in dspy_handlers)
    finally:
        for h in dspy_handlers:
            h.removeFilter(counter)
