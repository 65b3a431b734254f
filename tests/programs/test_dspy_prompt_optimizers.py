"""DSPy's GEPA and SIMBA compile every registered program, and chains mix prompt and weight optimizers (BetterTogether).

The per-program tests run on scripted LMs (fast); the chains and the LocalLM fixes run on the tiny random Llama of
``tests/conftest.py``, so the SFT step trains real LoRA adapters.
"""

from __future__ import annotations

import logging
import math

import dspy
import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.evaluation import answer_feedback, answer_score
from rolecall.lm import LocalLM
from rolecall.optimizers import SFT
from rolecall.programs import OPERA
from rolecall.programs.core.program import Program
from rolecall.programs.registry import PROGRAMS, build_program, get_program_class
from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM, ScriptedTextLM

NAMES = sorted(PROGRAMS)
INSTRUCTION = "Think about the passages, then answer with the entity's full name."
WRONG = "unknown"


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=20, n_dev=5, n_test=5)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25(world.corpus)


@pytest.fixture(autouse=True)
def _quiet_optimizers(caplog):
    """GEPA and SIMBA log every candidate at INFO; keep the test output readable."""
    caplog.set_level(logging.WARNING, logger="dspy")


def _build(name: str, retriever, lm, **options) -> Program:
    cls = get_program_class(name)
    return build_program(name, retriever if getattr(cls, "uses_retriever", True) else None, lm, **options)


def _instructions(program: Program) -> dict[str, str]:
    return {role: p.signature.instructions for role, p in program.roles.items()}


class _InstructedEngine:
    """SchemaLM's well-formed answers, right (``answer``) only when the system prompt holds :data:`INSTRUCTION`:
    a task LM whose score a better instruction raises, so a prompt optimizer has something to find."""

    def __init__(self, answer: str) -> None:
        self.right, self.wrong = SchemaLM(answer).engine_impl, SchemaLM(WRONG).engine_impl
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
        return (self.right if INSTRUCTION in system else self.wrong).complete(request)

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class InstructedLM(dspy.LM):
    """An LM that answers right only under :data:`INSTRUCTION` (see :class:`_InstructedEngine`)."""

    def __init__(self, answer: str) -> None:
        self.engine_impl = _InstructedEngine(answer)
        super().__init__("dummy/instructed", engine=self.engine_impl, cache=False, num_retries=0)


def _reflection_lm() -> ScriptedTextLM:
    """GEPA's proposer asks through JSONAdapter for ``new_instruction``; this reflection LM always proposes
    :data:`INSTRUCTION` (SchemaLM writes ChatAdapter sections, which JSONAdapter cannot parse)."""
    return ScriptedTextLM([f'{{"new_instruction": "{INSTRUCTION}"}}'])


# ---------------------------------------------------------------------------------------------------- GEPA and SIMBA
@pytest.mark.parametrize("name", NAMES)
def test_gepa_compiles_every_program_and_finds_the_better_instruction(name, world, bm25):
    """GEPA (component_selector="all") rewrites every role's instruction at once from rolecall's feedback metric;
    the task LM answers right only under the new instruction, so the candidate is accepted and returned."""
    answer = world.train[0].answer
    lm, reflection = InstructedLM(answer), _reflection_lm()
    program = _build(name, bm25, lm)
    before = _instructions(program)
    trainset = [e.to_dspy() for e in world.train[:2]]
    optimizer = dspy.GEPA(
        metric=answer_feedback,
        reflection_lm=reflection,
        max_metric_calls=10,
        reflection_minibatch_size=2,
        component_selector="all",
        use_merge=False,
        track_stats=True,
        num_threads=1,
    )
    with dspy.context(lm=lm):
        compiled = program.compile(optimizer, trainset=trainset, valset=trainset[:1])
        pred = compiled(question=world.test[0].question)
        original = program(question=world.test[0].question)
    assert isinstance(compiled, type(program)) and compiled is not program
    assert compiled.retriever is program.retriever and compiled.get_lm() is lm
    assert _instructions(program) == before  # GEPA optimized a copy
    changed = {role for role, text in _instructions(compiled).items() if text == INSTRUCTION}
    assert changed and changed <= set(program.roles)
    assert len(compiled.detailed_results.candidates) >= 2 and compiled.detailed_results.best_idx > 0
    assert reflection.calls >= 1
    assert "the correct answer is" in str(reflection.history[-1]["messages"])  # the feedback reached the reflection
    assert pred.answer == answer and original.answer != answer  # the new instruction is what made it right
    assert pred.trajectory.role_steps() and isinstance(pred.answer, str)


