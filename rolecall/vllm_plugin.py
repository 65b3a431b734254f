"""A vLLM plugin: grouped LoRA kernels for vLLM's CPU build.

vLLM's CPU platform applies LoRA with PyTorch fallbacks (``vllm.lora.ops.torch_ops``) that copy the adapter's matrix
for every token (``weights[indices]``) and contract one token at a time. For a prompt that is one copy of an
``r x d`` matrix per token, per projection, per layer: on SmolLM2-135M a 2,048-token prefill spends 8-11 s in LoRA
against 0.3-0.5 s when the tokens of one adapter are multiplied by that adapter's matrix in one GEMM
(``benchmarks/results/vllm_cpu_lora_kernels.json``). This module replaces the six fallbacks inside vLLM's CPU
punica wrapper by grouped versions: tokens are grouped by adapter and each group is one matrix product. Decode steps
with several adapters and few tokens keep vLLM's kernels, which are faster there.

The maths is unchanged except for one thing: a token whose adapter index is -1 ("no LoRA", vLLM's own convention)
gets no LoRA term, where the fallbacks read the last adapter slot.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts, so the engine's worker picks this up
from rolecall's installed metadata (``pyproject.toml``). The module lives outside :mod:`rolecall.lm` so that loading
it in vLLM's worker imports nothing else of rolecall. ``ROLECALL_VLLM_CPU_LORA=0`` turns it off (the benchmark's
baseline); on GPUs it does nothing.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

#: Below this many tokens, a batch that mixes adapters keeps vLLM's per-token kernels (measured faster for decode).
GROUPED_MIN_TOKENS = 64

_PATCHED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def _adapters(indices: torch.Tensor) -> list[int]:
    """The distinct adapter slots in ``indices`` (``-1``, no LoRA, included)."""
    return torch.unique(indices).tolist()


def _use_grouped(rows: int, indices: torch.Tensor, slots: list[int]) -> bool:
    return indices.shape[0] == rows and (len(slots) == 1 or rows >= GROUPED_MIN_TOKENS)


def _grouped_product(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, slots: list[int],
                     dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """``out[t] = inputs[t] @ weights[indices[t]].T``, one GEMM per adapter; rows with index -1 are zero."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    if len(slots) == 1 and slots[0] >= 0:
        return inputs @ weights[slots[0]].to(dtype).T
    out = inputs.new_zeros(inputs.shape[0], weights.shape[1])
    for slot in slots:
        if slot < 0:
            continue
        rows = (indices == slot).nonzero().squeeze(1)
        out.index_copy_(0, rows, inputs.index_select(0, rows) @ weights[slot].to(dtype).T)
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:  # fmt: skip
    """``output[:, :r] = scaling * inputs @ A[idx].T`` per token (vLLM's ``bgmv_shrink`` contract)."""
    slots = _adapters(lora_indices_tensor)
    if not _use_grouped(inputs.shape[0], lora_indices_tensor, slots):
        return _VLLM["bgmv_shrink"](inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling)
    out = _grouped_product(inputs, lora_a_weights, lora_indices_tensor, slots, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out
    return None


def _write(out: torch.Tensor, output_tensor: torch.Tensor, offset: int, size: int, add_inputs: bool) -> None:
    rows = min(out.shape[0], output_tensor.shape[0])
    target = output_tensor[:rows, offset : offset + size]
    if add_inputs:
        target += out[:rows, :size]
    else:
        target.copy_(out[:rows, :size])


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:  # fmt: skip
    """``output[:, :o] (+)= inputs @ B[idx].T`` per token (vLLM's ``bgmv_expand`` contract)."""
    slots = _adapters(lora_indices_tensor)
    if not _use_grouped(inputs.shape[0], lora_indices_tensor, slots):
        return _VLLM["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
    out = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, slots, output_tensor.dtype)
    _write(out, output_tensor, 0, min(out.shape[1], output_tensor.shape[1]), add_inputs)
    return None


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:  # fmt: skip
    """``output[:, offset:offset+size] (+)= inputs @ B[idx].T`` per token (vLLM's ``bgmv_expand_slice``)."""
    slots = _adapters(lora_indices_tensor)
    if not _use_grouped(inputs.shape[0], lora_indices_tensor, slots):
        return _VLLM["bgmv_expand_slice"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset,
                                          slice_size, add_inputs)  # fmt: skip
    out = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, slots, output_tensor.dtype)
    _write(out, output_tensor, slice_offset, slice_size, add_inputs)
    return None


def _per_token(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                batches: int, max_seq_length: int, token_nums: int, scaling: float) -> None:  # fmt: skip
    """The prefill form of :func:`bgmv_shrink`: one adapter index per sequence."""
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                batches: int, max_seq_length: int, token_nums: int, add_inputs: bool = False) -> None:  # fmt: skip
    """The prefill form of :func:`bgmv_expand`."""
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                      batches: int, max_seq_length: int, token_nums: int, slice_offset: int, slice_size: int,
                      add_inputs: bool = False) -> None:  # fmt: skip
    """The prefill form of :func:`bgmv_expand_slice`."""
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)  # fmt: skip


#: vLLM's own kernels, filled by :func:`register` (the fallback for small mixed batches).
_VLLM: dict = {}


def enabled() -> bool:
    """Whether the grouped kernels are wanted (``ROLECALL_VLLM_CPU_LORA``, default on)."""
    return os.environ.get("ROLECALL_VLLM_CPU_LORA", "1").strip().lower() not in {"0", "false", "no", "off"}


def register() -> bool:
    """vLLM's entry point: swap the grouped kernels into vLLM's CPU punica wrapper; True when they are in place.

    Safe to call more than once and in every vLLM process; does nothing off the CPU platform or when
    ``ROLECALL_VLLM_CPU_LORA=0``.
    """
    if not enabled():
        return False
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.punica_wrapper import punica_cpu
        from vllm.platforms import current_platform
    except ImportError:  # another vLLM layout: keep its own kernels
        logger.warning("rolecall's grouped LoRA kernels do not fit this vLLM version; keeping vLLM's")
        return False
    if not current_platform.is_cpu():
        return False
    for name in _PATCHED:
        _VLLM.setdefault(name, getattr(torch_ops, name))
        setattr(punica_cpu, name, globals()[name])
    logger.info("rolecall: grouped LoRA kernels in vLLM's CPU punica wrapper (ROLECALL_VLLM_CPU_LORA=0 turns off)")
    return True
