"""Tests of `rolecall eval`: its run folder, flags and failure reports (issue 54: nothing lost, nothing silently wrong).

The run-folder tests use a fake program (no model); the LM tests run the real ``LocalLM`` on a tiny random Llama.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import dspy
import pytest

from rolecall.cli import main
from rolecall.programs import registry
from rolecall.programs.core.trajectory import Step, Trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]


class Echo:
    """A program that needs no model: answers with the top passage's title (or ``options["fixed"]``)."""

    calls = 0

    def __init__(self, retriever=None, *, lm=None, top_k=5, **options):
        self.retriever, self.top_k, self.options = retriever, top_k, options

    def __call__(self, question: str) -> dspy.Prediction:
        Echo.calls += 1
        traj = Trajectory(question=question)
        passages = self.retriever(question, self.top_k) if self.retriever is not None else []
        traj.add(Step(kind="retrieval", role="search", outputs={"passage_ids": [p.id for p in passages]}))
        return dspy.Prediction(answer=self.options.get("fixed") or passages[0].title, trajectory=traj)


class NoModel:
    """Stands in for LocalLM where a test checks that a bad call stops before any model loads."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a model was loaded before the bad value was reported")


class FakeLM:
    """Stands in for LocalLM in the run-folder tests (the fake program makes no LM call)."""

    def __init__(self, model, *, temperature=0.0, max_tokens=256):
        self.model = model


@pytest.fixture
def echo(monkeypatch):
    """Register Echo as ``echo`` (and again as ``echo2``) and replace LocalLM by FakeLM."""
    module = types.ModuleType("fake_rolecall_eval_programs")
    module.Echo = Echo
    monkeypatch.setitem(sys.modules, "fake_rolecall_eval_programs", module)
    monkeypatch.setitem(registry.PROGRAMS, "echo", "fake_rolecall_eval_programs:Echo")
    monkeypatch.setitem(registry.PROGRAMS, "echo2", "fake_rolecall_eval_programs:Echo")
    monkeypatch.setattr("rolecall.lm.local.LocalLM", FakeLM)
    Echo.calls = 0
    return Echo


def _eval(out: Path, *extra: str, program: str = "echo") -> list[str]:
    return ["eval", "--program", program, "--limit", "4", "--out", str(out), "--no-progress", *extra]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------------------ 1: a folder with records
def test_eval_refuses_a_folder_with_records_before_writing_or_loading(echo, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(_eval(out)) == 0
    before = _snapshot(out)
    capsys.readouterr()
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(_eval(out, "--seed", "3")) == 1
    err = _one_line_error(capsys)
    assert str(out / "records.jsonl") in err and "--resume" in err and "--overwrite" in err and "resume=True" not in err
    assert _snapshot(out) == before  # config.json still describes the records


def test_eval_overwrite_clears_the_old_records(echo, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_eval(out, "-o", "fixed=old")) == 0
    assert main([*_eval(out, "-o", "fixed=new"), "--limit", "2", "--overwrite"]) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in records] == ["new", "new"]
    assert json.loads((out / "config.json").read_text())["option"] == ["fixed=new"]
    assert json.loads((out / "summary.json").read_text())["n"] == 2
    report = (out / "report.html").read_text()  # written at the end of each eval, from the new records
    table = report.split('<table id="questions">', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert table.count("<tr") == 2 and "report.html" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # one or the other
        main([*_eval(out), "--resume", "--overwrite"])


# ------------------------------------------------------------------------------------- 2: --resume checks the config
def test_resume_refuses_another_evaluation_naming_each_field(echo, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(_eval(out, "-o", "fixed=a")) == 0
    before = _snapshot(out)
    capsys.readouterr()
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    argv = _eval(out, "--resume", "--seed", "7", "--k", "3", "-o", "fixed=b", "--temperature", "0.5", program="echo2")
    assert main(argv) == 1
    err = _one_line_error(capsys)
    for field in ("program: saved 'echo', now 'echo2'", "seed: saved 0, now 7", "k: saved 5, now 3",
                  "temperature: saved 0.0, now 0.5", "-o: saved {'fixed': 'a'}, now {'fixed': 'b'}"):  # fmt: skip
        assert field in err, err
    assert "--overwrite" in err and echo.calls == 4
    assert _snapshot(out) == before


def test_resume_allows_run_flags_and_another_limit(echo, tmp_path, capsys):
    """--threads, --no-progress, -v and --limit may change on resume: a larger --limit runs the new questions only."""
    out = tmp_path / "run"
    assert main(_eval(out, "--threads", "2")) == 0
    assert main([*_eval(out, "--resume", "--threads", "5", "-v"), "--limit", "6"]) == 0
    assert echo.calls == 6 and len((out / "records.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "summary.json").read_text())["n"] == 6
    assert json.loads((out / "config.json").read_text())["limit"] == 6  # the config describes the summary


def test_resume_reads_a_config_written_before_settings_were_recorded(echo, tmp_path, monkeypatch, capsys):
    """An older config.json (the flags alone; --max-tokens 256 then meant what no flag means now, split null meant
    the whole file of a real dataset) resumes with the same flags and names the split that changed."""
    out = tmp_path / "run"
    assert main(_eval(out)) == 0
    old = json.loads((out / "config.json").read_text())
    old = {k: v for k, v in old.items() if k not in ("settings", "overwrite")} | {"split": None, "max_tokens": 256}
    (out / "config.json").write_text(json.dumps(old))
    assert main(_eval(out, "--resume")) == 0 and echo.calls == 4
    (out / "config.json").write_text(json.dumps(old | {"dataset": "musique"}))
    capsys.readouterr()
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(_eval(out, "--resume", "--dataset", "musique")) == 1
    assert "--split: saved 'all', now 'test'" in _one_line_error(capsys)


def test_resume_of_records_without_a_config_is_refused(echo, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(_eval(out)) == 0
    (out / "config.json").unlink()
    capsys.readouterr()
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(_eval(out, "--resume")) == 1
    err = _one_line_error(capsys)
    assert "config.json" in err and "--overwrite" in err


# ------------------------------------------------------------------------------------------ 3: the held-out split
def test_real_data_defaults_to_the_held_out_test_split(echo, shared_data, tmp_path, monkeypatch, capsys):
    from rolecall.cli_common import DEFAULT_DATA_PATHS
    from rolecall.data import hash_split
    from rolecall.data.corpus import load_dataset

    monkeypatch.chdir(REPO_ROOT)
    _, test = hash_split(load_dataset("musique", DEFAULT_DATA_PATHS["musique"]), fraction=0.8)
    argv = ["eval", "--program", "echo", "--dataset", "musique", "--no-progress", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    ids = {json.loads(line)["id"] for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()}
    assert ids == {e.id for e in test}
    assert "split: test" in printed
    assert json.loads((tmp_path / "run" / "config.json").read_text())["split"] == "test"
    assert main(argv[:-1] + [str(tmp_path / "all"), "--split", "all"]) == 0
    assert "split: all" in capsys.readouterr().out


def test_eval_help_names_the_default_split(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "test (the default)" in help_text and "--overwrite" in help_text


# ---------------------------------------------------------------------------------------------- 5, 6, 9: bad flags
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--temperature", "nan"], "--temperature must be a number in [0, 2] (0 is greedy), got nan"),
        (["--temperature", "inf"], "--temperature must be a number in [0, 2] (0 is greedy), got inf"),
        (["--temperature", "-0.5"], "--temperature must be a number in [0, 2] (0 is greedy), got -0.5"),
        (["--temperature", "2.5"], "--temperature must be a number in [0, 2] (0 is greedy), got 2.5"),
        (["--limit", "0"], "--limit must be >= 1, got 0"),
        (["--limit", "-3"], "--limit must be >= 1, got -3"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    ],
)
def test_bad_values_fail_in_one_line_before_the_model_loads(extra, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(["eval", "--program", "single_step_rag", "--out", str(tmp_path / "run"), *extra]) == 1
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_out_that_is_a_file_fails_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    (tmp_path / "taken").write_text("not a folder")
    for out in (tmp_path / "taken", tmp_path / "taken" / "run"):
        assert main(["eval", "--program", "single_step_rag", "--out", str(out)]) == 1
        err = _one_line_error(capsys)
        assert f"--out {out}" in err and str(tmp_path / "taken") in err and "is a file" in err
    assert (tmp_path / "taken").read_text() == "not a folder"


# ---------------------------------------------------------------------------------------- 7: damaged records.jsonl
def test_resume_redoes_the_question_a_kill_cut_short(echo, tmp_path, caplog):
    out = tmp_path / "run"
    assert main(_eval(out)) == 0
    path = out / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # killed while writing the 4th record
    with caplog.at_level(logging.WARNING, logger="rolecall.evaluation.records"):
        assert main(_eval(out, "--resume")) == 0
    assert f"{path}:4: dropping a truncated last record" in caplog.text and "re-run" in caplog.text
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(json.loads(line)["id"] for line in lines)
    assert echo.calls == 5  # four, then the one the kill cut short


@pytest.mark.parametrize("garbage", ["not json at all", "null", "[1, 2]", '{"id": 3}', '{"id": "q", "em": "high"}'])
def test_resume_stops_on_a_damaged_line_in_the_middle(echo, tmp_path, monkeypatch, capsys, garbage):
    out = tmp_path / "run"
    assert main(_eval(out)) == 0
    path = out / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], garbage, *lines[1:]]) + "\n")
    before = _snapshot(out)
    capsys.readouterr()
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(_eval(out, "--resume")) == 1
    assert f"{path}:2:" in _one_line_error(capsys)
    assert _snapshot(out) == before


# ------------------------------------------------------------------------------ 4, 5: the real LM on a tiny model
@pytest.fixture
def tiny_dir(tmp_path, tiny_model, smollm_tokenizer, monkeypatch) -> Path:
    """The tiny random Llama saved as a model folder; DSPy's response cache is off, since it keys on the folder's
    name ("local/tiny"), which every test's tiny model shares."""
    from dspy.clients.cache import Cache

    monkeypatch.setattr(dspy, "cache", Cache(False, False, None))
    folder = tmp_path / "tiny"
    tiny_model.save_pretrained(folder)
    smollm_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def asked_tokens(monkeypatch) -> list[int]:
    """The max_tokens of every generation request the LM makes (a spy on LocalEngine: the real call still runs)."""
    from rolecall.lm.local import LocalEngine

    asked: list[int] = []
    original = LocalEngine.to_generation_request

    def spy(self, messages, config, n=1):
        request = original(self, messages, config, n)
        asked.append(request.max_tokens)
        return request

    monkeypatch.setattr(LocalEngine, "to_generation_request", spy)
    return asked


