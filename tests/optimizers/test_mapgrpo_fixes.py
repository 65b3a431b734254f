"""MAPGRPO's label, reward and plumbing fixes (issue 15), each on a hand-checked case that failed before the fix."""

from __future__ import annotations

import random
from types import SimpleNamespace

import dspy
import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.mapgrpo_roles import GoldRecord, OperaRoleTasks, RoleInput
from rolecall.programs import OPERA
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.bm25 import BM25

COMPARISON = GoldRecord(
    question="Which band was formed earlier, Yaebroria or Traveilt Archives?",
    answers=["Yaebroria"],
    supporting_ids=["band/yaebroria", "band/traveilt-archives"],
    decomposition=[
        {"question": "In which year was the band Yaebroria formed?", "answer": "1961",
         "supporting_ids": ["band/yaebroria"]},
        {"question": "In which year was the band Traveilt Archives formed?", "answer": "2010",
         "supporting_ids": ["band/traveilt-archives"]},
    ],
)  # fmt: skip


class ProbeProgram:
    """A stand-in for the program where a test needs to see how it is called: it records the ``dspy.context``
    value each call sees and every plan it is asked to execute."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.executed: list[tuple[str, tuple[str, ...]]] = []
        self.lm = SimpleNamespace(backend=SimpleNamespace(adapter_versions={"analysis": 0}))
        self.k_schedule = (5, 10, 15)

    def __call__(self, question: str) -> dspy.Prediction:
        self.seen.append(dspy.settings.get("rolecall_probe"))
        return dspy.Prediction(answer="x", trajectory=Trajectory(question=question))

    def execute_plan(self, question: str, plan: list[str]) -> dspy.Prediction:
        self.seen.append(dspy.settings.get("rolecall_probe"))
        self.executed.append((question, tuple(plan)))
        return dspy.Prediction(answer="Yaebroria")


def _record_trainer_steps(monkeypatch) -> list[list]:
    """The samples of every ``AdapterTrainer.step`` call, which still runs."""
    calls: list[list] = []
    real_step = AdapterTrainer.step
    monkeypatch.setattr(
        AdapterTrainer, "step", lambda self, samples: calls.append(list(samples)) or real_step(self, samples)
    )
    return calls


def _item(record: GoldRecord, **gold) -> RoleInput:
    return RoleInput({"question": record.question}, record, gold)


def test_analysis_expert_is_absent_when_the_gold_answer_is_unknown():
    """Answerable (a supporting passage shown) but the dataset has no answer for the step: no c_best, never "no"."""
    tasks = OperaRoleTasks(ProbeProgram(), MAPGRPOConfig())
    assert tasks.gold_expert("analysis", _item(COMPARISON, sufficient=True, answers=[])) is None
    yes = tasks.gold_expert("analysis", _item(COMPARISON, sufficient=True, answers=["1961"]))
    assert yes["sufficient"] == "yes" and yes["answer"] == "1961"
    assert tasks.gold_expert("analysis", _item(COMPARISON, sufficient=False, answers=[]))["sufficient"] == "no"


def test_analysis_inputs_are_labelled_from_the_shown_passages_and_the_gold_step():
    """The trajectory retrieved both band passages but showed only Traveilt Archives' for "year Yaebroria formed"."""
    trajectory = Trajectory(question=COMPARISON.question)
    trajectory.steps.append(Step(kind="retrieval", role="bm25", inputs={"query": "year Yaebroria formed"},
                                 outputs={"passage_ids": ["band/traveilt-archives", "band/yaebroria"]},
                                 meta={"shown_ids": ["band/traveilt-archives"]}))  # fmt: skip
    analysis = Step(kind="role", role="analysis", meta={"sub_goal": 1, "attempt": 0},
                    inputs={"sub_goal": "year Yaebroria formed", "passages": "[1] Traveilt ... 2010"},
                    outputs={"sufficient": "no", "missing_information": "when Yaebroria formed"})  # fmt: skip
    trajectory.steps.append(analysis)
    tasks = OperaRoleTasks(ProbeProgram(), MAPGRPOConfig())
    (item,) = tasks._from_trajectory("analysis", COMPARISON, trajectory)
    assert item.gold == {"sufficient": False, "answers": []}
    # the rewrite input made from it carries the analysis agent's own missing information, and its reward depth is
    # the k the program retrieves a rewritten query with (attempt 0 -> the second k of 5, 10, 15)
    (rewrite,) = tasks._rewrite_from_analysis([COMPARISON], [dspy.Prediction(trajectory=trajectory)])
    assert rewrite.inputs["missing_information"] == "when Yaebroria formed"
    assert rewrite.gold["gold_ids"] == ["band/yaebroria"] and rewrite.gold["k"] == 10
    assert tasks._rewrite_depth(1) == 15 and tasks._rewrite_depth(7) == 15


