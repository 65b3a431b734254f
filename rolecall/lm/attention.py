"""Decode attention that skips each row's left padding, for batched generation on the CPU.

The batchers right-align their rows, so a row of a 500-token prompt decoding beside one of 2,700 tokens carries 2,200
columns of left padding. Transformers' SDPA path attends over the whole batch width and masks the padding out: the
keys and values of every padded column are still read and multiplied. On a CPU, where a decode step of a small model
is mostly that attention (py-spy on the 13-program comparison: 40% of all time), that is wasted work in proportion to
how uneven the rows are.

:func:`rowwise_sdpa_forward` is registered with transformers' ``AttentionInterface`` under :data:`ROWWISE`. For a
one-token decode step on the CPU whose boolean mask leaves more than :data:`MIN_PADDING` of the batch unattended, it
runs one SDPA call per row over that row's own columns only (a view: nothing is copied), passing the row's mask only
where its columns have holes (a cached prompt prefix followed by a padded suffix). Everything else -- prefill,
training, GPUs, evenly filled batches -- goes to transformers' own SDPA forward unchanged.

Example:
    >>> from rolecall.lm.attention import use_rowwise_attention
    >>> use_rowwise_attention(model)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

__all__ = ["MIN_PADDING", "ROWWISE", "rowwise_sdpa_forward", "use_rowwise_attention"]

logger = logging.getLogger(__name__)

#: Name under which the row-wise forward (and transformers' SDPA mask builder) are registered.
ROWWISE = "rolecall_rowwise_sdpa"

#: Fraction of the batch's mask that must be padding before the row-wise path is taken (below it, one batched call
#: over the padded width costs less than a call per row).
MIN_PADDING = 0.15

_plans = threading.local()  # the last mask seen on this thread and its per-row plan: one forward's layers share it


def _row_plan(mask: torch.Tensor) -> list[tuple[int, bool]] | None:
    """For a ``(B, 1, 1, W)`` boolean mask, each row's first attended column and whether the row has holes after it;
    None when the batch has too little padding for the row-wise path to pay."""
    cached = getattr(_plans, "last", None)
    if cached is not None and cached[0] is mask:
        return cached[1]
    rows = mask[:, 0, 0, :]
    width = rows.shape[1]
    counts = rows.sum(dim=1)
    if int(counts.sum()) >= (1.0 - MIN_PADDING) * rows.numel():
        plan = None
    else:
        starts = rows.to(torch.uint8).argmax(dim=1)  # first True (0 for a row with none: it is fed padding anyway)
        holes = counts < width - starts
        plan = list(zip(starts.tolist(), holes.tolist(), strict=True))
    _plans.last = (mask, plan)
    return plan


def rowwise_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` forward: per-row SDPA over each row's own columns for padded one-token CPU decode
    steps, transformers' ``sdpa_attention_forward`` for everything else. Returns ``(output (B, T, H, D), None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan = None
    if (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[-1] == key.shape[2]
        and attention_mask.shape[0] == query.shape[0]
        and not (dropout and module.training)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
    ):
        plan = _row_plan(attention_mask)
    if plan is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs = [
        sdpa(
            query[b : b + 1],
            key[b : b + 1, :, start:],
            value[b : b + 1, :, start:],
            attn_mask=attention_mask[b : b + 1, :, :, start:] if holes else None,
            scale=scaling,
            enable_gqa=gqa,
        )
        for b, (start, holes) in enumerate(plan)
    ]
    return torch.cat(outs).transpose(1, 2).contiguous(), None


def use_rowwise_attention(model: Any, enabled: bool = True) -> bool:
    """Switch ``model`` (a transformers model, or a PEFT model around one) from ``sdpa`` to the row-wise decode
    attention (``enabled=False`` switches it back). Returns whether the model now uses it; models on another attention
    implementation (eager, flash) are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROWWISE, rowwise_sdpa_forward)
    AttentionMaskInterface.register(ROWWISE, sdpa_mask)  # the same boolean masks SDPA gets
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    configs = [c for c in (getattr(base, "config", None), getattr(getattr(base, "model", None), "config", None)) if c]
    current = {getattr(c, "_attn_implementation", None) for c in configs}
    if not configs or not current <= {"sdpa", ROWWISE}:
        logger.info("row-wise attention not applied: the model uses %s", sorted(map(str, current)))
        return False
    for config in configs:
        config._attn_implementation = ROWWISE if enabled else "sdpa"
    return enabled
