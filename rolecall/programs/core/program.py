"""``Program``: the contract every rolecall program follows (roles, per-role LMs, recorded role calls, save / load).

A program is a ``dspy.Module`` whose predictors are its roles. ``forward(question)`` returns
``dspy.Prediction(answer=str, trajectory=Trajectory)`` and never raises: failures become recorded steps. Role calls go
through :meth:`Program.call_role`, which records the exact chat messages and raw completions of every LM call (via a
DSPy callback scoped to that one call, so concurrent questions never see each other's messages), the parsed outputs
or the parse error, the wall time and the token usage.
"""

from __future__ import annotations

import contextvars
import copy
import inspect
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.usage_tracker import UsageTracker

from rolecall.errors import ConfigError, ModelLoadError
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.base import Passage, Retriever

__all__ = [
    "Program",
    "LMCallRecorder",
    "COMPLETED_MARKER",
    "format_passages",
    "is_local_lm",
    "parallel_map",
    "default_lm_kwargs",
]

logger = logging.getLogger(__name__)

P = TypeVar("P", bound="Program")
T = TypeVar("T")
R = TypeVar("R")

_STATE_FILE = "program.json"
_ADAPTER_DIR = "adapters"
_FORMAT_VERSION = 1

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
        self.calls: dict[str, dict[str, Any]] = {}

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Store the chat messages of a starting LM call."""
        messages = inputs.get("messages")
        if messages is None and inputs.get("prompt") is not None:
            messages = [{"role": "user", "content": inputs["prompt"]}]
        record = {"messages": [dict(m) for m in messages or []], "completions": [], "lm": instance, "error": None}
        with self._lock:
            self.calls[call_id] = record

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: BaseException | None = None) -> None:
        """Store the raw completion text(s) of a finished LM call."""
        texts = [_completion_text(o) for o in outputs] if isinstance(outputs, list) else []
        with self._lock:
            record = self.calls.get(call_id)
            if record is not None:
                record["completions"] = texts
                record["error"] = None if exception is None else f"{type(exception).__name__}: {exception}"

    def ordered(self) -> list[dict[str, Any]]:
        """The recorded calls in start order."""
        with self._lock:
            return list(self.calls.values())


def format_passages(passages: Sequence[Any], *, max_chars: int = 300, max_total_chars: int = 1200) -> str:
    """Number and truncate passages for a prompt: ``"[1] title | text"`` lines, each cut to ``max_chars`` and
    stopping before the total would pass ``max_total_chars`` (the first passage is always kept).

    Args:
        passages: passages, documents (anything with ``title`` and ``text``) or strings.
        max_chars: most characters of one passage (title included).
        max_total_chars: most characters of all passages together.

    Returns:
        The formatted block, or ``"(no passages)"`` when there are none.

    Example:
        >>> format_passages([Passage("d1", "Paris", "Paris is the capital of France.")])
        '[1] Paris | Paris is the capital of France.'
    """
    lines: list[str] = []
    total = 0
    for i, p in enumerate(passages, start=1):
        text = p if isinstance(p, str) else (f"{p.title} | {p.text}" if getattr(p, "title", "") else p.text)
        text = " ".join(text.split())
        if len(text) > max_chars:
            text = text[: max_chars - 3].rsplit(" ", 1)[0] + "..."
        line = f"[{i}] {text}"
        if lines and total + len(line) > max_total_chars:
            break
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) if lines else "(no passages)"


def default_lm_kwargs(max_tokens: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The default ``lm_kwargs`` of a program: stop on ChatAdapter's completion marker, and each role's token budget.

    Example:
        >>> default_lm_kwargs({"plan": 128})
        {'*': {'stop': ['[[ ## completed ## ]]']}, 'plan': {'max_tokens': 128}}
    """
    return {"*": {"stop": [COMPLETED_MARKER]}, **{role: {"max_tokens": n} for role, n in max_tokens.items()}}


