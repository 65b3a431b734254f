"""Reading STRIDE's role outputs: the Supervisor's action, the Extractor's facts, and a demo fitted to a role.

The Supervisor's ``action`` and the Extractor's ``facts`` are plain strings in the signatures
(:mod:`rolecall.signatures.stride`), so a small model's "Retrieve." or a bulleted fact list is not a parse failure;
these readers turn them into the values the control layer routes on.
"""

from __future__ import annotations

import re
from typing import Any

import dspy

from rolecall.signatures.stride import ACTIONS, Action
from rolecall.signatures.types import is_null_answer

__all__ = ["read_action", "parse_facts", "fit_demo"]

_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|\[\d+\])\s*")


def read_action(text: str | None) -> Action | None:
    """The first action named in the Supervisor's ``action`` output, None when it names none.

    Example:
        >>> read_action(" Rewrite."), read_action("search")
        ('rewrite', None)
    """
    words = re.findall(r"[a-z]+", (text or "").lower())
    return next((w for w in words if w in ACTIONS), None)  # type: ignore[return-value]


def parse_facts(text: str | None) -> list[str]:
    """The Extractor's facts: one per non-empty line, bullets and numbers stripped, ``none`` lines dropped, duplicates
    removed.

    Example:
        >>> parse_facts("- Varn is in Ostria.\\n2. Ostria's capital is Dellin.\\n- Varn is in Ostria.")
        ['Varn is in Ostria.', "Ostria's capital is Dellin."]
        >>> parse_facts("none")
        []
    """
    lines = (" ".join(_BULLET.sub("", line).split()) for line in (text or "").splitlines())
    return list(dict.fromkeys(line for line in lines if line and not is_null_answer(line)))


def fit_demo(demo: Any, signature: type[dspy.Signature]) -> dspy.Example:
    """``demo`` restricted to ``signature``'s fields, its inputs marked (the direct-plan ablation drops the plan demos'
    ``strategy``).

    Example:
        >>> from rolecall.signatures.stride import DirectPlan
        >>> fit_demo(dspy.Example(question="q", strategy=["s"], sub_questions=["a"]), DirectPlan).toDict()
        {'question': 'q', 'sub_questions': ['a']}
    """
    data = demo.toDict() if hasattr(demo, "toDict") else dict(demo)
    kept = {k: v for k, v in data.items() if k in signature.fields}
    return dspy.Example(**kept).with_inputs(*[k for k in signature.input_fields if k in kept])
