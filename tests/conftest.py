"""Shared fixtures: a tiny random Llama with the SmolLM2 tokenizer, and DSPy settings reset between tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import dspy
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

# `--engine auto` would start a vLLM engine (20-40 s) in every CLI command the tests run where vLLM is installed;
# the tests pin the in-process engine, and the vLLM tests (tests/lm/test_vllm*.py, tests/test_cli_vllm.py) ask
# for vLLM by name. tests/lm/test_engines.py checks auto's own choice with this unset.
os.environ.setdefault("ROLECALL_ENGINE", "local")

# A suite started in the background by a shell without job control (`make test &`, `nohup ... &`) inherits SIGINT
# ignored, and so do the CLI processes it starts: the Ctrl-C tests (tests/optimizers/core/test_interrupt.py,
# tests/faults/, tests/test_cli_compile_guards.py) would see no Ctrl-C at all. Give the session Python's own handler;
# the processes it starts then begin with SIGINT at its default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _reset_dspy_settings():
    """Every test starts with no configured LM, no callbacks and the default adapter."""
    with dspy.context(lm=None, adapter=None, callbacks=[], trace=[]):
        yield


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The SmolLM2 tokenizer (from the embedded model, converted once into the cache)."""
    from transformers import AutoTokenizer

    from rolecall.lm.embedded import embedded_lm_path

    return AutoTokenizer.from_pretrained(str(embedded_lm_path()))


def make_tiny_llama(tokenizer, seed: int = 0):
    """A 2-layer Llama with random weights and the real tokenizer's vocabulary (fast, deterministic)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def tiny_model(smollm_tokenizer):
    """A fresh tiny random Llama (function scope: tests may add adapters to it)."""
    return make_tiny_llama(smollm_tokenizer)


@pytest.fixture(scope="session")
def embedded_lm():
    """The real embedded SmolLM2-135M-Instruct as a LocalLM (fp32, exact), shared by the slow tests."""
    from rolecall.lm import LocalLM

    return LocalLM(dtype="float32", cache=False)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (the shared/ folder beside the repo)")
    return SHARED_DATA
