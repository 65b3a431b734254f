"""Per-token log-probabilities for the losses, with the log-softmax in fp32, and the reference policy's.

The tensors follow :mod:`rolecall.optimizers.core.grpo.logprobs`: shape (B, T) over the whole right-padded sequence,
position t holding log pi(input_ids[t] | input_ids[:t]) on completion-mask positions and 0 elsewhere. The difference
is precision: logits are cast to fp32 before the log-softmax whatever the model's dtype, so a bf16 model trains on
fp32 log-probs (TRL does the same in its fused LM head with ``cast_lm_head_to_fp32``).

The reference policy pi_ref is the base model with every adapter disabled (OPERA Eq. 4; DPO's reference), or a named
frozen adapter; no second copy of the weights is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rolecall.optimizers.core.grpo.logprobs import (
    build_completion_batch,
    check_batch,
    ref_logprobs,
    sequence_logprobs,
)
from rolecall.optimizers.core.grpo.loss import selective_log_softmax

__all__ = ["per_token_logps", "shared_prefix_per_token_logps", "reference_per_token_logps", "store_reference_logps"]


def per_token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Computes log pi(o_t | o_<t) of each completion token in fp32, zero elsewhere.

    Equivalent to the naive::

        logps = model(input_ids).logits.float()[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None])[..., 0]
        torch.cat([zeros(B, 1), logps], 1) * completion_mask

    but only the logits from the first completion column on are kept (``logits_to_keep``).

    Args:
        model: A causal LM (or a PEFT model: its active adapter is used).
        input_ids: Prompt + completion ids, right-padded, shape (B, T).
        attention_mask: 1 on real tokens, shape (B, T).
        completion_mask: 1 on the tokens to score, shape (B, T); position 0 has no prefix and must be 0.
        temperature: Logits are divided by it (match the sampling temperature for ratios).

    Returns:
        per_token_logps, shape (B, T), float32; gradients flow outside ``torch.no_grad``.

    Raises:
        ValueError: If the shapes disagree or ``completion_mask`` marks position 0.
        ConfigError: If ``temperature`` is not positive.
    """
    return sequence_logprobs(model, input_ids, attention_mask, completion_mask, temperature=temperature, fp32=True)


