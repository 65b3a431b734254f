"""The real embedded SmolLM2-135M-Instruct through LocalLM (marked slow: loads the 135M model).

Exactness checks (log-probs, batched == unbatched) run in float32; ``dtype="auto"`` picks bf16 on CPUs with native
bf16 matmuls for speed, where the same checks hold only to bf16 precision.
"""

from __future__ import annotations

import dspy
import pytest
import torch

from rolecall.lm.generation import GenerationRequest

pytestmark = pytest.mark.slow

DEMOS = [
    dspy.Example(question="What is the capital of Italy?", answer="Rome").with_inputs("question"),
    dspy.Example(question="How many legs does a spider have?", answer="Eight").with_inputs("question"),
    dspy.Example(question="Who wrote Hamlet?", answer="William Shakespeare").with_inputs("question"),
]


def test_answers_a_simple_factual_question(embedded_lm):
    out = embedded_lm(messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    assert "paris" in out[0].lower()


def test_sampling_gives_different_samples(embedded_lm):
    comps = embedded_lm.sample([{"role": "user", "content": "Tell me a fact."}], n=4, temperature=1.0, max_tokens=16)
    assert len({c.text for c in comps}) > 1


def test_logprobs_match_a_separate_forward_pass(embedded_lm):
    msgs = [{"role": "user", "content": "Name three colours."}]
    prompt = embedded_lm.backend.encode_messages(msgs)
    comps = embedded_lm.sample(msgs, n=2, temperature=1.0, max_tokens=12, seed=0, logprobs=True)
    model = embedded_lm.hf_model
    for c in comps:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.max(torch.abs(torch.tensor(c.logprobs) - expected)).item() < 1e-3


def test_batched_and_unbatched_greedy_are_identical(embedded_lm):
    questions = ["What is the capital of Spain?", "Who painted the Mona Lisa?", "What is 2 plus 2?", "Name a fruit."]
    reqs = [
        GenerationRequest(embedded_lm.backend.encode_messages([{"role": "user", "content": q}]), max_tokens=20)
        for q in questions
    ]
    batched = embedded_lm.backend._run_batch(reqs)
    for req, out in zip(reqs, batched, strict=True):
        assert embedded_lm.backend._run_batch([req])[0][0].token_ids == out[0].token_ids


@pytest.mark.parametrize("adapter", [dspy.ChatAdapter(), dspy.JSONAdapter(), dspy.XMLAdapter()], ids=type)
def test_predict_with_demos_parses(embedded_lm, adapter):
    """With three demos the 135M model follows each adapter's format (0/5 zero-shot on ChatAdapter)."""
    predict = dspy.Predict("question -> answer")
    predict.demos = DEMOS
    with dspy.context(lm=embedded_lm, adapter=adapter):
        answer = predict(question="What is the capital of Japan?").answer
    assert isinstance(answer, str) and answer.strip()


def test_chain_of_thought_runs(embedded_lm):
    cot = dspy.ChainOfThought("question -> answer")
    cot.predict.demos = [
        dspy.Example(question=d.question, reasoning=f"The answer is {d.answer}.", answer=d.answer).with_inputs(
            "question"
        )
        for d in DEMOS
    ]
    with dspy.context(lm=embedded_lm):
        pred = cot(question="What is the capital of Germany?")
    assert pred.answer.strip()
