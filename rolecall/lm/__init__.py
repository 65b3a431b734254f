"""Language models: the local transformers LM with batching and per-role LoRA adapters, the embedded defaults, and
rollouts on a served model (:class:`ServedLM`) or offline vLLM (:mod:`rolecall.lm.vllm`, GPUs only, imported on use)."""

from rolecall.lm.backend import ModelBackend, default_lora_config
from rolecall.lm.batching import BatcherStats, RequestBatcher
from rolecall.lm.embedded import DEFAULT_EMBEDDER, DEFAULT_LM, embedded_embedder_path, embedded_lm_path
from rolecall.lm.generation import Completion, GenerationRequest, generate_batch
from rolecall.lm.local import LocalEngine, LocalLM
from rolecall.lm.openai_client import OpenAIClient, ServerError
from rolecall.lm.served import ServedLM

__all__ = [
    "BatcherStats",
    "Completion",
    "DEFAULT_EMBEDDER",
    "DEFAULT_LM",
    "GenerationRequest",
    "LocalEngine",
    "LocalLM",
    "ModelBackend",
    "OpenAIClient",
    "RequestBatcher",
    "ServedLM",
    "ServerError",
    "default_lora_config",
    "embedded_embedder_path",
    "embedded_lm_path",
    "generate_batch",
]
