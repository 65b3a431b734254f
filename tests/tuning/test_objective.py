"""A real study on the tiny random Llama: three trials (real SFT compiles, real dev evaluations), the second pruned by
optuna's ThresholdPruner from the dev EM the optimizer reports while training; then the SQLite file is opened again
and the study continues with every finished trial kept."""

from __future__ import annotations

import json
import math

import optuna
import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, SFT
from rolecall.programs import SingleStepRAG
from rolecall.retrievers.bm25 import BM25
from rolecall.tuning import (
    FloatParam,
    IntParam,
    Objective,
    SearchSpace,
    Simplex,
    load_config_file,
    make_pruner,
    make_sampler,
    open_study,
    reset_adapters,
    tune,
    with_fields,
)

SPACE = SearchSpace(params=(FloatParam("learning_rate", 1e-4, 1e-2, log=True), IntParam("max_steps", 1, 3)))


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=8, n_dev=8, n_test=8)  # 8 is the smallest split


def _objective(world, lm, out, **kw) -> Objective:
    retriever = BM25(world.corpus)
    sft = SFT(epochs=1, micro_batch_size=2, num_threads=2, show_progress=False)  # 6 samples: 3 steps
    return Objective(program_factory=lambda: SingleStepRAG(retriever, lm=lm), optimizers={"sft": sft}, space=SPACE,
                     trainset=world.train[:6], devset=world.dev[:2], eval_every=1, output_dir=out, num_threads=2,
                     **kw)  # fmt: skip


def test_three_trials_one_pruned_then_a_resume_keeps_them(world, smollm_tokenizer, tiny_model, tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    objective = _objective(world, lm, tmp_path)
    # dev EM is 0.0 on a random model: below 0.5, so a trial that reports at step >= 2 is pruned there
    pruner = make_pruner("threshold", lower=0.5, warmup_steps=2)
    storage = tmp_path / "study.db"
    study = open_study(storage, sampler=make_sampler(SPACE, seed=0), pruner=pruner)
    for max_steps in (1, 3, 1):
        study.enqueue_trial({"learning_rate": 2e-3, "max_steps": max_steps})
    result = tune(objective, study, n_trials=3, output_dir=tmp_path)

    first = study.get_trials()
    assert [t.state for t in first] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                                        optuna.trial.TrialState.COMPLETE]  # fmt: skip
    assert first[0].intermediate_values == {1: 0.0} and first[1].intermediate_values == {1: 0.0, 2: 0.0}
    assert first[1].user_attrs["config"] == {"sft": {"learning_rate": 2e-3, "max_steps": 3}}
    pruned = json.loads((tmp_path / "trials" / "1" / "sft" / "summary.json").read_text())
    assert pruned["stop_reason"] == "eval_hook" and pruned["steps"] == {"answer": 2} and pruned["planned"] == {
        "answer": 3}  # fmt: skip
    trained = json.loads((tmp_path / "trials" / "0" / "sft" / "summary.json").read_text())
    assert trained["stop_reason"] == "completed" and trained["steps"] == {"answer": 1}
    assert result.ran == 3 and result.finished == 3 and result.best_value == 0.0
    assert not (tmp_path / "trials" / "2" / "dev").exists()  # its last report (at its last step) is its score

    best = load_config_file(result.written["best_config"])
    assert best == {"sft": {"learning_rate": 2e-3, "max_steps": 1}}
    assert with_fields(SFT(), best["sft"]).sft_config.max_steps == 1  # what `rolecall compile --config` applies
    summary = json.loads((tmp_path / "trials.json").read_text())
    assert summary["states"] == {"COMPLETE": 2, "PRUNED": 1} and summary["best"]["number"] == 0
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"history.png", "importances.png", "slice.png",
                                                                "intermediate.png"}  # fmt: skip
    del study

    # a new process would do this: open the same file and ask for one more finished trial
    resumed = open_study(storage, sampler=make_sampler(SPACE, seed=1), pruner=pruner)
    assert len(resumed.trials) == 3
    resumed.enqueue_trial({"learning_rate": 5e-3, "max_steps": 1})
    again = tune(_objective(world, lm, tmp_path), resumed, n_trials=4, output_dir=tmp_path, plots=False)
    trials = resumed.get_trials()
    assert again.ran == 1 and len(trials) == 4 and trials[3].state == optuna.trial.TrialState.COMPLETE
    for old, new in zip(first, trials[:3], strict=True):  # the finished trials are kept as they were
        assert (new.state, new.value, new.params, new.intermediate_values) == (
            old.state, old.value, old.params, old.intermediate_values)  # fmt: skip
    assert tune(_objective(world, lm, tmp_path), resumed, n_trials=4).ran == 0  # nothing left to run


