"""Recording one role call: the LM-call recorder, ChatAdapter's stop marker, token counts, and salvaging the fields a
small model did write when DSPy's adapter rejected its whole output.

:func:`salvage_fields` is the one place a raw completion is read back into fields: :meth:`Program.call_role` runs it on
every failed call and keeps what it finds in ``step.meta["salvaged"]`` (and, with ``salvage=True``, returns it as the
call's prediction), so no program re-parses completions itself.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from dspy.utils.callback import BaseCallback

from rolecall.programs.core.trajectory import Step

__all__ = [
    "COMPLETED_MARKER",
    "LMCallRecorder",
    "is_local_lm",
    "default_lm_kwargs",
    "with_max_tokens",
    "jsonable",
    "first_line",
    "count_tokens",
    "fill_lm_record",
    "completion_texts",
    "read_sections",
    "read_list",
    "salvage_fields",
]

logger = logging.getLogger(__name__)

_J = TypeVar("_J", dict, list)

COMPLETED_MARKER = "[[ ## completed ## ]]"
"""ChatAdapter's end-of-output marker. Role calls stop on it by default: small models otherwise keep generating after it
(SmolLM2-135M repeats its output until the token budget runs out)."""


def is_local_lm(lm: Any) -> bool:
    """Whether ``lm`` is a rolecall ``LocalLM`` (checked without importing torch when it cannot be one)."""
    module = sys.modules.get("rolecall.lm.local")
    return module is not None and isinstance(lm, module.LocalLM)


class LMCallRecorder(BaseCallback):
    """Records the messages and completions of the LM calls made while it is active (thread-safe).

    One recorder serves one role call; it is installed with ``dspy.context(callbacks=[...])``, which DSPy keeps in a
    context variable, so calls made on other threads at the same time go to their own recorders.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = threading.local()  # the call this thread is in: an LM reports its sampled ids to it
        self.calls: dict[str, dict[str, Any]] = {}

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Store the chat messages of a starting LM call."""
        messages = inputs.get("messages")
        if messages is None and inputs.get("prompt") is not None:
            messages = [{"role": "user", "content": inputs["prompt"]}]
        record = {"messages": [dict(m) for m in messages or []], "completions": [], "lm": instance, "error": None,
                  "sampled": []}  # fmt: skip
        with self._lock:
            self.calls[call_id] = record
        self._current.record = record

    def note_sampled(self, token_ids: Sequence[int], finish_reason: str) -> None:
        """Store the token ids the LM sampled for this thread's current call (EOS or the stop string's tokens included,
        as sampled; ``finish_reason`` ``"length"`` marks a truncated call). A rolecall LM engine calls it on every
        recorder among DSPy's active callbacks, so a trainer can train on exactly those ids instead of re-tokenizing
        the text (:func:`rolecall.optimizers.core.samples.samples_from_trajectory`)."""
        record = getattr(self._current, "record", None)
        if record is not None:
            with self._lock:
                record["sampled"].append({"token_ids": [int(t) for t in token_ids], "finish_reason": finish_reason})

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: BaseException | None = None) -> None:
        """Store the raw completion text(s) of a finished LM call."""
        texts = [_completion_text(o) for o in outputs] if isinstance(outputs, list) else []
        with self._lock:
            record = self.calls.get(call_id)
            if record is not None:
                record["completions"] = texts
                record["error"] = None if exception is None else f"{type(exception).__name__}: {exception}"
        if getattr(self._current, "record", None) is record:
            self._current.record = None  # ids sampled after this call ended belong to no call of ours

    def ordered(self) -> list[dict[str, Any]]:
        """The recorded calls in start order."""
        with self._lock:
            return list(self.calls.values())


def default_lm_kwargs(max_tokens: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The default ``lm_kwargs`` of a program: stop on ChatAdapter's completion marker, and each role's token budget.

    Example:
        >>> default_lm_kwargs({"plan": 128})
        {'*': {'stop': ['[[ ## completed ## ]]']}, 'plan': {'max_tokens': 128}}
    """
    return {"*": {"stop": [COMPLETED_MARKER]}, **{role: {"max_tokens": n} for role, n in max_tokens.items()}}


def with_max_tokens(lm_kwargs: dict[str, dict[str, Any]], max_tokens: int) -> dict[str, dict[str, Any]]:
    """``lm_kwargs`` with every LM call's completion budget set to ``max_tokens``: the ``"*"`` entry and each role's
    own ``max_tokens`` (a role's entry wins over ``"*"``, so both are set). The input is not changed.

    This is what ``rolecall eval --max-tokens N`` does to a program: each role's ``MAX_TOKENS`` (or the budget a saved
    program recorded) is only the default.

    Example:
        >>> with_max_tokens({"*": {"stop": ["x"]}, "plan": {"max_tokens": 128}, "answer": {"n": 3}}, 32)
        {'*': {'stop': ['x'], 'max_tokens': 32}, 'plan': {'max_tokens': 32}, 'answer': {'n': 3}}
    """
    out = {key: dict(value) for key, value in lm_kwargs.items()}
    out.setdefault("*", {})["max_tokens"] = max_tokens
    for value in out.values():
        if "max_tokens" in value:
            value["max_tokens"] = max_tokens
    return out


