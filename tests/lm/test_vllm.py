"""The vLLM backend: request -> SamplingParams mapping everywhere; the GPU path of the engine where a GPU is (the
CPU engine: tests/lm/test_vllm_engine.py)."""

from __future__ import annotations

import importlib.util

import pytest

from rolecall.lm.generation import GenerationRequest
from rolecall.lm.vllm import sampling_kwargs

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_sampling_kwargs_carry_every_setting_of_the_request():
    request = GenerationRequest(prompt_ids=[1, 2], n=8, temperature=1.0, top_p=0.9, max_tokens=64, stop=("\n\n",),
                                seed=11, logprobs=True, adapter="plan")  # fmt: skip
    assert sampling_kwargs(request) == {
        "n": 8, "temperature": 1.0, "top_p": 0.9, "max_tokens": 64, "stop": ["\n\n"],
        "include_stop_str_in_output": False, "skip_special_tokens": True, "seed": 11, "logprobs": 0,
    }  # fmt: skip


def test_greedy_requests_ignore_top_p_and_ask_no_logprobs():
    kwargs = sampling_kwargs(GenerationRequest(prompt_ids=[1], temperature=0.0, top_p=0.5))
    assert kwargs["temperature"] == 0.0 and kwargs["top_p"] == 1.0
    assert "logprobs" not in kwargs and "seed" not in kwargs


def test_a_negative_seed_reaches_vllm_as_a_valid_one():
    """vLLM's CPU sampler kills the whole engine on a negative seed; seeds are taken modulo 2**32."""
    assert sampling_kwargs(GenerationRequest(prompt_ids=[1], temperature=1.0, seed=-1))["seed"] == 2**32 - 1
    assert sampling_kwargs(GenerationRequest(prompt_ids=[1], temperature=1.0, seed=7919))["seed"] == 7919


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the missing-dependency message does not apply")
def test_without_vllm_the_error_names_the_install_command():
    from rolecall.lm.vllm import VLLMLM

    with pytest.raises(ImportError, match=r"make setup"):
        VLLMLM()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (`make setup` installs it)")
def test_vllm_greedy_rollouts_follow_each_training_step_on_a_gpu():
    if not _has_cuda():
        pytest.skip("no CUDA GPU here: this is the GPU path (tests/lm/test_vllm_engine.py runs the CPU engine)")
    import torch

    from rolecall.lm.vllm import VLLMLM

    lm = VLLMLM(dtype="float32", gpu_memory_utilization=0.3)
    messages = [{"role": "user", "content": "Name a colour."}]
    plan = lm.for_role("plan")
    before = plan.sample(messages, max_tokens=12)[0].text
    assert before == lm.base.sample(messages, max_tokens=12)[0].text  # an identity adapter is the base model
    with torch.no_grad():
        for name, p in lm.backend.model.named_parameters():
            if ".plan." in name and "lora_B" in name:
                p.normal_(0, 0.05)
    lm.backend.mark_updated("plan")  # what the trainer calls after a step: the adapter is published to vLLM
    assert plan.sample(messages, max_tokens=12)[0].text != before
    assert lm.publisher.stats["pushes"] >= 2
    lm.close_engine()
