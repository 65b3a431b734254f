"""``dtype="auto"`` on a CPU: bf16 only where the CPU multiplies bf16 in hardware."""

from __future__ import annotations

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.lm import backend


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"),
    [(False, False, torch.float32), (True, False, torch.bfloat16), (False, True, torch.bfloat16)],
)
def test_auto_takes_bf16_only_with_bf16_instructions(monkeypatch, avx512_bf16, amx, expected):
    # oneDNN says it can run bf16 on any AVX-512 CPU (emulated, about 3x slower than fp32 there): not the criterion
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert backend.cpu_has_native_bf16() is (expected is torch.bfloat16)
    assert backend._pick_dtype("auto", torch.device("cpu")) is expected


def test_explicit_dtypes_and_gpus_are_taken_as_given(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert backend._pick_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert backend._pick_dtype(torch.float16, torch.device("cpu")) is torch.float16
    assert backend._pick_dtype("auto", torch.device("cuda")) is torch.bfloat16
    with pytest.raises(ConfigError, match="dtype must be one of"):
        backend._pick_dtype("fp8", torch.device("cpu"))