def test_trials_start_from_fresh_adapters(world, smollm_tokenizer, tiny_model):
    """The second trial's program does not inherit the first trial's trained adapter."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    objective = _objective(world, lm, None)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"learning_rate": 1e-2, "max_steps": 1})
    study.optimize(objective, n_trials=1)
    trained = [p.detach().abs().sum().item() for n, p in lm.hf_model.named_parameters() if "lora_B" in n]
    assert any(v > 0 for v in trained)  # SFT moved the adapter off the identity (B = 0)
    assert reset_adapters(objective.program_factory()) == ["answer"]  # what the next trial does first
    assert all(p.detach().abs().sum().item() == 0 for n, p in lm.hf_model.named_parameters() if "lora_B" in n)


def test_a_simplex_trial_builds_reward_weights_that_sum_to_one():
    """MAPGRPO's plan weights (OPERA Eq. 7) searched as one simplex group: each trial's optimizer gets weights on it."""
    space = SearchSpace(simplexes=(Simplex("plan_weights", ("logic", "feasibility", "execution", "efficiency",
                                                            "placeholder")),))  # fmt: skip
    objective = Objective(program_factory=lambda: None, optimizers={"mapgrpo": MAPGRPO(group_size=2)}, space=space,
                          trainset=[None], devset=[None])  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        chain = objective.build_chain(objective.trial_config(space.suggest(trial)))
        weights = chain["mapgrpo"].mapgrpo_config.plan_weights
        assert math.isclose(sum(vars(weights).values()), 1.0) and chain["mapgrpo"].mapgrpo_config.group_size == 2
        study.tell(trial, weights.execution)


def test_a_space_field_the_optimizer_lacks_fails_before_any_trial(world):
    space = SearchSpace(params=(FloatParam("learnin_rate", 1e-4, 1e-2),))
    with pytest.raises(ConfigError, match="SFTConfig has no field 'learnin_rate'"):
        Objective(program_factory=pytest.fail, optimizers={"sft": SFT()}, space=space, trainset=world.train,
                  devset=world.dev)  # fmt: skip
    out_of_range = SearchSpace(params=(FloatParam("learning_rate", 1e-4, 2.0),))
    with pytest.raises(ConfigError, match="learning_rate must be a float in"):
        Objective(program_factory=pytest.fail, optimizers={"sft": SFT()}, space=out_of_range, trainset=world.train,
                  devset=world.dev)  # fmt: skip


def test_default_values_are_the_optimizers_defaults_and_the_base_config():
    """What the defaults trial runs: the paper's values (OPERA's plan weights, D2Plan's alpha), the base config's where
    it sets a searched field, in a chain too."""
    from rolecall.optimizers.splanrl import SPlanRL, SPlanRLConfig

    plan = SearchSpace(simplexes=(Simplex("mapgrpo.plan_weights", ("logic", "execution")),),
                       params=(FloatParam("sft.learning_rate", 1e-4, 1e-2),))  # fmt: skip
    chain = Objective(program_factory=pytest.fail, optimizers={"sft": SFT(), "mapgrpo": MAPGRPO()}, space=plan,
                      trainset=[None], devset=[None], base_config={"sft": {"learning_rate": 5e-3}})  # fmt: skip
    weights = MAPGRPO().mapgrpo_config.plan_weights
    assert chain.default_values() == {"mapgrpo.plan_weights.logic": weights.logic, "sft.learning_rate": 5e-3,
                                      "mapgrpo.plan_weights.execution": weights.execution}  # fmt: skip
    ab = SearchSpace(params=(FloatParam("alpha", 0.0, 0.5), FloatParam("beta", 0.0, 0.5)))
    splanrl = Objective(program_factory=pytest.fail, optimizers={"splanrl": SPlanRL()}, space=ab, trainset=[None],
                        devset=[None])  # fmt: skip
    assert splanrl.default_values() == {"alpha": SPlanRLConfig.alpha, "beta": SPlanRLConfig.beta} == {
        "alpha": 0.1, "beta": 0.1}  # fmt: skip