def _completion_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return str(output.get("text") or output.get("content") or "")
    return str(output)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic models dumped, unknown objects as strings)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)


def first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


def count_tokens(calls: list[dict[str, Any]]) -> tuple[int, int]:
    """Tokenize recorded calls with the LM's own tokenizer when it is a ``LocalLM`` (else zeros)."""
    prompt = completion = 0
    for call in calls:
        lm = call["lm"]
        if not is_local_lm(lm):
            continue
        try:
            prompt += len(lm.backend.encode_messages(call["messages"]))
            completion += sum(
                len(lm.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in call["completions"]
            )
        except Exception:  # token counts are diagnostics; never fail a call over them
            logger.debug("token counting failed", exc_info=True)
    return prompt, completion


def read_sections(completion: str | None, names: Sequence[str]) -> dict[str, str]:
    """The raw text of each ``[[ ## name ## ]]`` section of a ChatAdapter completion (or the keys of a JSON object).

    Used to salvage what a small model did write when the adapter rejected the whole output (one field out of its
    ``Literal``, a list written as lines). Missing sections are left out.

    Example:
        >>> read_sections("[[ ## answer ## ]]\\nVarn\\n\\n[[ ## level ## ]]\\ndirect", ["answer", "level"])
        {'answer': 'Varn', 'level': 'direct'}
    """
    if not completion:
        return {}
    text = completion.strip()
    if text.startswith("{"):
        data = _json_value(text, dict)
        if data is not None:
            return {k: data[k] if isinstance(data[k], str) else json.dumps(data[k]) for k in names if k in data}
    headers = list(re.finditer(r"\[\[\s*##\s*(\w+)\s*##\s*\]\]", text))
    out: dict[str, str] = {}
    for i, header in enumerate(headers):
        name = header.group(1)
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        if name in names and name not in out:
            out[name] = text[header.end() : end].strip()
    return out


def _json_value(text: str, kind: type[_J]) -> _J | None:
    """``text`` parsed as JSON when it is valid JSON of type ``kind`` (a dict, a list), else None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, kind) else None


def read_list(value: str) -> list[str]:
    """A list field written as JSON (``["a", "b"]``) or as one item per line."""
    value = value.strip()
    if value.startswith("["):
        data = _json_value(value, list)
        if data is not None:
            return [str(x) for x in data]
        value = value.strip("[]")
    return [line.strip().strip('",').strip() for line in value.splitlines() if line.strip().strip('",').strip()]


def fill_lm_record(step: Step, recorder: LMCallRecorder, tracker: Any, *, fallback_lm: Any = None) -> None:
    """Copy what ``recorder`` and DSPy's usage ``tracker`` saw of one role call into ``step``: the last call's
    messages and completion(s), earlier attempts, an LM-side error, token usage and the adapter that answered."""
    calls = recorder.ordered()
    if calls:
        last = calls[-1]
        step.messages = last["messages"]
        step.completion = last["completions"][0] if last["completions"] else None
        if len(last["completions"]) > 1:
            step.meta["completions"] = last["completions"]
        if len(last.get("sampled") or ()) == 1 and len(last["completions"]) == 1:
            step.meta["sampled"] = last["sampled"][0]  # the exact ids of step.completion
        if len(calls) > 1:
            step.meta["attempts"] = [
                {"messages": c["messages"], "completions": c["completions"],
                 **({"sampled": c["sampled"][0]} if len(c.get("sampled") or ()) == 1 else {})}
                for c in calls
            ]  # fmt: skip
        if step.error is None and last["error"]:
            step.error = last["error"]
    prompt_tokens = completion_tokens = 0
    for usage in tracker.get_total_tokens().values():
        prompt_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        completion_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    if prompt_tokens == 0 and calls:
        prompt_tokens, completion_tokens = count_tokens(calls)
    step.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "lm_calls": len(calls)}
    lm = calls[-1]["lm"] if calls else fallback_lm
    adapter = getattr(lm, "adapter", None)
    step.adapter = adapter if isinstance(adapter, str) else None


def completion_texts(step: Step) -> list[str]:
    """Every raw completion of a recorded role call, the earliest attempt first (DSPy's ChatAdapter attempt before its
    JSON fallback), then the sampled candidates of the last call (``n > 1``), then ``step.completion``; no repeats."""
    texts = [c for a in step.meta.get("attempts", []) for c in a.get("completions", []) if c]
    texts += [c for c in step.meta.get("completions", []) if c]
    if step.completion:
        texts.append(step.completion)
    return list(dict.fromkeys(texts))


def salvage_fields(step: Step, names: Sequence[str]) -> dict[str, str]:
    """The fields named ``names`` readable in the raw completions of a role call (see :func:`read_sections`), the
    first attempt's spelling winning; empty when nothing is readable.

    Example:
        >>> step = Step(kind="role", role="x", completion="[[ ## answer ## ]]\\nVarn\\n\\n[[ ## level ## ]]\\nbad")
        >>> salvage_fields(step, ["answer", "level", "statement"])
        {'answer': 'Varn', 'level': 'bad'}
    """
    out: dict[str, str] = {}
    for text in completion_texts(step):
        for key, value in read_sections(text, names).items():
            out.setdefault(key, value)
    return out
