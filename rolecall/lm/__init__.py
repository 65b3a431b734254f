"""Language models: the local transformers LM with batching and per-role LoRA adapters, and the embedded defaults."""

from rolecall.lm.backend import ModelBackend, default_lora_config
from rolecall.lm.batching import BatcherStats, RequestBatcher
from rolecall.lm.embedded import DEFAULT_EMBEDDER, DEFAULT_LM, embedded_embedder_path, embedded_lm_path
from rolecall.lm.generation import Completion, GenerationRequest, generate_batch
from rolecall.lm.local import LocalEngine, LocalLM

__all__ = [
    "BatcherStats",
    "Completion",
    "DEFAULT_EMBEDDER",
    "DEFAULT_LM",
    "GenerationRequest",
    "LocalEngine",
    "LocalLM",
    "ModelBackend",
    "RequestBatcher",
    "default_lora_config",
    "embedded_embedder_path",
    "embedded_lm_path",
    "generate_batch",
]
