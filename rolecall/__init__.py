"""rolecall: trained multi-agent retrieval-augmented multi-hop QA programs in the style of DSPy.

Subpackages load lazily so ``import rolecall`` stays fast and a heavy backend is only imported when used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = {
    "data",
    "evaluation",
    "lm",
    "optimizers",
    "programs",
    "retrievers",
    "signatures",
    "tuning",
    "errors",
}
_ATTRS = {
    "LocalLM": ("rolecall.lm", "LocalLM"),
    "ServedLM": ("rolecall.lm.served", "ServedLM"),
    "VLLMLM": ("rolecall.lm.vllm", "VLLMLM"),
    "evaluate": ("rolecall.evaluation", "evaluate"),
    "Example": ("rolecall.data", "Example"),
    "Passage": ("rolecall.retrievers", "Passage"),
    "RolecallError": ("rolecall.errors", "RolecallError"),
}

__all__ = sorted(_SUBMODULES | set(_ATTRS) | {"__version__"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"rolecall.{name}")
    if name in _ATTRS:
        module, attr = _ATTRS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'rolecall' has no attribute {name!r}")
