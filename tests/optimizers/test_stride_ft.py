"""STRIDE-FT: each selection rule on hand-built trajectories, the stored DPO reference, and a real tuning run."""

from __future__ import annotations

import json
import random

import dspy
import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.evaluation.records import to_jsonable
from rolecall.lm import LocalLM
from rolecall.optimizers.core.logprobs import store_reference_logps
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.stride_ft import (
    STRIDEFT,
    Outcome,
    Run,
    causal_rewrites,
    clearly_better,
    concise_answer_targets,
    minimal_fact_targets,
    preference_pairs,
    score_run,
)
from rolecall.optimizers.stride_ft.optimizer import load_runs
from rolecall.optimizers.stride_ft.selection import (
    LengthBalance,
    answer_bearing_facts,
    plan_call_pairs,
    rewritten_facts,
)
from rolecall.programs import OPERA, STRIDE
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.bm25 import BM25

QUESTION = "Who is the father-in-law of Kranra Vrasov?"


def role(name: str, inputs=None, outputs=None, *, error=None, completion="x", **meta) -> Step:
    messages = [{"role": "user", "content": json.dumps(inputs or {}, sort_keys=True)}]
    return Step(kind="role", role=name, inputs=inputs or {}, outputs=outputs or {}, messages=messages,
                completion=completion, error=error, meta=meta)  # fmt: skip


def plan_run(strategy, sub_questions, outcome: Outcome, answers=("Dellin",)) -> Run:
    trajectory = Trajectory(question=QUESTION)
    trajectory.add(role("meta_planner", {"question": QUESTION}, {"steps": strategy}, completion=str(strategy)))
    trajectory.add(role("planner", {"question": QUESTION, "strategy": strategy}, {"sub_questions": sub_questions},
                        completion=str(sub_questions), strategy=strategy, sub_questions=sub_questions))  # fmt: skip
    return Run(trajectory=trajectory, outcome=outcome, answers=list(answers), final_sub_question=len(sub_questions) - 1)


RIGHT, WRONG = Outcome(True, 1.0, 2, 0), Outcome(False, 0.0, 5, 3)


# ---------------------------------------------------------------------------------------------- selection rules
def test_score_run_reads_the_four_scores():
    pred = dspy.Prediction(answer="the city of Dellin", iterations=3, state={"failures": [{"reason": "no facts"}]})
    got = score_run(pred, ["Dellin"])
    assert (got.correct, got.iterations, got.failures) == (False, 3, 1)
    assert got.f1 == pytest.approx(0.5)  # "city of dellin" against "dellin"
    assert Outcome(True, 1.0, 2, 0).rank() > Outcome(True, 1.0, 3, 0).rank() > Outcome(False, 1.0, 1, 0).rank()


def test_clearly_better_is_correct_vs_incorrect_or_an_f1_gap_above_the_threshold():
    assert clearly_better(RIGHT, Outcome(False, 0.9, 1, 0))  # correct beats incorrect whatever the F1
    assert clearly_better(Outcome(False, 0.8, 1, 0), Outcome(False, 0.4, 1, 0))  # gap 0.4 > 0.3
    assert not clearly_better(Outcome(False, 0.6, 1, 0), Outcome(False, 0.3, 1, 0))  # gap 0.3 is not > 0.3
    assert not clearly_better(RIGHT, RIGHT)


def test_preference_pairs_need_a_clear_winner_and_distinct_plans():
    same = ["Who is the spouse of Kranra Vrasov?", "Who is the father of [entity from step 1]?"]
    runs = [
        plan_run(["person -> spouse", "spouse -> father"], same, RIGHT),
        plan_run(["person -> spouse", "spouse -> father"], same, WRONG),  # same plan: no pair with run 0
        plan_run(["person -> city"], ["Where was Kranra Vrasov born?"], Outcome(False, 0.1, 5, 2)),
        plan_run(["person -> city"], ["Where was Kranra Vrasov born?"], Outcome(False, 0.2, 5, 2)),
    ]
    # run 0 is best; the worst run (1) has the same plan, so the loser is the next worst distinct one: run 2
    assert preference_pairs(runs) == [(0, 2)]
    assert preference_pairs(runs, per_question=2) == [(0, 2)]  # run 3 beats run 1 by an F1 gap of 0.2 only
    assert preference_pairs(runs[:2]) == []  # only identical plans
    assert preference_pairs([runs[2], runs[3]]) == []  # no clear winner (F1 gap 0.1)


