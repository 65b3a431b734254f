"""Fault injection: each way a run is cut short or its files are damaged, and what the next run does about it.

Every test drives the real CLI, ``main([...])`` in-process or ``python -m rolecall.cli`` in a subprocess for the
signals, on a tiny random Llama saved to a folder (``--model DIR``). A fault is survived when the next run either
resumes with nothing lost (every training step / question exactly once, and the steps trained again give the losses
the first run logged for them) or stops with one clear line naming the file, having changed nothing. Where both
continue the same checkpoint, a resumed compile is also compared with an uninterrupted one, losses and adapter bytes
(fresh compiles are seeded too: ``tests/test_cli_compile_guards.py``).

==========================  ===============================  ========================================================
fault                       surface                          survived when
==========================  ===============================  ========================================================
damaged adapter file:       ``eval --load``                  exit 1, one stderr line naming the file, no traceback,
truncated safetensors,      ``compile --from``               OUT not created, no model loaded
0 bytes, config not JSON    ``serve --adapter`` / ``--load``
damaged checkpoint          ``compile --resume``, an older   the older one is used with a warning naming the file;
(adapter truncated)         intact checkpoint kept           completes; losses and adapters = the uninterrupted run's
                            ``compile --resume``, only one   one line naming the file; OUT unchanged, no model loaded
damaged records.jsonl       ``eval --resume``, last line     that question runs again; every question once
                            cut (what a kill leaves)
                            ``eval --resume``, garbage       one line naming ``file:line``; OUT unchanged
                            line in the middle
SIGKILL mid-step            ``compile`` (>= 2 steps done)    ``--resume`` completes: steps 1..N once; each step the
                                                             killed run logged is logged again with the same loss
                            ``eval`` (>= 1 record written)   ``--resume`` finishes: every question once, the records
                                                             written before the kill unchanged
SIGINT mid-step (Ctrl-C)    ``compile``                      exit 130, no traceback, no "terminate called", the
                                                             line names the checkpoint; ``--resume`` as for SIGKILL
                            ``eval``                         exit 130, no traceback, no "terminate called", the
                                                             records intact; ``--resume`` finishes
disk full (injected         ``compile`` checkpoint write     one line naming the folder and the OS error, no half
``OSError(ENOSPC)``)                                         checkpoint; ``--resume`` as for SIGKILL
                            ``eval`` records.jsonl write     one line naming the file; the records written before it
                                                             intact; ``--resume`` finishes
==========================  ===============================  ========================================================

Run with ``.venv/bin/pytest -q tests/faults/test_fault_injection.py``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dspy
import pytest
from dspy.clients.cache import Cache

from rolecall.cli import main
from tests.conftest import make_tiny_llama

REPO_ROOT = Path(__file__).resolve().parents[2]
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
# OPERA's plan, analysis and synthesis adapters, 5 steps each (15 in all), two samples a step: enough steps that a
# signal after the second lands mid-training.
COMPILE = ["compile", "--program", "opera", "--limit", "4", "--max-steps", "5", "--epochs", "100", "--micro-batch-size",
           "1", "--gradient-accumulation-steps", "2", "--no-progress", "--num-threads", "2"]  # fmt: skip
STEPS = 15
EVAL = ["eval", "--program", "single_step_rag", "--k", "2", "--max-tokens", "8", "--threads", "2", "--no-progress",
        "-o", "demos=null"]  # fmt: skip
DAMAGES = ["truncated", "empty", "config"]
INTERRUPTED_EVAL = "interrupted; finished questions are in records.jsonl (rerun with --resume)"


# --------------------------------------------------------------------------------------------------------- fixtures
def _no_dspy_cache() -> Cache:
    """DSPy's response cache keys on the model folder's name, which every tiny model shares: keep it off."""
    return Cache(False, False, None)


@pytest.fixture(autouse=True)
def _uncached(monkeypatch):
    monkeypatch.setattr(dspy, "cache", _no_dspy_cache())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm_tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    make_tiny_llama(smollm_tokenizer).save_pretrained(folder)
    smollm_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory) -> Path:
    """An uninterrupted compile with :data:`COMPILE`'s settings. It keeps two checkpoints, as a SIGKILL between
    writing a checkpoint and pruning the one before it leaves them (the compile CLI keeps one: SFT has no
    ``keep_checkpoints`` setting)."""
    from rolecall.optimizers.core import base

    real_save = base.save_checkpoint

    def keep_two(*args, **kwargs):
        return real_save(*args, **{**kwargs, "keep": 2})

    out = tmp_path_factory.mktemp("reference") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base, "save_checkpoint", keep_two)
        mp.setattr(dspy, "cache", _no_dspy_cache())
        assert main([*COMPILE, "--model", str(model_dir), "--out", str(out)]) == 0
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000014", "step-00000015"]
    return out


@pytest.fixture
def compiled(reference, tmp_path) -> Path:
    """A copy of the reference compile (its checkpoints' hard links become separate files)."""
    out = tmp_path / "compiled"
    shutil.copytree(reference, out)
    return out


@pytest.fixture(scope="module")
def evaluated(model_dir, tmp_path_factory) -> Path:
    """A finished evaluation of 6 questions."""
    out = tmp_path_factory.mktemp("evaluated") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dspy, "cache", _no_dspy_cache())
        assert main([*EVAL, "--model", str(model_dir), "--limit", "6", "--out", str(out)]) == 0
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the fault must be found before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the damaged file was found")

    monkeypatch.setattr("rolecall.lm.local.LocalLM", refuse)