def shared_prefix_per_token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_length: int,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`per_token_logps` for rows that all start with the same ``prompt_length``-token prompt (the G completions
    of one GRPO group): the prompt is encoded once and its KV cache repeated over the rows, so a row costs its
    completion only. Gradients flow through the shared prompt pass too (LoRA acts on the prompt's keys and values).

    Args:
        model: A causal LM (or a PEFT model: its active adapter is used).
        input_ids: Shape (B, T): the same first ``prompt_length`` ids in every row, then each completion, right-padded.
        attention_mask: Shape (B, T), 1 on real tokens (every prompt column is real).
        completion_mask: Shape (B, T), 0 on the prompt columns.
        prompt_length: Length P >= 2 of the shared prompt.
        temperature: As for :func:`per_token_logps`.

    Returns:
        per_token_logps, shape (B, T), float32: equal (to float tolerance) to :func:`per_token_logps` on the batch.

    Raises:
        ValueError: If the rows do not share the prompt, or the shapes disagree.
    """
    check_batch(input_ids, attention_mask, completion_mask)
    batch_size, length = input_ids.shape
    if not 2 <= prompt_length < length:
        raise ValueError(f"prompt_length must be in [2, {length}); got {prompt_length}.")
    prompt = input_ids[:1, :prompt_length]
    if not bool((input_ids[:, :prompt_length] == prompt).all()) or not bool(attention_mask[:, :prompt_length].all()):
        raise ValueError("shared_prefix_per_token_logps needs every row to start with the same, unpadded prompt.")
    if bool(completion_mask[:, :prompt_length].any()):
        raise ValueError("completion_mask marks a prompt column.")
    from transformers import DynamicCache

    from rolecall.lm.generation import _cache_kwarg

    cache_kw = _cache_kwarg(model)
    head = prompt_length - 1  # the last prompt token goes with the completions: its logits predict their first token
    out = model(input_ids=prompt[:, :head], attention_mask=attention_mask[:1, :head], use_cache=True,
                logits_to_keep=1, **{cache_kw: DynamicCache()})  # fmt: skip
    cache = getattr(out, cache_kw)
    cache.reorder_cache(torch.zeros(batch_size, dtype=torch.long, device=input_ids.device))  # differentiable copy
    rest = input_ids[:, head:]  # (B, T - P + 1)
    out = model(input_ids=rest, attention_mask=attention_mask, use_cache=False, **{cache_kw: cache})
    logits = out.logits[:, :-1, :].float()  # predicts tokens P .. T-1
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, input_ids[:, prompt_length:])  # (B, T - P)
    full = torch.cat([logps.new_zeros(batch_size, prompt_length), logps], dim=1)
    return torch.where(completion_mask.bool(), full, torch.zeros_like(full))


def reference_per_token_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    adapter: str | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Computes log pi_ref per completion token without gradient: adapters disabled, or frozen ``adapter`` active.

    Args:
        model: A ``peft.PeftModel``.
        input_ids: Shape (B, T), as for :func:`per_token_logps`.
        attention_mask: Shape (B, T).
        completion_mask: Shape (B, T).
        adapter: None for the base model (every adapter disabled), or the name of a loaded adapter to score with.
        temperature: As for :func:`per_token_logps`.

    Returns:
        ref_per_token_logps, shape (B, T), float32, detached.

    Raises:
        TypeError: If ``model`` is not a PEFT model.
        ConfigError: If ``adapter`` is not loaded.
    """
    return ref_logprobs(
        model, input_ids, attention_mask, completion_mask, adapter=adapter, temperature=temperature, fp32=True
    )


def store_reference_logps(
    backend: Any, samples: Sequence[Any], *, adapter: str | None = None, batch_size: int = 4
) -> None:
    """Fills each DPO sample's ``ref_logps`` and ``rejected_ref_logps`` with log pi_ref, computed once.

    STRIDE-FT's DPO is "against the Meta-Planner as it was before DPO": calling this before training stores that
    policy's log-probs in the samples (and their saved file), so no frozen copy of the adapter has to be kept, and a
    resumed run uses the same reference as the killed one.

    Args:
        backend: The ``ModelBackend`` holding ``adapter``.
        samples: :class:`~rolecall.optimizers.core.sample.TrainingSample` s with ``rejected_ids``; filled in place.
        adapter: The adapter to score with (None: the base model, every adapter disabled).
        batch_size: Sequences per no-grad forward pass.
    """
    rows = [(s, "completion_ids", "loss_mask", "ref_logps") for s in samples]
    rows += [(s, "rejected_ids", "rejected_loss_mask", "rejected_ref_logps") for s in samples if s.rejected_ids]
    model = backend.model
    training = model.training
    with backend.lock:
        model.eval()  # no LoRA dropout in a reference pass
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            completions = [getattr(s, ids) for s, ids, _, _ in chunk]
            batch = build_completion_batch(backend.tokenizer, [s.prompt_ids for s, *_ in chunk], completions,
                                           loss_masks=[[1] * len(c) for c in completions])  # fmt: skip
            logps = reference_per_token_logps(model, batch["input_ids"], batch["attention_mask"],
                                              batch["completion_mask"], adapter=adapter)  # fmt: skip
            for i, ((sample, _, mask, target), completion) in enumerate(zip(chunk, completions, strict=True)):
                begin = len(sample.prompt_ids)
                values = logps[i, begin : begin + len(completion)].tolist()
                keep = getattr(sample, mask) or [1] * len(values)
                setattr(sample, target, [v if m else 0.0 for v, m in zip(values, keep, strict=True)])
        model.train(training)