def test_collection_and_execution_keep_the_dspy_context():
    program = ProbeProgram()
    tasks = OperaRoleTasks(program, MAPGRPOConfig(collect_questions=4, num_threads=4))
    with dspy.context(rolecall_probe="kept"):
        tasks.collect("analysis", [COMPARISON] * 4, random.Random(0))
        tasks.execute_plans([(COMPARISON.question, [f"step {i}"]) for i in range(3)])
    assert program.seen == ["kept"] * 7


def test_plan_executions_are_cached_while_the_downstream_agents_are_frozen():
    program = ProbeProgram()
    tasks = OperaRoleTasks(program, MAPGRPOConfig())
    q = COMPARISON.question
    plan = ["In which year was the band Yaebroria formed?", "In which year was the band Traveilt Archives formed?"]
    assert tasks.execute_plans([(q, plan), (q, plan), (q, None), (q, plan[:1])]) == [
        "Yaebroria", "Yaebroria", None, "Yaebroria",
    ]  # fmt: skip
    tasks.execute_plans([(q, plan)])  # the expert's plan, scored again: no second execution
    assert len(program.executed) == 2 and tasks.execution_stats == {"executed": 2, "cached": 2}
    program.lm.backend.adapter_versions["analysis"] = 1  # the analysis agent was trained: executions are stale
    tasks.execute_plans([(q, plan)])
    assert len(program.executed) == 3


