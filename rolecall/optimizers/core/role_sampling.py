"""Sampling settings for a program's roles while an optimizer's rollouts run, restored afterwards."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["role_lm_overrides"]


@contextlib.contextmanager
def role_lm_overrides(program: Any, overrides: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """Merge ``overrides[role]`` (``temperature``, ``top_p``, ...) into ``program.lm_kwargs[role]`` for the duration,
    then put the program's own ``lm_kwargs`` back exactly as they were (even when the rollouts raise).

    Example:
        >>> class P:
        ...     lm_kwargs = {"agent": {"max_tokens": 64}}
        >>> p = P()
        >>> with role_lm_overrides(p, {"agent": {"temperature": 1.0}}):
        ...     p.lm_kwargs["agent"]
        {'max_tokens': 64, 'temperature': 1.0}
        >>> p.lm_kwargs
        {'agent': {'max_tokens': 64}}
    """
    kwargs = program.lm_kwargs
    saved = copy.deepcopy(kwargs)
    for role, values in overrides.items():
        kwargs[role] = {**kwargs.get(role, {}), **values}
    try:
        yield
    finally:
        kwargs.clear()
        kwargs.update(saved)
