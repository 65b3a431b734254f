"""``rolecall tune`` on the tiny random Llama: help, one-line errors before anything loads, a run whose best config
``rolecall compile --config`` trains with, and a study SIGKILLed mid-trial that a rerun resumes with its finished
trials kept and the killed trial retried."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
import torch

from rolecall.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def model_dir(tmp_path, tiny_model, smollm_tokenizer) -> Path:
    path = tmp_path / "tiny"
    tiny_model.save_pretrained(path)
    smollm_tokenizer.save_pretrained(path)
    return path


def _tune_argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["tune", "--program", "single_step_rag", "--optimizer", "sft", "--model", str(model), "--limit", "4",
            "--dev-limit", "2", "--num-threads", "2", "--max-steps", "1", "--no-progress",
            "--param", "learning_rate=float:1e-4:1e-2:log", "--out", str(out), *extra]  # fmt: skip


def test_tune_help_names_the_search_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert all(flag in text for flag in ("--simplex", "--param", "--sampler", "--pruner", "--eval-every", "--config"))


@pytest.mark.parametrize("extra, message", [
    ([], "the search space is empty"),
    (["--param", "learnin_rate=float:0:1"], "SFTConfig has no field 'learnin_rate'; valid fields are: "),
    (["--param", "learning_rate=log:0:1"], "use NAME=float:LOW:HIGH"),
    (["--param", "learning_rate=float:1e-4:1e-2", "--sampler", "grid"], "needs a step for float param"),
    (["--param", "learning_rate=float:1e-4:1e-2", "--prune-below", "0.1"], "add --pruner threshold"),
    (["--param", "learning_rate=float:1e-4:1e-2", "--pruner", "threshold"], "needs the score below which"),
    (["--simplex", "plan_weights=logic,execution"], "SFTConfig has no field 'plan_weights'"),
])  # fmt: skip
def test_bad_searches_fail_in_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    argv = ["tune", "--program", "single_step_rag", "--optimizer", "sft", "--out", str(tmp_path / "t"), *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("rolecall tune: error: ") and message in err and "Traceback" not in err


def test_tune_then_compile_with_the_best_config(model_dir, tmp_path, capsys):
    out = tmp_path / "tune"
    assert main(_tune_argv(model_dir, out, "--trials", "2", "--eval-every", "1", "--no-plots")) == 0
    printed = capsys.readouterr().out
    assert "2 trials, 2 complete" in printed and f"best config: {out / 'best_config.json'}" in printed
    best = json.loads((out / "best_config.json").read_text())
    assert list(best) == ["sft"] and list(best["sft"]) == ["learning_rate"]
    summary = json.loads((out / "trials.json").read_text())
    trials = summary["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"] and all(t["intermediate_values"] for t in trials)
    # trial 0 runs SFT's default learning rate, and the summary compares the best trial with it
    assert [t["defaults"] for t in trials] == [True, False] and trials[0]["params"] == {"learning_rate": 2e-3}
    assert summary["defaults"]["number"] == 0 and "(defaults)" in printed and "best - defaults: " in printed
    assert main(_tune_argv(model_dir, out, "--trials", "2")) == 0  # rerun: resumed, nothing left to do
    assert "2 trials, 2 complete; 0 run now" in capsys.readouterr().out
    assert main(_tune_argv(model_dir, out, "--trials", "2", "--metric", "f1")) == 1  # another search: refused
    assert "was run with metric='em'" in capsys.readouterr().err

    saved = tmp_path / "compiled"
    config = str(out / "best_config.json")
    argv = ["compile", "--program", "single_step_rag", "--model", str(model_dir), "--limit", "2", "--max-steps", "1",
            "--num-threads", "2", "--no-progress", "--config", config, "--out", str(saved)]  # fmt: skip
    assert main(argv) == 0
    used = json.loads((saved / "sft_config.json").read_text())
    assert used["learning_rate"] == best["sft"]["learning_rate"] and used["max_steps"] == 1


STALE_AFTER = 3.5
"""Seconds after a kill by which a 1-second-heartbeat trial reads as dead: the grace period (2 s) plus 1 s, since
SQLite stamps heartbeats in whole seconds (a beat at 05.9 s and a check at 08.1 s read 05 and 08, 3 s; at 07.9 s
they read 2 s, not stale), plus a margin."""


def test_a_sigkilled_study_resumes_with_its_finished_trials(model_dir, tmp_path):
    """A subprocess runs the study; it is SIGKILLed while a trial runs, after at least one finished. The rerun finds
    the dead trial by its heartbeat (1 s; dead after 2 s), marks it FAIL and retries its parameters first."""
    out = tmp_path / "tune"
    argv = _tune_argv(model_dir, out, "--heartbeat-seconds", "1", "--no-plots")
    storage = f"sqlite:///{out / 'study.db'}"
    for attempt in range(3):  # the trial seen running may finish before the kill lands: then kill the resumed study
        _kill_while_a_trial_runs(argv, out / "study.db", tmp_path / f"killed{attempt}.log")
        killed = optuna.load_study(study_name="rolecall-tune", storage=storage).get_trials()
        finished = [t for t in killed if t.state.is_finished()]
        running = [t for t in killed if t.state == optuna.trial.TrialState.RUNNING]
        if running:
            break
        time.sleep(STALE_AFTER)  # past the grace period before the next attempt reopens the study
    assert finished and len(running) == 1
    time.sleep(STALE_AFTER)  # past the grace period: the killed trial's last heartbeat is stale

    assert main([*argv, "--trials", str(len(finished) + 1)]) == 0
    trials = optuna.load_study(study_name="rolecall-tune", storage=storage).get_trials()
    for old in finished:  # kept as they were
        new = trials[old.number]
        assert (new.state, new.value, new.params) == (old.state, old.value, old.params)
    assert trials[running[0].number].state == optuna.trial.TrialState.FAIL
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == running[0].number]
    assert len(retry) == 1 and retry[0].state.is_finished() and retry[0].params == running[0].params
    assert sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in trials) == len(
        finished) + 1  # fmt: skip


def _kill_while_a_trial_runs(argv: list[str], db: Path, log: Path) -> None:
    """Runs ``rolecall tune`` in a subprocess and SIGKILLs it once a trial has finished and the one after it runs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    before = len(_states(db))
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "rolecall.cli", *argv, "--trials", "50"], cwd=REPO, env=env,
                                stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 240
    try:
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no finished trial within 240 s"
            states = _states(db)
            # kill once the running trial has a heartbeat, so this test covers the stale-heartbeat path (a trial
            # killed before its first beat is reclaimed too: tests/tuning/test_study.py)
            new = states[before:]
            if "COMPLETE" in new and new[-1] == "RUNNING" and _last_trial_beat(db):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()