def test_pairs_avoid_a_shorter_chosen_plan_when_asked_and_the_lengths_are_reported():
    short_win = plan_run(["person -> spouse"], ["Who is the spouse of Kranra Vrasov?"], RIGHT)
    long_worst = plan_run(["person -> city", "city -> country", "country -> capital"],
                          ["Where was Kranra Vrasov born?", "Which country is [1] in?", "What is the capital of [2]?"],
                          Outcome(False, 0.0, 6, 3))  # fmt: skip
    short_bad = plan_run(["person -> band"], ["Which band?"], Outcome(False, 0.1, 5, 2))
    runs = [short_win, long_worst, short_bad]
    assert preference_pairs(runs) == [(0, 1)]  # the paper's rule: the worst run, whose plan is longer
    assert preference_pairs(runs, avoid_shorter_chosen=True) == [(0, 2)]  # a loser whose plan is not longer
    assert preference_pairs(runs[:2], avoid_shorter_chosen=True) == [(0, 1)]  # none qualifies: the worst run
    balance = LengthBalance()
    assert not balance.avoid_shorter_chosen
    balance.add(5, 12)
    assert balance.avoid_shorter_chosen  # one pair with the shorter plan chosen, none with the longer
    balance.add(9, 4)
    assert not balance.avoid_shorter_chosen
    assert balance.report() == {"pairs": 2, "chosen_shorter": 1, "chosen_longer": 1, "chosen_words": 7.0,
                                "rejected_words": 8.0}  # fmt: skip


def test_plan_call_pairs_train_the_strategy_call_and_the_plan_call_only_when_their_prompts_agree():
    winner = plan_run(["person -> spouse"], ["Who is the spouse of Kranra Vrasov?"], RIGHT)
    other_strategy = plan_run(["person -> city"], ["Where was Kranra Vrasov born?"], WRONG)
    pairs = plan_call_pairs(winner.trajectory, other_strategy.trajectory)
    assert [(c.role, r.role) for c, r in pairs] == [("meta_planner", "meta_planner")]
    same_strategy = plan_run(["person -> spouse"], ["Who married Kranra Vrasov?"], WRONG)
    pairs = plan_call_pairs(winner.trajectory, same_strategy.trajectory)
    assert [c.role for c, _ in pairs] == ["planner"]  # equal strategies: the strategy call has nothing to prefer


def sup(attempt, *, executed=True, resolved=True, error=None):
    return role("supervisor", {"sub_question": "q"}, {"action": "rewrite", "query": f"z{attempt}"}, error=error,
                attempt=attempt, executed=executed, resolved=resolved, rewrite=attempt > 0)  # fmt: skip


def test_causal_rewrites_are_executed_later_attempts_that_resolved_in_correct_runs():
    trajectory = Trajectory(question=QUESTION)
    causal = sup(1)
    for step in (sup(0), causal, sup(2, executed=False), sup(1, resolved=False), sup(1, error="unparsed")):
        trajectory.add(step)
    assert causal_rewrites([Run(trajectory=trajectory, outcome=RIGHT, answers=["x"])]) == [causal]
    assert causal_rewrites([Run(trajectory=trajectory, outcome=WRONG, answers=["x"])]) == []


def ext(facts, query="spouse of Kranra Vrasov", sq=0):
    text = "\n".join(f"- {f}" for f in facts)
    return role("extractor", {"query": query, "passages": "[1] ..."}, {"facts": text}, facts=facts, sub_question=sq)