def parallel_map(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` run on threads, each in a copy of the caller's context (DSPy settings included).

    Independent sub-tasks of one question (STRIDE's ready sub-questions, a Leader's wave of Searchers) run this way so
    their LM calls reach a ``LocalLM`` at the same time and are batched into one forward pass. A plain thread pool
    would lose ``dspy.context(...)`` overrides (the LM, callbacks, usage tracking), which live in context variables.
    Exceptions propagate from ``fn``, as in the list comprehension; results keep the order of ``items``.

    Example:
        >>> parallel_map(lambda x: x * x, [1, 2, 3])
        [1, 4, 9]
    """
    if len(items) <= 1 or max_workers == 1:
        return [fn(x) for x in items]
    contexts = [contextvars.copy_context() for _ in items]
    with ThreadPoolExecutor(max_workers=max_workers or len(items)) as pool:
        futures = [pool.submit(ctx.run, fn, x) for ctx, x in zip(contexts, items, strict=True)]
        return [f.result() for f in futures]


def _completion_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return str(output.get("text") or output.get("content") or "")
    return str(output)


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic models dumped, unknown objects as strings)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)


class Program(dspy.Module):
    """Base contract of rolecall programs: role predictors, per-role LMs, recorded role calls and retrieval.

    Subclasses create their predictors as plain attributes (so ``named_predictors()`` and DSPy's optimizers find
    them), then call :meth:`_bind_lm` at the end of ``__init__``. A role's name is the attribute holding its predictor
    (``self.plan`` -> ``"plan"``; a ``ChainOfThought`` at ``self.answer`` -> ``"answer"``).

    Args:
        retriever: the retriever tool, or None for programs that do not retrieve.
        lm: an LM for every role. A rolecall ``LocalLM`` with ``per_role_adapters=True`` gives each role its own LoRA
            adapter view (``lm.for_role(role)``); any other LM is shared by all roles; None uses ``dspy.settings.lm``.
        per_role_adapters: bind one adapter per role when ``lm`` is a ``LocalLM``.
        adapter: a DSPy adapter for the role calls (default: ``dspy.settings.adapter``, i.e. ``ChatAdapter``).
        lm_kwargs: extra LM call arguments by role (``max_tokens``, ``temperature``, ``stop``, ...); the key ``"*"``
            applies to every role and a role's own entry wins. Default: stop on ``[[ ## completed ## ]]``.
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.retriever = retriever
        self.lm = lm
        self.per_role_adapters = per_role_adapters
        self.adapter = adapter
        self.lm_kwargs = {"*": {"stop": [COMPLETED_MARKER]}} if lm_kwargs is None else copy.deepcopy(lm_kwargs)
        self._role_lms: dict[str, Any] = {}
        self._config: dict[str, Any] = {"per_role_adapters": per_role_adapters, "lm_kwargs": self.lm_kwargs}

    # ------------------------------------------------------------------ roles
    @property
    def roles(self) -> dict[str, dspy.Predict]:
        """Role name -> predictor, in definition order."""
        named = self.named_predictors()
        heads = [name.split(".")[0] for name, _ in named]
        return {(head if heads.count(head) == 1 else name): p for (name, p), head in zip(named, heads, strict=True)}

    def _predictor(self, role: str) -> dspy.Predict:
        roles = self.roles
        if role not in roles:
            raise ConfigError(f"{type(self).__name__} has no role {role!r}; its roles are {sorted(roles)}")
        return roles[role]

    def set_role_lm(self, role: str, lm: dspy.LM | None) -> None:
        """Make ``role`` call ``lm`` (None: fall back to ``dspy.settings.lm``)."""
        self._predictor(role).lm = lm
        if lm is None:
            self._role_lms.pop(role, None)
        else:
            self._role_lms[role] = lm

    def role_lm(self, role: str) -> dspy.LM | None:
        """The LM ``role`` will call: its own, else the program's binding, else ``dspy.settings.lm``."""
        return self._predictor(role).lm or self._role_lms.get(role) or dspy.settings.lm

    def bind_role_adapters(self, local_lm: Any) -> None:
        """Give every role its own LoRA adapter view of ``local_lm`` (adapter name = role name)."""
        if not hasattr(local_lm, "for_role"):
            raise ConfigError(f"bind_role_adapters needs a rolecall LocalLM, got {type(local_lm).__name__}")
        for role in self.roles:
            self.set_role_lm(role, local_lm.for_role(role))

    def _bind_lm(self) -> None:
        """Bind ``self.lm`` to the roles; subclasses call this once their predictors exist."""
        if self.lm is None:
            return
        if self.per_role_adapters and is_local_lm(self.lm):
            self.bind_role_adapters(self.lm)
        else:
            for role in self.roles:
                self.set_role_lm(role, self.lm)

    def set_demos(self, demos: dict[str, list[dspy.Example]]) -> None:
        """Set the few-shot demos of each named role (roles not in ``demos`` keep theirs)."""
        roles = self.roles
        unknown = sorted(set(demos) - set(roles))
        if unknown:
            raise ConfigError(f"demos for unknown roles {unknown}; {type(self).__name__} has roles {sorted(roles)}")
        for role, role_demos in demos.items():
            roles[role].demos = list(role_demos)

    # ------------------------------------------------------------------ recorded calls
    def call_role(
        self, role: str, trajectory: Trajectory, /, *, lm_config: dict[str, Any] | None = None, **inputs: Any
    ) -> dspy.Prediction | None:
        """Run ``role`` on ``inputs`` and record a ``Step(kind="role")``; None when the call or its parsing failed.

        ``lm_config`` overrides the role's ``lm_kwargs`` for this one call (e.g. ``{"n": 5, "temperature": 1.0}`` to
        sample several candidates).

        The step holds the inputs, the exact chat messages and raw completion of the (last) LM call, the parsed
        outputs or the error, the seconds taken and ``usage`` (``prompt_tokens``, ``completion_tokens``,
        ``lm_calls``). Earlier attempts (DSPy's JSON fallback after a parse failure) go to ``meta["attempts"]``.
        """
        predictor = self._predictor(role)
        recorder, tracker = LMCallRecorder(), UsageTracker()
        step = Step(kind="role", role=role, inputs=_jsonable(inputs))
        call_kwargs: dict[str, Any] = {}
        if predictor.lm is None and role in self._role_lms:
            call_kwargs["lm"] = self._role_lms[role]
        lm_kwargs = {**self.lm_kwargs.get("*", {}), **self.lm_kwargs.get(role, {}), **(lm_config or {})}
        if lm_kwargs:
            call_kwargs["config"] = lm_kwargs
        overrides: dict[str, Any] = {
            "callbacks": [*dspy.settings.get("callbacks", []), recorder],
            "usage_tracker": tracker,
        }
        if self.adapter is not None:
            overrides["adapter"] = self.adapter
        start = time.perf_counter()
        prediction: dspy.Prediction | None = None
        try:
            with dspy.context(**overrides):
                prediction = predictor(**inputs, **call_kwargs)
            step.outputs = {name: _jsonable(prediction.get(name)) for name in predictor.signature.output_fields}
        except AdapterParseError as e:
            step.error = f"parse error: {_first_line(str(e))}"
        except Exception as e:  # a role call must never crash the question
            logger.debug("role %s failed", role, exc_info=True)
            step.error = f"{type(e).__name__}: {_first_line(str(e))}"
        step.seconds = time.perf_counter() - start
        self._fill_lm_record(step, recorder, tracker, role)
        if step.error is not None:
            prediction = None
        trajectory.add(step)
        return prediction

    def _fill_lm_record(self, step: Step, recorder: LMCallRecorder, tracker: UsageTracker, role: str) -> None:
        calls = recorder.ordered()
        if calls:
            last = calls[-1]
            step.messages = last["messages"]
            step.completion = last["completions"][0] if last["completions"] else None
            if len(last["completions"]) > 1:
                step.meta["completions"] = last["completions"]
            if len(calls) > 1:
                step.meta["attempts"] = [{"messages": c["messages"], "completions": c["completions"]} for c in calls]
            if step.error is None and last["error"]:
                step.error = last["error"]
        prompt_tokens = completion_tokens = 0
        for usage in tracker.get_total_tokens().values():
            prompt_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
            completion_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        if prompt_tokens == 0 and calls:
            prompt_tokens, completion_tokens = _count_tokens(calls)
        step.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "lm_calls": len(calls)}
        lm = calls[-1]["lm"] if calls else None
        if getattr(lm, "adapter", None) is not None and isinstance(lm.adapter, str):
            step.meta["adapter"] = lm.adapter

    def retrieve(self, trajectory: Trajectory, query: str, k: int) -> list[Passage]:
        """Top-``k`` passages for ``query``, recorded as a retrieval step; failures give an error step and ``[]``."""
        step = Step(kind="retrieval", role="retrieve", inputs={"query": query, "k": k})
        start = time.perf_counter()
        passages: list[Passage] = []
        if self.retriever is None:
            step.error = "no retriever"
        elif not query or not query.strip():
            step.error = "empty query"
        else:
            try:
                passages = list(self.retriever(query, k))
            except Exception as e:  # a broken index must not crash the question
                logger.debug("retrieval failed for %r", query, exc_info=True)
                step.error = f"{type(e).__name__}: {_first_line(str(e))}"
            if step.error is None and not passages:
                step.error = "empty retrieval"
        step.outputs = {"passage_ids": [p.id for p in passages], "titles": [p.title for p in passages]}
        step.seconds = time.perf_counter() - start
        trajectory.add(step)
        return passages

    @staticmethod
    def failed(trajectory: Trajectory, error: BaseException) -> dspy.Prediction:
        """Record an unexpected error as an event step and return the empty prediction."""
        logger.debug("program run failed", exc_info=error)
        step = trajectory.event("error", type=type(error).__name__)
        step.error = f"{type(error).__name__}: {_first_line(str(error))}"
        return dspy.Prediction(answer="", trajectory=trajectory)

    # ------------------------------------------------------------------ optimisation, copies, persistence
    def compile(self: P, optimizer: Any, *, trainset: list[Any], valset: list[Any] | None = None, **kwargs: Any) -> P:
        """``optimizer.compile(self, trainset=..., valset=...)``; ``valset`` is passed only when given."""
        if valset is not None:
            kwargs["valset"] = valset
        return optimizer.compile(self, trainset=trainset, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Program:
        # Predictors and demos are copied; the retriever and every LM (the model weights) are shared.
        shared = [self.retriever, self.lm, *self._role_lms.values()]
        shared += [p.lm for _, p in self.named_predictors() if p.lm is not None]
        for obj in shared:
            if obj is not None:
                memo[id(obj)] = obj
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            try:
                new.__dict__[name] = copy.deepcopy(value, memo)
            except Exception:  # an uncopyable handle (lock, file) is shared rather than copied
                new.__dict__[name] = value
        return new

    def save(self, path: str | Path, save_program: bool = False, modules_to_serialize: Any = None) -> None:
        """Write ``path/program.json`` (each role's demos, instructions and signature, no LM objects) and, for each
        role bound to a ``LocalLM`` adapter, the adapter weights under ``path/adapters/<role>``.

        ``save_program`` and ``modules_to_serialize`` (``dspy.Module.save``'s pickle mode) are not supported.
        """
        if save_program or modules_to_serialize:
            raise ConfigError("Program.save writes JSON state and adapters only; save_program=True is not supported")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # LMs are not program state (and a custom engine may not be serializable): dump with them unbound
        bound = {name: p.lm for name, p in self.named_predictors()}
        try:
            for _, p in self.named_predictors():
                p.lm = None
            state = self.dump_state()
        finally:
            for name, p in self.named_predictors():
                p.lm = bound[name]
        adapters: dict[str, str] = {}  # role -> adapter name; roles sharing one adapter save it once
        for role in self.roles:
            lm = self.role_lm(role)
            if is_local_lm(lm) and lm.adapter is not None:
                if lm.adapter not in adapters.values():
                    lm.save_adapter(path / _ADAPTER_DIR / lm.adapter)
                adapters[role] = lm.adapter
        payload = {
            "format_version": _FORMAT_VERSION,
            "program": f"{type(self).__module__}.{type(self).__qualname__}",
            "config": self._config,
            "adapters": adapters,
            "state": state,
        }
        (path / _STATE_FILE).write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str))

    @classmethod
    def load(cls: type[P], path: str | Path, *, retriever: Retriever | None = None, lm: dspy.LM | None = None) -> P:
        """Rebuild a program written by :meth:`save`: same options, demos and instructions, and (when ``lm`` is a
        ``LocalLM``) each saved role adapter loaded into it.

        Raises:
            ModelLoadError: if ``path/program.json`` is missing or was written by another program class.
        """
        path = Path(path)
        file = path / _STATE_FILE
        if not file.is_file():
            raise ModelLoadError(f"{file} does not exist; pass the directory written by Program.save")
        payload = json.loads(file.read_text())
        expected = f"{cls.__module__}.{cls.__qualname__}"
        if payload.get("program") != expected:
            raise ModelLoadError(f"{file} holds a {payload.get('program')}, not a {expected}; load it with that class")
        params = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        options = {k: v for k, v in payload.get("config", {}).items() if takes_any or k in params}
        if "demos" in params:
            options["demos"] = None  # the saved state restores them
        program = cls(retriever, lm=lm, **options)
        program.load_state(payload["state"])
        for predictor in program.roles.values():  # DSPy restores demos as dicts; make them Examples again
            inputs = list(predictor.signature.input_fields)
            predictor.demos = [
                dspy.Example(**d).with_inputs(*[k for k in inputs if k in d]) if isinstance(d, dict) else d
                for d in predictor.demos
            ]
        if is_local_lm(lm):
            views: dict[str, Any] = {}
            for role, name in payload.get("adapters", {}).items():
                if name not in views:
                    folder = path / _ADAPTER_DIR / name
                    if not folder.is_dir():  # format 1 wrote one folder per role
                        folder = path / _ADAPTER_DIR / role
                    views[name] = lm.load_adapter(folder, name=name)
                program.set_role_lm(role, views[name])
        return program


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


def _count_tokens(calls: list[dict[str, Any]]) -> tuple[int, int]:
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
