"""Programs saved by rolecall before the registry / config renovation (issue 52, saved at 026de81 into
``tests/fixtures/saved_before_52``) still load; a program of a format this rolecall does not read fails in one line
naming its format version and what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rolecall.cli import main
from rolecall.errors import ModelLoadError
from rolecall.programs.registry import get_program_class, program_names

SAVED = Path(__file__).resolve().parents[2] / "fixtures" / "saved_before_52"


@pytest.mark.parametrize("name", program_names())
def test_every_prompt_only_program_saved_before_loads(name):
    folder = SAVED / "prompt_only" / name
    program = get_program_class(name).load(folder)
    saved = json.loads((folder / "program.json").read_text())
    assert saved["format_version"] == 2
    assert program.config()["options"] == saved["config"]["options"]
    assert {k: len(v.get("demos", [])) for k, v in program.dump_state().items()} == {
        k: len(v.get("demos", [])) for k, v in saved["state"].items()
    }  # every predictor's demos come back


def test_an_sft_compiled_program_saved_before_evaluates(tmp_path, tiny_model, smollm_tokenizer, capsys):
    """The tiny model is the one the fixture was trained on (make_tiny_llama's seed 0): its adapters load and the
    demo-free roles run through `rolecall eval --load`."""
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    argv = ["eval", "--load", str(SAVED / "opera_sft"), "--model", str(model_dir), "--limit", "2", "--threads", "2",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_future_format_fails_in_one_line(tmp_path, capsys):
    folder = tmp_path / "future"
    shutil.copytree(SAVED / "prompt_only" / "opera", folder)
    payload = json.loads((folder / "program.json").read_text())
    payload["format_version"] = 3
    (folder / "program.json").write_text(json.dumps(payload))
    with pytest.raises(ModelLoadError, match=r"format version 3; this rolecall reads versions 1 to 2: load it with"):
        get_program_class("opera").load(folder)
    assert main(["eval", "--load", str(folder), "--limit", "1", "--out", str(tmp_path / "e")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format version 3" in err[0]