def test_minimal_facts_keep_strictly_smaller_non_empty_selections_of_correct_runs():
    two = ext(["Kranra Vrasov married Ilsa Dorn.", "Kranra Vrasov was born in 1901."])
    one = ext(["Ilsa Dorn is the daughter of Tomas Dorn."])
    trajectory = Trajectory(question=QUESTION, steps=[two, one])
    runs = [Run(trajectory=trajectory, outcome=RIGHT, answers=["Tomas Dorn"])]
    select_first = lambda query, facts: facts[:1]  # noqa: E731
    assert minimal_fact_targets(runs, select_first) == [(two, ["Kranra Vrasov married Ilsa Dorn."])]
    assert minimal_fact_targets(runs, lambda q, f: f) == []  # nothing removed: no sample
    assert minimal_fact_targets(runs, lambda q, f: None) == []  # no usable selection
    assert minimal_fact_targets(runs, lambda q, f: ["an invented fact"]) == []  # not a subset of E
    assert minimal_fact_targets([Run(trajectory=trajectory, outcome=WRONG, answers=["x"])], select_first) == []
    assert rewritten_facts(two, ["Kranra Vrasov married Ilsa Dorn."]) == "- Kranra Vrasov married Ilsa Dorn."
    by_answer = answer_bearing_facts("Ilsa Dorn")
    assert by_answer("q", two.meta["facts"]) == ["Kranra Vrasov married Ilsa Dorn."]


def reasoner(answer, sq=1):
    return role("reasoner", {"sub_question": "q", "facts": "f"}, {"answer": answer}, answer=answer, sub_question=sq)


def test_concise_answers_retarget_verbose_final_answers_and_balance_them_with_twice_as_many_exact_ones():
    verbose = reasoner("Tomas Dorn of the city of Dellin")  # F1 0.5 with the gold, 7 words > 1.5 x 2
    short_wrong = reasoner("Tomas")  # F1 > 0.3 but not longer than the gold
    unrelated = reasoner("a very long answer that shares nothing at all")  # F1 0
    intermediate = reasoner("Ilsa Dorn the daughter of Tomas", sq=0)  # not the final sub-question
    exact = [reasoner("Tomas Dorn") for _ in range(3)]
    runs = [Run(trajectory=Trajectory(steps=[intermediate, s]), outcome=WRONG, answers=["Tomas Dorn"],
                final_sub_question=1) for s in (verbose, short_wrong, unrelated, *exact)]  # fmt: skip
    chosen, kept_exact = concise_answer_targets(runs, rng=random.Random(0))
    assert chosen == [(verbose, "Tomas Dorn")]
    assert len(kept_exact) == 2 and all(s in exact for s in kept_exact)  # 2 x 1 verbose sample
    assert concise_answer_targets(runs[1:], rng=random.Random(0)) == ([], [])  # no verbose sample: no exact either


# ---------------------------------------------------------------------------------------------- the optimizer
@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=4, n_dev=1, n_test=1)


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)


def lora(lm: LocalLM, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.backend.model.named_parameters() if f".{adapter}." in n}


def test_stored_reference_logps_are_the_adapter_before_training(lm):
    backend = lm.backend
    backend.ensure_adapter("meta_planner")
    sample = TrainingSample(role="meta_planner", adapter="meta_planner", prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                            loss_mask=[1, 0], rejected_ids=[6, 7, 8])  # fmt: skip
    store_reference_logps(backend, [sample], adapter="meta_planner")
    model = backend.model
    with torch.no_grad():
        model.set_adapter("meta_planner")
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits.float()
    expected = torch.log_softmax(logits[0, 2], -1)[4].item()  # token 4 after the prompt 1 2 3
    assert sample.ref_logps[0] == pytest.approx(expected, abs=1e-4) and sample.ref_logps[1] == 0.0  # masked
    assert len(sample.rejected_ref_logps) == 3 and all(v < 0 for v in sample.rejected_ref_logps)