def test_candidate_plans_that_share_a_sub_goal_solve_it_once():
    """Three candidate plans of one step share "Who directed X?": executed concurrently, its analysis runs once."""
    from dspy.utils.dummies import DummyLM

    from rolecall.retrievers.base import Passage

    answers = {"Who directed X?": "Ada", "Where was Ada born?": "Varn", "When was Ada born?": "1901"}
    script = {q: {"sufficient": "yes", "answer": a, "confidence": "high", "missing_information": "none"}
              for q, a in answers.items()}  # fmt: skip
    corpus = BM25([Passage("d1", "X", "X was directed by Ada."), Passage("d2", "Ada", "Ada was born in Varn.")])
    first = "Who directed X?"
    plans = [[first, "Where was [p from step 1] born?"], [first, "When was [p from step 1] born?"], [first]]
    runs = {}
    for share in (True, False):
        lm = DummyLM(script)
        program = OPERA(corpus, lm=lm, demos=None, final_synthesis=False)
        tasks = OperaRoleTasks(program, MAPGRPOConfig(share_sub_goals=share))
        runs[share] = (tasks.execute_plans([("q?", p) for p in plans]), len(lm.history), tasks.execution_stats)
    assert runs[True][0] == runs[False][0] == ["Varn", "1901", "Ada"]
    assert (runs[True][1], runs[False][1]) == (3, 5)
    assert runs[True][2] == {"executed": 3, "cached": 0, "sub_goals_solved": 3, "sub_goals_shared": 2}
    assert runs[False][2] == {"executed": 3, "cached": 0}


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=20, n_dev=4, n_test=4)


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_pi_old_is_the_current_policy_unless_a_batch_is_reused(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch, num_iterations
):
    """One update per batch: no recorded pi_old (the ratio is exactly 1, not bf16 sampler noise around it).
    ``num_iterations=2``: pi_old is the trainer's own forward before the first pass; the batch trains twice."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    # rewards that differ within a group (a random model's plans never parse, so real rewards would all be 0)
    monkeypatch.setattr(
        OperaRoleTasks, "score", lambda self, role, item, outs: [(float(i), {}) for i in range(len(outs))]
    )
    calls = _record_trainer_steps(monkeypatch)
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, num_iterations=num_iterations, show_progress=False,
                           output_dir=tmp_path / "run")  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    assert len(calls) == num_iterations
    policy = [s for s in calls[0] if s.advantage is not None]
    assert len(policy) == 2 * 2  # G - 1 = 2 samples for each of the 2 inputs; c_best gets no gradient
    if num_iterations == 1:
        assert all(s.old_logps is None for s in policy)
    else:
        assert all(s.old_logps is not None and len(s.old_logps) == len(s.completion_ids) for s in policy)
    assert optimizer.history[0]["groups/skipped"] == 0.0
    assert optimizer.history[0]["train/optimizer_steps"] == float(num_iterations)


def test_equal_reward_groups_are_skipped_and_best_of_n_uses_the_roles_sampling(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch
):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    program.lm_kwargs["plan"] = {"max_tokens": 6, "stop": ("\n\n\n",)}
    sampled: list[dict] = []
    view = program.roles["plan"].lm
    real_sample = type(view).sample

    def recording_sample(self, messages, **kw):
        sampled.append(kw)
        return real_sample(self, messages, **kw)

    monkeypatch.setattr(type(view), "sample", recording_sample)
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, expert="best_of_n", expert_samples=2, show_progress=False,
                           execute_plans=False)  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    # one sampling call per step: G - 1 policy samples plus the 2 best-of-N candidates, with the role's budget/stop
    assert len(sampled) == 1 and sampled[0]["n"] == 2 + 2
    assert sampled[0]["max_tokens"] == 6 and sampled[0]["stop"] == ("\n\n\n",)
    # a random model's plans never parse: every group's rewards are 0, so both groups are skipped
    record = optimizer.history[0]
    assert record["groups/skipped"] == 2.0 and record["groups/total"] == 2.0
    assert record["train/optimizer_steps"] == 0.0


def test_comparison_expert_plan_has_a_comparison_step_when_the_last_sub_goal_answers():
    """With ``final_synthesis=False`` OPERA answers with its last sub-goal: the gold plan of a comparison must end in
    the comparison (else it answers "2010" and f_exec is 0), and that plan is logically coherent without gold."""
    from rolecall.optimizers.rewards.opera import plan_logic

    program = ProbeProgram()
    program.final_synthesis = False
    plan = OperaRoleTasks(program, MAPGRPOConfig()).gold_expert("plan", _item(COMPARISON))["sub_goals"]
    assert plan == [
        "In which year was the band Yaebroria formed?",
        "In which year was the band Traveilt Archives formed?",
        "Which band was formed earlier, Yaebroria or Traveilt Archives, given [year from step 1] and "
        "[year from step 2]?",
    ]
    assert plan_logic(plan) == 1.0
    program.final_synthesis = True  # the synthesis combines the look-ups: the gold plan is the decomposition
    assert len(OperaRoleTasks(program, MAPGRPOConfig()).gold_expert("plan", _item(COMPARISON))["sub_goals"]) == 2


def _snapshot(lm, adapter):
    return {n.replace(f".{adapter}.", ".X."): p.detach().clone() for n, p in lm.hf_model.named_parameters()
            if f".{adapter}." in n and "lora_" in n}  # fmt: skip


def test_chained_compile_warm_starts_rl_from_sft_and_keeps_sft_as_the_reference(world, tiny_model, smollm_tokenizer):
    """``compile(optimizer=[SFT, MAPGRPO])``: SFT trains first, the compiled roles run demo-free, and the KL
    reference of the RL stage is a frozen copy of the SFT adapter (not the base model, which SFT moved away from)."""
    from rolecall.optimizers import SFT

    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    sft = SFT(roles=("plan",), max_steps=1, epochs=1.0, learning_rate=1e-2, show_progress=False, num_threads=2)
    seen: dict[str, dict] = {}

    class Probe(MAPGRPO):
        def start_stage(self, ctx):
            seen["ref"] = _snapshot(lm, "plan_ref")
            seen["sft"] = _snapshot(lm, "plan")
            seen["ref_adapter"] = ctx.stage.trainer.ref_adapter
            return super().start_stage(ctx)

    rl = Probe(stages=("plan",), steps={"plan": 1}, group_size=2, inputs_per_step=1, collect_questions=1,
               max_completion_length=8, execute_plans=False, expert_gradient=True, show_progress=False)  # fmt: skip
    compiled = program.compile(optimizer=[sft, rl], trainset=world.train[:4])
    assert compiled is program and sft.history and rl.history
    assert program.runs_demo_free("plan") and not program.roles["plan"].demos
    assert seen["ref_adapter"] == "plan_ref"
    assert any(bool(v.abs().sum()) for k, v in seen["sft"].items() if "lora_B" in k)  # SFT moved the adapter
    for name, value in seen["sft"].items():
        assert torch.equal(seen["ref"][name], value)
    after = _snapshot(lm, "plan_ref")
    assert all(torch.equal(after[n], v) for n, v in seen["ref"].items())  # the reference stays frozen


def test_warm_start_argument_and_joint_grpo_collects_every_pool_up_front(world, tiny_model, smollm_tokenizer):
    """``MAPGRPO(warm_start=SFT(...))`` is the same chain; ``JointGRPO`` (single-stage GRPO) collects every role's
    inputs before any role trains, interleaves the roles' steps and uses no expert."""
    from rolecall.optimizers import SFT, JointGRPO

    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    backend = lm.backend
    collected: list[tuple[str, int]] = []
    real_collect = OperaRoleTasks.collect

    def recording_collect(self, role, records, rng):
        collected.append((role, backend.adapter_versions.get("plan", 0)))
        return real_collect(self, role, records, rng)

    sft = SFT(roles=("plan",), max_steps=1, epochs=1.0, learning_rate=1e-2, show_progress=False, num_threads=2)
    joint = JointGRPO(stages=("plan", "analysis"), steps={"plan": 1, "analysis": 1}, group_size=2, inputs_per_step=1,
                      collect_questions=1, max_completion_length=8, execute_plans=False, show_progress=False,
                      warm_start=sft)  # fmt: skip
    assert joint.mapgrpo_config.expert == "none" and not joint.mapgrpo_config.progressive
    assert joint.config.schedule == "interleaved"
    given = JointGRPO(MAPGRPOConfig(), expert="gold")  # a given config is single-stage too; overrides still win
    assert not given.mapgrpo_config.progressive and given.mapgrpo_config.expert == "gold"
    import unittest.mock

    with unittest.mock.patch.object(OperaRoleTasks, "collect", recording_collect):
        program.compile(optimizer=joint, trainset=world.train[:4])
    assert sft.history  # the warm start ran
    assert [role for role, _ in collected] == ["plan", "analysis"]
    assert len({version for _, version in collected}) == 1  # both pools before the first RL step
    assert [r["stage"] for r in joint.history] == ["plan", "analysis"]


