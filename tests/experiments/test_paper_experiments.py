"""experiments/<paper>.py and their shared runner: a smoke run end to end on a tiny model (a trained row warm-started
from another row's saved program), kill-resume, --report-only, --help, and every paper config's rows."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PAPERS = ("opera", "reap", "multiagent_opd", "d2plan", "stride")

TOY_CONFIG = """
paper = "toy"
title = "Toy paper"
paper_model = "Big-7B"
paper_metric = "EM / F1 (%)"
tables = "its table 1"
datasets = ["synthetic", "musique"]
notes = ["a note the report repeats"]
[sizes.smoke]
test_questions = 1
train_questions = 2
threads = 2
sft_minutes = 0.2
sft_max_steps = 1
rl_minutes = 0.01
rl_max_steps = 1
group_size = 2
max_tokens = 8
[sizes.default]
test_questions = 1
train_questions = 2
[[rows]]
name = "rag"
label = "RAG prompt-only"
program = "single_step_rag"
method = "prompt-only"
paper_row = "Naive RAG"
paper.synthetic = { em = 10.0, f1 = 20.0 }
[[rows]]
name = "reap_sft"
program = "reap"
method = "sft"
[[rows]]
name = "reap_mt"
label = "REAP SFT + multi-task SFT"
program = "reap"
method = "multitask_sft"
warm_start = "reap_sft"
paper_row = "REAP"
paper_table = "main"
paper.musique = { f1 = 38.3 }
"""


def load_script(paper: str):
    spec = importlib.util.spec_from_file_location(f"experiment_{paper}", EXPERIMENTS / f"{paper}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its shared runner imports from experiments/ (pytest pythonpath)
    return module


@pytest.fixture(scope="module")
def opera():
    return load_script("opera")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm_tokenizer):
    from tests.conftest import make_tiny_llama

    path = tmp_path_factory.mktemp("tiny")
    make_tiny_llama(smollm_tokenizer).save_pretrained(path)
    smollm_tokenizer.save_pretrained(path)
    return path


def _rows(out: Path) -> dict[str, dict]:
    return {r["row"]: r for r in json.loads((out / "toy_smoke.json").read_text())["rows"]}


def test_smoke_run_resumes_and_reports(opera, model_dir, tmp_path, capsys):
    """Three rows on the synthetic world: prompt-only, SFT(gold), and multi-task SFT warm-started from the SFT row's
    saved program; then a killed run (a row missing from the JSON) reruns only that row, reusing its saved program and
    its evaluation records; then --report-only rebuilds the report and the README block."""
    config, out, runs, readme = tmp_path / "toy.toml", tmp_path / "results", tmp_path / "runs", tmp_path / "README.md"
    config.write_text(TOY_CONFIG)
    readme.write_text("# experiments\n\nintro\n")
    argv = [
        "--config",
        str(config),
        "--size",
        "smoke",
        "--datasets",
        "synthetic",
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--runs",
        str(runs),
        "--readme",
        str(readme),
    ]
    assert opera.run(argv) == 0
    printed = capsys.readouterr().out
    assert "reap_mt" in printed and "trained on synthetic (2 questions, within 0.2 min), warm start reap_sft" in printed

    rows = _rows(out)
    assert set(rows) == {"rag", "reap_sft", "reap_mt"} and all(r["status"] == "done" for r in rows.values())
    assert rows["rag"]["train"] is None and rows["rag"]["paper"] == {"em": 10.0, "f1": 20.0}
    mt = rows["reap_mt"]
    assert mt["train"]["on"] == "synthetic" and mt["train"]["questions"] == 2 and mt["n"] == 1
    assert mt["train"]["warm_start"] == "reap_sft" and mt["train"]["steps"] == {"multitask": 1}
    # minutes are rounded to 0.01: a one-step tiny-model run may record 0.0, so the warm start's share is checked
    assert mt["train"]["total_minutes"] >= mt["train"]["minutes"] >= 0
    assert mt["train"]["total_minutes"] == pytest.approx(
        mt["train"]["minutes"] + rows["reap_sft"]["train"]["minutes"], abs=0.011
    )
    assert 0 <= mt["em_ci"][0] <= mt["em"] <= mt["em_ci"][1] <= 1
    saved = runs / "toy_smoke" / "synthetic" / "reap_mt"
    assert (saved / "program" / "adapters" / "multitask").is_dir() and (saved / "eval" / "records.jsonl").is_file()
    assert (saved / "program" / "adapters" / "extractor").is_dir(), "the warm start's other adapters are kept"
    md = (out / "toy_smoke.md").read_text()
    assert md.startswith("# Toy paper: rolecall reproduction (smoke size)") and "Big-7B" in md
    assert "a note the report repeats" in md and "| RAG prompt-only (`rag`) | Naive RAG | not trained |" in md
    assert "synthetic / `reap_mt` (REAP SFT + multi-task SFT): trained on synthetic, 2 questions" in md
    assert "warm start `reap_sft`" in md and "| 10.0 | 20.0 |" in md
    assert (out / "toy_smoke.png").stat().st_size > 5000
    text = readme.read_text()
    assert text.startswith("# experiments\n\nintro\n") and "<!-- BEGIN toy results" in text
    assert "| main | REAP (`reap_mt`) | musique | – / 38.3 | not run yet |" in text

    # a run killed before reap_mt was recorded: only reap_mt reruns, from its saved program and records
    trained = json.loads((saved / "train.json").read_text())["trained_at"]
    payload = json.loads((out / "toy_smoke.json").read_text())
    payload["rows"] = [r for r in payload["rows"] if r["row"] != "reap_mt"]
    (out / "toy_smoke.json").write_text(json.dumps(payload))
    assert opera.run(argv) == 0
    printed = capsys.readouterr().out
    assert "synthetic / rag: done earlier" in printed and "synthetic / reap_sft: done earlier" in printed
    assert "training" not in printed.split("[3/3]")[1], "the saved program is reused, not retrained"
    assert json.loads((saved / "train.json").read_text())["trained_at"] == trained
    assert len((saved / "eval" / "records.jsonl").read_text().splitlines()) == 1, "the evaluation resumed"
    assert _rows(out)["reap_mt"]["em"] == mt["em"]

    # --report-only rebuilds the markdown, chart and README block from the JSON alone
    (out / "toy_smoke.md").unlink()
    (out / "toy_smoke.png").unlink()
    readme.write_text("# experiments\n")
    assert opera.run([*argv, "--report-only"]) == 0
    assert (out / "toy_smoke.md").read_text() == md and (out / "toy_smoke.png").is_file()
    assert readme.read_text().count("<!-- BEGIN toy results") == 1

    # runs/ loses reap_sft's program and reap_mt is run again with --fresh: reap_sft is trained again as its warm
    # start, so reap_sft's committed row describes a program that is gone; the run says so, and the next run
    # evaluates the saved program again instead of keeping the row
    sft_dir = runs / "toy_smoke" / "synthetic" / "reap_sft"
    old_sft = _rows(out)["reap_sft"]["train"]["trained_at"]
    shutil.rmtree(sft_dir / "program")
    assert opera.run([*argv, "--rows", "reap_mt", "--fresh"]) == 0
    printed = capsys.readouterr().out
    new_sft = json.loads((sft_dir / "train.json").read_text())["trained_at"]
    assert new_sft != old_sft and _rows(out)["reap_sft"]["train"]["trained_at"] == old_sft
    assert _rows(out)["reap_mt"]["train"]["warm_start_trained_at"] == new_sft
    assert f"note: synthetic / reap_sft: its result describes the program trained at {old_sft}" in printed
    assert (
        f"its warm start is the `reap_sft` program trained at {new_sft}, not the one"
        in (out / "toy_smoke.md").read_text()
    )
    assert opera.run(argv) == 0
    printed = capsys.readouterr().out
    assert "synthetic / reap_sft: its result describes the program trained at" in printed
    assert "evaluating it again" in printed and "    training " not in printed, "re-evaluated, not retrained"
    assert "synthetic / reap_mt: done earlier" in printed and "note:" not in printed
    assert _rows(out)["reap_sft"]["train"]["trained_at"] == new_sft
    assert "its warm start is the" not in (out / "toy_smoke.md").read_text(), "the rows agree again"

    # --re-evaluate forgets a row's result and records but keeps its program
    assert opera.run([*argv, "--rows", "reap_mt", "--re-evaluate"]) == 0
    printed = capsys.readouterr().out
    assert "    training " not in printed and "EM " in printed
    assert json.loads((saved / "train.json").read_text())["trained_at"] == _rows(out)["reap_mt"]["train"]["trained_at"]


def test_train_on_falls_back_to_synthetic_where_the_data_lacks_targets(opera, tmp_path):
    """A method needing gold decompositions trains on the synthetic world for a dataset without them, in the
    synthetic row's folder (trained once for every such dataset); an answers-only method trains on the dataset."""
    from rolecall.data.types import Example

    from _paper import Data, Experiment
    from _paper_config import load_config

    config = load_config(EXPERIMENTS / "configs" / "d2plan.toml")
    exp = Experiment(config, "smoke", out=tmp_path, runs=tmp_path / "runs", model=None)
    no_decomposition = [Example(f"q{i}", f"Who is {i}?", [str(i)], hops=2) for i in range(3)]
    exp._data["hotpotqa"] = Data("hotpotqa", no_decomposition, no_decomposition[:1], [])
    sft, splanrl, wo_purifier = config.row("sft"), config.row("splanrl"), config.row("wo_purifier")
    assert exp.train_on("hotpotqa", sft) == "synthetic"
    assert exp.program_dir("hotpotqa", sft) == tmp_path / "runs" / "d2plan_smoke" / "synthetic" / "sft"
    assert exp.train_on("hotpotqa", splanrl) == "hotpotqa"
    assert exp.program_dir("hotpotqa", splanrl) == tmp_path / "runs" / "d2plan_smoke" / "hotpotqa" / "splanrl"
    assert exp.train_on("hotpotqa", wo_purifier) == "hotpotqa"  # an ablation trains where its warm start did
    assert "trained on synthetic, evaluated on hotpotqa" in exp.describe("hotpotqa", sft)
    assert exp.fingerprint("hotpotqa", splanrl) != exp.fingerprint("synthetic", splanrl)


