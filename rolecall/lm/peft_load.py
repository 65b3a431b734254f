"""Loading a PEFT LoRA adapter all or nothing: a load that fails leaves the model exactly as it was.

PEFT changes the model before it reads the adapter's weights: it wraps each targeted layer in a LoRA layer, registers
the adapter's config (on the base model itself when it wraps a plain model) and freezes the base weights. A folder
whose weights then do not load (an adapter of another base model: shapes that differ, a damaged tensor) leaves all of
that behind, and the model then lists an adapter that was never loaded. :func:`load_peft_adapter` undoes it on any
failure, using only the layer-level API every supported PEFT has (``BaseTunerLayer.delete_adapter`` and
``get_base_layer``), so it never reaches transformers' PEFT integration, which needs a newer PEFT.

It also refuses an adapter PEFT would load only in part: PEFT skips saved LoRA tensors the model has no place for and
leaves unloaded ones at their initial value without an error, so an adapter of a deeper model would answer with some of
its layers missing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rolecall.errors import ModelLoadError

__all__ = ["load_peft_adapter", "peft_wrappers"]


def peft_wrappers(model: Any) -> dict[str, Any]:
    """The modules PEFT wrapped around the model's own layers, by name, outermost first: LoRA (tuner) layers and
    ``modules_to_save`` copies."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    found: dict[str, Any] = {}
    for key, module in model.named_modules():
        if isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper)) and not any(
            key.startswith(outer + ".") for outer in found
        ):
            found[key] = module
    return found


def load_peft_adapter(model: Any, name: str, path: Path) -> Any:
    """Loads the PEFT adapter in folder ``path`` onto ``model`` as ``name``, all or nothing.

    Args:
        model: a plain transformers model, or a ``peft.PeftModel`` without an adapter called ``name``.
        name: the new adapter's name.
        path: a folder written by ``save_pretrained`` (checked beforehand by
            :func:`~rolecall.lm.adapter_files.check_adapter_folder`).

    Returns:
        The model to use from now on: ``model`` itself, or a new ``PeftModel`` around it when it was plain.

    Raises:
        ModelLoadError: PEFT could not load the adapter, or its LoRA tensors do not match the LoRA weights its config
            places on this model; the model is then exactly as before (same layers, adapters and trainable flags).
    """
    from peft import PeftModel

    wrapped = hasattr(model, "peft_config")
    before = {id(m) for m in peft_wrappers(model).values()}
    trainable = {key: p.requires_grad for key, p in model.named_parameters()}
    try:
        if wrapped:
            model.load_adapter(str(path), adapter_name=name, is_trainable=True)
            loaded = model
        else:
            loaded = PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=True)
        _check_all_weights_placed(loaded, name, path)
    except Exception as err:
        _undo(model, name, wrapped, before, trainable)
        if isinstance(err, ModelLoadError):
            raise
        raise ModelLoadError(
            f"could not load the LoRA adapter in {path} onto this base model ({_one_line(err)}); a damaged file, or "
            "an adapter of another base model: re-save it, or load one trained on this base model"
        ) from err
    return loaded


def _check_all_weights_placed(model: Any, name: str, path: Path) -> None:
    """Raises ModelLoadError unless each LoRA tensor saved in ``path`` is a LoRA weight of adapter ``name``."""
    config = model.peft_config[name]
    weights = path / "adapter_model.safetensors"
    if getattr(config, "peft_type", None) != "LORA" or not weights.is_file():  # (PeftType is a str enum)
        return  # other methods' and pickled (.bin) weights: PEFT's own checks only
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        saved = sum("lora_" in key for key in f.keys())
    placed = 0
    for key, _ in model.named_parameters():  # ...q_proj.lora_A.<name>.weight
        parts = key.split(".")
        placed += any(p.startswith("lora_") and q == name for p, q in zip(parts, parts[1:], strict=False))
    if saved != placed:
        raise ModelLoadError(
            f"{weights} does not fit this base model: it holds {saved} LoRA weight tensors and its config places "
            f"{placed} on this model (an adapter of another base model?); load an adapter trained on this base model"
        )


def _undo(model: Any, name: str, wrapped: bool, before: set[int], trainable: dict[str, bool]) -> None:
    """Removes what a failed load of adapter ``name`` left on ``model``: its config, its weights in the LoRA layers
    that were there before, and the layers PEFT wrapped for it."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
        if wrapped and name in model.peft_config:
            model.delete_adapter(name)  # PeftModel's own: also clears modules_to_save copies
        elif not wrapped and hasattr(model, "peft_config"):
            del model.peft_config  # PEFT hands the plain model its config dict while wrapping it
        for key, module in peft_wrappers(model).items():
            if id(module) in before:
                if isinstance(module, BaseTunerLayer):
                    module.delete_adapter(name)  # a no-op unless PEFT got as far as this layer
                continue
            inner = module.get_base_layer() if isinstance(module, BaseTunerLayer) else module.original_module
            parent, _, child = key.rpartition(".")
            setattr(model.get_submodule(parent), child, inner)
    for key, param in model.named_parameters():
        if key in trainable:
            param.requires_grad_(trainable[key])


def _one_line(err: BaseException) -> str:
    """An exception's message on one line: its first two lines, and how many more there were."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
    return " ".join(lines[:2]) + more