def test_copy_adapter_is_an_independent_copy(tiny_model, smollm_tokenizer):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer)
    backend = lm.backend
    backend.ensure_adapter("src")
    with torch.no_grad():
        for n, p in lm.hf_model.named_parameters():
            if ".src." in n and "lora_B" in n:
                p.fill_(0.5)
    backend.copy_adapter("src", "dst")
    assert not backend.is_identity_adapter("dst")
    src, dst = _snapshot(lm, "src"), _snapshot(lm, "dst")
    assert src.keys() == dst.keys() and all(torch.equal(src[n], dst[n]) for n in src)
    with torch.no_grad():
        for n, p in lm.hf_model.named_parameters():
            if ".src." in n and "lora_B" in n:
                p.fill_(0.0)
    assert not backend.is_identity_adapter("dst")  # training the source later leaves the copy as it was
    from rolecall.errors import ConfigError

    with pytest.raises(ConfigError, match="No adapter named 'nope'"):
        backend.copy_adapter("nope", "x")


@pytest.mark.parametrize("skip_groups", ["on_policy", "with_expert"])
def test_groups_below_the_expert_are_trained_only_when_c_best_counts(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch, skip_groups
):
    """On-policy samples that all score 0 under a gold c_best scoring 1: ``"on_policy"`` skips the group,
    ``"with_expert"`` trains each sample on Eq. 2's A = 0 - mean(0, 0, 1) = -1/3."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)

    # the expert is scored alone (one output), the G - 1 samples together
    def score(self, role, item, outs):
        return [(float(len(outs) == 1), {})] * len(outs)

    monkeypatch.setattr(OperaRoleTasks, "score", score)
    calls = _record_trainer_steps(monkeypatch)
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, skip_groups=skip_groups, show_progress=False,
                           execute_plans=False)  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    record = optimizer.history[0]
    assert record["groups/flat_below_expert"] == 2.0
    if skip_groups == "on_policy":
        assert record["groups/skipped"] == 2.0 and record["train/optimizer_steps"] == 0.0
        assert calls == [[]]
    else:
        assert record["groups/skipped"] == 0.0 and record["train/optimizer_steps"] == 1.0
        assert [s.advantage for s in calls[0]] == pytest.approx([-1 / 3] * 4)


def test_skip_groups_is_validated():
    with pytest.raises(ConfigError, match="skip_groups must be one of"):
        MAPGRPOConfig(skip_groups="never")


def test_plan_wave_lists_candidates_extras_and_expert_per_question_and_drops_unparsed_plans():
    from rolecall.optimizers.mapgrpo import plan_wave

    batch = [SimpleNamespace(record=SimpleNamespace(question=q)) for q in ("Q1", "Q2")]
    outputs = [[{"sub_goals": ["a", " "]}, None], [{"sub_goals": []}]]
    extras = [[{"sub_goals": ["b"]}], []]
    gold = [{"sub_goals": ["a"]}, {"sub_goals": ["g1", "g2"]}]
    wave = plan_wave(batch, outputs, extras, gold)
    assert wave == [("Q1", ["a"]), ("Q1", ["b"]), ("Q1", ["a"]), ("Q2", ["g1", "g2"])]