@pytest.mark.parametrize("paper", PAPERS)
def test_help(paper):
    done = subprocess.run(
        [sys.executable, str(EXPERIMENTS / f"{paper}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "--size {smoke,default}" in done.stdout and "--report-only" in done.stdout and "--fresh" in done.stdout
    assert "--re-evaluate" in done.stdout
    assert f"experiments/{paper}.py --plan" in done.stdout


@pytest.mark.parametrize("paper", PAPERS)
def test_configs_name_valid_programs_and_methods(opera, paper):
    from rolecall.programs.registry import program_names

    from _paper_config import DATASETS, METHODS, load_config

    config = load_config(EXPERIMENTS / "configs" / f"{paper}.toml")
    assert config.paper == paper and set(config.datasets) == set(DATASETS)
    assert config.sizes["smoke"].test_questions <= 2 and config.sizes["default"].test_questions >= 20
    for row in config.rows:
        assert row.program in program_names() and row.method in METHODS
    assert any(METHODS[r.method].trains for r in config.rows) and any(r.paper for r in config.rows)
    assert any(r.warm_start for r in config.rows if METHODS[r.method].trains)


def test_configs_carry_the_papers_main_numbers(opera):
    from _paper_config import load_config

    def paper(name: str, row: str) -> dict:
        return load_config(EXPERIMENTS / "configs" / f"{name}.toml").row(row).paper

    assert paper("opera", "mapgrpo")["musique"] == {"em": 39.7, "f1": 58.0}
    assert paper("reap", "multitask")["2wiki"] == {"f1": 79.6}
    assert paper("multiagent_opd", "opd")["macro"] == {"em": 38.68}
    assert paper("d2plan", "splanrl")["hotpotqa"] == {"em": 46.17}
    assert paper("stride", "stride_ft")["musique"] == {"em": 35.0, "f1": 44.8}


@pytest.mark.parametrize(
    "row, message",
    [
        ('name = "a"\nprogram = "nope"\nmethod = "sft"', "unknown program 'nope'; valid: cascaded_team"),
        (
            'name = "a"\nprogram = "opera"\nmethod = "dpo"',
            "unknown method 'dpo'; valid: prompt-only, bootstrap_fewshot",
        ),
        ('name = "a"\nprogram = "reap"\nmethod = "mapgrpo"\nwarm_start = "a"', "mapgrpo applies to opera, not reap"),
        ('name = "a"\nprogram = "ircot"\nmethod = "sft"', "sft has gold-path targets for"),
        ('name = "a"\nprogram = "opera"\nmethod = "grpo"', "set warm_start"),
        ('name = "a"\nprogram = "opera"\nmethod = "prompt-only"\noptions = { top_k = 0 }', "top_k"),
        ('name = "a"\nprogram = "opera"\nmethod = "grpo"\nwarm_start = "b"', "warm_start 'b' is not a row"),
        ('name = "a"\nprogram = "opera"\nmethod = "sft"\nparams = { steps = 3 }', "unknown params ['steps']"),
    ],
)
def test_config_errors_name_the_valid_choices(opera, tmp_path, row, message):
    from _paper_config import load_config

    head = TOY_CONFIG.split("[[rows]]")[0]
    (tmp_path / "bad.toml").write_text(f"{head}[[rows]]\n{row}\n")
    with pytest.raises(ValueError) as err:
        load_config(tmp_path / "bad.toml")
    assert message in str(err.value)


def test_cli_rejects_an_unknown_row_and_skips_a_missing_dataset(opera, monkeypatch, tmp_path, capsys):
    import _paper

    with pytest.raises(SystemExit):
        opera.run(["--rows", "sft,nope", "--plan"])
    assert "--rows: unknown ['nope']; valid: opera_cot, ircot, bfs, sft" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        opera.run(["--fresh", "--re-evaluate", "--plan"])
    assert "--fresh retrains and --re-evaluate keeps the programs: give one of them" in capsys.readouterr().err
    monkeypatch.setattr(_paper, "SHARED_DATA", tmp_path / "absent")
    assert opera.run(["--datasets", "musique", "--plan", "--out", str(tmp_path), "--runs", str(tmp_path)]) == 0
    assert "skipping musique" in capsys.readouterr().out


def test_fresh_forgets_only_the_selected_rows(opera, tmp_path):
    from _paper import Experiment
    from _paper_cli import forget, fresh
    from _paper_config import load_config

    (tmp_path / "toy.toml").write_text(TOY_CONFIG)
    config = load_config(tmp_path / "toy.toml")
    exp = Experiment(config, "smoke", out=tmp_path / "results", runs=tmp_path / "runs", model=None)
    exp._data["synthetic"] = None  # not needed: every row here trains on the synthetic world
    for name in ("reap_sft", "reap_mt"):
        (exp.program_dir("synthetic", config.row(name)) / "program").mkdir(parents=True)
        exp.eval_dir("synthetic", config.row(name)).mkdir(parents=True, exist_ok=True)
    exp.results.parent.mkdir(parents=True)
    rows = [{"dataset": "synthetic", "row": n, "status": "done"} for n in ("rag", "reap_sft", "reap_mt")]
    exp.results.write_text(json.dumps({"rows": rows}))
    fresh(exp, [("synthetic", config.row("reap_mt"))])
    assert [r["row"] for r in exp.read_results()["rows"]] == ["rag", "reap_sft"]
    assert not exp.program_dir("synthetic", config.row("reap_mt")).exists()
    assert (exp.program_dir("synthetic", config.row("reap_sft")) / "program").is_dir()
    forget(exp, [("synthetic", config.row("reap_sft"))], programs=False)  # --re-evaluate
    assert [r["row"] for r in exp.read_results()["rows"]] == ["rag"]
    assert (exp.program_dir("synthetic", config.row("reap_sft")) / "program").is_dir()
    assert not exp.eval_dir("synthetic", config.row("reap_sft")).exists()


def test_stale_and_outdated_rows(opera, tmp_path):
    """A result row is stale when the saved program is not the one it describes (evaluated again), and outdated
    when its program was trained from an older warm start than the saved one (kept, with a note)."""
    from _paper import Experiment
    from _paper_config import load_config

    (tmp_path / "toy.toml").write_text(TOY_CONFIG)
    config = load_config(tmp_path / "toy.toml")
    exp = Experiment(config, "smoke", out=tmp_path / "results", runs=tmp_path / "runs", model=None)
    exp._data["synthetic"] = None
    sft, mt = config.row("reap_sft"), config.row("reap_mt")

    def row(name: str, trained_at: str, **train: str) -> dict:
        return {"dataset": "synthetic", "row": name, "status": "done", "train": {"trained_at": trained_at, **train}}

    old_sft, old_mt = row("reap_sft", "t1"), row("reap_mt", "t2", warm_start_trained_at="t1")
    rag = {"dataset": "synthetic", "row": "rag", "status": "done", "train": None}
    assert exp.stale(old_sft) is None and exp.outdated(old_mt) is None, "no saved program: nothing newer to say"
    for r, at, parent in ((sft, "t1", None), (mt, "t2", "t1")):
        (exp.program_dir("synthetic", r) / "program").mkdir(parents=True)
        (exp.program_dir("synthetic", r) / "program" / "program.json").write_text("{}")
        meta = {"trained_at": at, "warm_start_trained_at": parent}
        (exp.program_dir("synthetic", r) / "train.json").write_text(json.dumps(meta))
    assert exp.stale(old_sft) is None and exp.stale(old_mt) is None and exp.stale(rag) is None
    assert exp.outdated(old_mt) is None
    (exp.program_dir("synthetic", sft) / "train.json").write_text(json.dumps({"trained_at": "t3"}))
    assert exp.stale(old_sft) == "its result describes the program trained at t1; runs/ now holds the one trained at t3"
    assert exp.stale(old_mt) is None, "reap_mt's saved program is still the one its row describes"
    assert exp.outdated(old_mt) == "it was trained from an earlier reap_sft program than the one runs/ now holds"
    exp._data["musique"] = None  # its file absent: its rows' folders cannot be told, so nothing is said
    assert exp.stale({**old_sft, "dataset": "musique"}) is None
    assert exp.outdated({**old_mt, "dataset": "musique"}) is None
    (exp.program_dir("synthetic", sft) / "program" / "program.json").unlink()
    assert exp.stale(old_sft) is None, "no saved program (a killed training): nothing to evaluate without training"
    (exp.program_dir("synthetic", sft) / "program" / "program.json").write_text("{}")
    (exp.program_dir("synthetic", sft) / "train.json").write_text("{not json")
    assert exp.stale(old_sft) is None and exp.outdated(old_mt) is None, "a corrupt train.json is no evidence"