class HandBuiltRuns(STRIDEFT):
    """STRIDEFT whose runs are hand-built STRIDE trajectories (selection and training are the real ones)."""

    def _run_all(self, program, examples):
        spouse = ["Who is the spouse of Kranra Vrasov?", "Who is the father of [entity from step 1]?"]
        groups = []
        for example in examples:
            q = example.question
            good = plan_run(["person -> spouse", "spouse -> father"], spouse, RIGHT, answers=["Tomas Dorn"])
            bad = plan_run(["person -> birthplace"], [f"Where was {q} born?"], WRONG, answers=["Tomas Dorn"])
            for run in (good, bad):
                for step in run.trajectory.steps:
                    step.inputs = {**step.inputs, "question": q}
            good.trajectory.add(sup(1))
            good.trajectory.steps[-1].inputs = {"question": q, "progress": "1. pending", "sub_question": spouse[0],
                                                "failed_queries": "Kranra"}  # fmt: skip
            good.trajectory.add(ext(["Kranra Vrasov married Ilsa Dorn.", "Kranra Vrasov was born in 1901."]))
            good.trajectory.add(reasoner("Ilsa Dorn", sq=0))  # the sub-answer the answer rule looks for
            good.trajectory.add(reasoner("Tomas Dorn, that is Tomas Dorn"))  # verbose final answer
            good.trajectory.add(reasoner("Tomas Dorn"))  # already exact
            groups.append([good, bad])
        return groups


def test_stride_ft_builds_every_legs_samples_and_trains_dpo_and_sft_adapters(world, lm, tmp_path):
    program = STRIDE(BM25(world.corpus), lm=lm)
    before = {a: lora(lm, a) for a in ("meta_planner", "supervisor", "extractor", "reasoner")}
    optimizer = HandBuiltRuns(fact_selector="answer", epochs=1, batch_size=2, micro_batch_size=2,
                              dpo_learning_rate=1e-2, sft_learning_rate=1e-2, output_dir=str(tmp_path),
                              show_progress=False)  # fmt: skip
    # the answer rule keeps the facts holding the sub-answer; the reasoner's sub-question 1 answer is the gold
    program.compile(optimizer=optimizer, trainset=world.train)
    sel, n = optimizer.selection, len(world.train)
    assert sel["plan_pairs"] == n and sel["meta_planner_samples"] == n  # one strategy-call pair per question
    assert sel["supervisor_samples"] == n and sel["reasoner_verbose"] == n and sel["reasoner_exact"] == n
    assert sel["extractor_samples"] == n  # the fact holding the sub-answer "Ilsa Dorn" of two
    decode = lm.backend.tokenizer.decode
    extracted = decode(optimizer.samples["extractor"][0].completion_ids)
    assert "married Ilsa Dorn" in extracted and "1901" not in extracted  # the target is E*, not E
    answers = [decode(s.completion_ids) for s in optimizer.samples["reasoner"]]
    assert not any("that is" in a for a in answers) and sum("Tomas Dorn" in a for a in answers) == 2 * n
    dpo = optimizer.samples["meta_planner"]
    assert all(s.rejected_ids and s.ref_logps and s.rejected_ref_logps for s in dpo)
    assert {r["stage"] for r in optimizer.history} == {"meta_planner", "supervisor", "extractor", "reasoner"}
    assert any("loss/dpo" in r for r in optimizer.history)
    for adapter in ("meta_planner", "supervisor", "extractor", "reasoner"):
        after = lora(lm, adapter)
        assert any(not torch.equal(after[n], before[adapter][n]) for n in after), adapter
        assert adapter in program.demo_free_adapters  # the tuned roles run demo-free
    saved = json.loads((tmp_path / "selection.json").read_text())
    assert saved["runs"] == 2 * n and saved["correct_runs"] == n
    assert (tmp_path / "samples.jsonl").exists() and (tmp_path / "summary.json").exists()


def test_stride_ft_runs_n_sampled_plans_per_question_on_the_real_program(world, lm):
    program = STRIDE(BM25(world.corpus), lm=lm)
    before = json.dumps(program.lm_kwargs, sort_keys=True)
    runs = STRIDEFT(num_plans=2, show_progress=False)._run_all(program, world.train[:2])
    assert [len(g) for g in runs] == [2, 2]
    assert all(r.trajectory.role_steps("planner") for g in runs for r in g)
    assert json.dumps(program.lm_kwargs, sort_keys=True) == before  # the plan temperature is put back