# ---------------------------------------------------------------------------------------------------------- helpers
def damage(path: Path, how: str = "truncated") -> Path:
    """Damage ``path`` (a new file: the old one may be a hard link shared with another checkpoint)."""
    data = path.read_bytes()
    path.unlink()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    else:
        path.write_text("{ not json")
    return path


def damage_adapter(folder: Path, how: str) -> Path:
    """Damage the adapter in ``folder`` (``how``: one of :data:`DAMAGES`); returns the damaged file."""
    return damage(folder / (CONFIG if how == "config" else WEIGHTS), how)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    """What the CLI wrote to stderr, asserted to be one line (transformers' weight-loading bar and the warnings that
    the tiny model's answers were cut at --max-tokens aside: they come before the error, as they would in any run)."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if not line.startswith("Loading weights") and "LM response was truncated" not in line]  # fmt: skip
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_nothing_lost(out: Path, logged: list[dict], reference: Path | None = None) -> None:
    """Every step exactly once, the run completed as planned, and every step the interrupted run had logged (those
    after its checkpoint too, which the resumed run trained again) logged again with the same loss.

    A resume restores the adapters, optimizer and RNG states and the sample streams, so the steps it trains again
    are exact. Two *fresh* compiles with the same settings are not: each LoRA adapter's A matrix is drawn from
    torch's unseeded RNG when the program is built (their step-1 losses agree, the gradients do not), so a killed
    run's later steps have no uninterrupted twin to compare with. With ``reference`` (a run resumed from the
    reference's own checkpoint) the losses and the final adapters are compared with it, byte for byte.
    """
    metrics = metrics_of(out)
    assert [r["global_step"] for r in metrics] == list(range(1, STEPS + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["global_step"] == sum(summary["planned"].values()) == STEPS
    assert logged, "the interrupted run logged no step"
    for before in logged:
        after = metrics[before["global_step"] - 1]
        assert (after["adapter"], after["step"], after["loss/total"]) == (
            before["adapter"], before["step"], before["loss/total"]), (before, after)  # fmt: skip
    if reference is not None:
        for adapter in ("plan", "analysis", "synthesis"):
            weights = Path("adapters") / adapter / WEIGHTS
            assert (out / weights).read_bytes() == (reference / weights).read_bytes(), adapter


def logged_steps(out: Path) -> list[dict]:
    """The complete lines of ``out``'s metrics.jsonl now."""
    return [json.loads(line) for line in complete_lines(out / "metrics.jsonl").splitlines()]


def records_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def assert_every_question_once(out: Path, n: int) -> None:
    ids = Counter(r["id"] for r in records_of(out))
    assert len(ids) == n and set(ids.values()) == {1}, ids
    assert json.loads((out / "summary.json").read_text())["n"] == n


def complete_lines(path: Path) -> str:
    """The lines of ``path`` a kill cannot have cut (those that end in a newline)."""
    text = path.read_text() if path.is_file() else ""
    return text[: text.rfind("\n") + 1]


