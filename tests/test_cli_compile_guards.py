"""`rolecall compile` never loses or silently misreads a run: an existing OUT needs --resume (same settings) or
--overwrite, bad flags and damaged inputs fail in one line before the model loads, an adapter that trained no step
keeps its demos, Ctrl-C stops at a checkpoint that --resume continues, and a full disk leaves the last checkpoint
intact. The runs use a tiny random Llama saved to a folder (`--model DIR`)."""

from __future__ import annotations

import errno
import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rolecall.cli import main
from rolecall.errors import ModelLoadError

REPO_ROOT = Path(__file__).resolve().parents[1]
BASE = ["compile", "--program", "opera", "--limit", "3", "--max-steps", "1", "--no-progress", "--num-threads", "2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm_tokenizer) -> Path:
    spec = importlib.util.spec_from_file_location("rolecall_tests_conftest", REPO_ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    folder = tmp_path_factory.mktemp("tiny")
    conftest.make_tiny_llama(smollm_tokenizer).save_pretrained(folder)
    smollm_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def finished_run(model_dir, tmp_path_factory) -> Path:
    """A compile that ran to the end (3 questions, one step per adapter)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*BASE, "--model", str(model_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every check here must come before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr("rolecall.lm.local.LocalLM", refuse)


@pytest.fixture
def checks_passed(monkeypatch):
    """The model load stands for "every check passed": it fails with a marker the test looks for."""

    def stop(*args, **kwargs):
        raise ModelLoadError("checks passed; the model would load now")

    monkeypatch.setattr("rolecall.lm.local.LocalLM", stop)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    """What the CLI wrote to stderr (transformers' own weight-loading bar aside), asserted to be one line."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("Loading weights")]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


# ------------------------------------------------------------------------------------------------- A: OUT exists
def test_a_finished_run_is_never_overwritten_without_a_flag(run_copy, model_dir, no_model, capsys):
    before = snapshot(run_copy)
    assert main([*BASE, "--model", str(model_dir), "--out", str(run_copy)]) == 1
    err = one_line_error(capsys)
    assert str(run_copy) in err and "--resume" in err and "--overwrite" in err
    assert snapshot(run_copy) == before


def test_the_settings_are_saved_and_resume_with_others_names_each_difference(run_copy, model_dir, no_model, capsys):
    saved = json.loads((run_copy / "compile_config.json").read_text())
    assert saved["settings"]["program"] == "opera" and saved["settings"]["optimizers"]["sft"]["learning_rate"] == 2e-3
    argv = [*BASE, "--model", str(model_dir), "--out", str(run_copy), "--resume", "--learning-rate", "0.01"]
    assert main([*argv, "--epochs", "3"]) == 1
    err = one_line_error(capsys)
    assert "--resume" in err and "--epochs 2 --learning-rate 0.002" in err and "--epochs 3 --learning-rate 0.01" in err
    assert "--overwrite" in err and "--max-steps" not in err  # only the fields that differ


def test_resume_of_a_finished_run_with_its_settings_continues_it(run_copy, model_dir, capsys):
    lines = (run_copy / "metrics.jsonl").read_text()
    assert main([*BASE, "--model", str(model_dir), "--out", str(run_copy), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resuming from" in printed and "step 3" in printed  # plan, analysis, synthesis: one step each
    assert (run_copy / "metrics.jsonl").read_text() == lines  # nothing trained twice, nothing lost


def test_overwrite_clears_the_old_run_first(run_copy, model_dir, capsys):
    stale = run_copy / "checkpoints" / "step-00000099"
    shutil.copytree(run_copy / "checkpoints" / "step-00000003", stale)
    (run_copy / "metrics.jsonl").write_text('{"global_step": 42, "stage": "old"}\n')
    argv = [*BASE[:5], "--max-steps", "plan=1,analysis=1,synthesis=1", "--no-progress", "--num-threads", "2"]
    assert main([*argv, "--model", str(model_dir), "--out", str(run_copy), "--overwrite"]) == 0
    assert not stale.exists() and [p.name for p in (run_copy / "checkpoints").iterdir()] == ["step-00000003"]
    steps = [json.loads(line)["global_step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    saved = json.loads((run_copy / "compile_config.json").read_text())["settings"]
    assert saved["optimizers"]["sft"]["max_steps"] == {"plan": 1, "analysis": 1, "synthesis": 1}


def test_overwrite_does_not_clear_a_folder_compile_did_not_write(tmp_path, model_dir, no_model, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("months of work")
    assert main([*BASE, "--model", str(model_dir), "--out", str(out), "--overwrite"]) == 1
    err = one_line_error(capsys)
    assert "thesis.tex" in err and "rolecall compile" in err
    assert (out / "thesis.tex").read_text() == "months of work"


def test_resume_and_overwrite_exclude_each_other(tmp_path, no_model):
    with pytest.raises(SystemExit):
        main([*BASE, "--out", str(tmp_path / "x"), "--resume", "--overwrite"])


# ------------------------------------------------------------------------------------------------ C: OUT is a file
def test_an_out_that_is_a_file_fails_in_one_line_before_the_model_loads(tmp_path, no_model, capsys):
    out = tmp_path / "out.txt"
    out.write_text("x")
    assert main([*BASE, "--out", str(out)]) == 1
    err = one_line_error(capsys)
    assert str(out) in err and "file" in err
    assert main([*BASE, "--out", str(out / "below")]) == 1
    assert str(out) in one_line_error(capsys)


# ------------------------------------------------------------------------------------ B: --max-steps adapter names
def test_max_steps_for_an_unknown_adapter_lists_the_programs_adapters(tmp_path, no_model, capsys):
    assert main([*BASE[:5], "--max-steps", "answr=1", "--out", str(tmp_path / "x")]) == 1
    err = one_line_error(capsys)
    assert "answr" in err and "plan, analysis, rewrite, synthesis" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--program", "opera", "--max-steps", "plan=2,synthesis=1"],
        ["--program", "reap", "--optimizer", "multitask_sft", "--max-steps", "multitask=2"],
        ["--program", "stride", "--optimizer", "sft", "--max-steps", "meta_planner=2"],  # a group of two roles
    ],
)
def test_max_steps_for_the_programs_adapters_passes(argv, tmp_path, checks_passed, capsys):
    assert main(["compile", *argv, "--out", str(tmp_path / "x")]) == 1
    assert "checks passed" in capsys.readouterr().err


def test_max_steps_for_an_adapter_the_roles_flag_leaves_untrained_is_an_error(tmp_path, no_model, capsys):
    argv = ["compile", "--program", "opera", "--roles", "plan", "--max-steps", "synthesis=2"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 1
    err = one_line_error(capsys)
    assert "synthesis" in err and "--roles" in err


def test_sft_rejects_a_max_steps_mapping_with_an_unknown_adapter_before_collecting(tiny_model, smollm_tokenizer):
    from rolecall.data.synthetic import synthetic_world
    from rolecall.errors import ConfigError
    from rolecall.lm import LocalLM
    from rolecall.optimizers.sft import SFT
    from rolecall.programs.registry import build_program

    program = build_program("opera", None, LocalLM(tiny_model, tokenizer=smollm_tokenizer))
    optimizer = SFT(max_steps={"answr": 1}, show_progress=False)
    optimizer._collect_samples = lambda *a, **k: pytest.fail("collected before the names were checked")
    with pytest.raises(ConfigError, match=r"answr.*plan, analysis, rewrite, synthesis"):
        program.compile(optimizer=optimizer, trainset=list(synthetic_world(seed=0).train)[:2])


@pytest.mark.parametrize("max_steps", [0, -1, {"plan": 0}, 1.5, True])
def test_sft_rejects_a_max_steps_below_one(max_steps):
    from rolecall.errors import ConfigError
    from rolecall.optimizers.sft import SFT

    with pytest.raises(ConfigError, match="max_steps"):
        SFT(max_steps=max_steps)


# ------------------------------------------------------------------------------------- D: numbers, zero-step runs
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--limit", "0"], "--limit"),
        (["--limit", "-2"], "--limit"),
        (["--max-steps", "0"], "--max-steps"),
        (["--max-steps", "-1"], "--max-steps"),
        (["--max-steps", "plan=0"], "--max-steps"),
        (["--max-steps", "plan=2,plan=3"], "--max-steps"),
        (["--epochs", "0"], "--epochs"),
        (["--epochs", "nan"], "--epochs"),
        (["--epochs", "inf"], "--epochs"),
        (["--learning-rate", "nan"], "--learning-rate"),
        (["--learning-rate", "0"], "--learning-rate"),
        (["--learning-rate", "inf"], "--learning-rate"),
        (["--micro-batch-size", "0"], "--micro-batch-size"),
        (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps"),
        (["--time-budget-minutes", "0"], "--time-budget-minutes"),
        (["--time-budget-minutes", "nan"], "--time-budget-minutes"),
        (["--time-budget-minutes", "-1"], "--time-budget-minutes"),
        (["--time-budget-minutes", "nan", "--optimizer", "mapgrpo"], "--time-budget-minutes"),  # an RL budget
        (["--time-budget-minutes", "inf", "--optimizer", "mapgrpo"], "--time-budget-minutes"),
    ],
)
def test_bad_numbers_fail_in_one_line_before_the_model_loads(flags, named, tmp_path, no_model, capsys):
    argv = ["compile", "--program", "opera", *flags, "--out", str(tmp_path / "x")]
    assert main(argv) == 1
    err = one_line_error(capsys)
    assert named in err and flags[1] in err
    assert not (tmp_path / "x").exists()


def test_an_adapter_that_trained_no_step_keeps_its_demos(tmp_path, model_dir, capsys):
    """A budget spent by the first step: the other adapters train 0 steps, so they are not marked trained, keep
    their demos, and the output says so."""
    out = tmp_path / "run"
    argv = ["compile", "--program", "opera", "--limit", "3", "--time-budget-minutes", "0.00001", "--no-progress"]
    assert main([*argv, "--num-threads", "2", "--model", str(model_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    trained = {json.loads(line)["adapter"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert trained == {"plan"}  # the very first step always runs
    payload = json.loads((out / "program.json").read_text())
    assert payload["demo_free_adapters"] == ["plan"]
    demos = {k.split(".")[0]: v["demos"] for k, v in payload["state"].items() if isinstance(v, dict) and "demos" in v}
    assert demos["analysis"] and demos["synthesis"] and not demos["plan"]
    assert "analysis: 0 steps" in printed and "keeps its demos" in printed
    for line in printed.splitlines():  # every path printed was written
        if line.startswith("loss curve:"):
            assert Path(line.split(": ", 1)[1]).is_file()


# ------------------------------------------------------------------------------------- F: damaged inputs on resume
@pytest.mark.parametrize("damage", ["adapter", "state", "trainer"])
def test_resume_from_a_damaged_checkpoint_names_the_file_before_the_model_loads(damage, run_copy, model_dir,
                                                                                no_model, capsys):  # fmt: skip
    checkpoint = run_copy / "checkpoints" / "step-00000003"
    target = {"adapter": checkpoint / "adapters" / "plan" / "adapter_model.safetensors",
              "state": checkpoint / "state.json", "trainer": checkpoint / "trainers" / "plan.pt"}[damage]  # fmt: skip
    data = target.read_bytes()
    target.unlink()  # a hard link to the finished adapter's file: write a new one
    target.write_bytes(data[: len(data) // 2])
    assert main([*BASE, "--model", str(model_dir), "--out", str(run_copy), "--resume"]) == 1
    err = one_line_error(capsys)
    assert str(target) in err and "--overwrite" in err


def test_compile_from_a_damaged_program_folder_names_the_file_before_the_model_loads(run_copy, tmp_path, no_model,
                                                                                     capsys):  # fmt: skip
    weights = run_copy / "adapters" / "plan" / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.unlink()
    weights.write_bytes(data[:100])
    argv = ["compile", "--program", "opera", "--from", str(run_copy), "--out", str(tmp_path / "next")]
    assert main(argv) == 1
    assert str(weights) in one_line_error(capsys)
    weights.write_bytes(data)
    payload = json.loads((run_copy / "program.json").read_text())
    del payload["state"]
    (run_copy / "program.json").write_text(json.dumps(payload))
    assert main(argv) == 1
    assert str(run_copy / "program.json") in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------------- G: full disk
def test_a_full_disk_while_checkpointing_stops_in_one_line_and_resume_continues(tmp_path, model_dir, monkeypatch,
                                                                               capsys):  # fmt: skip
    import torch

    from rolecall.optimizers.core import checkpoint as checkpoint_module

    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if "step-00000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", save)
    out = tmp_path / "run"
    argv = [*BASE, "--model", str(model_dir), "--out", str(out)]
    assert main(argv) == 1
    err = one_line_error(capsys)
    assert "No space left on device" in err and str(out / "checkpoints") in err and "--resume" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000001"]  # no half checkpoint
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)  # space freed
    assert main([*argv, "--resume"]) == 0
    assert "resuming from" in capsys.readouterr().out
    steps = [json.loads(line)["global_step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


# ------------------------------------------------------------------------------------------------------ E: Ctrl-C
def test_ctrl_c_stops_at_a_checkpoint_and_resume_continues_from_it(tmp_path, model_dir, capsys):
    """The real CLI in a subprocess, interrupted mid-training (torch's CPU threads left as a user has them: a model
    thread still busy at exit used to abort with "terminate called without an active exception")."""
    from rolecall.optimizers.core.checkpoint import latest_checkpoint

    out = tmp_path / "run"
    argv = ["compile", "--program", "opera", "--limit", "8", "--max-steps", "20", "--epochs", "100",
            "--micro-batch-size", "1", "--gradient-accumulation-steps", "4", "--model", str(model_dir), "--out",
            str(out), "--no-progress", "--num-threads", "2"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "rolecall.cli", *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err and "records.jsonl" not in err
    checkpoint = latest_checkpoint(out / "checkpoints")
    step = json.loads((checkpoint / "state.json").read_text())["global_step"]
    assert step >= 2 and f"step {step}" in err and str(checkpoint) in err
    assert f"rolecall {' '.join(argv)} --resume" in err  # the command that continues it
    lines = [json.loads(line)["global_step"] for line in metrics.read_text().splitlines()]
    assert lines == list(range(1, step + 1))
    assert main([*argv, "--resume"]) == 0
    assert f"resuming from {checkpoint} (step {step})" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and step < summary["global_step"] == sum(summary["planned"].values())
    lines = [json.loads(line)["global_step"] for line in metrics.read_text().splitlines()]
    assert lines == list(range(1, summary["global_step"] + 1))  # continued from the checkpoint: none lost or rerun


@pytest.mark.parametrize("command, says", [("demo", "rolecall demo"), ("eval", "records.jsonl")])
def test_the_interrupt_message_fits_the_command(command, says, monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    argv = {"demo": ["demo", "--out", str(tmp_path)], "eval": ["eval", "--program", "opera", "--out", str(tmp_path)]}
    import rolecall.cli as cli

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda argv=None: _with_func(parser(argv), interrupted))
    assert main(argv[command]) == 130
    err = capsys.readouterr().err
    assert says in err and ("--resume" not in err if command == "demo" else True)


def _with_func(parser, func):
    """The parser, every subcommand running ``func``."""
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            sub.set_defaults(func=func)
    return parser


# ------------------------------------------------------------------------------------------------- reproducibility
def test_two_compiles_with_the_same_seed_train_the_same_adapters(tmp_path, model_dir):
    """The new adapters' LoRA A matrices come from the seeded RNG, so two fresh compiles of the same settings end with
    byte-identical adapters (before, A was drawn unseeded and the runs parted from their second step)."""
    argv = ["compile", "--program", "single_step_rag", "--limit", "4", "--max-steps", "3", "--no-progress",
            "--num-threads", "2", "--model", str(model_dir)]  # fmt: skip
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main([*argv, "--out", str(out)]) == 0
    a, b = (out / "adapters" / "answer" / "adapter_model.safetensors" for out in outs)
    assert a.read_bytes() == b.read_bytes()