@pytest.mark.parametrize("name", NAMES)
def test_simba_compiles_every_program(name, world, bm25):
    answer = world.train[0].answer
    lm = SchemaLM(answer)
    program = _build(name, bm25, lm)
    trainset = [e.to_dspy() for e in world.train[:3]]
    optimizer = dspy.SIMBA(metric=answer_score, max_steps=1, num_candidates=2, bsize=2, num_threads=1)
    with dspy.context(lm=lm):
        # valset is not passed: SIMBA.compile has none (Program.compile drops it for that step)
        compiled = program.compile(optimizer, trainset=trainset, valset=trainset[:1])
        pred = compiled(question=world.test[0].question)
    assert isinstance(compiled, type(program)) and compiled.retriever is program.retriever
    assert compiled.get_lm() is lm
    assert pred.answer == answer and pred.trajectory.role_steps()
    # SIMBA scored its candidate programs (the baseline and at least one it built) on the trainset
    scores = [c["score"] for c in compiled.candidate_programs]
    assert len(scores) >= 2 and all(0.0 <= s <= 1.0 for s in scores)
    assert compiled.trial_logs and lm.calls > len(trainset)
    # a candidate it built carries a demo or rule (instruction) that the baseline lacks, and runs like any program
    base = {role: (len(p.demos), p.signature.instructions) for role, p in program.roles.items()}
    built = [
        c["program"]
        for c in compiled.candidate_programs
        if any((len(p.demos), p.signature.instructions) != base[role] for role, p in c["program"].roles.items())
    ]
    assert built, f"{name}: SIMBA built no candidate with a new demo or rule"
    with dspy.context(lm=lm):
        assert built[0](question=world.test[1].question).answer == answer


# ---------------------------------------------------------------------------------------------------- demos, LMs
def test_a_trained_role_ignores_demos_an_optimizer_wrote_after_training(world, bm25):
    """The demo policy holds at call time: a role trained demo-free runs without the demos a later DSPy optimizer
    wrote straight into ``predictor.demos`` (BootstrapFewShot after SFT); under ``"always"`` they are used."""
    demo = dspy.Example(question="Who?", passages="[1] A", answer="A").with_inputs("question", "passages")
    for policy, expected in (("until_trained", 2), ("always", 4)):
        program = _build("single_step_rag", bm25, SchemaLM("x"), demos=None, demo_policy=policy)
        program.mark_trained("answer")
        program.roles["answer"].demos = [demo]
        (step,) = program(question=world.test[0].question).trajectory.role_steps("answer")
        assert len(step.messages) == expected, policy  # system + user, plus a user/assistant pair per demo