def start_cli(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    """``rolecall ARGV`` in a subprocess (its own DSPy cache folder, torch's threads as a user has them)."""
    env = {**os.environ, "DSPY_CACHEDIR": str(tmp_path / "dspy-cache")}
    return subprocess.Popen([sys.executable, "-m", "rolecall.cli", *argv], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def signal_after(proc: subprocess.Popen, path: Path, lines: int, sig: signal.Signals) -> str:
    """Send ``sig`` once ``path`` has ``lines`` complete lines; wait for the process and return its stderr."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if complete_lines(path).count("\n") >= lines:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()[1][-3000:]  # it must still be running: mid-step
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    return err


# ----------------------------------------------------------------------------------------- 1: damaged adapter file
@pytest.mark.parametrize("how", DAMAGES)
def test_eval_load_of_a_damaged_adapter_is_one_line(how, compiled, tmp_path, no_model, capsys):
    bad = damage_adapter(compiled / "adapters" / "plan", how)
    out = tmp_path / "eval"
    assert main(["eval", "--load", str(compiled), "--out", str(out)]) == 1
    assert str(bad) in one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("how", DAMAGES)
def test_compile_from_a_damaged_adapter_is_one_line(how, compiled, tmp_path, no_model, capsys):
    bad = damage_adapter(compiled / "adapters" / "analysis", how)
    out = tmp_path / "next"
    assert main(["compile", "--program", "opera", "--from", str(compiled), "--out", str(out)]) == 1
    assert str(bad) in one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("how", DAMAGES)
def test_serve_of_a_damaged_adapter_is_one_line(how, compiled, tmp_path, capsys):
    """The model folder does not exist: had it been loaded before the adapters were checked, its error would show."""
    bad = damage_adapter(compiled / "adapters" / "synthesis", how)
    model = str(tmp_path / "no-model")
    assert main(["serve", "--model", model, "--adapter", f"synthesis={compiled / 'adapters' / 'synthesis'}"]) == 1
    assert str(bad) in one_line_error(capsys)
    assert main(["serve", "--model", model, "--load", str(compiled)]) == 1
    assert str(bad) in one_line_error(capsys)


# --------------------------------------------------------------------------------------------- 2: damaged checkpoint
def test_compile_resume_skips_a_damaged_newest_checkpoint_for_the_one_before(compiled, reference, model_dir, capsys,
                                                                             caplog):  # fmt: skip
    newest, older = compiled / "checkpoints" / "step-00000015", compiled / "checkpoints" / "step-00000014"
    bad = damage(newest / "adapters" / "plan" / WEIGHTS)
    assert main([*COMPILE, "--model", str(model_dir), "--out", str(compiled), "--resume"]) == 0
    assert f"resuming from {older} (step 14)" in capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and str(bad) in r.getMessage()]
    assert len(warnings) == 1 and "damaged checkpoint" in warnings[0], warnings
    assert_nothing_lost(compiled, metrics_of(reference), reference)  # step 15 again, as the uninterrupted run did


def test_compile_resume_of_a_lone_damaged_checkpoint_is_one_line(compiled, model_dir, no_model, capsys):
    shutil.rmtree(compiled / "checkpoints" / "step-00000014")  # what the CLI keeps: the newest checkpoint only
    bad = damage(compiled / "checkpoints" / "step-00000015" / "adapters" / "plan" / WEIGHTS)
    before = snapshot(compiled)
    assert main([*COMPILE, "--model", str(model_dir), "--out", str(compiled), "--resume"]) == 1
    err = one_line_error(capsys)
    assert str(bad) in err and "--overwrite" in err
    assert snapshot(compiled) == before


# ------------------------------------------------------------------------------------------ 3: damaged records.jsonl
def test_eval_resume_redoes_the_question_of_a_cut_last_line(evaluated, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(evaluated, out)
    path = out / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # killed while writing the last record
    assert main([*EVAL, "--model", str(model_dir), "--limit", "6", "--out", str(out), "--resume"]) == 0
    assert_every_question_once(out, 6)
    assert path.read_text().startswith("\n".join(lines[:-1]) + "\n")  # the others untouched


def test_eval_resume_of_a_garbage_middle_line_is_one_line(evaluated, model_dir, tmp_path, no_model, capsys):
    out = tmp_path / "run"
    shutil.copytree(evaluated, out)
    path = out / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], "{ garbage", *lines[2:]]) + "\n")
    before = snapshot(out)
    assert main([*EVAL, "--model", str(model_dir), "--limit", "6", "--out", str(out), "--resume"]) == 1
    assert f"{path}:3:" in one_line_error(capsys)
    assert snapshot(out) == before


# ------------------------------------------------------------------------------------------- 4, 5: SIGKILL, SIGINT
def test_compile_killed_mid_step_resumes_with_nothing_lost(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*COMPILE, "--model", str(model_dir), "--out", str(out)]
    signal_after(start_cli(argv, tmp_path), out / "metrics.jsonl", 2, signal.SIGKILL)
    logged = logged_steps(out)
    assert len(logged) < STEPS
    assert main([*argv, "--resume"]) == 0
    assert "resuming from" in capsys.readouterr().out
    assert_nothing_lost(out, logged)


def test_compile_interrupted_mid_step_stops_cleanly_and_resumes_with_nothing_lost(model_dir, tmp_path, capsys):
    from rolecall.optimizers.core.checkpoint import latest_checkpoint

    out = tmp_path / "run"
    argv = [*COMPILE, "--model", str(model_dir), "--out", str(out)]
    proc = start_cli(argv, tmp_path)
    err = signal_after(proc, out / "metrics.jsonl", 2, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
    checkpoint = latest_checkpoint(out / "checkpoints")
    step = json.loads((checkpoint / "state.json").read_text())["global_step"]
    last = err.strip().splitlines()[-1]
    assert f"step {step}" in last and str(checkpoint) in last and "--resume" in last, last
    logged = logged_steps(out)
    assert [r["global_step"] for r in logged] == list(range(1, step + 1))  # the running step finished and saved
    assert main([*argv, "--resume"]) == 0
    assert_nothing_lost(out, logged)


def test_eval_killed_mid_run_resumes_with_every_question_once(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*EVAL, "--model", str(model_dir), "--limit", "16", "--out", str(out)]
    signal_after(start_cli(argv, tmp_path), out / "records.jsonl", 1, signal.SIGKILL)
    written = complete_lines(out / "records.jsonl")
    assert 1 <= written.count("\n") < 16
    assert main([*argv, "--resume"]) == 0
    assert_every_question_once(out, 16)
    assert (out / "records.jsonl").read_text().startswith(written)


def test_eval_interrupted_mid_run_stops_cleanly_and_resumes(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*EVAL, "--model", str(model_dir), "--limit", "16", "--out", str(out)]
    proc = start_cli(argv, tmp_path)
    err = signal_after(proc, out / "records.jsonl", 1, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == INTERRUPTED_EVAL
    written = (out / "records.jsonl").read_text()
    assert written.endswith("\n") and 1 <= written.count("\n") < 16  # whole records only
    assert main([*argv, "--resume"]) == 0
    assert_every_question_once(out, 16)
    assert (out / "records.jsonl").read_text().startswith(written)


# ------------------------------------------------------------------------------------------------------ 6: disk full
@pytest.fixture
def full_disk(monkeypatch) -> Iterator[list[str]]:
    """``full_disk.append(fragment)``: from then on, a ``torch.save`` of a checkpoint file whose path holds
    ``fragment`` fails as a full disk does (ENOSPC); clearing the list frees the space."""
    import torch

    from rolecall.optimizers.core import checkpoint

    real_save, full = torch.save, []

    def save(obj, path, *args, **kwargs):
        if any(fragment in str(path) for fragment in full):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    yield full


def test_compile_with_a_full_disk_at_a_checkpoint_is_one_line_and_resumes(full_disk, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*COMPILE, "--model", str(model_dir), "--out", str(out)]
    full_disk.append("step-00000007")
    assert main(argv) == 1
    err = one_line_error(capsys)
    assert os.strerror(errno.ENOSPC) in err and str(out / "checkpoints") in err and "--resume" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000006"]  # no half checkpoint
    logged = logged_steps(out)
    assert [r["global_step"] for r in logged] == list(range(1, 8))  # step 7 trained, its checkpoint not written
    full_disk.clear()  # space freed
    assert main([*argv, "--resume"]) == 0
    assert_nothing_lost(out, logged)  # step 7 trained again from step 6's checkpoint: the same loss


def test_eval_with_a_full_disk_at_a_record_is_one_line_and_resumes(model_dir, tmp_path, monkeypatch, capsys):
    """The third record's write fails half-way, as on a full disk: the first two stay, the cut line is redone."""
    from rolecall.evaluation.records import RecordWriter

    real_write, writes = RecordWriter.write_json, []

    def write_json(self, value):
        writes.append(value["id"])
        if len(writes) == 3:
            self._file.write(json.dumps(value)[:30])
            self._file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, value)

    monkeypatch.setattr(RecordWriter, "write_json", write_json)
    out = tmp_path / "run"
    argv = [*EVAL, "--model", str(model_dir), "--limit", "6", "--out", str(out)]
    assert main(argv) == 1
    err = one_line_error(capsys)
    assert os.strerror(errno.ENOSPC) in err and str(out / "records.jsonl") in err and "--resume" in err
    written = complete_lines(out / "records.jsonl")
    assert [json.loads(line)["id"] for line in written.splitlines()] == writes[:2]
    monkeypatch.setattr(RecordWriter, "write_json", real_write)  # space freed
    assert main([*argv, "--resume"]) == 0
    assert_every_question_once(out, 6)
    assert (out / "records.jsonl").read_text().startswith(written)
