"""Choosing the generation engine: ``auto`` takes vLLM where it is installed, on a GPU and on a CPU with rolecall's
grouped LoRA kernels and enough free memory, LocalLM where vLLM cannot run, and says why; ``local`` / ``vllm`` are
taken as asked;
ROLECALL_ENGINE replaces auto's choice."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from rolecall.errors import ConfigError
from rolecall.lm import engines
from rolecall.lm.engines import choose_engine, make_lm

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def unpinned(monkeypatch):
    """auto's own choice: the test suite pins ROLECALL_ENGINE=local (tests/conftest.py)."""
    monkeypatch.delenv("ROLECALL_ENGINE", raising=False)


def test_an_unknown_engine_names_the_choices():
    with pytest.raises(ConfigError, match=r"engine must be one of \['auto', 'local', 'vllm'\], got 'vlm'"):
        choose_engine("vlm")


def test_asked_engines_are_taken():
    assert choose_engine("local") == ("local", "asked for")
    if HAS_VLLM:
        assert choose_engine("vllm") == ("vllm", "asked for")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: `make setup` installs it")
def test_vllm_needs_model_files_not_an_object(tiny_model):
    with pytest.raises(ConfigError, match="needs a model name or folder"):
        choose_engine("vllm", tiny_model)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the missing-engine message does not apply")
def test_vllm_asked_for_without_vllm_says_how_to_install():
    with pytest.raises(ConfigError, match="make setup"):
        choose_engine("vllm")


def test_auto_on_a_model_object_is_local(unpinned, tiny_model):
    assert choose_engine("auto", tiny_model) == ("local", "a model object (vLLM loads model files)")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: `make setup` installs it")
def test_auto_takes_vllm_on_a_gpu_and_on_a_cpu_with_the_grouped_kernels(unpinned, monkeypatch):
    """On a CPU vLLM with the grouped LoRA kernels evaluated 1.56x LocalLM's rate (benchmarks/results/vllm_cpu.json)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_engine("auto") == ("vllm", "a CUDA GPU and vLLM")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engines, "_free_memory_gib", lambda: 20.0)
    engine, reason = choose_engine("auto")
    assert engine == "vllm" and "grouped LoRA kernels" in reason and "benchmarks/results/vllm_cpu.json" in reason


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: `make setup` installs it")
def test_auto_takes_local_on_a_cpu_short_of_memory_or_without_the_grouped_kernels(unpinned, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engines, "_free_memory_gib", lambda: 3.5)
    assert choose_engine("auto") == ("local", "a CPU with 3.5 GiB free: vLLM's engine needs about 6")
    monkeypatch.setattr(engines, "_free_memory_gib", lambda: 20.0)
    monkeypatch.setenv("ROLECALL_VLLM_CPU_LORA", "0")
    engine, reason = choose_engine("auto")
    assert engine == "local" and "ROLECALL_VLLM_CPU_LORA=0" in reason


def test_rolecall_engine_replaces_autos_choice(monkeypatch):
    monkeypatch.setenv("ROLECALL_ENGINE", "local")
    assert choose_engine("auto") == ("local", "ROLECALL_ENGINE=local")
    assert choose_engine("local", "any") == ("local", "asked for")  # an explicit engine beats the variable
    monkeypatch.setenv("ROLECALL_ENGINE", "gpu")
    with pytest.raises(ConfigError, match="ROLECALL_ENGINE must be 'local' or 'vllm', got 'gpu'"):
        choose_engine("auto")


def test_make_lm_logs_its_choice(tiny_model, smollm_tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="rolecall.lm.engines"):
        lm = make_lm(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    assert type(lm).__name__ == "LocalLM" and lm.kwargs["max_tokens"] == 4
    assert "generation engine: local" in caplog.text
    engines.close_lm(lm)