def _states(path: Path) -> list[str]:
    """The states of the study's trials, read from its SQLite file while another process writes it. Read-only and
    through sqlite3: opening it as an optuna storage would race the writer creating the schema (both insert the
    alembic version row)."""
    import sqlite3

    if not path.is_file():
        return []
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return [state for (state,) in db.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.OperationalError:  # the tables are not created yet, or the writer holds a lock
        return []


def _last_trial_beat(path: Path) -> bool:
    """Whether the study's last trial has recorded a heartbeat (read as :func:`_states` reads)."""
    import sqlite3

    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT COUNT(*) FROM trial_heartbeats WHERE trial_id = "
                             "(SELECT trial_id FROM trials ORDER BY number DESC LIMIT 1)").fetchone()  # fmt: skip
    except sqlite3.OperationalError:
        return False
    return bool(row and row[0])


def test_compile_and_tune_from_a_saved_program(model_dir, tmp_path, capsys):
    """``--from DIR`` starts training from a saved program's adapters (with a learning rate of ~0 they come back as
    they were, not at the identity), and a tune study starts every trial from them."""
    from safetensors.torch import load_file

    first = tmp_path / "first"
    common = ["--program", "single_step_rag", "--model", str(model_dir), "--limit", "2", "--max-steps", "1",
              "--num-threads", "2", "--no-progress"]  # fmt: skip
    assert main(["compile", *common, "--out", str(first)]) == 0
    again = tmp_path / "again"
    assert main(["compile", *common, "--learning-rate", "1e-7", "--from", str(first), "--out", str(again)]) == 0
    before = load_file(first / "adapters" / "answer" / "adapter_model.safetensors")
    after = load_file(again / "adapters" / "answer" / "adapter_model.safetensors")
    lora_b = [k for k in before if "lora_B" in k]
    assert lora_b and any(before[k].abs().sum() > 0 for k in lora_b)  # the first compile trained: B left 0
    assert all(torch.allclose(before[k], after[k], atol=1e-5) for k in before)  # the second started from it
    capsys.readouterr()

    out = tmp_path / "tune"
    argv = _tune_argv(model_dir, out, "--trials", "1", "--no-plots", "--from", str(first))
    assert main(argv) == 0 and "1 trials, 1 complete" in capsys.readouterr().out
    assert main([*argv[:-2], "--from", str(again)]) == 1  # a resumed study starts from the same program
    assert "was run with from=" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--from", "{tmp}/nothing"], "program.json does not exist"),
    (["--from", "{saved}", "--program", "opera"], "pass --program single_step_rag"),
    (["--from", "{saved}", "-o", "top_k=3"], "drop -o top_k=3"),
])  # fmt: skip
def test_a_bad_from_fails_in_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, extra, message):
    from rolecall.programs.core.saving import STATE_FILE

    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / STATE_FILE).write_text(json.dumps({"program": "rolecall.programs.baselines.direct.SingleStepRAG"}))
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    extra = [e.format(tmp=tmp_path, saved=saved) for e in extra]
    program = ["--program", "single_step_rag"] if "--program" not in extra else []
    assert main(["compile", *program, *extra, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rolecall compile: error: --from ") and message in err and "Traceback" not in err


def test_splanrl_from_a_saved_program_skips_its_cold_start(tmp_path):
    from rolecall.cli import build_parser
    from rolecall.cli_compile import build_optimizers

    args = build_parser().parse_args(["compile", "--program", "d2plan", "--optimizer", "splanrl", "--from",
                                      str(tmp_path), "--out", str(tmp_path / "o")])  # fmt: skip
    assert build_optimizers(args, ["splanrl"], ["splanrl"])[0].splanrl_config.cold_start == "none"
    args.from_dir = None
    assert build_optimizers(args, ["splanrl"], ["splanrl"])[0].splanrl_config.cold_start == "self"