def test_max_tokens_reaches_every_lm_call(tiny_dir, tmp_path, asked_tokens, capsys):
    """single_step_rag's answer role asks for 128 tokens of its own; --max-tokens 8 is what every call gets."""
    from rolecall.programs import SingleStepRAG

    argv = ["eval", "--program", "single_step_rag", "--model", str(tiny_dir), "--limit", "2", "--k", "2"]
    argv += ["--no-progress", "--threads", "2", "-o", "demos=null"]
    assert SingleStepRAG.MAX_TOKENS["answer"] > 8
    assert main([*argv, "--max-tokens", "8", "--out", str(tmp_path / "capped")]) == 0
    assert asked_tokens and set(asked_tokens) == {8}
    asked_tokens.clear()
    assert main([*argv, "--out", str(tmp_path / "default")]) == 0  # without the flag: the role's own budget
    assert set(asked_tokens) == {SingleStepRAG.MAX_TOKENS["answer"]}


def test_truncation_warning_names_the_flag_that_raises_the_budget(tiny_dir, tmp_path, capsys):
    """A random tiny model never writes the completion marker, so every answer is cut at the budget."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    logging.getLogger("dspy.clients.lm").addHandler(handler)
    try:
        argv = ["eval", "--program", "single_step_rag", "--model", str(tiny_dir), "--limit", "1", "--k", "2"]
        assert main([*argv, "--max-tokens", "4", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    finally:
        logging.getLogger("dspy.clients.lm").removeHandler(handler)
    truncated = [m for m in seen if "truncated" in m]
    assert truncated and all("--max-tokens" in m and "increase max_tokens" not in m for m in truncated), truncated
    assert not logging.getLogger("dspy.clients.lm").filters  # the rewording ends with the command


def test_failed_lm_calls_are_counted_and_every_question_failing_exits_1(tiny_dir, tmp_path, monkeypatch, capsys):
    """An LM that fails on every call (an injected out-of-memory error) is reported, not scored as 0 errors."""
    from rolecall.lm.local import LocalEngine

    def out_of_memory(self, request):
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(LocalEngine, "complete", out_of_memory)
    out = tmp_path / "run"
    argv = ["eval", "--program", "single_step_rag", "--model", str(tiny_dir), "--limit", "2", "--k", "2"]
    assert main([*argv, "--max-tokens", "4", "--no-progress", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "2 errors" in captured.out
    assert "every question failed" in captured.err and "CUDA out of memory (injected)" in captured.err
    assert json.loads((out / "summary.json").read_text())["n_errors"] == 2


# ------------------------------------------------------------------------------------ 8: a damaged saved program
@pytest.mark.parametrize("damage", ["truncate_weights", "empty_weights", "bad_config"])
def test_eval_load_names_a_damaged_adapter_file_before_the_model_loads(
    damage, tiny_model, smollm_tokenizer, tmp_path, monkeypatch, capsys
):
    from rolecall.lm import LocalLM
    from rolecall.programs import SingleStepRAG

    saved = tmp_path / "saved"
    program = SingleStepRAG(None, lm=LocalLM(tiny_model, tokenizer=smollm_tokenizer), top_k=2)
    program.mark_trained("answer")
    program.save(saved)
    folder = saved / "adapters" / "answer"
    weights, config = folder / "adapter_model.safetensors", folder / "adapter_config.json"
    if damage == "truncate_weights":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "empty_weights":
        weights.write_bytes(b"")
    else:
        config.write_text("{ not json")
    monkeypatch.setattr("rolecall.lm.local.LocalLM", NoModel)
    assert main(["eval", "--load", str(saved), "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys)
    assert str(config if damage == "bad_config" else weights) in err
    assert not (tmp_path / "run").exists()