def _lora(lm: LocalLM, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{adapter}." in n and "lora_" in n}


MAGIC = "MAGIC-7"


def _prefers_magic(example, prediction, trace=None) -> float:
    """A stand-in for "the proposed instruction works better": 1 when the role prompt carried the instruction
    proposed by the scripted prompt model (which holds :data:`MAGIC`), so MIPROv2 must pick a non-default one."""
    steps = prediction.trajectory.role_steps() if prediction is not None else []
    return float(any(MAGIC in str(s.messages) for s in steps))


def test_miprov2_then_sft_trains_the_adapters_under_the_chosen_instruction(world, bm25, tiny_model, smollm_tokenizer):
    """``compile(optimizer=[MIPROv2, SFT])`` (BetterTogether's prompt-then-weights): MIPROv2 runs the program on the
    tiny LocalLM and picks the proposed instruction; SFT then trains the adapter in place on demo-free prompts that
    carry that instruction. The trained role keeps MIPROv2's instruction and drops its demos (its policy)."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = _build("single_step_rag", bm25, lm, lm_kwargs={"*": {"max_tokens": 8}})
    prompt_model = SchemaLM(MAGIC)  # proposes "proposed instruction: MAGIC-7"
    mipro = dspy.MIPROv2(metric=_prefers_magic, prompt_model=prompt_model, task_model=prompt_model, auto=None,
                         num_candidates=2, num_threads=1, seed=0, verbose=False)  # fmt: skip
    sft = SFT(max_steps=2, epochs=1.0, learning_rate=1e-2, show_progress=False, num_threads=1)
    before = _lora(lm, "answer")
    with dspy.context(lm=prompt_model):
        compiled = program.compile(
            optimizer=[mipro, sft],
            trainset=world.train[:2],  # rolecall Examples: MIPROv2 gets them as dspy.Examples, SFT as they are
            valset=world.dev[:2],
            num_trials=2,
            minibatch=False,
            max_bootstrapped_demos=0,
            max_labeled_demos=1,
        )
    # the program SFT trained is the one MIPROv2 returned (its trial logs ride along), carrying its instruction
    assert compiled is not program and compiled.trial_logs and compiled.score == 100.0
    instruction = compiled.roles["answer"].signature.instructions
    assert MAGIC in instruction and MAGIC not in program.roles["answer"].signature.instructions
    assert sft.history and all(math.isfinite(r["loss/total"]) for r in sft.history)
    # SFT trained on the prompts the compiled role sends: MIPROv2's instruction, no demos
    prompts = [smollm_tokenizer.decode(sample.prompt_ids) for sample in sft.samples["answer"]]
    assert prompts and all(MAGIC in text and text.count("[[ ## question ## ]]") == 1 for text in prompts)
    after = _lora(lm, "answer")
    assert any(not torch.equal(before[n], after[n]) for n in before), "SFT left the adapter unchanged"
    assert compiled.get_lm() is lm and compiled.runs_demo_free("answer") and compiled.roles["answer"].demos == []
    (step,) = compiled(question=world.test[0].question).trajectory.role_steps("answer")
    assert step.adapter == "answer" and step.messages[0]["content"] == instruction  # the short trained prompt


def test_sft_then_bootstrap_fewshot_keeps_the_trained_role_demo_free(world, bm25, tiny_model, smollm_tokenizer):
    """The other direction, ``[SFT, BootstrapFewShot]``: BootstrapFewShot writes labeled demos into the copy it
    returns, but the role trained demo-free keeps running without them (``demo_policy="until_trained"``)."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = _build("single_step_rag", bm25, lm, lm_kwargs={"*": {"max_tokens": 8}})
    before = _lora(lm, "answer")
    sft = SFT(max_steps=1, epochs=1.0, learning_rate=1e-2, show_progress=False, num_threads=1)
    fewshot = dspy.BootstrapFewShot(metric=answer_score, max_bootstrapped_demos=1, max_labeled_demos=1)
    compiled = program.compile(optimizer=[sft, fewshot], trainset=world.train[:2])
    assert any(not torch.equal(before[n], p) for n, p in _lora(lm, "answer").items())
    assert isinstance(compiled, type(program)) and compiled is not program and compiled.get_lm() is lm
    assert compiled.roles["answer"].demos and compiled.runs_demo_free("answer")
    (step,) = compiled(question=world.test[0].question).trajectory.role_steps("answer")
    assert step.adapter == "answer" and len(step.messages) == 2  # no demo turns


def test_set_lm_and_get_lm_keep_one_adapter_per_role(world, bm25, tiny_model, smollm_tokenizer):
    """DSPy's ``get_lm`` raised on a program whose roles run different adapter views, and its ``set_lm`` bound every
    role to one view; SIMBA calls both. ``Program`` keeps one adapter per role."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(bm25, lm=lm)
    assert program.get_lm() is lm
    hot = lm.copy(temperature=1.0, rollout_id=1)
    program.set_lm(hot)
    assert program.lm is hot and program.get_lm() is hot
    for role, predictor in program.roles.items():
        assert predictor.lm.adapter == program.adapter_name(role) and predictor.lm.kwargs["temperature"] == 1.0
    scripted = SchemaLM("x")
    program.set_lm(scripted)
    assert program.get_lm() is scripted and all(p.lm is scripted for p in program.roles.values())
    program.set_lm(None)
    assert program.lm is None and all(p.lm is None for p in program.roles.values())
    program.set_role_lm("plan", scripted)
    program.set_role_lm("analysis", SchemaLM("y"))
    with pytest.raises(ValueError, match="Multiple LMs"):
        program.get_lm()


def test_simba_and_gepa_run_a_program_on_a_local_lm(world, bm25, tiny_model, smollm_tokenizer):
    """SIMBA failed on any LocalLM program with two or more adapters ("Multiple LMs are being used"); now it samples
    with per-role adapter views and returns the program on its own adapters. GEPA runs such a program too, and takes
    the same local model as its reflection LM."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(bm25, lm=lm, max_steps=1, max_rewrites=0, lm_kwargs={"*": {"max_tokens": 8}})
    trainset = world.train[:2]
    simba = dspy.SIMBA(metric=answer_score, max_steps=1, num_candidates=2, bsize=2, num_threads=1)
    compiled = program.compile(simba, trainset=trainset)
    assert len(compiled.candidate_programs) >= 2
    assert {r: p.lm.adapter for r, p in compiled.roles.items()} == {r: r for r in program.roles}
    assert compiled.get_lm() is lm

    def gepa() -> dspy.GEPA:
        return dspy.GEPA(metric=answer_feedback, reflection_lm=lm, max_metric_calls=4, reflection_minibatch_size=1,
                         use_merge=False, track_stats=True, num_threads=1)  # fmt: skip

    # No output of the random model parses, and GEPA reflects only on role calls that parsed (a rolecall program
    # records a failed call instead of raising): it has nothing to reflect on and keeps the program.
    kept = program.compile(gepa(), trainset=trainset[:1])
    assert len(kept.detailed_results.candidates) == 1 and kept.get_lm() is lm
    assert isinstance(kept(question=world.test[0].question).answer, str)
    # With roles that parse, the local model is asked for a new instruction; its unparseable reply is recorded by GEPA
    for role in program.roles:
        program.set_role_lm(role, SchemaLM(WRONG))
    asked = len(lm.history)
    program.compile(gepa(), trainset=trainset[:1])
    assert len(lm.history) > asked


def test_a_chain_whose_sft_step_has_no_local_lm_fails_with_sfts_message(world, bm25):
    """The weight step of a chain needs a real LocalLM: on a scripted LM it fails with SFT's own message."""
    program = _build("single_step_rag", bm25, SchemaLM(world.train[0].answer))
    fewshot = dspy.BootstrapFewShot(metric=answer_score, max_bootstrapped_demos=1, max_labeled_demos=1)
    with pytest.raises(ConfigError, match="build the program with lm=LocalLM"):
        program.compile(optimizer=[fewshot, SFT(max_steps=1, show_progress=False)], trainset=world.train[:2])
