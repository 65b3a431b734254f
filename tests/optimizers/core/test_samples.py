"""samples_from_trajectory on a recorded role call: the prompt is what the backend encoded, the target ends as the
model would end it, and masked character spans carry no gradient."""

from __future__ import annotations

import dspy
import pytest

from rolecall.lm import LocalLM
from rolecall.optimizers.core import completion_target, mask_spans, samples_from_trajectory
from rolecall.programs.core.calls import COMPLETED_MARKER, LMCallRecorder
from rolecall.programs.core.trajectory import Step, Trajectory


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)


def record_step(lm: LocalLM) -> Step:
    """One real dspy.Predict call on the tiny model's 'qa' adapter, recorded as Program.call_role records it."""
    view = lm.for_role("qa")
    recorder = LMCallRecorder()
    with dspy.context(lm=view, callbacks=[recorder], adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        try:
            dspy.Predict("question -> answer")(question="Who wrote Hamlet?")
        except Exception:  # a random model's output does not parse; the call is still recorded
            pass
    call = recorder.ordered()[0]
    assert call["completions"], "the LM call was not recorded"
    # a random model's text is arbitrary: keep the recorded messages, give the completion a parsed call's shape
    completion = "[[ ## answer ## ]]\nShakespeare"
    return Step(kind="role", role="qa", adapter="qa", messages=call["messages"], completion=completion)


def test_prompt_is_what_the_backend_encodes_and_the_target_ends_with_marker_then_eos(lm, smollm_tokenizer):
    step = record_step(lm)
    assert step.messages[0]["role"] == "system" and "question" in step.messages[-1]["content"]
    trajectory = Trajectory(question="q", steps=[Step(kind="retrieval", role="bm25"), step])
    (sample,) = samples_from_trajectory(trajectory, lm.for_role("qa"))
    assert sample.role == "qa" and sample.adapter == "qa"
    assert sample.prompt_ids == lm.backend.encode_messages(step.messages)
    target = smollm_tokenizer(f"[[ ## answer ## ]]\nShakespeare\n\n{COMPLETED_MARKER}", add_special_tokens=False)
    assert sample.completion_ids == [*target["input_ids"], smollm_tokenizer.eos_token_id]
    assert sample.loss_mask == [1] * len(sample.completion_ids)
    # a bare tokenizer and the backend give the same sample
    (again,) = samples_from_trajectory(trajectory, smollm_tokenizer)
    assert again.prompt_ids == sample.prompt_ids and again.completion_ids == sample.completion_ids


def test_filters_roles_failed_steps_and_maps_adapters(lm):
    step = record_step(lm)
    failed = Step(kind="role", role="qa", messages=step.messages, completion="garbage", error="parse error")
    other = Step(kind="role", role="plan", messages=step.messages, completion="[[ ## plan ## ]]\n1. x")
    trajectory = Trajectory(steps=[step, failed, other])
    assert [s.role for s in samples_from_trajectory(trajectory, lm)] == ["qa", "plan"]
    assert [s.role for s in samples_from_trajectory(trajectory, lm, include_failed=True)] == ["qa", "qa", "plan"]
    assert [s.role for s in samples_from_trajectory(trajectory, lm, roles=["plan"])] == ["plan"]
    grouped = samples_from_trajectory(trajectory, lm, adapter_of={"qa": "group", "plan": "group"})
    assert {s.adapter for s in grouped} == {"group"}
    assert samples_from_trajectory(trajectory, lm, adapter_of=lambda s: None)[1].adapter == "plan"  # role name
    with pytest.raises(TypeError, match="LocalLM"):
        samples_from_trajectory(trajectory, object())


def test_completion_target_rules():
    assert completion_target("[[ ## a ## ]]\nx\n\n") == f"[[ ## a ## ]]\nx\n\n{COMPLETED_MARKER}"
    assert completion_target(f"[[ ## a ## ]]\nx\n\n{COMPLETED_MARKER}\n") == f"[[ ## a ## ]]\nx\n\n{COMPLETED_MARKER}\n"
    assert completion_target('{"a": 1}') == '{"a": 1}'
    assert completion_target("[[ ## a ## ]]\nx", end_marker=None) == "[[ ## a ## ]]\nx"
    assert completion_target("x", end_marker="END") == "x\n\nEND"


def test_masked_spans_get_zero(lm, smollm_tokenizer):
    passage = "Passage: Hamlet is a tragedy by William Shakespeare."
    completion = f"[[ ## query ## ]]\nauthor of Hamlet\n{passage}\n[[ ## answer ## ]]\nShakespeare"
    start = completion.index(passage)
    span = (start, start + len(passage))
    ids, mask = mask_spans(completion, [span], smollm_tokenizer)
    offsets = smollm_tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert ids == smollm_tokenizer(completion, add_special_tokens=False)["input_ids"]
    for (a, b), m in zip(offsets, mask, strict=True):
        assert m == (0 if a < span[1] and span[0] < b else 1)
    assert 0 < mask.count(0) < len(mask)
    masked_text = smollm_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert "Hamlet is a tragedy" in masked_text and mask[-1] == 1  # the passage is masked, the answer is not
    # through the trajectory: meta["masked_spans"] reaches the sample's loss mask; marker and EOS stay trained
    step = Step(kind="role", role="searcher", messages=[{"role": "user", "content": "q"}], completion=completion,
                meta={"masked_spans": [span]})  # fmt: skip
    (sample,) = samples_from_trajectory([step], lm)
    assert sample.loss_mask[: len(mask)] == mask and sample.loss_mask[-1] == 1
    assert sample.num_loss_tokens == len(sample.completion_ids) - mask.count(0)
    with pytest.raises(ValueError, match="outside"):
        mask_spans("abc", [(2, 9)], smollm_tokenizer)
