"""Per-token log-probabilities of completions under a causal LM, and the padded batches they are computed on.

GRPO's ratio pi_theta / pi_old and KL toward pi_ref (DeepSeekMath, arXiv 2402.03300; OPERA Eq. 4, arXiv 2508.16438)
need log pi(o_t | q, o_<t) for each completion token o_t. Tensors keep the full sequence length T (prompt and
completion, right-padded): position t holds the log-prob of ``input_ids[:, t]`` given ``input_ids[:, :t]``, and every
position outside the completion mask holds 0, so the (B, T) tensors go straight into ``grpo_loss``.

With one LoRA adapter per role on one base model, the reference policy pi_ref (the initial model) is the base model
with the adapter disabled, so no second copy of the weights is needed (:func:`ref_logprobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo.loss import selective_log_softmax

logger = logging.getLogger(__name__)

__all__ = [
    "build_completion_batch",
    "ref_logprobs",
    "sequence_logprobs",
    "adapters_disabled",
    "adapter_active",
    "check_batch",
]


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    fp32: bool = False,
) -> torch.Tensor:
    """Computes log pi(o_t | o_<t) of each completion token, zero elsewhere.

    Only the logits from the first completion column onward are materialized (``logits_to_keep``), which matters with
    long prompts and large vocabularies. Gradients flow when called outside ``torch.no_grad``.

    Args:
        model: A Hugging Face causal LM, or a PEFT model wrapping one (the active adapter is used).
        input_ids: Prompt + completion token ids, right-padded, shape (B, T).
        attention_mask: 1 on real tokens, shape (B, T).
        completion_mask: 1 on the tokens to score, shape (B, T); position 0 cannot be scored (it has no prefix).
        temperature: Logits are divided by it, matching the sampling distribution of the rollouts.
        fp32: cast the logits to float32 before the log-softmax, whatever the model's dtype
            (:func:`rolecall.optimizers.core.logprobs.per_token_logps`, what the trainer uses).

    Returns:
        per_token_logps, shape (B, T), float (float32 with ``fp32``); 0 where ``completion_mask`` is 0.

    Raises:
        ValueError: If the shapes disagree or ``completion_mask`` marks position 0.
        ConfigError: If ``temperature`` is not positive.
    """
    check_batch(input_ids, attention_mask, completion_mask)
    if not temperature > 0:
        raise ConfigError(f"temperature must be > 0; got {temperature}.")
    mask = completion_mask.bool()  # (B, T)
    batch_size, length = input_ids.shape
    columns = mask.any(dim=0).nonzero()
    first = int(columns[0]) if columns.numel() else length - 1  # first completion column in the batch
    first = max(first, 1)
    keep = length - first + 1  # logits at positions first-1 .. T-1 predict tokens first .. T-1 (and one past the end)
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, use_cache=False)
    logits = outputs.logits[:, -keep:-1, :]  # (B, T - first, V); slicing also covers models that ignore the keep hint
    if fp32:
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, input_ids[:, first:])  # (B, T - first)
    prefix = logps.new_zeros(batch_size, first)  # positions before the first completion token carry no log-prob
    per_token_logps = torch.cat([prefix, logps], dim=1)  # (B, T)
    return torch.where(mask, per_token_logps, torch.zeros_like(per_token_logps))


def ref_logprobs(
    peft_model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    adapter: str | None = None,
    temperature: float = 1.0,
    fp32: bool = False,
) -> torch.Tensor:
    """Computes reference log-probs log pi_ref(o_t | o_<t) without gradient.

    With ``adapter=None`` the reference is the base model: every adapter is disabled for the forward pass
    (``with model.disable_adapter():``), which is OPERA's pi_ref = the initial model. With ``adapter="name"`` the
    named adapter (e.g. a frozen Teacher for MultiAgent-OPD Eq. 5) is activated for the pass; the previously active
    adapter and every parameter's ``requires_grad`` are restored afterwards.

    Args:
        peft_model: A ``peft.PeftModel`` (or a transformers model with adapters loaded through its PEFT integration).
        input_ids: Shape (B, T), as for :func:`sequence_logprobs`.
        attention_mask: Shape (B, T).
        completion_mask: Shape (B, T).
        adapter: The adapter to score with, or None for the base model.
        temperature, fp32: As for :func:`sequence_logprobs`.

    Returns:
        ref_per_token_logps, shape (B, T), detached; 0 where ``completion_mask`` is 0.

    Raises:
        TypeError: If the model carries no adapters to disable or switch.
        ConfigError: If ``adapter`` names no loaded adapter.
    """
    context = adapters_disabled(peft_model) if adapter is None else adapter_active(peft_model, adapter)
    with torch.no_grad(), context:
        return sequence_logprobs(
            peft_model, input_ids, attention_mask, completion_mask, temperature=temperature, fp32=fp32
        )


@contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    if hasattr(model, "disable_adapter"):  # peft.PeftModel
        with model.disable_adapter():
            yield
    elif getattr(model, "_hf_peft_config_loaded", False):  # transformers' own PEFT integration
        model.disable_adapters()
        try:
            yield
        finally:
            model.enable_adapters()
    else:
        raise TypeError(
            f"ref_logprobs needs a PEFT model to disable its adapter; got {type(model).__name__}. For a full "
            "fine-tune, call sequence_logprobs on a frozen copy of the initial model under torch.no_grad()."
        )


@contextmanager
def adapter_active(model: Any, adapter: str) -> Iterator[None]:
    loaded = list(getattr(model, "peft_config", {}) or {})
    if not hasattr(model, "set_adapter") or not loaded:
        raise TypeError(f"ref_logprobs(adapter={adapter!r}) needs a PEFT model; got {type(model).__name__}.")
    if adapter not in loaded:
        raise ConfigError(f"Adapter {adapter!r} is not loaded; loaded adapters are {loaded}.")
    previous = model.active_adapter
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    # set_adapter also flips requires_grad of the adapters' weights, hence the snapshot
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(requires_grad[name])


def build_completion_batch(
    tokenizer: Any | None,
    prompts_ids: Sequence[Sequence[int]],
    completions_ids: Sequence[Sequence[int]],
    pad_id: int | None = None,
    loss_masks: Sequence[Sequence[int]] | None = None,
    *,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Concatenates prompts and completions into one right-padded batch with a completion mask.

    Args:
        tokenizer: Supplies the pad id when ``pad_id`` is None (``pad_token_id``, else ``eos_token_id``); may be None
            when ``pad_id`` is given.
        prompts_ids: Token ids of each prompt (non-empty).
        completions_ids: Token ids of each completion.
        pad_id: The padding token id.
        loss_masks: Optional 0/1 list per completion, as long as the completion: 0 drops a token from the loss, e.g.
            a tool output or retrieved passage the model did not generate (MultiAgent-OPD masks passages).
        device: Where to put the tensors (default CPU).

    Returns:
        ``{"input_ids", "attention_mask", "completion_mask"}``, each a long tensor of shape (B, T) with
        T = max(len(prompt) + len(completion)); ``completion_mask`` is 1 on completion tokens kept by ``loss_masks``.

    Raises:
        ValueError: If the lists have different lengths, a prompt is empty, or a loss mask has the wrong length or
            values other than 0/1.
        ConfigError: If no pad id can be found.

    Example:
        >>> batch = build_completion_batch(None, [[5, 6], [7]], [[8], [9, 10]], pad_id=0, loss_masks=[[1], [0, 1]])
        >>> batch["input_ids"].tolist(), batch["completion_mask"].tolist()
        ([[5, 6, 8], [7, 9, 10]], [[0, 0, 1], [0, 0, 1]])
    """
    pad_id = _resolve_pad_id(tokenizer, pad_id)
    if len(prompts_ids) != len(completions_ids):
        raise ValueError(f"Got {len(prompts_ids)} prompts but {len(completions_ids)} completions.")
    if loss_masks is not None and len(loss_masks) != len(completions_ids):
        raise ValueError(f"Got {len(loss_masks)} loss masks for {len(completions_ids)} completions.")
    length = max((len(p) + len(c) for p, c in zip(prompts_ids, completions_ids, strict=True)), default=0)
    shape = (len(prompts_ids), length)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    completion_mask = torch.zeros(shape, dtype=torch.long)
    for i, (prompt, completion) in enumerate(zip(prompts_ids, completions_ids, strict=True)):
        if len(prompt) == 0:
            raise ValueError(f"Prompt {i} is empty; a completion token needs a token before it to be scored.")
        keep = [1] * len(completion) if loss_masks is None else list(loss_masks[i])
        if len(keep) != len(completion) or any(v not in (0, 1) for v in keep):
            raise ValueError(f"loss_masks[{i}] must be {len(completion)} values of 0/1; got {keep}.")
        n_prompt, n_total = len(prompt), len(prompt) + len(completion)
        input_ids[i, :n_total] = torch.tensor([*prompt, *completion], dtype=torch.long)
        attention_mask[i, :n_total] = 1
        completion_mask[i, n_prompt:n_total] = torch.tensor(keep, dtype=torch.long)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}
    return {key: value.to(device) for key, value in batch.items()} if device is not None else batch


def _resolve_pad_id(tokenizer: Any | None, pad_id: int | None) -> int:
    if pad_id is not None:
        return int(pad_id)
    for attribute in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attribute, None)
        if isinstance(value, list):  # some tokenizers list several eos ids
            value = value[0] if value else None
        if value is not None:
            return int(value)
    raise ConfigError("No pad id: pass pad_id=..., or a tokenizer with a pad_token_id or eos_token_id.")


def check_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (B, T); got {tuple(input_ids.shape)}.")
    for name, tensor in (("attention_mask", attention_mask), ("completion_mask", completion_mask)):
        if tensor.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(input_ids.shape)}.")
    if bool(completion_mask[:, 0].bool().any()):
        raise ValueError("completion_mask marks position 0, which has no prefix to condition on; start with a prompt.")