def test_stride_ft_errors_name_the_fix(world, lm):
    with pytest.raises(ConfigError, match="applies to the stride program"):
        OPERA(BM25(world.corpus), lm=lm).compile(optimizer=STRIDEFT(), trainset=world.train)
    with pytest.raises(ConfigError, match="legs"):
        STRIDEFT(legs=("planner",))
    with pytest.raises(ConfigError, match="multiple of micro_batch_size"):
        STRIDEFT(batch_size=6, micro_batch_size=4)


def test_a_killed_stride_ft_resumes_with_its_samples_and_reaches_the_uninterrupted_adapters(
    world, smollm_tokenizer, tmp_path, monkeypatch
):
    from tests.optimizers.test_sft import _fresh_lm

    def run(out, *, resume=False):
        lm = _fresh_lm(smollm_tokenizer)
        program = STRIDE(BM25(world.corpus), lm=lm)
        optimizer = HandBuiltRuns(fact_selector="answer", epochs=1, batch_size=2, micro_batch_size=2,
                                  dpo_learning_rate=1e-2, sft_learning_rate=1e-2, output_dir=str(out), resume=resume,
                                  show_progress=False)  # fmt: skip
        program.compile(optimizer=optimizer, trainset=world.train)
        return lm, optimizer

    full_lm, full = run(tmp_path / "full")
    original, calls = STRIDEFT.update, []

    def dies_on_the_third_step(self, ctx, samples, trainer):
        calls.append(ctx.global_step)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return original(self, ctx, samples, trainer)

    monkeypatch.setattr(STRIDEFT, "update", dies_on_the_third_step)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed")
    monkeypatch.setattr(STRIDEFT, "update", original)
    resumed_lm, resumed = run(tmp_path / "killed", resume=True)
    assert [r["global_step"] for r in resumed.history] == [r["global_step"] for r in full.history][2:]
    for adapter in ("meta_planner", "supervisor", "extractor", "reasoner"):
        expected, got = lora(full_lm, adapter), lora(resumed_lm, adapter)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the runs journal
class CountedSTRIDE(STRIDE):
    """STRIDE counting its runs (the program itself is the real one)."""

    calls = 0

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return super().forward(*args, **kwargs)


def test_the_runs_journal_restores_each_run_as_collected(world, lm, tmp_path):
    """A run read back from runs.jsonl gives the same outcome and the same training samples, token for token."""
    program = STRIDE(BM25(world.corpus), lm=lm)
    optimizer = STRIDEFT(num_plans=2, output_dir=str(tmp_path), show_progress=False)
    runs = optimizer._run_all(program, world.train[:2])
    loaded = load_runs(tmp_path, world.train[:2])

    assert sorted(loaded) == [0, 1] and [len(g) for g in loaded.values()] == [2, 2]
    by_question = {i: sorted(g, key=lambda r: json.dumps(r.trajectory.to_dict())) for i, g in enumerate(runs)}
    for i, group in loaded.items():
        for original, back in zip(
            by_question[i], sorted(group, key=lambda r: json.dumps(r.trajectory.to_dict())), strict=True
        ):
            assert back.outcome == original.outcome and back.answers == original.answers
            assert back.final_sub_question == original.final_sub_question
            steps = original.trajectory.role_steps()
            assert steps and len(back.trajectory.role_steps()) == len(steps)
            for a, b in zip(steps, back.trajectory.role_steps(), strict=True):
                assert prompt_of(program, a) == prompt_of(program, b)  # every call's prompt, parsed or not
                assert (a.error, a.completion) == (b.error, b.completion)
                assert json.loads(json.dumps(to_jsonable(a.meta))) == b.meta  # JSON keeps no int dict keys
                for key in SELECTION_META:  # what the rules read comes back as it was
                    assert a.meta.get(key) == b.meta.get(key), key
                if a.error is None:  # the parsed calls, which are the ones selection turns into samples
                    x, y = optimizer._sample(program, a), optimizer._sample(program, b)
                    assert (x.prompt_ids, x.completion_ids) == (y.prompt_ids, y.completion_ids)


