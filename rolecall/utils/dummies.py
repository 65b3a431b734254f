"""Scripted DSPy LMs for tests without a model: ``SchemaLM`` answers any signature well-formed, ``ScriptedTextLM``
returns given raw texts (random or malformed output, for robustness tests).

It reads the output fields from the system message DSPy's adapters write ("Your output fields are: 1. `name` (type)")
and answers every one of them with a value of the right shape (a JSON list for ``list[...]``, the first option of a
``Literal``, a number for ``int``/``float``, ``<answer>...</answer>`` for a field whose description asks for that tag,
otherwise a short string). DSPy's own optimizers (BootstrapFewShot,
MIPROv2, ...) call many internal signatures whose fields a hand-written ``DummyLM`` script cannot anticipate; this LM
answers them all, so an optimizer's control flow can be tested end to end.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

__all__ = ["SchemaLM", "ScriptedTextLM"]

_FIELD = re.compile(r"^\s*\d+\.\s+`([A-Za-z_][A-Za-z0-9_]*)`\s*\(([^)]*)\)(.*)$", re.MULTILINE)


def _value(type_text: str, name: str, answer: str, description: str = "") -> str:
    t = type_text.strip()
    if t == "str" and "<answer>" in description:  # a tagged action field (Search-R1): answer with the tag
        return f"<answer>{answer}</answer>"
    if t.startswith("Literal["):
        options = re.findall(r"'([^']*)'|\"([^\"]*)\"", t)
        first = next((a or b for a, b in options), "")
        return first
    if t.replace(" ", "").lower() in ("list[int]", "list[float]"):
        return "[1]"
    if t.startswith("list") or t.startswith("List"):
        return '["' + answer + '"]'
    if t in ("int",):
        return "1"
    if t in ("float",):
        return "0.5"
    if t in ("bool",):
        return "True"
    if t.startswith("dict") or t.startswith("Dict"):
        return "{}"
    return answer if name in ("answer", "query") else f"{name.replace('_', ' ')}: {answer}"


class _TextEngine:
    """A DSPy engine whose completion is the text :meth:`text` returns for a request (no usage, always ``stop``)."""

    def text(self, request: Any) -> str:
        raise NotImplementedError

    def complete(self, request: Any) -> Response:
        return Response(
            id=None,
            model=request.model,
            message=Message.assistant([TextPart(self.text(request))]),
            finish_reason="stop",
            usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
        )

    def stream(self, request: Any):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class _SchemaEngine(_TextEngine):
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls = 0

    def text(self, request: Any) -> str:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
        outputs = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
        fields = _FIELD.findall(outputs)
        self.calls += 1
        text = "".join(f"[[ ## {name} ## ]]\n{_value(t, name, self.answer, d)}\n\n" for name, t, d in fields)
        return text + "[[ ## completed ## ]]"


class SchemaLM(dspy.LM):
    """A scripted LM that fills every output field of any ChatAdapter prompt (see the module docstring).

    Args:
        answer: the string used for ``answer``/``query`` fields and inside other string fields.

    Example:
        >>> lm = SchemaLM("Paris")
        >>> with dspy.context(lm=lm):
        ...     dspy.Predict("question -> answer")(question="Capital of France?").answer
        'Paris'
    """

    def __init__(self, answer: str = "unknown") -> None:
        self.engine_impl = _SchemaEngine(answer)
        super().__init__("dummy/schema", engine=self.engine_impl, cache=False, num_retries=0)

    @property
    def calls(self) -> int:
        """Number of completions served."""
        return self.engine_impl.calls


class _ScriptedEngine(_TextEngine):
    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts) or [""]
        self.calls = 0
        self._lock = threading.Lock()

    def text(self, request: Any) -> str:
        with self._lock:
            text = self.texts[self.calls % len(self.texts)]
            self.calls += 1
        return text


class ScriptedTextLM(dspy.LM):
    r"""An LM that returns the given raw completion texts in turn (cycling), whatever it is asked.

    For robustness tests: drive a program with random or malformed text (hypothesis strategies, half-formed
    ``[[ ## field ## ]]`` headers, empty strings) and check that it finishes, records the failures and still returns
    an ``answer`` field. Thread-safe: concurrent calls take the next texts in order.

    Args:
        texts: the completions to return, in order; an empty list returns ``""`` every time.

    Example:
        >>> lm = ScriptedTextLM(["[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"])
        >>> with dspy.context(lm=lm):
        ...     dspy.Predict("question -> answer")(question="Capital of France?").answer
        'Paris'
    """

    def __init__(self, texts: list[str]) -> None:
        self.engine_impl = _ScriptedEngine(texts)
        super().__init__("dummy/scripted", engine=self.engine_impl, cache=False, num_retries=0)

    @property
    def calls(self) -> int:
        """Number of completions served."""
        return self.engine_impl.calls
