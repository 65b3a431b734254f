"""Tests of the ``rolecall`` command: help texts, argument errors, and ``eval`` end to end with a fake program."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import dspy
import pytest

from rolecall.cli import build_parser, main
from rolecall.programs import registry
from rolecall.programs.core.trajectory import Step, Trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]


class FakeRAG:
    """Follows the program contract: answers with the title of the top passage (or ``options["fixed"]``)."""

    calls = 0
    last_options: dict = {}

    def __init__(self, retriever=None, *, lm=None, top_k=5, **options):
        self.retriever, self.lm, self.top_k, self.options = retriever, lm, top_k, options
        FakeRAG.last_options = {"top_k": top_k, **options}

    def __call__(self, question: str) -> dspy.Prediction:
        FakeRAG.calls += 1
        traj = Trajectory(question=question)
        passages = self.retriever(question, self.top_k) if self.retriever is not None else []
        traj.add(Step(kind="retrieval", role="search", outputs={"passage_ids": [p.id for p in passages]}))
        answer = self.options.get("fixed") or (passages[0].title if passages else "")
        return dspy.Prediction(answer=answer, trajectory=traj)


class FakeLM:
    """Stands in for LocalLM so the CLI tests load no model."""

    def __init__(self, model, *, temperature=0.0, max_tokens=256):
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens


@pytest.fixture
def fake_program(monkeypatch):
    """Register FakeRAG as ``fake_rag`` and replace LocalLM by FakeLM."""
    module = types.ModuleType("fake_rolecall_programs")
    module.FakeRAG = FakeRAG
    monkeypatch.setitem(sys.modules, "fake_rolecall_programs", module)
    monkeypatch.setitem(registry.PROGRAMS, "fake_rag", "fake_rolecall_programs:FakeRAG")
    monkeypatch.setattr("rolecall.lm.local.LocalLM", FakeLM)
    FakeRAG.calls, FakeRAG.last_options = 0, {}
    return FakeRAG


def _subcommands() -> list[str]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(actions[0].choices)


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in _subcommands()])
def test_help_for_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rolecall")
    if len(argv) == 2:  # every subcommand takes -v
        assert "--verbose" in out
    if argv == ["eval", "--help"]:
        for flag in ("--program", "--dataset", "--data-path", "--retriever", "--k", "--model", "--threads", "--out"):
            assert flag in out
        assert "examples:" in out and "(default: synthetic)" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "eval" in capsys.readouterr().err


def test_unknown_program_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--program", "nope"])
    assert exit_info.value.code == 2
    assert "single_step_rag" in capsys.readouterr().err  # the valid choices are listed


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--threads", "0"], "--threads must be >= 1"),
        (["--resume"], "--resume needs --out"),
        (["--dataset", "flashrag"], "needs --data-path"),
        (["--dataset", "hotpotqa", "--data-path", "missing.jsonl"], "does not exist"),
        (["-o", "not a pair"], "KEY=VALUE"),
    ],
)
def test_eval_configuration_errors(fake_program, extra, message, capsys):
    assert main(["eval", "--program", "fake_rag", *extra]) == 1
    assert message in capsys.readouterr().err


def test_eval_synthetic_end_to_end_and_resume(fake_program, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["eval", "--program", "fake_rag", "--limit", "5", "--k", "2", "--threads", "3", "--out", str(out)]
    assert main([*argv, "--no-progress", "-o", "note=1"]) == 0
    printed = capsys.readouterr().out
    assert "fake_rag on synthetic (5 questions, bm25 k=2)" in printed and "retrieval recall" in printed
    assert fake_program.calls == 5 and fake_program.last_options == {"note": 1, "top_k": 2}  # --k reaches top_k
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 5 and all(len(r["retrieved_ids"]) <= 2 for r in records)
    assert json.loads((out / "summary.json").read_text())["n"] == 5
    assert json.loads((out / "config.json").read_text())["program"] == "fake_rag"

    assert main([*argv, "--no-progress", "-o", "note=1", "--resume"]) == 0  # nothing left to run
    assert fake_program.calls == 5 and len((out / "records.jsonl").read_text().splitlines()) == 5


def test_k_reaches_top_k_of_dspy_module_programs():
    class Program(dspy.Module):  # dspy's metaclass hides __init__ from inspect.signature(cls)
        def __init__(self, retriever=None, *, lm=None, top_k: int = 5):
            super().__init__()

    assert registry.option_names(Program) == ["top_k"]


def test_eval_flashrag_files_keep_corpus_ids(fake_program, tmp_path, capsys):
    from rolecall.data.synthetic import synthetic_world

    paths = synthetic_world(seed=1, n_train=5, n_dev=5, n_test=5).to_flashrag(tmp_path / "data")
    argv = ["eval", "--program", "fake_rag", "--dataset", "flashrag", "--data-path", str(paths["test"])]
    assert main([*argv, "--split", "all", "--out", str(tmp_path / "run"), "--no-progress"]) == 0  # the whole file
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    n_questions = len(paths["test"].read_text().splitlines())
    assert summary["n"] == n_questions and summary["retrieval_recall"] > 0  # gold ids match the corpus file's ids


def test_eval_default_path_of_a_real_dataset(fake_program, shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)  # the defaults are ../shared/data/... from the working directory
    argv = ["eval", "--program", "fake_rag", "--dataset", "musique", "--limit", "3", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["n"] == 3


@pytest.mark.slow
def test_eval_smoke_with_the_embedded_lm(tmp_path):
    """The real thing: SingleStepRAG with SmolLM2-135M on 3 synthetic questions (skipped until the program exists)."""
    if importlib.util.find_spec("rolecall.programs.baselines") is None:
        pytest.skip("rolecall.programs.baselines (SingleStepRAG) is not in this tree yet")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rolecall.cli", "eval", "--program", "single_step_rag", "--dataset", "synthetic"]
    # Short prompts and completions keep it near a minute on 2 CPU cores (a 1.5k-token prompt costs ~10 s there).
    cmd += ["--limit", "3", "--threads", "3", "--k", "2", "--max-tokens", "32", "-o", "demos=null"]
    cmd += ["--out", str(out), "--no-progress"]
    # One intra-op thread: on a shared 2-core machine torch's spinning OpenMP threads slow this 3-10x (measured).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EM" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 3 and summary["lm_calls"] >= 1
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert all(len(r["retrieved_ids"]) <= 2 for r in records)  # --k 2 reached the program's top_k


@pytest.mark.parametrize(
    "option, message",
    [
        ("no_such_option=3", "program 'opera' has no option 'no_such_option'; its options are: max_passage_chars"),
        ("use_rewrite=maybe", "option use_rewrite='maybe' is not valid: use_rewrite must be a bool"),
        ("top_k=0", "option top_k must be an int >= 1, got 0"),
        ("k_schedule=5,x", "option k_schedule='5,x' is not valid"),
        ("demo_policy=sometimes", "option demo_policy='sometimes' is not valid: choose one of always, never"),
    ],
)
def test_bad_program_options_fail_in_one_line_before_anything_loads(option, message, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr("rolecall.lm.local.LocalLM", no_model)
    monkeypatch.setattr("rolecall.cli_eval.load_data", no_model)
    assert main(["eval", "--program", "opera", "-o", option]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_good_program_options_are_parsed_by_type():
    values = registry.parse_program_options("opera", ["use_rewrite=false", "k_schedule=5,10", "demos=none"])
    assert values == {"use_rewrite": False, "k_schedule": (5, 10), "demos": None}


def test_eval_load_needs_a_saved_program_directory(fake_program, tmp_path, capsys):
    assert main(["eval", "--load", str(tmp_path / "nowhere")]) == 1
    assert "program.json does not exist" in capsys.readouterr().err
    assert main(["eval", "--load", str(tmp_path), "-o", "top_k=2"]) == 1
    assert "-o cannot change them" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --program and --load exclude each other
        main(["eval", "--load", str(tmp_path), "--program", "opera"])


def test_eval_load_evaluates_a_saved_program_with_its_adapters(
    tmp_path, tiny_model, smollm_tokenizer, monkeypatch, capsys
):
    """A program saved with a trained (changed) adapter, evaluated by `rolecall eval --load` on a tiny local model:
    the adapter weights reach the evaluated program and the demo-free role runs without demos."""
    import torch

    from rolecall.lm import LocalLM
    from rolecall.programs import SingleStepRAG

    model_dir, saved = tmp_path / "tiny", tmp_path / "saved"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    lm = LocalLM(str(model_dir), max_tokens=4)
    program = SingleStepRAG(None, lm=lm, top_k=2)
    lora = [p for n, p in lm.hf_model.named_parameters() if "lora_B" in n and ".answer." in n]
    with torch.no_grad():
        for p in lora:
            p.add_(0.5)  # stands in for a training step
    trained = {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if ".answer." in n}
    program.mark_trained("answer")
    program.save(saved)
    loaded_weights = {}
    original = LocalLM.load_adapter

    def spy(self, path, name=None):
        view = original(self, path, name=name)
        loaded_weights.update({n: p.detach().clone() for n, p in self.hf_model.named_parameters() if ".answer." in n})
        return view

    monkeypatch.setattr(LocalLM, "load_adapter", spy)
    out = tmp_path / "run"
    argv = ["eval", "--load", str(saved), "--model", str(model_dir), "--limit", "2", "--k", "2", "--max-tokens", "4"]
    assert main([*argv, "--out", str(out), "--no-progress", "--threads", "2"]) == 0
    assert "single_step_rag on synthetic (2 questions" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    steps = [s for r in records for s in r["trajectory"]["steps"] if s["kind"] == "role"]
    assert steps and all(s["adapter"] == "answer" for s in steps)
    assert all(len(s["messages"]) == 2 for s in steps)  # system + question: no demo turns
    assert json.loads((out / "config.json").read_text())["program"] == "single_step_rag"
    assert loaded_weights.keys() == trained.keys() and trained
    assert all(torch.equal(loaded_weights[n], trained[n]) for n in trained)  # the trained weights were evaluated


def test_compile_then_eval_load_on_a_tiny_model(tmp_path, tiny_model, smollm_tokenizer, capsys):
    """`rolecall compile` trains and saves; `rolecall eval --load` evaluates the compiled, demo-free program."""
    model_dir, saved = tmp_path / "tiny", tmp_path / "compiled"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "opera", "--limit", "3", "--max-steps", "1", "--model", str(model_dir)]
    assert main([*argv, "--out", str(saved), "--no-progress", "--num-threads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "opera compiled with sft on 3 synthetic questions" in printed and "rolecall eval --load" in printed
    payload = json.loads((saved / "program.json").read_text())
    trained = {json.loads(line)["adapter"] for line in (saved / "metrics.jsonl").read_text().splitlines()}
    assert {"plan", "analysis", "synthesis"} <= trained  # 3 questions may need no rewrite: then it keeps its demos
    assert set(payload["demo_free_adapters"]) == trained
    assert (saved / "adapters" / "plan" / "adapter_config.json").is_file() and (saved / "loss.png").is_file()
    out = tmp_path / "run"
    argv = ["eval", "--load", str(saved), "--model", str(model_dir), "--limit", "1", "--max-tokens", "4"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    plan = next(s for s in record["trajectory"]["steps"] if s["role"] == "plan")
    assert plan["adapter"] == "plan" and len(plan["messages"]) == 2  # the compiled role runs without demos


def test_compile_rejects_a_program_without_gold_targets_before_loading(monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["compile", "--program", "ircot", "--out", "x"]) == 1
    assert (
        "gold-path targets for cascaded_team, d2plan, hierarchical_team, no_retrieval_cot, opera, reap, "
        "search_r1, single_step_rag, stride; 'ircot' has none" in capsys.readouterr().err
    )


def test_compile_chains_sft_and_mapgrpo(tmp_path, tiny_model, smollm_tokenizer, capsys):
    """`--optimizer sft,mapgrpo`: SFT writes OUT/sft/, then MAPGRPO (its budget spent after one plan step) writes
    OUT/mapgrpo/metrics.jsonl and the reward curves; the saved program holds both."""
    model_dir, saved = tmp_path / "tiny", tmp_path / "chained"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "opera", "--optimizer", "sft,mapgrpo", "--limit", "3", "--sft.max-steps", "1",
            "--time-budget-minutes", "0.01", "--group-size", "2", "--model", str(model_dir)]  # fmt: skip
    assert main([*argv, "--out", str(saved), "--no-progress", "--num-threads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "opera compiled with sft,mapgrpo on 3 synthetic questions" in printed
    assert "mapgrpo optimizer steps per adapter: {'plan': 1}" in printed
    assert (saved / "sft" / "loss.png").is_file() and (saved / "program.json").is_file()
    (record,) = [json.loads(line) for line in (saved / "mapgrpo" / "metrics.jsonl").read_text().splitlines()]
    assert record["stage"] == "plan" and "time/execute" in record and (saved / "rewards.png").is_file()


def test_compile_multitask_sft_trains_reaps_one_planning_adapter(tmp_path, tiny_model, smollm_tokenizer, capsys):
    model_dir, saved = tmp_path / "tiny", tmp_path / "reap-multitask"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "reap", "--optimizer", "multitask_sft", "--limit", "3", "--max-steps", "1",
            "--model", str(model_dir), "--out", str(saved), "--no-progress", "--num-threads", "2"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "multitask_sft optimizer steps per adapter: {'multitask': 1}" in printed
    assert (saved / "loss.png").is_file() and (saved / "adapters" / "multitask").is_dir()
    assert json.loads((saved / "program.json").read_text())["config"]["adapter_groups"] == {
        "multitask": ["decomposer", "replanner"]
    }


def test_compile_stride_ft_that_selects_nothing_says_what_to_do(tmp_path, tiny_model, smollm_tokenizer, capsys):
    """A random tiny model answers nothing right, so no rule selects a sample: a clear error, no traceback."""
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "stride", "--optimizer", "stride_ft", "--limit", "2", "--num-plans", "2",
            "--model", str(model_dir), "--out", str(tmp_path / "out"), "--no-progress",
            "--num-threads", "2"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "STRIDEFT selected no sample from 2 questions x 2 runs" in err and "SFT first" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "optimizer, program, message",
    [
        ("mapgrpo,sft", "opera", "sft is the warm start, so it comes first"),
        ("sft,mapgrpo,grpo", "opera", "pick one of mapgrpo, grpo (after sft)"),
        ("sft,mapgrpo", "reap", "--optimizer mapgrpo applies to opera, not 'reap'"),
        ("stride_ft", "opera", "--optimizer stride_ft applies to stride, not 'opera'"),
        ("multitask_sft", "stride", "--optimizer multitask_sft applies to reap, not 'stride'"),
        ("sft,multitask_sft", "reap", "multitask_sft is itself SFT"),
        ("splanrl", "opera", "--optimizer splanrl applies to d2plan, not 'opera'"),
        ("sft,splanrl", "stride", "--optimizer splanrl applies to d2plan, not 'stride'"),
        ("dpo", "opera", "--optimizer takes sft, mapgrpo, grpo, stride_ft, multitask_sft"),
    ],
)
def test_compile_rejects_a_bad_chain_before_loading(monkeypatch, capsys, optimizer, program, message):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["compile", "--program", program, "--optimizer", optimizer, "--out", "x"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_compile_rejects_a_bad_batch_size_before_loading(monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["compile", "--program", "opera", "--micro-batch-size", "0", "--out", "x"]) == 1
    err = capsys.readouterr().err
    assert "micro_batch_size" in err and "0" in err and "Traceback" not in err


def test_eval_split_of_a_real_dataset_is_the_compile_hash_split(fake_program, shared_data, tmp_path, monkeypatch):
    """--split train / test of a real dataset are the 80/20 hash split `rolecall compile` trains on / holds out; the
    default is test, and all is the whole file."""
    from rolecall.cli_common import DEFAULT_DATA_PATHS
    from rolecall.data import hash_split
    from rolecall.data.corpus import load_dataset

    monkeypatch.chdir(REPO_ROOT)
    train, test = hash_split(load_dataset("musique", DEFAULT_DATA_PATHS["musique"]), fraction=0.8)
    seen = {}
    for split in ("train", "test", "all", None):
        argv = ["eval", "--program", "fake_rag", "--dataset", "musique", "--no-progress"]
        argv += ["--split", split] if split else []
        assert main([*argv, "--out", str(tmp_path / str(split))]) == 0
        records = (tmp_path / str(split) / "records.jsonl").read_text().splitlines()
        seen[split] = {json.loads(line)["id"] for line in records}
    assert seen["train"] == {e.id for e in train} and seen["test"] == {e.id for e in test}
    assert seen["all"] == seen["train"] | seen["test"] and not seen["train"] & seen["test"]
    assert seen[None] == seen["test"]  # the default: the held-out side
    assert main(["eval", "--program", "fake_rag", "--dataset", "musique", "--split", "dev", "--out", "x"]) == 1


def test_compile_on_a_real_dataset_trains_on_its_train_side(tmp_path, tiny_model, smollm_tokenizer, shared_data,
                                                            monkeypatch, capsys):  # fmt: skip
    monkeypatch.chdir(REPO_ROOT)
    model_dir, saved = tmp_path / "tiny", tmp_path / "compiled"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "opera", "--dataset", "musique", "--limit", "2", "--max-steps", "1"]
    assert main([*argv, "--model", str(model_dir), "--out", str(saved), "--no-progress", "--num-threads", "2"]) == 0
    assert "opera compiled with sft on 2 musique questions" in capsys.readouterr().out
    from rolecall.cli_common import DEFAULT_DATA_PATHS
    from rolecall.data import hash_split
    from rolecall.data.corpus import load_dataset

    train, _ = hash_split(load_dataset("musique", DEFAULT_DATA_PATHS["musique"]), fraction=0.8)
    samples = [json.loads(line) for line in (saved / "samples.jsonl").read_text().splitlines()]
    assert {s["role"] for s in samples} >= {"plan", "analysis"} and (saved / "program.json").is_file()
    plans = [smollm_tokenizer.decode(s["prompt_ids"]) for s in samples if s["role"] == "plan"]
    assert len(plans) == 2 and all(e.question in p for e, p in zip(train[:2], plans, strict=True))


def test_compile_splanrl_builds_d2plans_optimizer_from_the_flags():
    """`--optimizer splanrl` alone: the paper's filtered self cold start, then GRPO; after `sft,` the chain's SFT is
    the cold start. Built from the flags before any model loads."""
    from rolecall.cli_compile import build_optimizers, check_chain
    from rolecall.optimizers import SPlanRL
    from rolecall.optimizers.splanrl import cold_start_metric

    def built(optimizer):
        argv = ["compile", "--program", "d2plan", "--optimizer", optimizer, "--group-size", "5",
                "--time-budget-minutes", "3", "--cold-start-epochs", "1", "--cold-start-max-steps", "7", "--seed", "2",
                "--out", "runs/x"]  # fmt: skip
        args = build_parser(argv).parse_args(argv)
        return build_optimizers(args, *check_chain(args))[-1]

    optimizer = built("splanrl")
    cfg = optimizer.splanrl_config
    assert isinstance(optimizer, SPlanRL) and cfg.group_size == 5 and cfg.time_budget_minutes == 3
    assert (cfg.cold_start, cfg.cold_start_epochs, cfg.cold_start_max_steps, cfg.seed) == ("self", 1.0, 7, 2)
    assert cfg.output_dir == str(Path("runs/x") / "splanrl") and optimizer.config.time_budget_s == 180
    cold = optimizer.cold_start_optimizer()
    assert cold.metric is cold_start_metric and cold.sft_config.output_dir == str(Path("runs/x/splanrl/cold_start"))
    assert built("sft,splanrl").cold_start_optimizer() is None


def test_compile_chains_sft_and_splanrl_on_a_tiny_model(tmp_path, tiny_model, smollm_tokenizer, capsys):
    """`--program d2plan --optimizer sft,splanrl`: gold-path SFT writes OUT/sft/, then SPlanRL (its budget spent
    after one step) writes OUT/splanrl/metrics.jsonl with the SPlanRL reward terms."""
    model_dir, saved = tmp_path / "tiny", tmp_path / "d2plan-splanrl"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "d2plan", "--optimizer", "sft,splanrl", "--limit", "2", "--sft.max-steps", "1",
            "--time-budget-minutes", "0.01", "--group-size", "2", "--model", str(model_dir), "-o", "max_searches=1",
            "-o", "max_sub_questions=2"]  # fmt: skip
    assert main([*argv, "--out", str(saved), "--no-progress", "--num-threads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "d2plan compiled with sft,splanrl on 2 synthetic questions" in printed
    assert "splanrl optimizer steps per adapter: {'reasoner': 1}" in printed
    assert (saved / "sft" / "loss.png").is_file() and (saved / "program.json").is_file()
    (record,) = [json.loads(line) for line in (saved / "splanrl" / "metrics.jsonl").read_text().splitlines()]
    assert record["stage"] == "reasoner" and "reward/plan" in record and "groups/skipped" in record


@pytest.mark.parametrize(
    "optimizer, program, message",
    [
        ("grpo", "reap", "--optimizer grpo applies to opera, search_r1, not 'reap'"),
        ("sft,grpo", "stride", "--optimizer grpo applies to opera, search_r1, not 'stride'"),
        ("sft", "react", "--optimizer sft has gold-path targets for"),  # no gold path for ReAct
    ],
)
def test_compile_grpo_names_the_programs_it_applies_to(monkeypatch, capsys, optimizer, program, message):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["compile", "--program", program, "--optimizer", optimizer, "--out", "x"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("program, expected", [("search_r1", "SearchR1GRPO"), ("opera", "JointGRPO")])
def test_compile_grpo_builds_each_programs_own_optimizer(tmp_path, tiny_model, smollm_tokenizer, capsys, monkeypatch,
                                                         program, expected):  # fmt: skip
    """`--optimizer grpo` is Search-R1's plain GRPO on search_r1 and OPERA's JointGRPO on opera (their training runs
    are tested with the optimizers; here compile only records what it was given)."""
    import rolecall.optimizers as optimizers

    built = []

    def record(self, student, *, trainset, **_):
        built.append((self, len(trainset)))
        return student

    monkeypatch.setattr(getattr(optimizers, expected), "compile", record)
    model_dir, saved = tmp_path / "tiny", tmp_path / "out"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", program, "--optimizer", "grpo", "--limit", "3", "--group-size", "3",
            "--time-budget-minutes", "2", "--model", str(model_dir), "--out", str(saved), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    ((optimizer, questions),) = built
    assert type(optimizer).__name__ == expected and questions == 3
    assert optimizer.config.time_budget_s == 120 and optimizer.config.output_dir == str(saved / "grpo")
    group_size = optimizer.grpo_config.group_size if program == "search_r1" else optimizer.mapgrpo_config.group_size
    assert group_size == 3 and (saved / "program.json").is_file()
    assert f"{program} compiled with grpo on 3 synthetic questions" in capsys.readouterr().out


def test_compile_opd_builds_multiagent_opd_from_the_flags(monkeypatch):
    """`--program hierarchical_team --optimizer opd`: MultiAgent-OPD with G = --group-size, each stage within
    --time-budget-minutes / --teacher-minutes and at most --steps / --teacher-steps steps, written to OUT/opd (Stage I
    to OUT/opd/teacher); no model loads."""
    from rolecall.cli_compile import build_optimizers, check_chain
    from rolecall.optimizers import OPD

    argv = ["compile", "--program", "hierarchical_team", "--optimizer", "opd", "--group-size", "5",
            "--time-budget-minutes", "3", "--teacher-minutes", "3", "--steps", "7", "--teacher-steps", "7", "--seed",
            "2", "--out", "runs/x"]  # fmt: skip
    args = build_parser(argv).parse_args(argv)
    (optimizer,) = build_optimizers(args, *check_chain(args))
    cfg = optimizer.opd_config
    assert isinstance(optimizer, OPD) and cfg.group_size == 5 and (cfg.steps, cfg.teacher_steps) == (7, 7)
    assert (cfg.time_budget_minutes, cfg.teacher_minutes, cfg.seed) == (3, 3, 2)
    assert cfg.output_dir == str(Path("runs/x") / "opd") and optimizer.config.time_budget_s == 180
    assert (cfg.beta, cfg.kl_coef, cfg.outcome_only, cfg.teacher_adapter) == (1.0, 1e-3, False, "opd_teacher")
    built = []
    monkeypatch.setattr(
        "rolecall.cli_compile.build_optimizers", lambda args, *_: built.append(args) or pytest.fail("built")
    )
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(pytest.fail.Exception, match="built"):
        main(argv)
    assert len(built) == 1


@pytest.mark.parametrize("program", ["opera", "cascaded_team"])
def test_compile_opd_on_another_program_fails_at_once_naming_hierarchical_team(monkeypatch, capsys, program):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setattr("rolecall.cli_compile.build_optimizers", lambda args, *_: pytest.fail("optimizer built"))
    assert main(["compile", "--program", program, "--optimizer", "opd", "--out", "x"]) == 1
    err = capsys.readouterr().err
    assert f"--optimizer opd applies to hierarchical_team, not {program!r}" in err and "Traceback" not in err


def test_eval_with_a_missing_colbert_index_says_how_to_build_one(tmp_path, capsys):
    missing = tmp_path / "no-index"
    code = main(["eval", "--program", "single_step_rag", "--retriever", "colbert", "--index", str(missing),
                 "--limit", "1", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 1
    assert f"rolecall index --out {missing}" in capsys.readouterr().err