SELECTION_META = ("sub_question", "answer", "facts", "strategy", "sub_questions", "executed", "attempt", "resolved")


def prompt_of(program: STRIDE, step: Step) -> list[dict]:
    """The demo-free messages ``step``'s role would be sent for ``step``'s inputs."""
    adapter = program.role_adapter(step.role) or dspy.ChatAdapter()
    return adapter.format(program.roles[step.role].signature, demos=[], inputs=dict(step.inputs))


def test_a_killed_collection_resumes_with_the_runs_it_journaled(world, lm, tmp_path):
    program = CountedSTRIDE(BM25(world.corpus), lm=lm)
    examples = world.train[:2]
    STRIDEFT(num_plans=2, output_dir=str(tmp_path), show_progress=False)._run_all(program, examples)
    journal = tmp_path / "runs.jsonl"
    lines = journal.read_text().splitlines()
    # killed after three runs, the fourth cut mid-write
    journal.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    CountedSTRIDE.calls = 0

    runs = STRIDEFT(num_plans=2, output_dir=str(tmp_path), resume=True, show_progress=False)._run_all(program, examples)

    assert CountedSTRIDE.calls == 1  # only the lost run ran again
    assert [len(g) for g in runs] == [2, 2]
    assert len(load_runs(journal, examples)) == 2 and sum(len(g) for g in load_runs(journal, examples).values()) == 4
    # without resume the collection starts over, and a journal of other questions is not reused
    CountedSTRIDE.calls = 0
    STRIDEFT(num_plans=2, output_dir=str(tmp_path), show_progress=False)._run_all(program, examples)
    assert CountedSTRIDE.calls == 4
    assert load_runs(journal, world.train[2:4]) == {}


def test_selection_settings_are_tried_on_one_collection_with_runs_from(world, lm, tmp_path):
    program = CountedSTRIDE(BM25(world.corpus), lm=lm)
    examples = world.train[:2]
    STRIDEFT(num_plans=2, output_dir=str(tmp_path / "first"), show_progress=False)._run_all(program, examples)
    CountedSTRIDE.calls = 0

    other = STRIDEFT(num_plans=3, pairs_per_question=2, runs_from=str(tmp_path / "first"),
                     output_dir=str(tmp_path / "lever"), show_progress=False)  # fmt: skip
    runs = other._run_all(program, examples)

    assert CountedSTRIDE.calls == 2  # the third plan of each question; the first two come from the journal
    assert [len(g) for g in runs] == [3, 3]
    assert sum(len(g) for g in load_runs(tmp_path / "lever", examples).values()) == 6  # its own journal holds all
    assert sum(len(g) for g in load_runs(tmp_path / "first", examples).values()) == 4  # the source is not touched


def test_collect_minutes_stops_starting_runs_round_by_round_and_a_resume_runs_the_rest(world, lm, tmp_path):
    program = CountedSTRIDE(BM25(world.corpus), lm=lm)
    examples = world.train[:2]
    ticks = iter(range(0, 10_000, 60))  # a virtual clock: each reading is a minute later
    optimizer = STRIDEFT(num_plans=2, collect_minutes=2.5, num_threads=1, output_dir=str(tmp_path),
                         show_progress=False)  # fmt: skip
    optimizer.clock = lambda: next(ticks)
    CountedSTRIDE.calls = 0

    runs = optimizer._run_all(program, examples)

    assert CountedSTRIDE.calls == 2 and [len(g) for g in runs] == [1, 1]  # every question's first plan, then cut
    assert optimizer.selection["runs_not_started"] == 2
    resumed = STRIDEFT(num_plans=2, output_dir=str(tmp_path), resume=True, show_progress=False)
    assert [len(g) for g in resumed._run_all(program, examples)] == [2, 2] and CountedSTRIDE.calls == 4
    assert resumed.selection["runs_not_started"] == 0
    with pytest.raises(ConfigError, match="collect_minutes"):
        STRIDEFT(collect_minutes=0)
